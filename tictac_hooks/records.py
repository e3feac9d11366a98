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


# A transfer's state at a gate (TransferRecord.state; gate.cc's StateName writes the
# same strings).
PASS = "pass"              # not listed: straight through
LISTED = "listed"          # listed and expected here: waited for its turn
LATE = "late"              # listed, but its slot was already skipped: straight through
UNEXPECTED = "unexpected"  # listed, but not a transfer this PS served when installed
DUPLICATE = "duplicate"    # a second transfer of the same name in one step
STATES = (PASS, LISTED, LATE, UNEXPECTED, DUPLICATE)

# Why a gate skipped a listed transfer (SkipRecord.reason).
SLOW = "slow"            # its request came, but its response did not within the bound
TIMEOUT = "timeout"      # its request did not come within the bound
ABSENT = "absent"        # skipped for not coming in several steps running: at once now
CANCELLED = "cancelled"  # its call ended without a response
SKIP_REASONS = (SLOW, TIMEOUT, ABSENT, CANCELLED)


class RecordError(ValueError):
    """A record does not have the fields of its schema."""


def _field(d: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return d[key]
    except (KeyError, TypeError):
        raise RecordError(f"{what} record has no {key!r}: {str(d)[:200]}") from None


@dataclasses.dataclass(frozen=True)
class TransferRecord:
    """One RecvTensor through a gate. Times are wall-clock seconds at the PS; 0: not
    (yet) happened.

    The two backends hold different ends of a transfer: the proxy holds the *request*
    (the PS produces the response once the gate lets the request go), the native gate
    holds the *response* (the PS produces it at once; the gate hands it back in turn).
    Each field means one thing on both; :attr:`held_s` and :attr:`ps_s` read them.
    """

    name: str        # the transfer as schedules name it (sending node, or edge_<n>_...)
    state: str       # one of STATES
    priority: int    # its priority in the installed order; -1 when not listed
    bytes: int       # response bytes
    arrive: float    # its request reached the gate
    release: float   # the gate stopped holding it back (proxy: request forwarded to the
                     # PS; native: response handed back)
    release_seq: int  # order of release among listed transfers, gate-wide (-1: none)
    handback: float  # its response went to gRPC, back to the worker
    error: str = ""  # a failed call's status
    # The key's full tensor name (edge_<n>_...), recorded where ``name`` came twice in
    # the step (a tensor sent over two edges, under its node's name): which edge it was.
    tensor: str = ""
    # The PS sent a dead tensor (is_dead in the response): the exit iteration of a
    # loop (steps_per_execution > 1) sends every body transfer once more, dead.
    dead: bool = False
    # The PS had produced the response (native: RecvTensor's callback; proxy: its first
    # HEADERS frame came back, which is also its hand-back). 0: unknown (older records).
    ready: float = 0.0

    @property
    def held_s(self) -> float:
        """Seconds the gate held the transfer back for its turn: its request (from
        arrival to release) or its response (from ready to release)."""
        if not self.release:
            return 0.0
        start = self.ready if 0 < self.ready <= self.release else self.arrive
        return max(self.release - start, 0.0)

    @property
    def ps_s(self) -> float:
        """Seconds the PS spent producing the response: from the request's arrival
        (native), or from its release (proxy), to ready."""
        ready = self.ready or self.handback
        if not ready:
            return 0.0
        start = self.release if 0 < self.release < ready else self.arrive
        return max(ready - start, 0.0)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "state": self.state, "priority": self.priority,
               "bytes": self.bytes, "arrive": self.arrive, "release": self.release,
               "release_seq": self.release_seq, "handback": self.handback}
        if self.ready:
            out["ready"] = self.ready
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
                   bool(d.get("dead", False)), float(d.get("ready", 0.0)))


@dataclasses.dataclass(frozen=True)
class SkipRecord:
    """A transfer the gate skipped: its name, why (slow, timeout, absent, cancelled),
    and when."""

    name: str
    reason: str   # one of SKIP_REASONS
    time: float   # wall-clock seconds at the PS

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


