"""A model's profile: what `tictac whatif` needs to predict a cluster it has not run.

One worker's step as a DAG with its time oracle (compute op times measured where the
profile was taken, each recv's bytes), the parameters in the order the model creates
them (how ParameterServerStrategy places them), and each parameter's gradient push.
TicTac writes one at the switch (``log_dir``), ``tictac analyze --model ... --profile
DIR`` writes one for a model, and the built-in models' profiles ship with the package
(``profiles/``), so predicting needs no TensorFlow.

:func:`placed` puts the DAG on P parameter servers as ParameterServerStrategy does:
variables round-robin in creation order, a variable of ``bytes >= 2 x min_shard_bytes``
split into ``min(P, bytes // min_shard_bytes)`` shards (``MinSizePartitioner``), each
shard taking the next PS. See docs/WHATIF.md.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from typing import Any

from tictac_hooks.graph.dag import RECV, Graph, GraphError, Op, parse_json

VERSION = 1
FILE = "tictac_profile.json.gz"
BUILTIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")


class ProfileError(ValueError):
    """A profile that is missing or cannot be used; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One PS variable as the workers see it each step."""

    name: str
    bytes: int        # the whole variable (decides its shards)
    push_bytes: int   # its gradient, worker -> PS, per step (0: not trained)


@dataclasses.dataclass(frozen=True)
class Profile:
    """A worker's step, its oracle and its parameters (see the module docstring).

    ``cpu_s``: CPU seconds one worker step costs the whole cluster (worker ops,
    dispatch, the PSes' serving), where measured; None: the DAG's compute alone.
    """

    model: str
    training: bool
    batch: int
    graph: Graph                 # recvs carry ``param`` and ``bytes``; compute ops a time
    parameters: tuple[Parameter, ...]   # in creation order
    min_shard_bytes: int | None  # the partitioner's; None: no variable is sharded
    cpu_s: float | None = None
    source: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def compute_s(self) -> float:
        """The step's compute on one worker with nothing to wait for."""
        return sum(op.time or 0.0 for op in self.graph.compute_ops)

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "model": self.model, "training": self.training,
                "batch": self.batch, "graph": self.graph.to_json(),
                "parameters": [dataclasses.asdict(p) for p in self.parameters],
                "min_shard_bytes": self.min_shard_bytes, "cpu_s": self.cpu_s,
                "source": self.source}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Profile":
        if not isinstance(data, dict) or data.get("version") != VERSION:
            got = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ProfileError(f"{where}: not a TicTac profile of version {VERSION} "
                               f"(got {got!r}); write it again with this version")
        try:
            graph = Graph.from_json(data["graph"], where)
            params = tuple(Parameter(str(p["name"]), int(p["bytes"]), int(p["push_bytes"]))
                           for p in data["parameters"])
            profile = cls(model=str(data["model"]), training=bool(data["training"]),
                          batch=int(data["batch"]), graph=graph, parameters=params,
                          min_shard_bytes=data.get("min_shard_bytes"),
                          cpu_s=data.get("cpu_s"), source=dict(data.get("source") or {}))
        except (KeyError, TypeError) as e:
            raise ProfileError(f"{where}: a profile field is missing or malformed ({e})") from None
        profile.check(where)
        return profile

    def check(self, where: str) -> None:
        """Raises ProfileError where a recv has no size or parameter, or an op no time."""
        known = {p.name for p in self.parameters}
        for op in self.graph.ops:
            if op.time is None and op.kind != RECV:
                raise ProfileError(f"{where}: op {op.name!r} has no time")
            if op.kind == RECV and (op.bytes is None or op.param not in known):
                raise ProfileError(f"{where}: recv {op.name!r} has no size or names no "
                                   f"listed parameter ({op.param!r})")

    def save(self, directory: str) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, FILE)
        with gzip.open(path, "wt") as f:
            json.dump(self.to_json(), f, separators=(",", ":"))
        return path


def from_run(graph: Graph, compute_times: dict[str, float] | None,
             served_bytes: dict[str, int], model: str = "run", batch: int = 0) -> Profile:
    """The profile of a running job at TicTac's switch: the worker DAG restricted to what
    the PSes served, each recv sized by the bytes the PS served it with, the measured
    compute times (0 where not measured). The run's shards stay as they were: a shard
    is a parameter of its own (TicTac does not see the partitioner), so ``whatif`` keeps
    their count at every P; every read is taken to be trained (pushed back)."""
    channels: dict[str, set[str]] = {}
    for op in graph.recvs:
        channels.setdefault(op.param or op.name, set()).add(op.channel or "")
    ops, sizes = [], {}
    for op in graph.ops:
        if op.kind == RECV:
            key = op.param or op.name
            if len(channels[key]) > 1:
                key = f"{key}@{op.channel}"
            nbytes = int(served_bytes.get(op.name, op.bytes or 0))
            op = dataclasses.replace(op, param=key, bytes=nbytes, time=None)
            sizes.setdefault(key, [0, 0, op.declared if op.declared is not None else 1 << 30])
            sizes[key][0] = max(sizes[key][0], nbytes)
            sizes[key][1] += nbytes if op.inputs else 0
        else:
            op = dataclasses.replace(op, time=(compute_times or {}).get(op.name, 0.0))
        ops.append(op)
    params = tuple(Parameter(k, v[0], v[1] or v[0])
                   for k, v in sorted(sizes.items(), key=lambda kv: (kv[1][2], kv[0])))
    return Profile(model=model, training=True, batch=batch, graph=Graph(ops),
                   parameters=params, min_shard_bytes=None,
                   source={"from": "a TicTac run, at the switch",
                           "compute": "measured" if compute_times else "not measured (0)"})


