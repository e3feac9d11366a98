"""What TicTac makes of the gates' records on the worker side: each worker's steps
(:class:`WorkerStep`, run/steplog.py) and the order check's result
(:class:`CheckResult`, run/order_check.py)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Iterable, Mapping

from tictac_hooks.records._base import _field

# A worker step's phase: profiling in TensorFlow's order, in TicTac's order, or a check
# block in TensorFlow's order after the switch.
PROFILING, SCHEDULED, CHECK = 0, 1, 2
PHASE_NAMES = {PROFILING: "profiling", SCHEDULED: "scheduled", CHECK: "check"}


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
    """One order check's result (run/order_check.py, ``decide``)."""

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
    # every candidate's pairs per worker (benchmarks: `tictac bench --frontend fit`)
    candidate_workers: Mapping[str, Mapping[str, WorkerCheck]] = dataclasses.field(
        default_factory=dict)
    # the order that runs after the check: the kept candidate, "default" (TensorFlow's),
    # or where it could not decide the one installed before it (None: not applied yet)
    kept: str | None = None
    # per candidate: d = log(median TF-order step / median candidate step) per round,
    # and the rule's standing on them (n, mean, lower, upper, verdict: run/sequential.py)
    values: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    bounds: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    seed: int | None = None         # the order of each round's sides (CheckPlan.seed)

    def gain(self, candidate: str | None = None) -> tuple[float, float | None] | None:
        """(mean gain, its lower bound) of ``candidate`` (default: the focused one), as
        throughput gains exp(d) - 1; None where no round measured it."""
        b = self.bounds.get(candidate or self.algorithm)
        if not b or not b.get("n"):
            return None
        lower = b.get("lower")
        return math.expm1(b["mean"]), None if lower is None else math.expm1(lower)

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
        if self.kept is not None:
            out["kept"] = self.kept
        if self.reason:
            out["reason"] = self.reason
        if self.candidate_workers:
            out["candidate_workers"] = {c: {w: wc.to_json() for w, wc in ws.items()}
                                        for c, ws in self.candidate_workers.items()}
        if self.values:
            out["values"] = {c: list(v) for c, v in self.values.items()}
        if self.bounds:
            out["bounds"] = {c: dict(b) for c, b in self.bounds.items()}
        if self.seed is not None:
            out["seed"] = self.seed
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
                   f("decision"), f("chosen"), str(d.get("reason", "")),
                   {c: {w: WorkerCheck.from_json(wc) for w, wc in ws.items()}
                    for c, ws in d.get("candidate_workers", {}).items()},
                   d.get("kept"),
                   {c: tuple(float(x) for x in v) for c, v in d.get("values", {}).items()},
                   {c: dict(b) for c, b in d.get("bounds", {}).items()},
                   d.get("seed"))


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
