"""How far a run's step is from the link's limit.

No order makes a step shorter than the larger of two times (:class:`LinkLimit`):

- *compute*: the step with no transfer at all (the compute reference, each worker on
  its own copy of the parameters: the calibration blocks' ``@no-transfer`` median in
  the same rounds, else the profiling phase's);
- *wire*: the busiest link direction's bytes per step over the link rate. Every task
  has one link of the run's rate each way. Out of PS ``p`` go the pulls of every
  worker, ``workers * pulled[p]``, and into it, in training, their pushes (the
  gradients), ``workers * pushed[p]``; a worker's link carries the sum over the PSes
  of its pulls one way and of its pushes the other (bench/metrics.py
  ``comm_seconds``). The two directions of a link are independent, so the wire part
  is the larger of the pulls' and the pushes' times, not their sum.

``bound = max(compute, pulls, pushes)``; the report gives the measured median step of
TicTac's best order and of TensorFlow's default over it.

Synchronous training adds a barrier the bound above ignores: no worker's backward pass
starts before its last pull has arrived (the forward pass needs every parameter), and
the next step's pulls wait for this step's pushes (the update). That gives two paths
through the step, and the step is no shorter than either:

- *out of the PS*: the worker whose last pull arrives last (no earlier than *pulls*,
  when the PS's egress is the busiest) produces every gradient after it, and all its
  pushes follow: pulls + one worker's pushes;
- *into the PS*: no gradient exists before some worker has all its own pulls (no
  earlier than one worker's pulls), and the PS's ingress then carries every worker's
  pushes: one worker's pulls + pushes.

``barrier bound = max(compute, pulls + one worker's pushes, one worker's pulls +
pushes)`` (:attr:`LinkLimit.sync_s`; "one worker's" is its busiest direction alone).
With dense gradients (pushes as large as pulls) both paths are (workers + 1) x one
worker's pulls. Only a pipeline across steps, which synchronous training forbids, could
beat it.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from tictac_hooks.bench.gains import DEFAULT, TICTAC
from tictac_hooks.bench.gains import fmt as _fmt
from tictac_hooks.bench.metrics import comm_seconds
from tictac_hooks.records import BenchRun, RateRun

# Where the parts come from (LinkLimit.compute_source, push_source).
IN_RUN, PROFILED = "in-run", "profiled"   # the compute-only step
TRACED, AS_PULLS = "traced", "as pulls"   # the pushes' bytes


@dataclasses.dataclass(frozen=True)
class LinkLimit:
    """The lower bound on one run's step (seconds), with its parts."""

    compute_s: float | None   # the step with no transfer (None: not measured)
    compute_source: str       # IN_RUN or PROFILED ("" where not measured)
    pull_s: float             # the busiest direction's pulls per step
    push_s: float | None      # the busiest direction's pushes per step (None: inference)
    push_source: str          # TRACED, AS_PULLS ("" in inference)
    push_one_s: float | None = None  # one worker's pushes alone (None: inference)
    pull_one_s: float | None = None  # one worker's pulls alone (None: the ingress path unknown)

    @property
    def wire_s(self) -> float:
        """The busiest link direction's time per step."""
        return max(self.pull_s, self.push_s or 0.0)

    @property
    def bound_s(self) -> float:
        return max(self.compute_s or 0.0, self.wire_s)

    @property
    def sync_s(self) -> float | None:
        """The bound with synchronous training's barrier (module docstring): every
        pull, then one worker's pushes; or one worker's pulls, then every push; None in
        inference."""
        if self.push_one_s is None:
            return None
        ingress = (self.pull_one_s + self.push_s
                   if self.pull_one_s is not None and self.push_s is not None else 0.0)
        return max(self.compute_s or 0.0, self.pull_s + self.push_one_s, ingress)

    def over(self, step_s: float | None, bound_s: float | None = None) -> float | None:
        """``step_s`` over the bound (or over ``bound_s``; None where either is
        unknown)."""
        bound_s = self.bound_s if bound_s is None else bound_s
        if step_s is None or not bound_s:
            return None
        return step_s / bound_s


def pushed_bytes_per_ps(run: RateRun, ps: int, training: bool
                        ) -> tuple[tuple[float, ...] | None, str]:
    """Per PS, the bytes a worker pushes into it per step, and where they come from.
    Inference pushes nothing: (None, ""). In training, the traced pushes of the
    simulator's inputs where the run carries them (per PS the largest over the
    workers; a result file does not, ``tictac bench-report --repredict`` loads them
    from beside it), else the pulls (``run.bytes_per_ps``): with dense variables each
    variable a worker pulls comes back as a gradient of the same size."""
    if not training:
        return None, ""
    if run.push_bytes_per_ps is not None:
        return tuple(run.push_bytes_per_ps), TRACED
    pushes = (run.sim_inputs or {}).get("pushes")
    if pushes:
        return traced_push_bytes(pushes, ps), TRACED
    return tuple(run.bytes_per_ps), AS_PULLS