@dataclasses.dataclass(frozen=True)
class GateStats:
    """What one gate's ``stats`` answers, on every backend: its settings, its counters,
    and step records (every one held; with ``since``, a cursor's read: the records
    finished after record number ``since``). The wire format is :meth:`to_json`; a
    client reads it with :meth:`from_json` (a missing field is a :class:`RecordError`
    naming it). gate.cc's ``SummaryLocked`` writes the same fields
    (tests/test_records.py checks they do not drift)."""

    ps: str                        # the PS's address (set by the client that read it)
    backend: str                   # "native", "proxy" or "inprocess"
    schedule_version: int | None   # the installed order (None: TensorFlow's own)
    algorithm: str | None          # its algorithm
    expected: int                  # transfers of that order this PS enforces
    window_bytes: int              # look-ahead bytes in flight (0: one at a time)
    active_steps: int              # (step, worker) records still open
    history: int                   # finished records held
    served_names: int              # distinct transfer names served so far
    totals: Mapping[str, int]      # transfers handed back per state (STATES), and
                                   # requests the gate could not parse ("unparsed")
    steps: tuple[GateStep, ...]    # oldest first: finished, then active (seq 0)
    # Native only (None elsewhere): bytes/s the hand-back is paced to (0: not paced),
    # whether paced turns align to the link, the conserve bound, the skip bound.
    pace_rate: float | None = None
    align: bool | None = None
    conserve_after_s: float | None = None
    skip_after_s: float | None = None
    since: int | None = None       # the read's cursor (None: every record held)
    last_seq: int = 0              # the newest finished record's number (next since)
    dropped: int = 0               # records after ``since`` the history bound let go
    device: str = ""               # native: the PS device its control ops run on
    upstream: str = ""             # proxy: the PS it forwards to

    def to_json(self, steps: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ps": self.ps, "backend": self.backend,
            "schedule_version": self.schedule_version, "algorithm": self.algorithm,
            "expected": self.expected, "window_bytes": self.window_bytes,
            "active_steps": self.active_steps, "history": self.history,
            "served_names": self.served_names, "totals": dict(self.totals)}
        for key in ("pace_rate", "align", "conserve_after_s", "skip_after_s", "since"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.since is not None:
            out["last_seq"], out["dropped"] = self.last_seq, self.dropped
        for key in ("device", "upstream"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if steps:
            out["steps"] = [s.to_json() for s in self.steps]
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], ps: str | None = None,
                  backend: str | None = None) -> "GateStats":
        """Reads a ``stats`` reply; ``ps`` and ``backend`` name the gate where the reply
        does not (each step record gets the ``ps``)."""
        f = lambda k: _field(d, k, "stats")  # noqa: E731
        steps = f("steps")
        if not isinstance(steps, list):
            raise RecordError(f"stats 'steps' must be a list of step records, got "
                              f"{type(steps).__name__}")
        ps = ps if ps is not None else str(d.get("ps", ""))
        version = f("schedule_version")
        opt = lambda k, kind: None if d.get(k) is None else kind(d[k])  # noqa: E731
        return cls(ps=ps, backend=backend if backend is not None else str(f("backend")),
                   schedule_version=None if version is None else int(version),
                   algorithm=f("algorithm"), expected=int(f("expected")),
                   window_bytes=int(f("window_bytes")), active_steps=int(f("active_steps")),
                   history=int(f("history")), served_names=int(f("served_names")),
                   totals={str(k): int(v) for k, v in f("totals").items()},
                   steps=tuple(GateStep.from_json(s, ps=ps) for s in steps),
                   pace_rate=opt("pace_rate", float), align=opt("align", bool),
                   conserve_after_s=opt("conserve_after_s", float),
                   skip_after_s=opt("skip_after_s", float), since=opt("since", int),
                   last_seq=int(d.get("last_seq", 0)), dropped=int(d.get("dropped", 0)),
                   device=str(d.get("device") or ""), upstream=str(d.get("upstream") or ""))


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


@dataclasses.dataclass(frozen=True)
class RatioSpread:
    """Paired ratios median(TensorFlow's order) / median(TicTac's order) of an order
    check (> 1: TicTac faster): how many pairs, their median and range."""

    pairs: int
    median: float | None = None
    low: float | None = None
    high: float | None = None

    @classmethod
    def of(cls, ratios: Iterable[float]) -> "RatioSpread":
        ratios = list(ratios)
        if not ratios:
            return cls(0)
        return cls(len(ratios), statistics.median(ratios), min(ratios), max(ratios))

    def to_json(self) -> dict[str, Any]:
        if not self.pairs:
            return {"pairs": 0}
        return {"pairs": self.pairs, "ratio_median": self.median, "ratio_min": self.low,
                "ratio_max": self.high}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RatioSpread":
        pairs = int(_field(d, "pairs", "ratio spread"))
        if not pairs:
            return cls(0)
        f = lambda k: float(_field(d, k, "ratio spread"))  # noqa: E731
        return cls(pairs, f("ratio_median"), f("ratio_min"), f("ratio_max"))


