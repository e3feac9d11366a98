"""The order check: TicTac's orders against TensorFlow's own, in interleaved blocks.

After the switch the training loop runs ``rounds`` rounds of blocks of ``block_steps``
steps *per worker* each: under ParameterServerStrategy the loop dispatches a block of
``block_steps x workers`` steps, which the coordinator spreads over the workers, so that
every worker gives its pairs however many workers there are (at 64 workers a block of
20 dispatched steps would give most workers no step at all). A round holds, for each candidate order (TIC, and TAC where
compute times were measured), a block with that order installed (T) followed by a block
with it cleared (D, TensorFlow's default order). Interleaving keeps slow drift of the
machine (other load, thermal state, page cache) out of the comparison.

The PS labels every step with the order it really ran in (a step is bound to one
schedule version, and so one algorithm, at its first transfer), so the blocks need not
line up with the dispatch. Per worker, each maximal run of steps in one order gives one
median step time; the first step of a run straddles the change and is dropped, and the
last, which holds the next block's install (a pause), has no step time. Each D
run is paired with the T run just before it, and ``median(D) / median(T)`` is 1 + that
candidate's throughput gain in that pair.

Decision rule (stated, and the same everywhere): the candidate with the largest median
paired ratio, over all its pairs of all workers, stays installed when that median is at
least KEEP_ABOVE, 1.05 (in the typical pair it is 5 % faster than the default);
otherwise the schedule is cleared and TensorFlow's order is kept. The margin is chosen
from measured runs (benchmarks/check_margin.py): block pairs of a few steps vary by
10 % and more, and with no margin 7 of 23 kept orders measured slower again after the
check. The controller repeats the check every
``recheck_every`` steps per worker. docs/ALGORITHMS.md, "The order check", says why.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, Mapping, Sequence

from tictac_hooks.flags import MIN_CHECK_BLOCK_STEPS
from tictac_hooks.records import (CHECK, SCHEDULED, CheckBlock, CheckResult, RatioSpread,
                                  WorkerCheck, WorkerStep)

TICTAC, DEFAULT = "tictac", "default"

# The rule's margin: a candidate is kept when its median paired ratio is at least this.
# On 26 fit runs (benchmarks/check_margin.py), 1.05 against 1.0 cleared 4 of the 7 kept
# orders that were slower when measured again (-4.4 to -13.6 %) and 2 of the 16 that were
# faster (+6.8, +13.0 %).
KEEP_ABOVE = 1.05


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """``rounds`` rounds of (T, D) block pairs of ``block_steps`` steps per worker each,
    one pair per candidate order (``candidates``: algorithm names; empty: one candidate,
    the installed order). ``workers``: the workers the loop's dispatched steps are
    spread over (ParameterServerStrategy: every worker task; 1 where each dispatched
    step runs on every worker, as a graph-mode session.run does)."""

    rounds: int
    block_steps: int
    candidates: tuple[str, ...] = ()
    workers: int = 1

    def __post_init__(self) -> None:
        for name in ("rounds", "block_steps", "workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"check {name} must be an integer >= 0, got {value!r}")
        if self.workers < 1:
            raise ValueError(f"check workers must be >= 1, got {self.workers}")
        if self.rounds and self.block_steps < MIN_CHECK_BLOCK_STEPS:
            raise ValueError(
                f"check block_steps must be >= {MIN_CHECK_BLOCK_STEPS} (each block's first step "
                f"straddles the order change and its last holds the next install, so "
                f"neither is measured), got {self.block_steps}")
        if len(set(self.candidates)) != len(self.candidates) or DEFAULT in self.candidates:
            raise ValueError(f"check candidates must be distinct order names, got "
                             f"{self.candidates!r}")

    @property
    def block_dispatched(self) -> int:
        """Dispatched steps per block: ``block_steps`` for each worker."""
        return self.block_steps * self.workers

    @property
    def total_steps(self) -> int:
        """Dispatched steps the whole check runs."""
        return 2 * self.rounds * max(1, len(self.candidates)) * self.block_dispatched

    def block(self, dispatched: int) -> str | None:
        """The candidate installed for step number ``dispatched`` (0-based, counted from
        the check's start) while the check runs; None in a D block (TensorFlow's order).
        With no candidates named, a T block gives TICTAC."""
        index = dispatched // self.block_dispatched
        if index % 2:
            return None
        names = self.candidates or (TICTAC,)
        return names[(index // 2) % len(names)]

    def scheduled_block(self, dispatched: int) -> bool:
        """Whether step number ``dispatched`` falls in a T block (an order installed)."""
        return self.block(dispatched) is not None


def run_medians(records: Iterable[WorkerStep]) -> dict[str, list[tuple[int, float, int]]]:
    """worker device -> [(phase, median step time, steps)] per maximal run of steps in
    one order (SCHEDULED or CHECK), in time order; each run's first step and steps
    without a step time (paused, last) are dropped."""
    return _medians(runs_of(records))


def _medians(runs: dict[str, list[tuple[int, float, int, list[int], str | None]]]
             ) -> dict[str, list[tuple[int, float, int]]]:
    return {w: [(p, m, n) for p, m, n, _, _ in rs] for w, rs in runs.items()}


def runs_of(records: Iterable[WorkerStep]
            ) -> dict[str, list[tuple[int, float, int, list[int], str | None]]]:
    """As :func:`run_medians`, each run with the step indices it covers and the order it
    ran in (the algorithm for SCHEDULED runs, as the PS labelled the steps; None for
    TensorFlow's order or where the label is unknown)."""
    by_worker: dict[str, list[WorkerStep]] = {}
    for r in records:
        if r.phase in (SCHEDULED, CHECK):
            by_worker.setdefault(r.worker, []).append(r)
    out: dict[str, list[tuple[int, float, int, list[int], str | None]]] = {}
    for worker, recs in sorted(by_worker.items()):
        recs.sort(key=lambda r: r.start)
        runs: list[tuple[int, str | None, list[float], list[int]]] = []
        for i, r in enumerate(recs):
            label = r.order if r.phase == SCHEDULED else None
            if i == 0 or (r.phase, label) != runs[-1][:2]:
                runs.append((r.phase, label, [], [r.step]))  # straddling first step
                continue
            runs[-1][3].append(r.step)
            if r.step_time is not None and not r.paused_s:
                runs[-1][2].append(r.step_time)
        out[worker] = [(phase, statistics.median(t), len(t), steps, label)
                       for phase, label, t, steps in runs if t]
    return out


def paired_ratios(medians: dict[str, list[tuple[int, float, int]]]) -> dict[str, list[float]]:
    """worker -> median(D run) / median(T run before it), per pair (> 1: TicTac faster)."""
    out: dict[str, list[float]] = {}
    for worker, runs in medians.items():
        ratios = []
        for (p0, t0, _), (p1, t1, _) in zip(runs, runs[1:]):
            if p0 == SCHEDULED and p1 == CHECK and t0 > 0:
                ratios.append(t1 / t0)
        out[worker] = ratios
    return out


def _candidate_pairs(runs: dict[str, list[tuple[int, float, int, list[int], str | None]]],
                     default_label: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """candidate -> worker -> [(median T, median D)] per (T run, D run after it)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for worker, rs in runs.items():
        for (p0, t0, _, _, l0), (p1, t1, _, _, _) in zip(rs, rs[1:]):
            if p0 == SCHEDULED and p1 == CHECK and t0 > 0:
                out.setdefault(l0 or default_label, {}).setdefault(worker, []).append((t0, t1))
    return out


def kept_by_rule(medians: Mapping[str, float]) -> str | None:
    """The rule: of the candidates' median paired ratios (median(TensorFlow order) /
    median(candidate order)), the candidate with the largest when it is >= KEEP_ABOVE;
    None (TensorFlow's order) otherwise or without candidates."""
    best = max(medians, key=medians.get, default=None)
    return best if best is not None and medians[best] >= KEEP_ABOVE else None


def decide(records: Sequence[WorkerStep], plan: CheckPlan, algorithm: str) -> CheckResult:
    """The check's result: per candidate, per worker and overall, the paired ratios'
    median and range, and the decision by the module's rule (``decision`` TICTAC or
    DEFAULT, ``chosen`` the kept candidate). ``decision`` is None when no pair could be
    formed (too few steps reached the PS): the installed order then stays.
    ``algorithm`` names steps the PS did not label (a single-candidate check)."""
    runs = runs_of(records)
    pairs = _candidate_pairs(runs, algorithm)
    ratios = {c: [d / t for ws in by_worker.values() for t, d in ws]
              for c, by_worker in pairs.items()}
    medians = {c: statistics.median(rs) for c, rs in ratios.items()}
    best = max(medians, key=medians.get, default=None)
    focus = best or algorithm
    mine = pairs.get(focus, {})
    chosen = kept_by_rule(medians)
    decision = None if best is None else (TICTAC if chosen else DEFAULT)
    return CheckResult(
        algorithm=focus, rounds=plan.rounds, block_steps=plan.block_steps,
        candidates={c: RatioSpread.of(rs) for c, rs in sorted(ratios.items())},
        rule="keep the candidate order with the largest median paired ratio "
             f"median(TensorFlow order) / median(TicTac order) when it is >= {KEEP_ABOVE:g}"
             ", else TensorFlow's order",
        workers={w: _worker_check(ps) for w, ps in sorted(mine.items())},
        spread=RatioSpread.of(ratios.get(focus, [])),
        blocks={w: tuple(CheckBlock(p, m, tuple(steps)) for p, m, _, steps, _ in rs)
                for w, rs in runs.items()},
        decision=decision, chosen=chosen,
        reason="" if best is not None else "no (TicTac, TensorFlow) block pair reached the PS",
        candidate_workers={c: {w: _worker_check(ps) for w, ps in sorted(ws.items())}
                           for c, ws in sorted(pairs.items())})


def _worker_check(pairs: Sequence[tuple[float, float]]) -> WorkerCheck:
    """One worker's (median T, median D) pairs of one candidate."""
    return WorkerCheck(RatioSpread.of(d / t for t, d in pairs),
                       _median([d for _, d in pairs]), _median([t for t, _ in pairs]))


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None
