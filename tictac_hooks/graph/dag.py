"""The DAG of one worker's iteration: compute ops and recv ops (paper section 3).

A recv op is the transfer of one parameter tensor from a parameter server to this
worker; recvs are the roots of the worker's partition graph. Every other op is a compute
op, run on the worker's one compute resource. A recv is carried by the channel of its PS
task (one channel per (worker, PS) pair).

See docs/ALGORITHMS.md, "Model".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import reprlib
from typing import Any, Iterable, Mapping, Sequence

RECV = "recv"
COMPUTE = "compute"
DEFAULT_CHANNEL = "ps:0"


class GraphError(ValueError):
    """A graph that cannot be scheduled: malformed input, unknown names, cycles."""


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlevel = 3


def short_repr(value: Any) -> str:
    """repr() of a value for an error message: nesting and length cut short."""
    try:
        return _SHORT.repr(value)
    except ValueError:  # an int over sys.get_int_max_str_digits() digits
        if isinstance(value, int):
            return f"<an integer of {value.bit_length()} bits>"
        return f"<a {type(value).__name__}>"


def read_text(path: str | os.PathLike, error: type[ValueError], what: str, expected: str) -> str:
    """The UTF-8 text of a file (a leading byte-order mark dropped), or ``error`` naming
    the file: missing, unreadable (a directory, no permission) or not UTF-8 text."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                    f"expected {expected}") from None