def at_step(profile: Profile, compute_ms: float, where: str = "--compute-ms") -> Profile:
    """``profile`` with every compute op's time scaled so that its step computes for
    ``compute_ms`` (a GPU worker's step, say, where the profile was taken on a CPU):
    the ops keep their relative costs and dependencies. The CPU a step costs is then
    that compute (the measured ``cpu_s`` was the profiling machine's)."""
    if not compute_ms > 0:
        raise ProfileError(f"{where} must be > 0 ms, got {compute_ms}")
    if profile.compute_s <= 0:
        raise ProfileError(f"{where}: the {profile.model} profile has no compute times to "
                           "scale")
    factor = compute_ms / 1e3 / profile.compute_s
    graph = profile.graph.with_times({op.name: (op.time or 0.0) * factor
                                      for op in profile.graph.compute_ops})
    return dataclasses.replace(
        profile, graph=graph, cpu_s=None,
        source=dict(profile.source, compute=f"scaled to {compute_ms:g} ms per step "
                                            f"(x {factor:.4g} of the profiled "
                                            f"{profile.compute_s * 1e3:.1f} ms)"))


def load(directory: str) -> Profile:
    """The profile in ``directory`` (as :meth:`Profile.save` wrote it, or the file)."""
    path = directory if directory.endswith(".json.gz") else os.path.join(directory, FILE)
    if not os.path.exists(path):
        raise ProfileError(
            f"no profile at {path}: write one with `tictac analyze --model NAME --profile "
            f"{directory}`, or pass a TicTac run's log_dir (written at the switch)")
    try:
        with gzip.open(path, "rt") as f:
            text = f.read()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path}: not a gzip'd profile ({e})") from None
    return Profile.from_json(parse_json(text, path, ProfileError), path)


def builtin_names() -> list[str]:
    """The models whose profiles ship with the package."""
    if not os.path.isdir(BUILTIN_DIR):
        return []
    return sorted(n[: -len(".json.gz")] for n in os.listdir(BUILTIN_DIR)
                  if n.endswith(".json.gz"))


def builtin(name: str) -> Profile:
    """A shipped profile by model name (``resnet50``, ``dlrm``, ...)."""
    names = builtin_names()
    if name not in names:
        raise ProfileError(f"no built-in profile {name!r}; built in: {', '.join(names)}; "
                           "for another model pass --profile DIR")
    return load(os.path.join(BUILTIN_DIR, name + ".json.gz"))


def shard_count(nbytes: int, ps: int, min_shard_bytes: int | None) -> int:
    """MinSizePartitioner(min_shard_bytes, max_shards=ps): at least one shard, at most
    one per PS, none smaller than ``min_shard_bytes``."""
    if not min_shard_bytes:
        return 1
    return max(1, min(ps, nbytes // min_shard_bytes))


@dataclasses.dataclass(frozen=True)
class Placed:
    """A profile placed on ``ps`` PSes: one worker's DAG with each recv on its PS's
    channel (``ps:<k>``), and per PS the bytes a worker pulls and pushes per step."""

    graph: Graph
    ps: int
    pull_bytes: tuple[int, ...]
    push_bytes: tuple[int, ...]


def placed(profile: Profile, ps: int) -> Placed:
    """The profile's DAG on ``ps`` PSes (module docstring): a recv of a sharded variable
    becomes one recv per shard (``<name>/part_<k>``, its bytes split evenly; a gather's
    rows split with the table), and its consumers wait for every shard."""
    if ps < 1:
        raise ProfileError(f"the number of PS must be >= 1, got {ps}")
    home: dict[str, list[int]] = {}  # parameter -> the PS of each shard
    pushes = [0] * ps
    counter = 0
    for p in profile.parameters:
        shards = shard_count(p.bytes, ps, profile.min_shard_bytes)
        home[p.name] = [(counter + k) % ps for k in range(shards)]
        counter += shards
        for k in home[p.name]:
            pushes[k] += p.push_bytes // shards
    pulls = [0] * ps
    renamed: dict[str, tuple[str, ...]] = {}
    ops: list[Op] = []
    for op in profile.graph.ops:
        if op.kind != RECV:
            continue
        where = home[op.param]  # type: ignore[index]
        op = dataclasses.replace(op, inputs=tuple(n for i in op.inputs
                                                  for n in renamed.get(i, (i,))))
        if len(where) == 1:
            parts = [dataclasses.replace(op, channel=f"ps:{where[0]}")]
        else:
            parts = [dataclasses.replace(op, name=f"{op.name}/part_{k}", channel=f"ps:{ps_k}",
                                         bytes=(op.bytes or 0) // len(where))
                     for k, ps_k in enumerate(where)]
        renamed[op.name] = tuple(part.name for part in parts)
        for part in parts:
            pulls[int(part.channel[3:])] += part.bytes or 0  # type: ignore[index]
        ops.extend(parts)
    for op in profile.graph.ops:
        if op.kind == RECV:
            continue
        inputs = tuple(n for i in op.inputs for n in renamed.get(i, (i,)))
        ops.append(dataclasses.replace(op, inputs=inputs))
    try:
        graph = Graph(ops)
    except GraphError as e:
        raise ProfileError(f"placing {profile.model} on {ps} PS: {e}") from None
    return Placed(graph=graph, ps=ps, pull_bytes=tuple(pulls), push_bytes=tuple(pushes))
