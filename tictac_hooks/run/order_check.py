"""The order check: TicTac's orders against TensorFlow's own, in rounds of clean blocks.

After the switch the training loop runs rounds of blocks of ``block_steps`` steps *per
worker* each: under ParameterServerStrategy the loop dispatches a block of
``block_steps x workers`` steps, which the coordinator spreads over the workers. A
round holds, for each candidate order still in the check, a block with that order
installed (T) and one with the PSes cleared (D, TensorFlow's order). The first round
runs T first (the switch's order is in place); each later round T or D first by a
pseudo-random sequence (``seed``), so neither side is always first and no fixed pattern
lines up with a periodic load of the machine: strict ABBA (T D, D T, ...) did, on this
machine, keeping TensorFlow's own order as "faster" in 10 % of resampled checks
(benchmarks/check_error_rates.py), against 3 % in random order. Each check draws its
seed (``seed`` None) unless the plan gives one; the result records it.

Clean blocks: at every block boundary the runner waits for the dispatched steps
(check_runner.py), installs the block's order, and opens the block's window once the
install is in force on every PS; the window closes when the block's steps have run.
A block's steps are the records that start inside its window *and* that the PS
labelled with the block's order (a step is bound to one schedule version at its first
transfer); each worker's first step in a window, steps with a pause, and steps
without a step time are left out. So no step of the profiling or switching period, and
none that straddles an install, enters a block.

Each round gives one value per candidate, ``d = log(median D / median T)`` over the
round's two blocks, every worker's steps pooled: the workers of one block share one
machine state, so the sample is the rounds, not the workers' pairs. The decision is
run/sequential.py's rule (a sequential one-sided t test, at most ``rounds`` rounds);
docs/ALGORITHMS.md, "The order check", says why, and benchmarks/check_error_rates.py
measures its error rates.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
import statistics
from typing import Iterable, Mapping, Sequence

from tictac_hooks.flags import MIN_CHECK_BLOCK_STEPS
from tictac_hooks.records import (CHECK, SCHEDULED, CheckBlock, CheckResult, RatioSpread,
                                  WorkerCheck, WorkerStep)
from tictac_hooks.run import sequential

TICTAC, DEFAULT = "tictac", "default"
AUTO_BLOCK = 0   # block_steps chosen when the check starts (CheckRunner._choose_block)


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """At most ``rounds`` rounds of (T, D) blocks of ``block_steps`` steps per worker,
    one pair per candidate order (``candidates``: algorithm names; empty: one candidate,
    the installed order). ``workers``: the workers the loop's dispatched steps are
    spread over (ParameterServerStrategy: every worker task; 1 where each dispatched
    step runs on every worker, as a graph-mode session.run does)."""

    rounds: int
    block_steps: int
    candidates: tuple[str, ...] = ()
    workers: int = 1
    seed: int | None = None   # the sides' order; None: drawn when the check starts

    def __post_init__(self) -> None:
        for name in ("rounds", "block_steps", "workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"check {name} must be an integer >= 0, got {value!r}")
        if self.workers < 1:
            raise ValueError(f"check workers must be >= 1, got {self.workers}")
        if self.rounds and self.block_steps != AUTO_BLOCK and \
                self.block_steps < MIN_CHECK_BLOCK_STEPS:
            raise ValueError(
                f"check block_steps must be >= {MIN_CHECK_BLOCK_STEPS} (each block's first step "
                f"straddles the order change and its last holds the next install, so "
                f"neither is measured), got {self.block_steps}")
        if len(set(self.candidates)) != len(self.candidates) or DEFAULT in self.candidates:
            raise ValueError(f"check candidates must be distinct order names, got "
                             f"{self.candidates!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return self.candidates or (TICTAC,)

    @property
    def block_dispatched(self) -> int:
        """Dispatched steps per block: ``block_steps`` for each worker."""
        return self.block_steps * self.workers

    @property
    def total_steps(self) -> int:
        """Dispatched steps of the longest check (every round, no candidate dropped)."""
        return 2 * self.rounds * len(self.names) * self.block_dispatched

    def rule(self, candidates: int | None = None) -> sequential.Rule:
        """The decision rule for this plan: at most ``rounds`` rounds, looks from round
        min(3, rounds) on, alpha and beta split over the candidates."""
        rounds = max(1, self.rounds)
        return sequential.Rule(min_rounds=min(sequential.MIN_ROUNDS, rounds),
                               max_rounds=rounds,
                               candidates=candidates or len(self.names))

    def t_first(self, round_: int) -> bool:
        """Whether round ``round_`` (0-based) runs each candidate's T block first: the
        first round does; later ones by the plan's pseudo-random sequence."""
        return round_ == 0 or random.Random((self.seed or 0) * 1_000_003
                                            + round_).random() < 0.5

    def round_blocks(self, round_: int, names: Sequence[str]) -> list[str | None]:
        """The blocks of round ``round_`` (0-based) for ``names``: per candidate its T
        block (the name) and its D block (None), in the round's order."""
        first = self.t_first(round_)
        out: list[str | None] = []
        for c in names:
            out += [c, None] if first else [None, c]
        return out

    def block(self, dispatched: int) -> str | None:
        """The candidate installed for step number ``dispatched`` (0-based, counted from
        the check's start) in the longest check; None in a D block."""
        index = dispatched // self.block_dispatched
        per_round = 2 * len(self.names)
        return self.round_blocks(index // per_round, self.names)[index % per_round]

    def scheduled_block(self, dispatched: int) -> bool:
        """Whether step number ``dispatched`` falls in a T block (an order installed)."""
        return self.block(dispatched) is not None


@dataclasses.dataclass(frozen=True)
class Window:
    """One block as it ran: its round, its candidate, whether the candidate was
    installed (T) or TensorFlow's order ran (D), and the wall-clock interval from the
    install in force to the end of its steps."""

    round: int
    candidate: str
    tictac: bool
    start: float
    end: float
    # False: the candidate is TensorFlow's own order (an A/A check of the rule, as the
    # bench runs it): its T block clears the PSes, as a D block does.
    ordered: bool = True

    def holds(self, r: WorkerStep) -> bool:
        """Whether ``r`` is one of this block's steps: it started inside the window and
        ran in the block's order, as the PS labelled it."""
        if not self.start <= r.start < self.end:
            return False
        if self.tictac and self.ordered:
            return r.phase == SCHEDULED and r.order in (self.candidate, None)
        return r.phase == CHECK


def block_steps_of(records: Iterable[WorkerStep], windows: Sequence[Window]
                   ) -> list[dict[str, list[WorkerStep]]]:
    """Per window, worker -> its measured steps in that block, in time order: each
    worker's first step in the window, paused steps and steps without a time dropped.
    Each window reads only the records that start inside it (bisection on the sorted
    starts), so a look costs O(records log records), not records x windows."""
    ordered = sorted(records, key=lambda r: r.start)
    starts = [r.start for r in ordered]
    out: list[dict[str, list[WorkerStep]]] = []
    for w in windows:
        by_worker: dict[str, list[WorkerStep]] = {}
        lo, hi = bisect.bisect_left(starts, w.start), bisect.bisect_left(starts, w.end)
        for r in ordered[lo:hi]:
            if w.holds(r):
                by_worker.setdefault(r.worker, []).append(r)
        out.append({worker: [r for r in rs[1:] if r.step_time is not None and not r.paused_s]
                    for worker, rs in by_worker.items()})
    return out


def _pooled_median(steps: Mapping[str, list[WorkerStep]] | None) -> float | None:
    """The median step time of a block, every worker's steps pooled."""
    return _median([r.step_time for rs in (steps or {}).values() for r in rs])


@dataclasses.dataclass
class _Pair:
    """One round of one candidate: its T and D blocks' steps."""

    t: dict[str, list[WorkerStep]] | None = None
    d: dict[str, list[WorkerStep]] | None = None


def _pairs(steps: Sequence[dict[str, list[WorkerStep]]], windows: Sequence[Window]
           ) -> dict[str, dict[int, _Pair]]:
    """candidate -> round -> its two blocks' steps (either may be missing), from
    ``steps``, :func:`block_steps_of` of ``windows``."""
    sides: dict[tuple[str, int, bool], dict[str, list[WorkerStep]]] = {}
    for w, s in zip(windows, steps):
        sides[(w.candidate, w.round, w.tictac)] = s
    out: dict[str, dict[int, _Pair]] = {}
    for candidate, r, _ in sides:
        out.setdefault(candidate, {})[r] = _Pair(sides.get((candidate, r, True)),
                                                 sides.get((candidate, r, False)))
    return out


def _values(pairs: Mapping[str, Mapping[int, _Pair]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for c, rounds in pairs.items():
        values = out.setdefault(c, [])
        for _, p in sorted(rounds.items()):
            mt, md = _pooled_median(p.t), _pooled_median(p.d)
            if mt and md:
                values.append(math.log(md / mt))
    return out


def round_values(records: Sequence[WorkerStep], windows: Sequence[Window]
                 ) -> dict[str, list[float]]:
    """candidate -> d = log(median D / median T) per complete round, in round order
    (a round where either block measured no step gives no value)."""
    return _values(_pairs(block_steps_of(records, windows), windows))


def decide(records: Sequence[WorkerStep], plan: CheckPlan, windows: Sequence[Window],
           final: bool = True) -> CheckResult:
    """The check's result on the blocks of ``windows``: per candidate its per-round
    values and bounds, per worker the same steps' medians, and the decision by
    run/sequential.py's rule (``decision`` TICTAC or DEFAULT, ``chosen`` the kept
    candidate). ``final``: no more rounds will run (a candidate still open is not
    kept). ``decision`` is None when no round measured both blocks of any candidate."""
    steps = block_steps_of(records, windows)
    pairs = _pairs(steps, windows)
    values = _values(pairs)
    names = [c for c in plan.names if c in pairs] or sorted(pairs)
    rule = plan.rule(len(names) or None)
    kept, over, standing = rule.look({c: values.get(c, []) for c in names})
    measured = {c: v for c, v in values.items() if v}
    if not measured:
        decision = None
    elif kept is not None:
        decision = TICTAC
    elif over or final:
        decision = DEFAULT
    else:
        decision = None
    focus = kept or max(measured, key=lambda c: standing[c].mean, default=None) \
        or (names[0] if names else TICTAC)
    rounds_run = max((len(v) for v in values.values()), default=0)
    reason = ""
    if not measured:
        reason = "no round measured both a TicTac block and a TensorFlow block"
    elif decision is None:
        reason = f"{rounds_run} round{'s' if rounds_run != 1 else ''}, undecided"

    def worker_checks(c: str) -> dict[str, WorkerCheck]:
        out = {}
        workers = sorted({w for p in pairs.get(c, {}).values() for s in (p.t, p.d)
                          if s for w in s})
        for worker in workers:
            ratios, ts, ds = [], [], []
            for p in pairs[c].values():
                t = [r.step_time for r in (p.t or {}).get(worker, [])]
                d = [r.step_time for r in (p.d or {}).get(worker, [])]
                mt, md = _median(t), _median(d)
                if mt and md:
                    ratios.append(md / mt)
                    ts += t
                    ds += d
            out[worker] = WorkerCheck(RatioSpread.of(ratios), _median(ds), _median(ts))
        return out

    blocks: dict[str, list[CheckBlock]] = {}
    for w, s in zip(windows, steps):
        for worker, rs in s.items():
            if rs:
                blocks.setdefault(worker, []).append(CheckBlock(
                    SCHEDULED if w.tictac else CHECK,
                    statistics.median(r.step_time for r in rs), tuple(r.step for r in rs)))
    return CheckResult(
        algorithm=focus, rounds=rounds_run, block_steps=plan.block_steps,
        candidates={c: RatioSpread.of(math.exp(d) for d in v) for c, v in sorted(values.items())},
        rule=rule.describe(),
        workers=worker_checks(focus),
        spread=RatioSpread.of(math.exp(d) for d in values.get(focus, [])),
        blocks={w: tuple(bs) for w, bs in sorted(blocks.items())},
        decision=decision, chosen=kept, reason=reason,
        candidate_workers={c: worker_checks(c) for c in sorted(pairs)},
        values={c: tuple(v) for c, v in sorted(values.items())},
        bounds={c: dataclasses.asdict(b) for c, b in sorted(standing.items())},
        seed=plan.seed)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None