def parse_json(text: str, source: str, error: type[ValueError]) -> Any:
    """json.loads, every failure raised as ``error`` naming ``source``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{source}: not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{source}: JSON nested too deeply to read") from None
    except ValueError as e:  # an integer literal over sys.get_int_max_str_digits() digits
        detail = str(e).split(";")[0]
        raise error(f"{source}: not valid JSON here: a number too long ({detail})") from None


@dataclasses.dataclass(frozen=True)
class Op:
    """One node of the iteration DAG.

    Attributes:
      name: unique name. For a recv, the name the transfer is known by at the PS (the
        sending node's name, e.g. ``model/dense/MatMul/ReadVariableOp``).
      kind: ``"recv"`` or ``"compute"``.
      inputs: names of the ops this op depends on (data and control edges alike).
      time: seconds with the resource to itself (the time oracle), or None if unknown.
      channel: for a recv, the PS task carrying it (e.g. ``"ps:0"``).
      bytes: size of the transferred tensor, where known.
      param: for a recv, the parameter it reads, where known: the shards of one
        partitioned variable (``.../part_<k>``) share it, and count as one parameter
        for the orders' dependency sets (algorithms.py).
      declared: for a recv, the position of the variable it reads in the model's
        declaration order (``model.trainable_variables``, then the other variables in
        creation order), where the extraction was given it: the order BytePS,
        ByteScheduler and P3 prioritise by (``declared`` in algorithms.py). The shards
        of one variable, and two reads of it, share its position.

    A recv usually has no inputs (the PS can serve it at the start of the step). A
    recv WITH inputs is a read the PS can serve only once they are done on the worker
    (an embedding gather needs the ids the worker computes and sends): it is ready when
    its inputs are, and an order places it after every recv they depend on.
    """

    name: str
    kind: str
    inputs: tuple[str, ...] = ()
    time: float | None = None
    channel: str | None = None
    bytes: int | None = None
    param: str | None = None
    declared: int | None = None

    @property
    def is_recv(self) -> bool:
        return self.kind == RECV


class Graph:
    """A validated, topologically ordered iteration DAG.

    Construction checks everything a scheduler relies on and raises :class:`GraphError`
    naming the offending op: duplicate names, unknown kinds or inputs, negative or
    non-finite times, cycles.
    """

    def __init__(self, ops: Iterable[Op]):
        by_name: dict[str, Op] = {}
        for op in ops:
            if not isinstance(op.name, str) or not op.name:
                raise GraphError(f"op name must be a non-empty string, got {short_repr(op.name)}")
            if op.name in by_name:
                raise GraphError(f"duplicate op name {op.name!r}")
            if op.kind not in (RECV, COMPUTE):
                raise GraphError(
                    f"op {op.name!r}: kind must be 'recv' or 'compute', got {short_repr(op.kind)}")
            if op.time is not None and (not math.isfinite(op.time) or op.time < 0):
                raise GraphError(
                    f"op {op.name!r}: time must be a finite number >= 0 seconds, "
                    f"got {short_repr(op.time)}")
            if op.bytes is not None and op.bytes < 0:
                raise GraphError(f"op {op.name!r}: bytes must be >= 0, got {short_repr(op.bytes)}")
            if op.declared is not None and (op.kind != RECV or op.declared < 0):
                raise GraphError(f"op {op.name!r}: 'declared' is a recv's declaration "
                                 f"position, an integer >= 0, got {short_repr(op.declared)}")
            if op.kind == RECV:
                if op.channel is None:
                    op = dataclasses.replace(op, channel=DEFAULT_CHANNEL)
            by_name[op.name] = op
        for op in by_name.values():
            for name in op.inputs:
                if name not in by_name:
                    raise GraphError(f"op {op.name!r} has unknown input {name!r}")
        self._ops: list[Op] = _topological(by_name)
        self._index = {op.name: i for i, op in enumerate(self._ops)}
        self._recvs = [op for op in self._ops if op.kind == RECV]

    # --- access -------------------------------------------------------------------
    @property
    def ops(self) -> Sequence[Op]:
        """All ops, in a topological order (stable with respect to the input order)."""
        return self._ops

    @property
    def recvs(self) -> Sequence[Op]:
        return self._recvs

    @property
    def compute_ops(self) -> list[Op]:
        return [op for op in self._ops if op.kind == COMPUTE]

    @property
    def channels(self) -> list[str]:
        return sorted({op.channel for op in self._recvs})

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> Op:
        return self._ops[self._index[name]]

    def index(self, name: str) -> int:
        return self._index[name]

    def has_times(self) -> bool:
        return all(op.time is not None for op in self._ops)

    def with_times(self, times: Mapping[str, float], default: float | None = None) -> "Graph":
        """A copy whose op times come from ``times`` (missing: ``default``, or kept)."""
        ops = []
        for op in self._ops:
            t = times.get(op.name, op.time if default is None else default)
            ops.append(dataclasses.replace(op, time=None if t is None else float(t)))
        return Graph(ops)

    def with_recvs_only(self, names: "set[str] | Sequence[str]") -> "Graph":
        """A copy in which only the recvs in ``names`` stay recvs.

        The others become compute ops taking no time: reads that the graph shows but
        that never cross the network (e.g. an optimizer's read of a variable on its own
        PS, feeding an update that runs there). Used once the PSes have reported which
        transfers a worker really receives.
        """
        keep = set(names)
        ops = [op if op.kind != RECV or op.name in keep
               else dataclasses.replace(op, kind=COMPUTE, channel=None, time=0.0,
                                         declared=None, param=None)
               for op in self._ops]
        return Graph(ops)

    def renamed(self, names: Mapping[str, str]) -> "Graph":
        """A copy with ops renamed by ``names`` (old -> new; others keep theirs), and
        every input that names a renamed op renamed with it."""
        new = lambda n: names.get(n, n)  # noqa: E731
        return Graph(dataclasses.replace(op, name=new(op.name),
                                         inputs=tuple(new(i) for i in op.inputs))
                     for op in self._ops)

    def summary(self) -> dict[str, Any]:
        n_bytes = [op.bytes for op in self._recvs if op.bytes is not None]
        return {
            "ops": len(self._ops),
            "recvs": len(self._recvs),
            "compute_ops": len(self._ops) - len(self._recvs),
            "channels": self.channels,
            "param_bytes": sum(n_bytes) if n_bytes else None,
        }

    # --- JSON interchange -----------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = []
        for op in self._ops:
            d: dict[str, Any] = {"name": op.name, "kind": op.kind, "inputs": list(op.inputs)}
            if op.time is not None:
                d["time"] = op.time
            if op.kind == RECV:
                d["channel"] = op.channel
            if op.bytes is not None:
                d["bytes"] = op.bytes
            if op.param is not None and op.kind == RECV:  # (a recv made a PS-side read
                d["param"] = op.param                     # keeps its param: not written)
            if op.declared is not None and op.kind == RECV:
                d["declared"] = op.declared
            out.append(d)
        return {"ops": out}

    @classmethod
    def from_json(cls, data: Any, source: str = "graph") -> "Graph":
        """Builds a graph from the interchange format (see README, "Graph JSON").

        Raises:
          GraphError: naming ``source`` and, where it is about one op, its index.
        """
        if not isinstance(data, dict) or "ops" not in data:
            raise GraphError(f"{source}: expected an object with an 'ops' list")
        if not isinstance(data["ops"], list):
            raise GraphError(f"{source}: 'ops' must be a list, got {type(data['ops']).__name__}")
        ops = []
        for i, d in enumerate(data["ops"]):
            where = f"{source}: ops[{i}]"
            if not isinstance(d, dict):
                raise GraphError(f"{where}: expected an object, got {type(d).__name__}")
            unknown = set(d) - {"name", "kind", "time", "inputs", "channel", "bytes", "param",
                                "declared"}
            if unknown:
                raise GraphError(f"{where} ({short_repr(d.get('name'))}): unknown field(s) "
                                 f"{sorted(map(str, unknown))}")
            if "name" not in d:
                raise GraphError(f"{where}: missing field 'name'")
            name = d["name"]
            if not isinstance(name, str) or not name:
                raise GraphError(f"{where}: op name must be a non-empty string, "
                                 f"got {short_repr(name)}")
            where = f"{where} ({name!r})"
            kind = d.get("kind", COMPUTE)
            inputs = d.get("inputs", [])
            if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
                raise GraphError(f"{where}: 'inputs' must be a list of op names, "
                                 f"got {short_repr(inputs)}")
            time = d.get("time")
            if time is not None:
                if isinstance(time, bool) or not isinstance(time, (int, float)):
                    raise GraphError(f"{where}: 'time' must be a number of seconds, "
                                     f"got {short_repr(time)}")
                try:
                    time = float(time)
                except OverflowError:
                    raise GraphError(f"{where}: 'time' must be a finite number of seconds, "
                                     f"got {short_repr(time)}") from None
            channel = d.get("channel")
            if channel is not None and not isinstance(channel, str):
                raise GraphError(f"{where}: 'channel' must be a string, got {short_repr(channel)}")
            if channel is not None and kind != RECV:
                raise GraphError(f"{where}: only recv ops have a 'channel'")
            nbytes = d.get("bytes")
            if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int)):
                raise GraphError(f"{where}: 'bytes' must be an integer, got {short_repr(nbytes)}")
            param = d.get("param")
            if param is not None and (not isinstance(param, str) or kind != RECV):
                raise GraphError(f"{where}: 'param' is a recv's parameter name (a string), "
                                 f"got {short_repr(param)}")
            declared = d.get("declared")
            if declared is not None and (isinstance(declared, bool)
                                         or not isinstance(declared, int)
                                         or declared < 0 or kind != RECV):
                raise GraphError(f"{where}: 'declared' is a recv's declaration position, "
                                 f"an integer >= 0, got {short_repr(declared)}")
            ops.append(Op(name=name, kind=kind, inputs=tuple(inputs), time=time,
                          channel=channel, bytes=nbytes, param=param, declared=declared))
        try:
            return cls(ops)
        except GraphError as e:
            raise GraphError(f"{source}: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Graph":
        """Reads a graph JSON file; GraphError names the file and what is wrong."""
        text = read_text(path, GraphError, "file", "graph JSON (see README, \"Graph JSON\")")
        return cls.from_json(parse_json(text, str(path), GraphError), source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f)


def _topological(by_name: dict[str, Op]) -> list[Op]:
    """Kahn's algorithm, visiting ready ops in input order; raises on cycles."""
    position = {name: i for i, name in enumerate(by_name)}
    indegree = {name: len(set(op.inputs)) for name, op in by_name.items()}
    consumers: dict[str, list[str]] = {name: [] for name in by_name}
    for op in by_name.values():
        for name in set(op.inputs):
            consumers[name].append(op.name)
    import heapq
    ready = [position[n] for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    names = list(by_name)
    out: list[Op] = []
    while ready:
        name = names[heapq.heappop(ready)]
        out.append(by_name[name])
        for c in consumers[name]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready, position[c])
    if len(out) != len(by_name):
        stuck = [n for n, d in indegree.items() if d > 0]
        cycle = _find_cycle(by_name, set(stuck))
        raise GraphError(f"graph has a cycle: {' -> '.join(cycle)}")
    return out


def _find_cycle(by_name: dict[str, Op], candidates: set[str]) -> list[str]:
    """One cycle among ``candidates`` (ops left with unresolved inputs), for the error."""
    start = min(candidates, key=list(by_name).index)
    path, seen = [start], {start: 0}
    node = start
    while True:
        nxt = next(i for i in by_name[node].inputs if i in candidates)
        if nxt in seen:
            cyc = path[seen[nxt]:] + [nxt]
            return list(reversed(cyc))[:12]
        seen[nxt] = len(path)
        path.append(nxt)
        node = nxt
