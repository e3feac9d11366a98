"""What a run reports at its end: one typed :class:`RunSummary`, built in one place
(``Controller.finish``) and rendered from there: ``to_json()`` is the
``tictac_summary.json`` beside the event files, the frontends' ``summary`` dict, what
the examples print and what ``tictac bench --frontend fit`` records."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

# The order counts, every one present (zero included): a run whose check kept
# TensorFlow's order says it scheduled 0 steps rather than leaving the count out.
ORDER_COUNTS = ("scheduled_steps", "followed", "partly_ordered", "skips", "violations",
                "early_released")


@dataclasses.dataclass(frozen=True)
class OrderCounts:
    """Over the steps that ran the installed order (every worker): how many
    (``scheduled_steps``), how many followed it at every PS (``followed``); steps a PS
    that carries the order ran in TensorFlow's (``partly_ordered``); transfers let go
    past their turn (``skips``) or served out of it (``violations``); transfers any PS
    released early, whatever the phase (``early_released``; none in a healthy run)."""

    scheduled_steps: int = 0
    followed: int = 0
    partly_ordered: int = 0
    skips: int = 0
    violations: int = 0
    early_released: int = 0

    @classmethod
    def from_counts(cls, counts: Mapping[str, int]) -> "OrderCounts":
        unknown = set(counts) - set(ORDER_COUNTS)
        if unknown:
            raise ValueError(f"unknown order counts: {sorted(unknown)}")
        return cls(**{k: int(v) for k, v in counts.items()})


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One run's summary (see the module docstring).

    Attributes:
      config: the run's RunConfig, field by field (RunConfig.fields).
      workers: per worker: its steps, per phase the steps in the medians and their
        median step time, the steps left out by reason, missing and unfinished steps,
        when it was lost and came back (StepLog.summary).
      order: the order counts (:class:`OrderCounts`).
      records: what was read from the PSes (reading.records_summary).
      check / checks: the last order check's result (with ``same_as`` and
        ``not_checked``), and every check's when there was more than one.
      schedule: the order of the last install (algorithm, order, priorities).
      coverage: what the order covered (coverage.Coverage.to_json).
      not_ordered: why the run kept TensorFlow's order (the switch failed or training
        ended first); tac_off: why TAC was off; restored_from: the saved order's file.
      hook: the frontend's cost per step (StepDriver.hook_cost).
      phases: the run's phases (phases.Phases.to_json: each move, seconds from the
        start, and why; moves the table does not allow, counted).
    """

    config: Mapping[str, Any]
    workers: Mapping[str, Mapping[str, Any]]
    order: OrderCounts
    records: Mapping[str, Any]
    check: Mapping[str, Any] | None = None
    checks: tuple[Mapping[str, Any], ...] = ()
    schedule: Mapping[str, Any] | None = None
    coverage: Mapping[str, Any] | None = None
    not_ordered: str | None = None
    tac_off: str | None = None
    restored_from: str | None = None
    hook: Mapping[str, Any] | None = None
    phases: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON: every field set (None and empty ones left out)."""
        out: dict[str, Any] = {"workers": {w: dict(e) for w, e in self.workers.items()},
                               "order": dataclasses.asdict(self.order)}
        for name in ("not_ordered", "coverage", "schedule", "tac_off", "restored_from"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value if isinstance(value, str) else dict(value)
        out["records"] = dict(self.records)
        if self.hook is not None:
            out["hook"] = dict(self.hook)
        if self.phases is not None:
            out["phases"] = dict(self.phases)
        if self.check is not None:
            out["check"] = dict(self.check)
        if len(self.checks) > 1:
            out["checks"] = [dict(c) for c in self.checks]
        out["config"] = {k: sorted(v) if isinstance(v, frozenset) else
                         [list(p) for p in v] if k == "worker_addresses" else
                         list(v) if isinstance(v, tuple) else v
                         for k, v in self.config.items()}
        return out
