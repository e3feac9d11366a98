"""What a gate records: per (step, worker) a :class:`GateStep` with a
:class:`TransferRecord` per RecvTensor and a :class:`SkipRecord` per skip, and what its
``stats`` answers, :class:`GateStats`. ``to_json`` / ``from_json`` are the wire format
on every backend; the native gate (gate_records.cc) writes the same fields
(tests/test_records.py)."""

from __future__ import annotations

import dataclasses
import re
import statistics
from typing import Any, Iterable, Mapping

from tictac_hooks.records._base import RecordError, _field

# TensorFlow's names for what a lowered while loop's condition function takes (e.g.
# ``Func/while/cond/_0/input/_57``): sent in every iteration, the dead exit one too.
_LOOP_CONDITION = re.compile(r"(^|/)cond/_\d+/")


# A transfer's state at a gate (TransferRecord.state; gate_records.cc's StateName writes the
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

# Why a gate let a transfer go out of its order (TransferRecord.early): its channel was
# finished while it was held or in flight. A healthy cluster has none.
STALE = "stale"        # its channel was quiet for the stale bound with it unserved
EVICTED = "evicted"    # more steps were live than the gate's memory bound
SHUTDOWN = "shutdown"  # the gate closed
SUPERSEDED = "superseded"  # its worker began another step: it left this one (restarted)
EARLY_REASONS = (STALE, EVICTED, SHUTDOWN, SUPERSEDED)


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
    # Why the gate let it go out of its order (EARLY_REASONS; "": it did not).
    early: str = ""

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
        if self.early:
            out["early"] = self.early
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TransferRecord":
        f = lambda k: _field(d, k, "transfer")  # noqa: E731
        return cls(f("name"), f("state"), int(f("priority")), int(f("bytes")),
                   float(f("arrive")), float(f("release")), int(f("release_seq")),
                   float(f("handback")), str(d.get("error", "")), str(d.get("tensor", "")),
                   bool(d.get("dead", False)), float(d.get("ready", 0.0)),
                   str(d.get("early", "")))


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
    complete: bool                 # finished with nothing let go early, every listed
                                   # transfer handed back or skipped
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
    # The channel's turn at a paced native gate (gate.h): how many channels its worker
    # opened there before it, levelled when the worker came back from a pause; workers
    # served together share one. -1: a gate that keeps no turns (the Python gate).
    turn: int = -1

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
        if self.turn >= 0:
            out["turn"] = self.turn
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
                   int(d.get("seq", 0)), int(d.get("worker_seq", 0)),
                   int(d.get("turn", -1)))


@dataclasses.dataclass(frozen=True)
class GateStats:
    """What one gate's ``stats`` answers, on every backend: its settings, its counters,
    and step records (every one held; with ``since``, a cursor's read: the records
    finished after record number ``since``). The wire format is :meth:`to_json`; a
    client reads it with :meth:`from_json` (a missing field is a :class:`RecordError`
    naming it). gate_records.cc's ``SummaryLocked`` writes the same fields
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
    # The bounds of a step's life (enforce/gate.py, gate.h): the records held at most,
    # and how long a channel is quiet before it finishes (None: an older gate).
    history_limit: int | None = None
    finish_after_s: float | None = None
    since: int | None = None       # the read's cursor (None: every record held)
    last_seq: int = 0              # the newest finished record's number (next since)
    dropped: int = 0               # records after ``since`` the history bound let go
    device: str = ""               # native: the PS device its control ops run on
    upstream: str = ""             # proxy: the PS it forwards to
    # The gate's own identity, new in every process that runs one: a PS restarted at
    # the same address answers with another (its order, counters and records are gone).
    instance: str = ""

    def to_json(self, steps: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ps": self.ps, "backend": self.backend,
            "schedule_version": self.schedule_version, "algorithm": self.algorithm,
            "expected": self.expected, "window_bytes": self.window_bytes,
            "active_steps": self.active_steps, "history": self.history,
            "served_names": self.served_names, "totals": dict(self.totals)}
        for key in ("pace_rate", "align", "conserve_after_s", "skip_after_s",
                    "history_limit", "finish_after_s", "since"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.since is not None:
            out["last_seq"], out["dropped"] = self.last_seq, self.dropped
        for key in ("device", "upstream", "instance"):
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
                   skip_after_s=opt("skip_after_s", float),
                   history_limit=opt("history_limit", int),
                   finish_after_s=opt("finish_after_s", float), since=opt("since", int),
                   last_seq=int(d.get("last_seq", 0)), dropped=int(d.get("dropped", 0)),
                   device=str(d.get("device") or ""), upstream=str(d.get("upstream") or ""),
                   instance=str(d.get("instance") or ""))


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