@dataclasses.dataclass(frozen=True)
class WorkerCheck:
    """One worker's pairs in an order check: their ratios, and the median step time in
    each order over them (None: no pair)."""

    spread: RatioSpread
    default_median_step_time: float | None
    tictac_median_step_time: float | None

    def to_json(self) -> dict[str, Any]:
        return self.spread.to_json() | {
            "default_median_step_time": self.default_median_step_time,
            "tictac_median_step_time": self.tictac_median_step_time}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "WorkerCheck":
        return cls(RatioSpread.from_json(d), d.get("default_median_step_time"),
                   d.get("tictac_median_step_time"))


@dataclasses.dataclass(frozen=True)
class CheckBlock:
    """A maximal run of one worker's steps in one order: its phase (SCHEDULED or
    CHECK), median step time, and the step indices it covers."""

    phase: int
    median: float
    steps: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One order check's result (callbacks/order_check.py, ``decide``)."""

    algorithm: str                  # the candidate the figures are about (the best)
    rounds: int
    block_steps: int
    candidates: Mapping[str, RatioSpread]   # every candidate's pairs, all workers
    rule: str                       # the decision rule, in words
    workers: Mapping[str, WorkerCheck]      # the focused candidate, per worker
    spread: RatioSpread             # the focused candidate, all workers
    blocks: Mapping[str, tuple[CheckBlock, ...]]  # per worker, for TensorBoard
    decision: str | None            # "tictac", "default", or None: no pair formed
    chosen: str | None              # the kept candidate (None: TensorFlow's order)
    reason: str = ""                # why there is no decision

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "algorithm": self.algorithm, "rounds": self.rounds,
            "block_steps": self.block_steps,
            "candidates": {c: s.to_json() for c, s in self.candidates.items()},
            "rule": self.rule, "workers": {w: c.to_json() for w, c in self.workers.items()},
            **self.spread.to_json(),
            "blocks": {w: [[b.phase, b.median, list(b.steps)] for b in bs]
                       for w, bs in self.blocks.items()},
            "decision": self.decision, "chosen": self.chosen}
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckResult":
        f = lambda k: _field(d, k, "order check")  # noqa: E731
        return cls(f("algorithm"), int(f("rounds")), int(f("block_steps")),
                   {c: RatioSpread.from_json(s) for c, s in f("candidates").items()},
                   f("rule"), {w: WorkerCheck.from_json(c) for w, c in f("workers").items()},
                   RatioSpread.from_json(d),
                   {w: tuple(CheckBlock(int(p), float(m), tuple(st)) for p, m, st in bs)
                    for w, bs in f("blocks").items()},
                   f("decision"), f("chosen"), str(d.get("reason", "")))


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


# --- Benchmark runs (`tictac bench`) -------------------------------------------------
#
# One run's result, as `tictac bench --json` writes it and `tictac bench-report` reads
# it: :class:`BenchRun` holds the configuration, the machine and network, and one
# :class:`RateRun` per link rate, each with a :class:`ScheduleSummary` per schedule.
# ``from_json`` reads every result written since the benchmark's first version: a field
# added later is optional and defaults (documented beside it); a field every version
# wrote is required, and a record without it is a :class:`RecordError`.


