"""The Python gate's parts (:mod:`tictac_hooks.enforce.gate` holds the gate): its bounds
and defaults, what :meth:`Gate.install` returns, an installed schedule as one destination
enforces it, a :class:`Ticket` per RecvTensor, and a channel: the counter and records of
one (step, destination, loop iteration)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any

from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.records import (LATE, LISTED, PASS, UNEXPECTED, GateStep, SkipRecord,
                                  TransferRecord)

# Ticket.state values: records.STATES (PASS, LISTED, LATE, UNEXPECTED, DUPLICATE).

DEFAULT_WINDOW_BYTES = 1 << 20  # also tictac_hooks.flags.DEFAULTS["window_bytes"]

# The skip bound, defined once: the default of --tictac_skip_timeout (TicTac, TicTacLoop,
# TicTacHook), Gate, TicTacServer and `tictac ps --skip-timeout`; the native gate is always
# configured with it explicitly. It bounds how long the counter of a (step, destination)
# may stand still while a later transfer waits. Healthy stalls are short on the native
# backend (a step's requests arrive together, responses are ready in milliseconds), but
# on a loaded PS, or behind the proxy on a slow link (it sees a hand-back only once the
# response before it has drained), they reach tenths of a second and more: 0.5 s could
# skip a healthy transfer there, and every end-to-end run so far (0 skips) used 2 s. The
# bound is also what a scheduled transfer that does not come costs per step until it is
# presumed absent (after ``presume_absent_after`` steps), so it must stay small next to a
# step time: 2 s, never forever.
DEFAULT_SKIP_AFTER_S = 2.0

# The bounds of a step's life, the same in gate.h. A channel with nothing held or in
# flight is finished once quiet for DEFAULT_FINISH_AFTER_S: a worker's requests for one
# step come together at its start, so a second of quiet means the step is over at this
# PS, and its record is readable a second later. DEFAULT_STALE_AFTER_S finishes one
# whatever it holds (a response the PS never produced). The history and the live-step
# bound are sized with the workers (`tictac ps --workers`, default DEFAULT_WORKERS):
# RECORDS_PER_WORKER records per worker between two reads, LIVE_STEPS_PER_WORKER live
# steps per worker before the oldest is evicted.
DEFAULT_FINISH_AFTER_S = 1.0
DEFAULT_STALE_AFTER_S = 60.0
DEFAULT_WORKERS = 64
RECORDS_PER_WORKER = 64
LIVE_STEPS_PER_WORKER = 256


@dataclasses.dataclass(frozen=True)
class InstallResult:
    """What :meth:`Gate.install` did.

    Attributes:
      version: the new schedule version (steps bind to it at their first transfer).
      transfers: how many transfers the schedule names.
      expected: how many of them this PS will enforce (those it has served so far, or
        all of them when it has served none yet).
      unmatched: scheduled names this PS has not served (empty if it served none yet).
      served: how many distinct transfer names this PS has served so far.
    """

    version: int
    transfers: int
    expected: int
    unmatched: tuple[str, ...]
    served: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"unmatched": list(self.unmatched)}


class _Installed:
    """One installed schedule, restricted to the transfers this PS serves."""

    __slots__ = ("version", "algorithm", "priority", "names_by_priority", "size", "listed",
                 "schedule", "expected")

    def __init__(self, version: int, schedule: Schedule, expected: set[str]) -> None:
        self.version = version
        self.algorithm = schedule.algorithm
        self.schedule = schedule
        self.expected = frozenset(expected)
        names = [n for n in schedule.order if n in expected]
        # Local priority: how many expected transfers have a strictly smaller priority
        # (ties stay ties), so the global [0, n) numbers work on a PS serving a subset.
        self.priority: dict[str, int] = {}
        below = 0
        for i, name in enumerate(names):
            if i and schedule.priority[name] != schedule.priority[names[i - 1]]:
                below = i
            self.priority[name] = below
        self.names_by_priority = tuple(names)
        self.size = len(names)
        self.listed = frozenset(schedule.order)

    def for_destination(self, served: set[str]) -> "_Installed":
        """The view one destination enforces: only what this PS has served *to it*.

        The counter is per (step, destination), so a destination must not wait for
        transfers that only other destinations receive (in-graph replication: each
        tower reads through its own ops; a schedule may cover several workers)."""
        expected = self.expected & served
        if not expected or expected == self.expected:
            # Served none of the listed transfers yet (e.g. a between-graph worker that
            # has only polled for initialization): it enforces the whole schedule.
            return self
        return _Installed(self.version, self.schedule, set(expected))


class Ticket:
    """One RecvTensor going through the gate."""

    __slots__ = ("step_id", "dest", "name", "state", "priority", "seq", "future",
                 "t_arrive", "t_release", "t_handback", "nbytes", "error", "channel",
                 "charge", "rseq", "tensor", "dead", "early")

    def __init__(self, step_id: int, dest: str, name: str, t_arrive: float) -> None:
        self.step_id = step_id
        self.dest = dest
        self.name = name
        self.state = PASS
        self.priority = -1
        self.seq = 0
        self.future: asyncio.Future | None = None
        self.t_arrive = t_arrive
        self.t_release = 0.0
        self.t_handback = 0.0
        self.nbytes = 0
        self.error = ""
        self.channel: _Channel | None = None
        self.charge = 0  # bytes it counts against the window while in flight
        self.rseq = -1   # release order among listed transfers (gate-wide sequence)
        self.tensor = ""  # the key's full tensor name, where it is not ``name``
        self.dead = False  # a dead tensor (a loop's exit iteration)
        self.early = ""    # why it went out of its order (records.EARLY_REASONS)

    def __lt__(self, other: "Ticket") -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


class _Channel:
    """The counter and records of one (step_id, destination device, loop iteration)."""

    __slots__ = ("step_id", "dest", "installed", "counter", "waiters", "done", "cursor",
                 "arrived", "handed", "skipped", "timer", "t_first", "finished",
                 "released", "rcursor", "inflight", "tensors", "frame", "iteration",
                 "key", "t_last", "live", "served")

    def __init__(self, step_id: int, dest: str, installed: _Installed | None,
                 frame: int = 0, iteration: int = 0, key: Any = None) -> None:
        self.step_id = step_id
        self.key = key                     # the gate's key of its step
        self.t_last = 0.0                  # its last arrival or hand-back (gate clock)
        self.live: set[Ticket] = set()     # arrived, not yet handed back or abandoned
        self.served: set[str] = set()      # names it served (the gate's once finished)
        self.dest = dest
        self.frame = frame
        self.iteration = iteration
        self.installed = installed
        self.counter = 0
        self.waiters: list[Ticket] = []
        self.done: set[str] = set()        # expected names handed back or skipped
        self.cursor = 0                    # into installed.names_by_priority
        self.arrived: set[str] = set()
        self.handed: list[Ticket] = []     # in hand-back order
        self.skipped: list[tuple[str, str, float]] = []  # (name, reason, time)
        self.timer: asyncio.TimerHandle | None = None
        self.t_first = 0.0
        self.finished = False
        self.released: set[str] = set()    # listed names forwarded to the PS
        self.rcursor = 0                   # into names_by_priority: first not gone
        self.inflight = 0                  # window bytes released, not handed back
        self.tensors: dict[str, str] = {}  # sending node -> first full tensor name seen

    def gone_prefix(self) -> int:
        """How many transfers, in priority order, have gone (released or skipped)."""
        names = self.installed.names_by_priority if self.installed else ()
        while self.rcursor < len(names) and (names[self.rcursor] in self.released
                                             or names[self.rcursor] in self.done):
            self.rcursor += 1
        return self.rcursor

    def next_missing(self) -> str | None:
        """The expected transfer with the smallest priority not yet handed back/skipped."""
        names = self.installed.names_by_priority if self.installed else ()
        while self.cursor < len(names) and names[self.cursor] in self.done:
            self.cursor += 1
        return names[self.cursor] if self.cursor < len(names) else None

    def complete(self) -> bool:
        """Every expected transfer handed back or skipped, nothing held, in flight or
        let go out of its order (GateStep.complete; gate_internal.h's Channel::Complete)."""
        if self.waiters or self.live or any(t.early for t in self.handed):
            return False
        return self.installed is None or len(self.done) >= self.installed.size

    def record(self, seq: int = 0, worker_seq: int = 0) -> GateStep:
        handed = self.handed
        # a name handed back twice (a tensor over two edges, recorded under its node):
        # each copy's record says its edge (as gate_records.cc's Channel::Record)
        named = collections.Counter(t.name for t in handed)
        listed = self.installed.priority if self.installed else {}
        return GateStep(
            step_id=self.step_id, worker=self.dest,
            schedule_version=self.installed.version if self.installed else None,
            algorithm=self.installed.algorithm if self.installed else None,
            complete=self.complete(), order=tuple(t.name for t in handed),
            # This gate holds the request: the response is ready when its first
            # HEADERS frame comes back, which is also when it is handed back.
            transfers=tuple(TransferRecord(t.name, t.state, t.priority, t.nbytes,
                                           t.t_arrive, t.t_release, t.rseq, t.t_handback,
                                           t.error, t.tensor if named[t.name] > 1 else "",
                                           t.dead, ready=t.t_handback, early=t.early)
                            for t in handed),
            bytes=sum(t.nbytes for t in handed),
            start=min((t.t_arrive for t in handed), default=self.t_first),
            end=max((t.t_handback for t in handed), default=self.t_first),
            skipped=tuple(SkipRecord(n, r, tm) for n, r, tm in self.skipped),
            skips=len(self.skipped),
            violations=sum(1 for t in handed if t.state in (LATE, UNEXPECTED)),
            reordered=_reordered(handed),
            unlisted=tuple(t.name for t in handed
                           if t.state == PASS and t.name not in listed),
            iteration=self.iteration, frame=self.frame, seq=seq, worker_seq=worker_seq)


def _reordered(handed: list[Ticket]) -> int:
    """Listed transfers handed back after one with a larger priority (look-ahead window)."""
    n, highest = 0, -1
    for t in handed:
        if t.state == LISTED:
            if t.priority < highest:
                n += 1
            highest = max(highest, t.priority)
    return n
