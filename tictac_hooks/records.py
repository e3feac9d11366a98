"""The records TicTac keeps, in one place: what a gate saw of a step, what a worker's
step was, what a benchmark client measured.

- :class:`GateStep`: one (step, worker) at one PS, as both gates report it (the Python
  gate builds it; the native gate's JSON is read into it), with its
  :class:`TransferRecord` per RecvTensor in hand-back order and a :class:`SkipRecord`
  per skipped transfer. ``to_json`` / ``from_json`` are the wire format of
  ``stats`` on both backends; ``from_json`` refuses a record that lacks a field.
- :class:`WorkerStep`: one step of one worker, merged over the PSes and finalized
  (callbacks/steplog.py): step time, phase, measured E. TensorBoard writes these.
- :class:`ClientStep`: one synchronous step as the benchmark client timed it.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from typing import Any, Iterable, Mapping

# TensorFlow's names for what a lowered while loop's condition function takes (e.g.
# ``Func/while/cond/_0/input/_57``): sent in every iteration, the dead exit one too.
_LOOP_CONDITION = re.compile(r"(^|/)cond/_\d+/")

# A worker step's phase: profiling in TensorFlow's order, in TicTac's order, or a check
# block in TensorFlow's order after the switch.
PROFILING, SCHEDULED, CHECK = 0, 1, 2
PHASE_NAMES = {PROFILING: "profiling", SCHEDULED: "scheduled", CHECK: "check"}


class RecordError(ValueError):
    """A record does not have the fields of its schema."""


def _field(d: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return d[key]
    except (KeyError, TypeError):
        raise RecordError(f"{what} record has no {key!r}: {str(d)[:200]}") from None


@dataclasses.dataclass(frozen=True)
class TransferRecord:
    """One RecvTensor through a gate. Times are wall-clock seconds at the PS."""

    name: str        # the transfer as schedules name it (sending node, or edge_<n>_...)
    state: str       # pass, listed, late, unexpected, duplicate (enforce/gate.py)
    priority: int    # its priority in the installed order; -1 when not listed
    bytes: int       # response bytes
    arrive: float    # request seen
    release: float   # forwarded to the PS's own RecvTensor (0: not yet)
    release_seq: int  # release order among listed transfers, gate-wide (-1: none)
    handback: float  # response handed to gRPC (0: not yet)
    error: str = ""  # a failed call's status
    # The key's full tensor name (edge_<n>_...), recorded where ``name`` came twice in
    # the step (a tensor sent over two edges, under its node's name): which edge it was.
    tensor: str = ""
    # The PS sent a dead tensor (is_dead in the response): the exit iteration of a
    # loop (steps_per_execution > 1) sends every body transfer once more, dead.
    dead: bool = False

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "state": self.state, "priority": self.priority,
               "bytes": self.bytes, "arrive": self.arrive, "release": self.release,
               "release_seq": self.release_seq, "handback": self.handback}
        if self.error:
            out["error"] = self.error
        if self.tensor:
            out["tensor"] = self.tensor
        if self.dead:
            out["dead"] = True
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TransferRecord":
        f = lambda k: _field(d, k, "transfer")  # noqa: E731
        return cls(f("name"), f("state"), int(f("priority")), int(f("bytes")),
                   float(f("arrive")), float(f("release")), int(f("release_seq")),
                   float(f("handback")), str(d.get("error", "")), str(d.get("tensor", "")),
                   bool(d.get("dead", False)))


@dataclasses.dataclass(frozen=True)
class SkipRecord:
    """A transfer the gate skipped: its name, why (slow, timeout, absent, cancelled),
    and when."""

    name: str
    reason: str
    time: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "time": self.time}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SkipRecord":
        return cls(_field(d, "name", "skip"), _field(d, "reason", "skip"),
                   float(_field(d, "time", "skip")))


@dataclasses.dataclass(frozen=True)
class GateStep:
    """One worker's transfers of one training step at one PS (the gate's counter per
    (step, destination, loop iteration), paper section 4). A dispatched call that runs
    several training steps in a loop (``steps_per_execution > 1``) has one step id and
    one record per iteration: ``iteration`` is the rendezvous key's iter id (0 outside
    loops), ``frame`` its frame id (0 outside loops)."""

    step_id: int
    worker: str                    # destination device
    schedule_version: int | None   # the order the step was bound to (None: none)
    algorithm: str | None
    complete: bool                 # every listed transfer handed back or skipped
    order: tuple[str, ...]         # names in hand-back order
    transfers: tuple[TransferRecord, ...]
    bytes: int
    start: float                   # first arrival
    end: float                     # last hand-back
    skipped: tuple[SkipRecord, ...]
    skips: int
    violations: int                # late or unexpected transfers
    reordered: int                 # handed back behind a later-listed one (window)
    unlisted: tuple[str, ...]      # passed straight through, not in the order
    ps: str = ""                   # the PS's address (set by the client that read it)
    iteration: int = 0             # loop iteration within the step id
    frame: int = 0                 # loop frame id (0: not in a loop)
    # Where the record stands in its gate's history: ``seq``, the order in which the
    # gate's records finished (from 1; 0: still active), and ``worker_seq``, the same
    # count per destination (0: unknown). Two records of one worker at one PS with
    # consecutive worker_seq have nothing lost between them.
    seq: int = 0
    worker_seq: int = 0

    @property
    def scheduled(self) -> bool:
        return self.schedule_version is not None

    @property
    def dead(self) -> bool:
        """The record holds no training step: each of its transfers is a dead tensor
        or the loop's condition input (which TensorFlow sends live in every iteration,
        the exit one too). A loop's exit iteration, or a PS that only feeds the loop's
        condition."""
        return bool(self.transfers) and all(
            t.dead or _LOOP_CONDITION.search(t.name) for t in self.transfers)

    def to_json(self) -> dict[str, Any]:
        out = {"step_id": self.step_id, "worker": self.worker,
               "schedule_version": self.schedule_version, "algorithm": self.algorithm,
               "complete": self.complete, "order": list(self.order),
               "transfers": [t.to_json() for t in self.transfers], "bytes": self.bytes,
               "start": self.start, "end": self.end,
               "skipped": [s.to_json() for s in self.skipped], "skips": self.skips,
               "violations": self.violations, "reordered": self.reordered,
               "unlisted": list(self.unlisted)}
        if self.ps:
            out["ps"] = self.ps
        if self.frame or self.iteration:
            out["frame"], out["iteration"] = self.frame, self.iteration
        if self.seq:
            out["seq"] = self.seq
        if self.worker_seq:
            out["worker_seq"] = self.worker_seq
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], ps: str | None = None) -> "GateStep":
        f = lambda k: _field(d, k, "step")  # noqa: E731
        version = f("schedule_version")
        return cls(int(f("step_id")), f("worker"),
                   None if version is None else int(version), f("algorithm"),
                   bool(f("complete")), tuple(f("order")),
                   tuple(TransferRecord.from_json(t) for t in f("transfers")),
                   int(f("bytes")), float(f("start")), float(f("end")),
                   tuple(SkipRecord.from_json(s) for s in f("skipped")), int(f("skips")),
                   int(f("violations")), int(f("reordered")), tuple(f("unlisted")),
                   ps if ps is not None else str(d.get("ps", "")),
                   int(d.get("iteration", 0)), int(d.get("frame", 0)),
                   int(d.get("seq", 0)), int(d.get("worker_seq", 0)))


def served_sizes(record: GateStep) -> dict[str, int]:
    """Transfer name -> the bytes the PS served it with in one step record. A tensor
    sent over two edges comes twice under its node's name unless the installed order
    names its edges; each copy then counts under its edge's name (its record's
    ``tensor``), and a name twice in a record without it counts for neither edge."""
    counts: dict[str, int] = {}
    for t in record.transfers:
        counts[t.name] = counts.get(t.name, 0) + 1
    out = {}
    for t in record.transfers:
        if t.error:
            continue
        if counts[t.name] == 1:
            out[t.name] = t.bytes
        elif t.tensor:
            out[t.tensor] = t.bytes
    return out


def bytes_per_transfer(records: Iterable[GateStep], names: Iterable[str] | None = None
                       ) -> dict[str, float]:
    """Per transfer (of ``names``, the DAGs' recvs; None: all), the median bytes the PS
    served it with over ``records`` (:func:`served_sizes`)."""
    wanted = set(names) if names is not None else None
    sizes: dict[str, list[int]] = {}
    for r in records:
        for name, nbytes in served_sizes(r).items():
            if wanted is None or name in wanted:
                sizes.setdefault(name, []).append(nbytes)
    return {n: float(statistics.median(b)) for n, b in sorted(sizes.items())}


def checked_steps(steps: Any) -> list[dict[str, Any]]:
    """A gate's ``stats`` steps as the schema writes them: every record read through
    :class:`GateStep` (a missing field is a :class:`RecordError` naming it)."""
    if not isinstance(steps, list):
        raise RecordError(f"stats 'steps' must be a list of step records, got "
                          f"{type(steps).__name__}")
    return [GateStep.from_json(s).to_json() for s in steps]


@dataclasses.dataclass(frozen=True)
class WorkerStep:
    """One step of one worker, as seen by the parameter servers."""

    worker: str            # destination device, e.g. /job:worker/replica:0/task:1/...
    step: int              # per-worker step index, from 0
    start: float           # wall-clock time of the step's first transfer
    step_time: float | None  # to the next step's start (None for the last step)
    transfer_span: float
    phase: int             # PROFILING, SCHEDULED, or CHECK (TF's order, after the switch)
    efficiency: float | None = None
    paused_s: float = 0.0  # TicTac's own pause inside the step (taken out of step_time;
                           # such a step is left out of the medians)
    order: str | None = None  # the algorithm of the order it ran in (None: TensorFlow's)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "WorkerStep":
        f = lambda k: _field(d, k, "worker step")  # noqa: E731
        return cls(f("worker"), int(f("step")), float(f("start")), f("step_time"),
                   float(f("transfer_span")), int(f("phase")), d.get("efficiency"),
                   float(d.get("paused_s", 0.0)), d.get("order"))


@dataclasses.dataclass(frozen=True)
class ClientStep:
    """One synchronous step as the benchmark client measured it.

    Attributes:
      schedule: the schedule the step ran under ("none", "rendezvous", "tic", ...).
      step_time: wall seconds of the step, as the client saw it.
      finishes: per worker, seconds from the step's start to that tower's finish.
    """

    schedule: str
    step_time: float
    finishes: tuple[float, ...]

    def straggler_pct(self) -> float:
        """Largest share (%) of the step any worker waits for the slowest."""
        if len(self.finishes) < 2 or self.step_time <= 0:
            return 0.0
        return 100.0 * (max(self.finishes) - min(self.finishes)) / self.step_time

    @property
    def makespan(self) -> float:
        """The step's makespan on the workers: the slowest tower's finish."""
        return max(self.finishes) if self.finishes else self.step_time

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "step_time": self.step_time,
                "finishes": list(self.finishes)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ClientStep":
        f = lambda k: _field(d, k, "client step")  # noqa: E731
        return cls(f("schedule"), float(f("step_time")), tuple(float(x) for x in f("finishes")))