def _floats(values: Iterable[Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _optional(value: Any, kind: Any) -> Any:
    return None if value is None else kind(value)


@dataclasses.dataclass(frozen=True)
class GateCounts:
    """What the gates recorded of one schedule's steps (bench/metrics.py
    ``rendezvous_counts``): a schedule through a gate has them, TensorFlow's default
    and "stock" (the gate bypassed) do not."""

    transfers: int                  # RecvTensor calls over every gate
    violations: int                 # late or unexpected transfers
    violation_pct: float | None     # their share of transfers (None: no transfer)
    skips: int
    matched: float | None           # share of scheduled transfers the order named
    reordered: int | None = None    # behind a later-listed one (None: older results)
    # what the PSes served a worker per step, median over steps (None: older results)
    bytes_per_worker_step: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GateCounts":
        f = lambda k: _field(d, k, "gate counts")  # noqa: E731
        return cls(int(f("transfers")), int(f("violations")),
                   _optional(f("violation_pct"), float), int(f("skips")),
                   _optional(f("matched"), float), _optional(d.get("reordered"), int),
                   _optional(d.get("bytes_per_worker_step"), float))


@dataclasses.dataclass(frozen=True)
class UnscheduledTransfer:
    """A transfer an installed order did not name (bench/metrics.py
    ``unscheduled_transfers``)."""

    name: str
    bytes: int     # as last served
    steps: int     # scheduled steps it came in
    reason: str    # late, "in the DAG, not in the order", "not in the traced DAG"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "UnscheduledTransfer":
        f = lambda k: _field(d, k, "unscheduled transfer")  # noqa: E731
        return cls(str(f("name")), int(f("bytes")), int(f("steps")), str(f("reason")))


@dataclasses.dataclass(frozen=True)
class CheckSummary:
    """What schedule "checked" ran of TicTac's order check, and what it decided."""

    decision: str               # "tictac" or "default"
    kept: str | None            # the order kept (None: TensorFlow's)
    seconds: float              # the check's wall time
    steps: int                  # the check's steps
    candidates: Mapping[str, float | None]  # order -> median paired ratio to TF's order

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision, "kept": self.kept, "seconds": self.seconds,
                "steps": self.steps, "candidates": dict(self.candidates)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckSummary":
        f = lambda k: _field(d, k, "order check")  # noqa: E731
        return cls(str(f("decision")), f("kept"), float(f("seconds")), int(f("steps")),
                   {str(k): _optional(v, float) for k, v in f("candidates").items()})


@dataclasses.dataclass(frozen=True)
class ScheduleSummary:
    """One schedule's steps at one link rate (bench/metrics.py ``summarize``). Times
    in seconds; see bench/metrics.py for the definitions."""

    steps: int
    throughput: float               # samples per second
    step_time_mean: float
    step_time_median: float
    step_time_p95: float
    step_time_cv: float
    straggler_pct: float            # mean over steps
    straggler_pct_p95: float
    efficiency_median: float | None  # measured E (None: no step bounded by the oracle)
    makespan_median: float
    efficiency_steps: int | None = None  # steps with an E (None: older results)
    efficiency_note: str | None = None   # why steps have no E
    gate: GateCounts | None = None       # None: no gate on the path (none, stock)
    # transfers the installed order left out, largest first (None: no order installed)
    unscheduled: tuple[UnscheduledTransfer, ...] | None = None
    check: CheckSummary | None = None    # schedule "checked" only

    _GATE = tuple(f.name for f in dataclasses.fields(GateCounts))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("gate", "unscheduled", "check")}
        # the gate's counts sit beside the step times (None where no gate counted)
        out.update(self.gate.to_json() if self.gate else dict.fromkeys(self._GATE))
        if self.unscheduled is not None:
            out["unscheduled"] = [u.to_json() for u in self.unscheduled]
        if self.check is not None:
            out["check"] = self.check.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ScheduleSummary":
        f = lambda k: _field(d, k, "schedule summary")  # noqa: E731
        unscheduled = d.get("unscheduled")
        return cls(
            int(f("steps")), float(f("throughput")), float(f("step_time_mean")),
            float(f("step_time_median")), float(f("step_time_p95")),
            float(f("step_time_cv")), float(f("straggler_pct")),
            float(f("straggler_pct_p95")), _optional(f("efficiency_median"), float),
            float(f("makespan_median")), _optional(d.get("efficiency_steps"), int),
            d.get("efficiency_note"),
            None if d.get("transfers") is None else GateCounts.from_json(d),
            None if unscheduled is None else tuple(UnscheduledTransfer.from_json(u)
                                                    for u in unscheduled),
            CheckSummary.from_json(d["check"]) if d.get("check") else None)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One schedule against TensorFlow's default in the same run (bench/metrics.py
    ``compare``)."""

    throughput_gain_pct: float
    cv_cut: float | None          # default's CV / this CV (None: undefined)
    straggler_cut: float | None   # default's straggler share / this one

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Comparison":
        f = lambda k: _field(d, k, "comparison")  # noqa: E731
        return cls(float(f("throughput_gain_pct")), _optional(f("cv_cut"), float),
                   _optional(f("straggler_cut"), float))


@dataclasses.dataclass(frozen=True)
class InRunCompute:
    """The calibration blocks of one rate's rounds (bench/client.py CALIBRATION): the
    gate with no order over the fast profiling link, and the compute reference."""

    fast_link_s: float
    compute_s: float
    fast_link_steps: tuple[float, ...]
    compute_steps: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast_link_steps", _floats(self.fast_link_steps))
        object.__setattr__(self, "compute_steps", _floats(self.compute_steps))

    def to_json(self) -> dict[str, Any]:
        return {"fast_link_s": self.fast_link_s, "compute_s": self.compute_s,
                "fast_link_steps": list(self.fast_link_steps),
                "compute_steps": list(self.compute_steps)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "InRunCompute":
        f = lambda k: _field(d, k, "in-run compute")  # noqa: E731
        return cls(float(f("fast_link_s")), float(f("compute_s")), f("fast_link_steps"),
                   f("compute_steps"))


@dataclasses.dataclass(frozen=True)
class ProfiledCompute:
    """The profiling phase's compute, measured once before the rates."""

    comp_s: float          # slowest tower over the fast link: the link rates' comp
    compute_s: float       # the compute reference (no transfer): E's comp
    fast_link_s: float
    trace_op_sum_s: float  # the traced ops' sum

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProfiledCompute":
        f = lambda k: float(_field(d, k, "profiled compute"))  # noqa: E731
        return cls(f("comp_s"), f("compute_s"), f("fast_link_s"), f("trace_op_sum_s"))


