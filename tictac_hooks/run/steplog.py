"""Per-step records assembled from the parameter servers' transfer statistics.

Each PS reports, per (step_id, destination worker, loop iteration), the transfers it
handed back. A step of a worker is the union over PSes. Under Keras's
``steps_per_execution > 1`` one step id runs several training steps as the iterations
of a loop: each iteration is a step (what the call does once, outside the loop, counts
with its first iteration), and the loop's dead exit iteration is none. A step is
*finalized* once a later step of the same worker exists; finalized steps are handed out
once and then only their aggregates are kept, so memory stays bounded over any number
of steps.

Step times come from consecutive records only: a step's time is the interval to the
worker's next step when the PSes number the two consecutively (``worker_seq``). Where
records between them were lost (a gate's history bound), the interval is a gap: counted
per worker, never drawn as a step, and the steps after it keep their own numbers.

A worker that stops while the others go on can be marked lost (:meth:`StepLog.mark_lost`,
the controller decides); its last step, which ParameterServerStrategy runs again on
another worker, then counts as unfinished, not as a step. A lost worker whose new step
arrives is back: the mark is cleared and said (:meth:`StepLog.returned_workers`).

Memory is bounded whatever the number of steps and workers: per worker, the step times
of the latest _KEEP_STEP_TIMES steps of each phase (their count is kept whole), and
the record numbers of the latest _KEEP_RECEIVED records per PS.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import statistics
import threading
from typing import Any, Callable, Iterable

from tictac_hooks.records import (CHECK, LISTED, PHASE_NAMES, PROFILING, SCHEDULED, GateStep,
                                  WorkerStep, bytes_per_transfer)
from tictac_hooks.run.summary import ORDER_COUNTS

_KEEP_STEP_TIMES = 4_096     # per (worker, phase): the medians are the latest steps'
_KEEP_INTERVALS = 16         # per worker: its latest step-to-step intervals
_KEEP_FINALIZED_IDS = 4_096  # per worker, to ignore re-reported old steps
_KEEP_PROFILED = 256         # unscheduled (PS, step, worker) records, for served sizes
_KEEP_RECEIVED = 4_096       # per (PS, worker): worker_seq of the records read
_KEEP_PAUSES = 4_096         # TicTac's own pauses of the loop (a few per check block)


@dataclasses.dataclass
class _Pending:
    per_ps: dict[str, GateStep]

    @property
    def start(self) -> float:
        return min(r.start for r in self.per_ps.values())

    @property
    def end(self) -> float:
        return max(r.end for r in self.per_ps.values())

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.per_ps.values())

    @property
    def scheduled(self) -> bool:
        return any(r.scheduled for r in self.per_ps.values())

    def ordered_at(self, ordered: "set[str]") -> bool:
        """Whether every PS of ``ordered`` (those that carry the order) that recorded
        this step ran it in the order: not one restarted and not yet given it."""
        return all(r.scheduled for r in self.per_ps.values() if r.ps in ordered)

    @property
    def algorithm(self) -> str | None:
        """The algorithm of the order the step ran in at its PSes (None: TensorFlow's)."""
        return next((r.algorithm for r in self.per_ps.values() if r.scheduled), None)

    def missing_before(self, later: "_Pending",
                       received: Callable[[str, int, int], int]) -> int | None:
        """Records lost between this step and ``later`` (same worker): at each PS that
        recorded both, the numbers between theirs that were not read
        (``received(ps, lo, hi)`` counts those read: records that are no step, such as
        a loop's exit iteration, or a call's record outside its loop); the most over
        the PSes; None when no PS recorded both (unknown). Records without numbers: 0."""
        missing = None
        numbered = False
        for key, rec in self.per_ps.items():
            other = later.per_ps.get(key)
            if not rec.worker_seq or other is None or not other.worker_seq:
                numbered = numbered or bool(rec.worker_seq)
                continue
            lost = other.worker_seq - rec.worker_seq - 1 - received(
                rec.ps, rec.worker_seq, other.worker_seq)
            missing = max(missing or 0, lost, 0)
        if missing is None and not numbered and not any(
                r.worker_seq for r in later.per_ps.values()):
            return 0  # a gate that does not number its records: as before
        return missing

    def followed_order(self) -> bool:
        """Every PS sent its listed transfers to the PS in non-decreasing priority (the
        order they were released in; with the look-ahead window the PS may answer those
        in flight together in another order), with no skip, no violation and nothing
        let go early."""
        for r in self.per_ps.values():
            if r.skips or r.violations or any(t.early for t in r.transfers):
                return False
            listed = [t for t in r.transfers if t.state == LISTED and t.priority >= 0]
            listed.sort(key=lambda t: t.release_seq)  # stable: hand-back order
            last = -1
            for t in listed:
                if t.priority < last:
                    return False
                last = t.priority
        return True


class _Numbers:
    """The record numbers read at one PS for one worker, as disjoint runs
    [first, last] of consecutive numbers: a PS numbers a worker's records 1, 2, 3, ...,
    so a read adds to the newest run and memory is the number of gaps, not of records
    (256 workers x 16 PS stay under a few MB). The latest _KEEP_RECEIVED numbers are
    kept (the lowest let go first); how many lie between two numbers costs the runs
    between them."""

    def __init__(self) -> None:
        self._starts: list[int] = []   # run i is [_starts[i], _ends[i]], sorted, disjoint
        self._ends: list[int] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, n: int) -> None:
        i = bisect.bisect_right(self._starts, n) - 1   # the run starting at or before n
        if i >= 0 and n <= self._ends[i]:
            return                                       # read before
        joins_left = i >= 0 and self._ends[i] == n - 1
        joins_right = i + 1 < len(self._starts) and self._starts[i + 1] == n + 1
        if joins_left and joins_right:                   # n closes a gap of one
            self._ends[i] = self._ends[i + 1]
            del self._starts[i + 1], self._ends[i + 1]
        elif joins_left:
            self._ends[i] = n
        elif joins_right:
            self._starts[i + 1] = n
        else:
            self._starts.insert(i + 1, n)
            self._ends.insert(i + 1, n)
        self._count += 1
        while self._count > _KEEP_RECEIVED:             # let the lowest go
            drop = min(self._count - _KEEP_RECEIVED, self._ends[0] - self._starts[0] + 1)
            self._starts[0] += drop
            self._count -= drop
            if self._starts[0] > self._ends[0]:
                del self._starts[0], self._ends[0]

    def count_between(self, lo: int, hi: int) -> int:
        """How many numbers read lie strictly between ``lo`` and ``hi``."""
        total = 0
        i = max(0, bisect.bisect_right(self._starts, lo) - 1)
        while i < len(self._starts) and self._starts[i] < hi:
            first, last = max(self._starts[i], lo + 1), min(self._ends[i], hi - 1)
            total += max(0, last - first + 1)
            i += 1
        return total


