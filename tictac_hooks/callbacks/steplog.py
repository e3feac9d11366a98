"""Per-step records assembled from the parameter servers' transfer statistics.

Each PS reports, per (step_id, destination worker, loop iteration), the transfers it
handed back. A step of a worker is the union over PSes. Under Keras's
``steps_per_execution > 1`` one step id runs several training steps as the iterations
of a loop: each iteration is a step (what the call does once, outside the loop, counts
with its first iteration), and the loop's dead exit iteration is none. A step is *finalized* once a later step of the
same worker exists (its step time is the gap between their first transfers); finalized
steps are handed out once and then only their aggregates are kept, so memory stays
bounded over any number of steps.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Any, Callable, Iterable

from tictac_hooks.records import (CHECK, PHASE_NAMES, PROFILING, SCHEDULED, GateStep,
                                  WorkerStep, bytes_per_transfer)

_KEEP_STEP_TIMES = 100_000   # per (worker, phase), for medians
_KEEP_FINALIZED_IDS = 4_096  # per worker, to ignore re-reported old steps
_KEEP_PROFILED = 256         # unscheduled (PS, step, worker) records, for served sizes


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

    @property
    def algorithm(self) -> str | None:
        """The algorithm of the order the step ran in at its PSes (None: TensorFlow's)."""
        return next((r.algorithm for r in self.per_ps.values() if r.scheduled), None)

    def followed_order(self) -> bool:
        """Every PS sent its listed transfers to the PS in non-decreasing priority (the
        order they were released in; with the look-ahead window the PS may answer those
        in flight together in another order), with no skip and no violation."""
        for r in self.per_ps.values():
            if r.skips or r.violations:
                return False
            listed = [t for t in r.transfers if t.state == "listed" and t.priority >= 0]
            listed.sort(key=lambda t: t.release_seq)  # stable: hand-back order
            last = -1
            for t in listed:
                if t.priority < last:
                    return False
                last = t.priority
        return True


class StepLog:
    """Merges PS step records into per-worker steps (see module docstring)."""

    def __init__(self, destination_jobs: Iterable[str] = ("worker",)) -> None:
        self.destination_jobs = tuple(destination_jobs)
        # worker -> (step_id, iteration) -> the step's records so far
        self._pending: dict[str, dict[tuple[int, int], _Pending]] = \
            collections.defaultdict(dict)
        self._finalized_ids: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=_KEEP_FINALIZED_IDS))
        self._count: dict[str, int] = collections.defaultdict(int)
        self.served: dict[str, set[str]] = collections.defaultdict(set)  # while profiling
        self.best_link_rate: float | None = None                          # bytes/s
        # the latest unscheduled records by (PS, step, worker): what each transfer is
        # served with in TensorFlow's order (a record re-reported replaces itself)
        self._profiled: collections.OrderedDict[tuple, GateStep] = collections.OrderedDict()
        self.step_times: dict[tuple[str, int], collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=_KEEP_STEP_TIMES))
        self.order = collections.Counter()  # scheduled / followed / skips / violations
        # Steps counted but left out of the medians, per worker and reason.
        self.excluded: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        # Wall time the schedule was first installed: an unscheduled step that starts
        # after it ran in TensorFlow's order on purpose (a check block), not profiling.
        self.switched_at: float | None = None

    def is_destination(self, worker: str) -> bool:
        return any(f"/job:{job}/" in worker for job in self.destination_jobs)

    def add(self, records: Iterable[GateStep]) -> None:
        for rec in records:
            worker = rec.worker
            if not rec.order or not self.is_destination(worker) or rec.dead:
                continue  # e.g. the coordinator's own reads while workers train
            step_key = (rec.step_id, rec.iteration)
            if step_key in self._finalized_ids[worker]:
                continue
            step = self._pending[worker].setdefault(step_key, _Pending({}))
            step.per_ps[rec.ps if not rec.frame else f"{rec.ps} loop"] = rec
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
        return list(self._profiled.values())

    def transfer_bytes(self) -> dict[str, float]:
        """Transfer name -> the median bytes the PSes served it with in the latest
        unscheduled steps; each edge of a tensor sent over two edges under its own name
        (records.served_sizes)."""
        return bytes_per_transfer(self._profiled.values())

    def finalize(self, paused: Callable[[float, float], float],
                 efficiency: Callable[[_Pending, float | None], float | None],
                 everything: bool = False) -> list[WorkerStep]:
        """Finalizes every pending step that has a successor (all, if ``everything``).

        ``paused(start, end)`` gives the seconds of TicTac's own pauses inside a step
        interval (taken out of its step time; the step stays out of the medians);
        ``efficiency`` gives a step's measured E.
        """
        out = []
        for worker, pending in self._pending.items():
            steps = sorted(pending.items(), key=lambda kv: kv[1].start)
            ready = steps if everything else steps[:-1]
            for i, (step_id, step) in enumerate(ready):
                nxt = steps[i + 1][1].start if i + 1 < len(steps) else None
                step_time, pause = None, 0.0
                if nxt is not None:
                    pause = paused(step.start, nxt)
                    step_time = max(nxt - step.start - pause, 0.0)
                phase = self._phase(step)
                index = self._count[worker]
                self._count[worker] += 1
                out.append(WorkerStep(worker=worker, step=index, start=step.start,
                                      step_time=step_time, transfer_span=step.end - step.start,
                                      phase=phase, efficiency=None if pause else
                                      efficiency(step, step_time), paused_s=pause,
                                      order=step.algorithm))
                # Step 0 holds tracing and start-up: not a steady-state step.
                if index == 0:
                    self.excluded[worker]["first_step"] += 1
                elif step_time is None:
                    self.excluded[worker]["last_step"] += 1
                elif pause:
                    self.excluded[worker]["paused"] += 1
                else:
                    self.step_times[(worker, phase)].append(step_time)
                if phase == SCHEDULED:
                    self.order["scheduled_steps"] += 1
                    self.order["followed"] += step.followed_order()
                    self.order["skips"] += sum(r.skips for r in step.per_ps.values())
                    self.order["violations"] += sum(r.violations for r in step.per_ps.values())
                self._finalized_ids[worker].append(step_id)
                del pending[step_id]
        return out

    def _phase(self, step: _Pending) -> int:
        if step.scheduled:
            return SCHEDULED
        if self.switched_at is not None and step.start >= self.switched_at:
            return CHECK
        return PROFILING

    def summary(self) -> dict[str, Any]:
        """Per worker: its steps, and per phase the steps in the medians and their
        median step time; the steps left out, by reason (so that ``steps`` =
        the phases' ``*_steps`` + the ``excluded`` counts); order statistics."""
        workers: dict[str, Any] = {}
        for worker, count in sorted(self._count.items()):
            entry: dict[str, Any] = {"steps": count}
            for phase in (PROFILING, SCHEDULED, CHECK):
                label = PHASE_NAMES[phase]
                times = self.step_times.get((worker, phase))
                if times or phase != CHECK:
                    entry[f"{label}_steps"] = len(times or ())
                if times:
                    entry[f"{label}_median_step_time"] = statistics.median(times)
            entry["excluded"] = dict(self.excluded.get(worker, {}))
            workers[worker] = entry
        return {"workers": workers, "order": dict(self.order)}
