"""The order check: TicTac's order against TensorFlow's own, in interleaved blocks.

After the switch the training loop runs ``rounds`` pairs of blocks of ``block_steps``
dispatched steps each: first with the schedule installed (T, TicTac's order), then
with it cleared (D, TensorFlow's default order), alternately. Interleaving keeps slow
drift of the machine (other load, thermal state, page cache) out of the comparison.

The PS labels every step with the order it really ran in (a step is bound to one
schedule version at its first transfer), so the blocks need not line up with the
dispatch. Per worker, each maximal run of steps in one order gives one median step time;
the first step of a run straddles the change and is dropped. Each D run is paired with
the T run just before it, and ``median(D) / median(T)`` is 1 + TicTac's throughput gain
in that pair.

Decision rule (stated, and the same everywhere): TicTac's order stays installed when the
median of the paired ratios, over all pairs of all workers, is at least 1 (in the
typical pair it is not slower than the default); otherwise the schedule is cleared and
TensorFlow's order is kept. docs/ALGORITHMS.md, "The order check", says why.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, Sequence

from tictac_hooks.records import CHECK, SCHEDULED, WorkerStep

TICTAC, DEFAULT = "tictac", "default"


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """``rounds`` (T, D) block pairs of ``block_steps`` dispatched steps each."""

    rounds: int
    block_steps: int

    def __post_init__(self) -> None:
        for name in ("rounds", "block_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"check {name} must be an integer >= 0, got {value!r}")
        if self.rounds and self.block_steps < 2:
            raise ValueError(f"check block_steps must be >= 2 (the first step of a block "
                             f"is dropped), got {self.block_steps}")

    @property
    def total_steps(self) -> int:
        return 2 * self.rounds * self.block_steps

    def scheduled_block(self, dispatched: int) -> bool:
        """Whether step number ``dispatched`` (0-based, counted from the switch) falls in
        a T block (schedule installed) while the check runs."""
        return (dispatched // self.block_steps) % 2 == 0


def run_medians(records: Iterable[WorkerStep]) -> dict[str, list[tuple[int, float, int]]]:
    """worker device -> [(phase, median step time, steps)] per maximal run of steps in
    one order (SCHEDULED or CHECK), in time order; each run's first step and steps
    without a step time (paused, last) are dropped."""
    return _medians(runs_of(records))


def _medians(runs: dict[str, list[tuple[int, float, int, list[int]]]]
             ) -> dict[str, list[tuple[int, float, int]]]:
    return {w: [(p, m, n) for p, m, n, _ in rs] for w, rs in runs.items()}


def runs_of(records: Iterable[WorkerStep]
            ) -> dict[str, list[tuple[int, float, int, list[int]]]]:
    """As :func:`run_medians`, each run with the step indices it covers."""
    by_worker: dict[str, list[WorkerStep]] = {}
    for r in records:
        if r.phase in (SCHEDULED, CHECK):
            by_worker.setdefault(r.worker, []).append(r)
    out: dict[str, list[tuple[int, float, int, list[int]]]] = {}
    for worker, recs in sorted(by_worker.items()):
        recs.sort(key=lambda r: r.start)
        runs: list[tuple[int, list[float], list[int]]] = []
        for i, r in enumerate(recs):
            if i == 0 or r.phase != recs[i - 1].phase:
                runs.append((r.phase, [], [r.step]))  # its straddling first step: no time
                continue
            runs[-1][2].append(r.step)
            if r.step_time is not None and not r.paused_s:
                runs[-1][1].append(r.step_time)
        out[worker] = [(phase, statistics.median(t), len(t), steps)
                       for phase, t, steps in runs if t]
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


def decide(records: Sequence[WorkerStep], plan: CheckPlan, algorithm: str) -> dict[str, Any]:
    """The check's result: per worker and overall, the paired ratios' median and range,
    and the decision by the module's rule. ``decision`` is None when no pair could be
    formed (too few steps reached the PS): the schedule then stays installed."""
    runs = runs_of(records)
    medians = _medians(runs)
    ratios = paired_ratios(medians)
    every = [x for rs in ratios.values() for x in rs]
    result: dict[str, Any] = {
        "algorithm": algorithm, "rounds": plan.rounds, "block_steps": plan.block_steps,
        "rule": "keep TicTac's order when the median paired ratio "
                "median(TensorFlow order) / median(TicTac order) is >= 1",
        "workers": {w: _spread(rs) | {
            "default_median_step_time": _median([t for p, t, _ in medians[w] if p == CHECK]),
            "tictac_median_step_time": _median([t for p, t, _ in medians[w]
                                                if p == SCHEDULED])}
            for w, rs in ratios.items()},
        **_spread(every),
        # worker -> [(phase, median, [step indices])]: the blocks, for TensorBoard
        "blocks": {w: [(p, m, steps) for p, m, _, steps in rs] for w, rs in runs.items()},
    }
    if not every:
        result["decision"] = None
        result["reason"] = "no (TicTac, TensorFlow) block pair reached the PS"
    else:
        result["decision"] = TICTAC if statistics.median(every) >= 1.0 else DEFAULT
    return result


def _spread(ratios: Sequence[float]) -> dict[str, Any]:
    if not ratios:
        return {"pairs": 0}
    return {"pairs": len(ratios), "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios)}


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None