class Pauses:
    """TicTac's own pauses of the training loop ([start, end] wall times), the latest
    _KEEP_PAUSES by start: how much of a step's interval they cover costs the pauses
    that can overlap it (found by bisection), not the run's history."""

    def __init__(self) -> None:
        self._spans: list[tuple[float, float]] = []   # sorted by start
        self._longest = 0.0

    def __len__(self) -> int:
        return len(self._spans)

    def add(self, start: float, end: float) -> None:
        bisect.insort(self._spans, (start, end))
        self._longest = max(self._longest, end - start)
        if len(self._spans) > _KEEP_PAUSES:
            del self._spans[0]

    def within(self, start: float, end: float) -> float:
        """Seconds of the pauses inside [start, end] (overlapping pauses each count)."""
        lo = bisect.bisect_left(self._spans, (start - self._longest, float("-inf")))
        hi = bisect.bisect_right(self._spans, (end, float("inf")))
        return sum(max(0.0, min(end, p1) - max(start, p0)) for p0, p1 in self._spans[lo:hi])


class StepLog:
    """Merges PS step records into per-worker steps (see module docstring)."""

    def __init__(self, destination_jobs: Iterable[str] = ("worker",)) -> None:
        self.destination_jobs = tuple(destination_jobs)
        # Per worker, its steps by (step_id, loop iteration).
        self._pending: dict[str, dict[tuple[int, int], _Pending]] = \
            collections.defaultdict(dict)
        self._finalized_ids: dict[str, collections.OrderedDict] = collections.defaultdict(
            collections.OrderedDict)
        self._count: dict[str, int] = collections.defaultdict(int)   # steps finalized
        self._number: dict[str, int] = collections.defaultdict(int)  # the next step number
        # Per worker: steps lost in gaps, intervals left out as gaps, unfinished steps.
        self.gaps: collections.Counter[str] = collections.Counter()
        self.unknown_gaps: collections.Counter[str] = collections.Counter()
        self.unfinished: collections.Counter[str] = collections.Counter()
        # worker -> when its last step started, when it was found lost, why.
        self.lost: dict[str, dict[str, Any]] = {}
        self._last_start: dict[str, float] = {}
        self._latest_start = float("-inf")  # of any worker's step
        # per worker: its latest intervals from one step's start to the next's
        self._intervals: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=_KEEP_INTERVALS))
        self.came_back: list[tuple[str, dict[str, Any]]] = []  # lost workers back
        self.returns: collections.Counter[str] = collections.Counter()
        # Per (PS, worker): the numbers (worker_seq) of the records read, steps or not;
        # a number between two steps' that is not among them is a record lost.
        self._received: dict[tuple[str, str], _Numbers] = collections.defaultdict(_Numbers)
        self.served: dict[str, set[str]] = collections.defaultdict(set)  # while profiling
        self.best_link_rate: float | None = None                          # bytes/s
        # the latest unscheduled records by (PS, step, worker): what each transfer is
        # served with in TensorFlow's order (a record re-reported replaces itself)
        self._profiled: collections.OrderedDict[tuple, GateStep] = collections.OrderedDict()
        # add() (the reading thread) and the switch's reads of the profiled steps and
        # served names (another thread under fit) hold it.
        self._lock = threading.RLock()
        self.step_times: dict[tuple[str, int], collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=_KEEP_STEP_TIMES))
        self.step_counts: collections.Counter[tuple[str, int]] = collections.Counter()
        # Every count present, zero included: a run whose check kept TensorFlow's order
        # says it scheduled 0 steps rather than leaving the count out.
        self.order = collections.Counter(dict.fromkeys(ORDER_COUNTS, 0))
        # Steps counted but left out of the medians, per worker and reason.
        self.excluded: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        # Wall time the schedule was first installed: an unscheduled step that starts
        # after it ran in TensorFlow's order on purpose (a check block), not profiling.
        self.switched_at: float | None = None
        # The PSes the installed order has transfers on (the controller sets them at
        # each install): a step counts as scheduled only where each of them ran it so.
        self.ordered_ps: set[str] = set()

    def is_destination(self, worker: str) -> bool:
        return any(f"/job:{job}/" in worker for job in self.destination_jobs)

    def add(self, records: Iterable[GateStep]) -> None:
        with self._lock:
            self._add(records)

    def _add(self, records: Iterable[GateStep]) -> None:
        for rec in records:
            worker = rec.worker
            if not self.is_destination(worker):
                continue  # e.g. the coordinator's own reads while workers train
            if not rec.order or rec.dead:
                # No training step (nothing handed back; a loop's exit iteration): its
                # number is no gap.
                if rec.worker_seq:
                    self._received[(rec.ps, worker)].add(rec.worker_seq)
                continue
            key = (rec.step_id, rec.iteration)
            if key in self._finalized_ids[worker]:
                continue
            step = self._pending[worker].get(key)
            if step is None:
                if worker in self.lost and rec.start > (
                        self.lost[worker]["last_step_start"] or float("-inf")):
                    self._back(worker)
                step = self._pending[worker][key] = _Pending({})
                last = self._last_start.get(worker)
                if last is None or rec.start > last:
                    if last is not None:
                        self._intervals[worker].append(rec.start - last)
                    self._last_start[worker] = rec.start
                self._latest_start = max(self._latest_start, rec.start)
            # A call's records outside its loop (frame 0) join its first iteration's
            # step beside the loop's record from the same PS.
            step.per_ps[rec.ps if not rec.frame else f"{rec.ps} loop"] = rec
            if rec.worker_seq:
                self._received[(rec.ps, worker)].add(rec.worker_seq)
            if not rec.scheduled:
                self.served[worker].update(rec.order)
                key = (rec.ps, rec.step_id, rec.frame, rec.iteration, worker)
                self._profiled.pop(key, None)
                self._profiled[key] = rec
                while len(self._profiled) > _KEEP_PROFILED:
                    self._profiled.popitem(last=False)
                if rec.end > rec.start and rec.bytes > 0:
                    rate = rec.bytes / (rec.end - rec.start)
                    self.best_link_rate = max(self.best_link_rate or 0.0, rate)

    def profiled_records(self) -> list[GateStep]:
        """The latest records of steps in TensorFlow's order (up to a bound), per PS,
        step and worker: what the PSes serve unordered."""
        with self._lock:
            return list(self._profiled.values())

    def served_copy(self) -> dict[str, set[str]]:
        """worker -> the names the PSes served it while profiling (a copy: the reading
        thread adds to them)."""
        with self._lock:
            return {w: set(names) for w, names in self.served.items()}

    def transfer_bytes(self) -> dict[str, float]:
        """Transfer name -> the median bytes the PSes served it with in the latest
        unscheduled steps; each edge of a tensor sent over two edges under its own name
        (records.served_sizes)."""
        return bytes_per_transfer(self.profiled_records())

    def finalize(self, paused: Callable[[float, float], float],
                 efficiency: Callable[[_Pending, float | None], float | None],
                 everything: bool = False,
                 beside: Callable[[float, float], bool] | None = None) -> list[WorkerStep]:
        """Finalizes every pending step that has a successor (all, if ``everything``).

        ``paused(start, end)`` gives the seconds of TicTac's own pauses inside a step
        interval (taken out of its step time; the step stays out of the medians);
        ``beside(start, end)`` whether TicTac's own work ran beside the step without
        holding it (a switch in the background, whose compute profile shares the
        machine): such a step keeps its step time (TensorBoard) but not the medians;
        ``efficiency`` gives a step's measured E.
        """
        out = []
        for worker, pending in self._pending.items():
            steps = sorted(pending.items(), key=lambda kv: (kv[1].start, kv[0][1]))
            ready = steps if everything else steps[:-1]
            for i, (key, step) in enumerate(ready):
                later = steps[i + 1][1] if i + 1 < len(steps) else None
                self._finalized_ids[worker][key] = None
                while len(self._finalized_ids[worker]) > _KEEP_FINALIZED_IDS:
                    self._finalized_ids[worker].popitem(last=False)
                del pending[key]
                if later is None and worker in self.lost:
                    # Its last step: ParameterServerStrategy runs that closure again on
                    # another worker, where it counts.
                    self.unfinished[worker] += 1
                    continue
                missing = 0 if later is None else step.missing_before(
                    later, lambda ps, lo, hi: self._received_between(ps, worker, lo, hi))
                step_time, pause, switching = None, 0.0, False
                if later is not None and missing == 0:
                    pause = paused(step.start, later.start)
                    # Beside TicTac's own work (the compute profile shares the machine)
                    # a step keeps its time, a point in TensorBoard, but no median.
                    switching = beside is not None and beside(step.start, later.start)
                    step_time = max(later.start - step.start - pause, 0.0)
                phase = self._phase(step)
                partly = phase == SCHEDULED and not step.ordered_at(self.ordered_ps)
                index = self._number[worker]
                self._number[worker] += 1 + (missing or 0)  # a gap keeps its numbers
                self._count[worker] += 1
                out.append(WorkerStep(worker=worker, step=index, start=step.start,
                                      step_time=step_time, transfer_span=step.end - step.start,
                                      phase=phase, efficiency=None if pause or switching
                                      or step_time is None else efficiency(step, step_time),
                                      paused_s=pause, order=step.algorithm))
                if missing:
                    self.gaps[worker] += missing
                elif missing is None:
                    self.unknown_gaps[worker] += 1
                # Step 0 holds tracing and start-up: not a steady-state step.
                if index == 0:
                    self.excluded[worker]["first_step"] += 1
                elif later is None:
                    self.excluded[worker]["last_step"] += 1
                elif switching:
                    self.excluded[worker]["switching"] += 1
                elif step_time is None:
                    self.excluded[worker]["before_gap"] += 1
                elif pause:
                    self.excluded[worker]["paused"] += 1
                elif partly:
                    self.excluded[worker]["partly_ordered"] += 1
                else:
                    self.step_times[(worker, phase)].append(step_time)
                    self.step_counts[(worker, phase)] += 1
                if partly:  # a PS that carries the order ran it in TensorFlow's
                    self.order["partly_ordered"] += 1
                elif phase == SCHEDULED:
                    self.order["scheduled_steps"] += 1
                    self.order["followed"] += step.followed_order()
                    self.order["skips"] += sum(r.skips for r in step.per_ps.values())
                    self.order["violations"] += sum(r.violations for r in step.per_ps.values())
                # A PS that let transfers go out of their order (records.EARLY_REASONS):
                # none in a healthy run, whatever the phase.
                self.order["early_released"] += sum(
                    1 for r in step.per_ps.values() for t in r.transfers if t.early)
        return out

    def _received_between(self, ps: str, worker: str, lo: int, hi: int) -> int:
        return self._received[(ps, worker)].count_between(lo, hi)

    def silent(self, worker: str) -> tuple[float, float] | None:
        """When ``worker``'s last step started, and for how many of its own steps it has
        been silent while the others went on: the time from that start to the latest
        step any worker started, over its own typical step interval (the median of its
        latest; the workers' where it has none). None: no step of it seen."""
        last = self._last_start.get(worker)
        if last is None:
            return None
        own = self._intervals.get(worker)
        typical = statistics.median(own) if own else self.typical_interval()
        if not typical:
            return last, 0.0
        return last, max(0.0, self._latest_start - last) / typical

    def typical_interval(self) -> float | None:
        """The median over the workers of their step intervals (None: none yet)."""
        medians = [statistics.median(d) for d in self._intervals.values() if d]
        return statistics.median(medians) if medians else None

    def _back(self, worker: str) -> None:
        """A lost worker's new step arrived: it is back. Its steps from before it was
        lost are over: the last one, which ParameterServerStrategy ran again on another
        worker, counts as unfinished; none of them is served or timed any more."""
        info = self.lost.pop(worker)
        before = info["last_step_start"]
        for key, step in list(self._pending[worker].items()):
            if before is None or step.start <= before:
                del self._pending[worker][key]
                self._finalized_ids[worker][key] = None
                self.unfinished[worker] += 1
        self._intervals[worker].clear()  # the downtime is no step interval
        self._last_start.pop(worker, None)
        self.returns[worker] += 1
        self.came_back.append((worker, info))

    def returned_workers(self) -> list[tuple[str, dict[str, Any]]]:
        """The lost workers that came back since the last call, with their lost marks."""
        back, self.came_back = self.came_back, []
        return back

    def workers(self) -> list[str]:
        """Every worker with a step seen."""
        return sorted(self._last_start)

    def restarted(self, ps: str) -> None:
        """The PS at ``ps`` was restarted: its gate numbers its records from 1 again."""
        for key in [k for k in self._received if k[0] == ps]:
            del self._received[key]

    def mark_lost(self, worker: str, detected: float, reason: str) -> None:
        """``worker`` stopped (the controller found it unreachable, or silent while the
        others went on): its last step will count as unfinished."""
        self.lost[worker] = {"last_step_start": self._last_start.get(worker),
                             "detected": detected, "reason": reason}

    def _phase(self, step: _Pending) -> int:
        if step.scheduled:
            return SCHEDULED
        if self.switched_at is not None and step.start >= self.switched_at:
            return CHECK
        return PROFILING

    def totals(self) -> tuple[int, int, int]:
        """Over every worker: steps recorded, steps missing in gaps, and lost workers'
        unfinished last steps (``summary``'s per-worker counts, summed)."""
        workers = set(self._count) | set(self.lost) | set(self.unfinished)
        return (sum(self._count.get(w, 0) for w in workers),
                sum(self.gaps.get(w, 0) for w in workers),
                sum(self.unfinished.get(w, 0) for w in workers))

    def mark_switched(self, at: float) -> None:
        """The schedule was first installed at ``at`` (wall time): unscheduled steps
        that start later ran TensorFlow's order on purpose (check blocks)."""
        self.switched_at = at

    def set_ordered_ps(self, ps: "set[str] | frozenset[str]") -> None:
        """The PSes that carry the installed order (none: TensorFlow's everywhere)."""
        with self._lock:
            self.ordered_ps = set(ps)

    def summary(self) -> dict[str, Any]:
        """Per worker: its steps, and per phase the steps in the medians and their
        median step time; the steps left out, by reason (so that ``steps`` =
        the phases' ``*_steps`` + the ``excluded`` counts); ``missing``, steps whose
        records were lost (gaps, not in ``steps``); where the worker was lost, when and
        its ``unfinished`` step (not in ``steps``); order statistics."""
        workers: dict[str, Any] = {}
        for worker in sorted(set(self._count) | set(self.lost) | set(self.unfinished)):
            entry: dict[str, Any] = {"steps": self._count.get(worker, 0),
                                     "missing": self.gaps.get(worker, 0)}
            if self.unknown_gaps.get(worker):
                entry["unknown_gaps"] = self.unknown_gaps[worker]
            if worker in self.lost:
                entry["lost"] = dict(self.lost[worker])
            if worker in self.lost or self.unfinished.get(worker):
                entry["unfinished"] = self.unfinished.get(worker, 0)
            if self.returns.get(worker):
                entry["came_back"] = self.returns[worker]
            for phase in (PROFILING, SCHEDULED, CHECK):
                label = PHASE_NAMES[phase]
                times = self.step_times.get((worker, phase))
                if times or phase != CHECK:
                    entry[f"{label}_steps"] = self.step_counts.get((worker, phase), 0)
                if times:
                    entry[f"{label}_median_step_time"] = statistics.median(times)
            entry["excluded"] = dict(self.excluded.get(worker, {}))
            workers[worker] = entry
        return {"workers": workers, "order": dict(self.order)}