@dataclasses.dataclass(frozen=True)
class RateRun:
    """Every schedule at one link rate."""

    rate_bits: float
    comp_s: float                   # the compute the rate was chosen by (comm/comp)
    comm_s: float                   # the step's parameter bytes over the bottleneck link
    comm_comp_ratio: float
    bytes_per_ps: tuple[float, ...]  # parameter bytes each PS serves a worker per step
    schedules: Mapping[str, ScheduleSummary]   # in the order they were named
    vs_default: Mapping[str, Comparison]       # empty without TensorFlow's default
    step_times: Mapping[str, tuple[float, ...]]  # schedule -> its step times, in order
    schedule_lengths: Mapping[str, int]        # order -> transfers it lists
    # the simulator's step seconds per model and order (None: older results)
    predicted_step_s: Mapping[str, Mapping[str, float]] | None = None
    compute_s: float | None = None  # the compute reference, E's comp (None: older results)
    in_run: InRunCompute | None = None  # calibration blocks (None: not run)
    # The simulator's inputs: the client hands them over with the run, the CLI writes
    # them beside the result (<result>.sim.json.gz), not into it.
    sim_inputs: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False,
                                                            repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes_per_ps", _floats(self.bytes_per_ps))
        object.__setattr__(self, "step_times",
                           {n: _floats(t) for n, t in self.step_times.items()})

    @property
    def rate(self) -> str:
        """The rate as the report names it, e.g. ``500mbit``."""
        return f"{self.rate_bits / 1e6:.0f}mbit"

    def to_json(self) -> dict[str, Any]:
        out = {"rate_bits": self.rate_bits, "rate": self.rate, "comp_s": self.comp_s,
               "comm_s": self.comm_s, "comm_comp_ratio": self.comm_comp_ratio,
               "bytes_per_ps": list(self.bytes_per_ps),
               "schedules": {n: s.to_json() for n, s in self.schedules.items()},
               "vs_default": {n: c.to_json() for n, c in self.vs_default.items()},
               "step_times": {n: list(t) for n, t in self.step_times.items()},
               "schedule_lengths": dict(self.schedule_lengths),
               "predicted_step_s": self.predicted_step_s}
        if self.compute_s is not None:
            out["compute_s"] = self.compute_s
        out["in_run"] = self.in_run.to_json() if self.in_run else None
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RateRun":
        f = lambda k: _field(d, k, "rate run")  # noqa: E731
        in_run = d.get("in_run")
        return cls(float(f("rate_bits")), float(f("comp_s")), float(f("comm_s")),
                   float(f("comm_comp_ratio")), f("bytes_per_ps"),
                   {n: ScheduleSummary.from_json(s) for n, s in f("schedules").items()},
                   {n: Comparison.from_json(c) for n, c in f("vs_default").items()},
                   f("step_times"), {n: int(k) for n, k in f("schedule_lengths").items()},
                   d.get("predicted_step_s"), _optional(d.get("compute_s"), float),
                   InRunCompute.from_json(in_run) if in_run else None,
                   d.get("sim_inputs"))