def traced_push_bytes(pushes: Sequence[Mapping[str, tuple[str, float]]], ps: int
                      ) -> tuple[float, ...]:
    """Per PS, the bytes one worker pushes into it per step: ``pushes`` holds per
    worker {tensor: (PS channel "ps:<i>", bytes)} (bench/orders.py traced_pushes);
    the largest over the workers."""
    per_ps = [0.0] * ps
    for worker in pushes:
        mine = [0.0] * ps
        for channel, size in worker.values():
            index = int(str(channel).split(":")[-1])
            if index < ps:
                mine[index] += float(size)
        per_ps = [max(a, b) for a, b in zip(per_ps, mine)]
    return tuple(per_ps)


def compute_only_s(result: BenchRun, run: RateRun) -> tuple[float | None, str]:
    """The step with no transfer: the calibration blocks' median in ``run``'s rounds,
    else the profiling phase's compute reference; (None, "") where neither was
    measured."""
    if run.in_run is not None:
        return run.in_run.compute_s, IN_RUN
    reference = run.compute_s if run.compute_s is not None else (
        result.compute.compute_s if result.compute is not None else None)
    return (reference, PROFILED) if reference is not None else (None, "")


def link_limit(result: BenchRun, run: RateRun) -> LinkLimit:
    """The bound on ``run``'s step (see the module's docstring)."""
    workers, ps = result.config.workers, len(run.bytes_per_ps)
    compute, source = compute_only_s(result, run)
    pushed, push_source = pushed_bytes_per_ps(run, ps, result.config.mode == "training")
    return LinkLimit(
        compute_s=compute, compute_source=source,
        pull_s=comm_seconds(run.bytes_per_ps, workers, run.rate_bits),
        push_s=comm_seconds(pushed, workers, run.rate_bits) if pushed is not None else None,
        push_source=push_source,
        push_one_s=comm_seconds(pushed, 1, run.rate_bits) if pushed is not None else None,
        pull_one_s=comm_seconds(run.bytes_per_ps, 1, run.rate_bits))


def best_tictac(run: RateRun) -> tuple[str, float] | None:
    """(the TIC/TAC schedule with the shortest median step, that median), or None."""
    medians = {n: run.schedules[n].step_time_median for n in TICTAC if n in run.schedules}
    if not medians:
        return None
    name = min(medians, key=medians.get)
    return name, medians[name]


def _ms(seconds: float | None) -> str:
    return _fmt(seconds * 1e3 if seconds is not None else None, ".0f")


def _times(ratio: float | None) -> str:
    return _fmt(ratio, ".2f") + ("x" if ratio is not None else "")


def limit_section(results: Sequence[BenchRun]) -> list[str]:
    """A table with a row per run: both parts of the bound, the bound, and the median
    step of TicTac's best order and of TensorFlow's default over it."""
    rows: list[str] = []
    sources: dict[str, set[str]] = {"compute": set(), "push": set()}
    unshaped = [r.config.label for r in results if not r.shaped]
    for result in results:
        for run in result.runs:
            limit = link_limit(result, run)
            sources["compute"].add(limit.compute_source)
            sources["push"].add(limit.push_source)
            best = best_tictac(run)
            default = run.schedules.get(DEFAULT)
            default_s = default.step_time_median if default else None
            best_s = best[1] if best else None
            rows.append(
                f"| {result.config.label} | {run.rate} | {_ms(limit.compute_s)} "
                f"| {_ms(limit.pull_s)} | {_ms(limit.push_s)} | {_ms(limit.bound_s)} "
                f"| {best[0] + ' ' + _ms(best_s) if best else '-'} "
                f"| {_times(limit.over(best_s))} | {_ms(default_s)} "
                f"| {_times(limit.over(default_s))} | {_ms(limit.sync_s)} "
                f"| {_times(limit.over(best_s, limit.sync_s) if limit.sync_s else None)} |")
    if not rows:
        return []
    notes = []
    if AS_PULLS in sources["push"]:
        notes.append("pushes taken as the pulls' bytes (dense gradients: the result "
                     "records no push bytes; `--repredict` reads the traced pushes "
                     "from the simulator's inputs beside it)")
    if TRACED in sources["push"]:
        notes.append("pushes as traced (the simulator's inputs)")
    if unshaped:
        notes.append(f"LOOPBACK, no link was shaped ({', '.join(unshaped)}): the rate did "
                     "not bind, and neither does the wire part of the bound")
    if "" in sources["compute"]:
        notes.append("a '-' compute: the result measured no step without transfer, the "
                     "bound is the wire's alone")
    return ["The bound no order can beat: max(compute, pulls, pushes). *compute*: the "
            "step with no transfer (the calibration blocks in the run's rounds, else the "
            "profiling phase's); *pulls*, *pushes*: the busiest link direction's bytes per "
            "step over the link rate (out of a PS: every worker's pulls; into it, in "
            "training: their gradients; a worker's link: the sum over the PSes). Steps "
            "are medians. *with the barrier* (training): synchronous training's bound, "
            "max(compute, pulls + one worker's pushes, one worker's pulls + pushes): the "
            "worker whose last pull comes last pushes every gradient after it, and no "
            "gradient leaves before some worker has all its pulls.", "",
            "| config | link | compute ms | pulls ms | pushes ms | bound ms "
            "| TicTac's best ms | over the bound | default ms | over the bound "
            "| with the barrier ms | TicTac's best over it |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"] + rows + \
        ([""] + [f"- {n}" for n in notes] if notes else [])