@dataclasses.dataclass(frozen=True)
class BenchConfigRecord:
    """The configuration a run was made with (bench/runner.py ``BenchConfig``, with the
    batch it resolved and its label). Settings added after the first results are None
    where a result does not record them."""

    label: str            # model/mode/W<workers>/P<ps>[/pinned]
    model: str
    mode: str
    workers: int
    ps: int
    batch: int            # per worker
    bandwidth: tuple[str, ...]
    schedules: tuple[str, ...]
    steps: int
    block_steps: int
    settle_steps: int
    warmup: int
    profile_steps: int
    skip_timeout: float
    window_bytes: int
    timeout_s: float
    loopback: bool
    backend: str | None = None
    pin_workers: bool | None = None
    check_rounds: int | None = None
    check_block_steps: int | None = None
    conserve_after_s: float | None = None
    calibrate: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", tuple(self.bandwidth))
        object.__setattr__(self, "schedules", tuple(self.schedules))

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["bandwidth"], out["schedules"] = list(self.bandwidth), list(self.schedules)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BenchConfigRecord":
        names = [f.name for f in dataclasses.fields(cls)]
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING]
        values = {k: _field(d, k, "bench config") for k in required}
        values.update({k: d[k] for k in names if k not in required and k in d})
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class MachineLoad:
    loadavg_1m: float
    loadavg_5m: float
    cpus: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MachineLoad":
        f = lambda k: _field(d, k, "machine load")  # noqa: E731
        return cls(float(f("loadavg_1m")), float(f("loadavg_5m")), int(f("cpus")))


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """One `tictac bench` run: every rate of one configuration. ``to_json`` /
    ``from_json`` are the result file's format; the code in between reads attributes."""

    config: BenchConfigRecord
    shaped: bool                    # a shaped network (False: the loopback fallback)
    machine_before: MachineLoad
    machine_after: MachineLoad
    wall_s: float
    param_bytes: int
    global_batch: int
    runs: tuple[RateRun, ...]       # one per rate, in the order measured
    network_reason: str = ""        # why the network is not shaped
    compute: ProfiledCompute | None = None  # None: older results
    incomplete: str = ""            # why some rates were not measured ("": all were)
    # The package's git commit ("": not a git checkout, or older results), whether its
    # checkout had uncommitted changes, and the command line that ran the benchmark.
    commit: str = ""
    dirty: bool = False
    command: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(self.runs))

    @property
    def schedules(self) -> Mapping[str, ScheduleSummary]:
        """The first rate's per-schedule summaries."""
        return self.runs[0].schedules if self.runs else {}

    def to_json(self) -> dict[str, Any]:
        network: dict[str, Any] = {"shaped": self.shaped}
        if self.network_reason or not self.shaped:
            network["reason"] = self.network_reason
        out = {"config": self.config.to_json(), "network": network,
               "machine": {"before": self.machine_before.to_json(),
                           "after": self.machine_after.to_json()},
               "wall_s": self.wall_s, "commit": self.commit, "dirty": self.dirty,
               "command": self.command, "param_bytes": self.param_bytes,
               "global_batch": self.global_batch,
               "compute": self.compute.to_json() if self.compute else None,
               "runs": [r.to_json() for r in self.runs]}
        if self.incomplete:
            out["incomplete"] = self.incomplete
        if self.runs:  # the first rate's per-schedule metrics, at the top level too
            out["schedules"] = out["runs"][0]["schedules"]
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BenchRun":
        f = lambda k: _field(d, k, "bench run")  # noqa: E731
        network, machine = f("network"), f("machine")
        compute = d.get("compute")
        return cls(BenchConfigRecord.from_json(f("config")),
                   bool(_field(network, "shaped", "network")),
                   MachineLoad.from_json(_field(machine, "before", "machine")),
                   MachineLoad.from_json(_field(machine, "after", "machine")),
                   float(f("wall_s")), int(f("param_bytes")), int(f("global_batch")),
                   tuple(RateRun.from_json(r) for r in f("runs")),
                   str(network.get("reason") or ""),
                   ProfiledCompute.from_json(compute) if compute else None,
                   str(d.get("incomplete") or ""), str(d.get("commit") or ""),
                   bool(d.get("dirty", False)), str(d.get("command") or ""))
