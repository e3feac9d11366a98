"""Per-schedule metrics of a benchmark run, from per-step records (no TensorFlow).

A step record is what the benchmark client measures for one synchronous iteration:
the wall time of ``session.run`` and, per worker, when that worker's tower finished
(seconds after the step started; read from a ``tf.timestamp()`` op that depends on the
tower's last output, on the worker itself). Definitions:

- throughput: samples per second, ``global batch * steps / sum of step times``.
- step time median, p95 (nearest rank) and coefficient of variation (stdev / mean).
- straggler time % of a step (the paper's definition): the largest share of the
  iteration any worker spends waiting for the slowest one,
  ``100 * (slowest finish - fastest finish) / step time``; reported as the mean over
  steps. Zero with one worker.
- measured efficiency E of a step (paper Eq. 4): ``(U - m) / (U - L)`` with
  ``U = comp + comm``, ``L = max(comp, comm)`` from the oracle (comp: the workers'
  computation with no transfer, a step of the benchmark's compute reference, see
  ``workloads.build``; comm: the step's parameter bytes over the bottleneck link, see
  :func:`comm_seconds`) and ``m`` the step's makespan on the
  workers: the slowest tower's finish. Undefined (None) when U = L, and for a step whose
  makespan lies outside [L, U] (the oracle then does not bound the step: E would leave
  [0, 1]); the summary counts those steps and says why E is missing.
- violations and matched share from the rendezvous's records of the same steps.

Each result is a record of :mod:`tictac_hooks.records` (ScheduleSummary, GateCounts,
Comparison, UnscheduledTransfer).
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Sequence

from tictac_hooks.graph.simulate import efficiency
from tictac_hooks.records import (ClientStep, Comparison, GateCounts, GateStep, ScheduleSummary,
                                  UnscheduledTransfer)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (q in [0, 1]) of a non-empty sequence."""
    if not values:
        raise ValueError("quantile of no values")
    xs = sorted(values)
    rank = max(1, math.ceil(q * len(xs)))
    return xs[min(rank, len(xs)) - 1]


def median_interval(values: Sequence[float], confidence: float = 0.95
                    ) -> tuple[float, float] | None:
    """A distribution-free interval for the median of ``values`` (taken as independent
    draws): the order statistics x(k) and x(n-k+1), k the largest with
    P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2 (20 steps: x(6) and x(15), 95.9 %).
    None where ``values`` are too few for that confidence (fewer than 6 at 95 %)."""
    xs = sorted(values)
    n, tail, k, cdf = len(xs), (1.0 - confidence) / 2.0, 0, 0.0
    while True:  # cdf = P(B <= k)
        cdf += math.comb(n, k) / 2.0 ** n
        if cdf > tail:
            break
        k += 1
    if k == 0:
        return None
    return xs[k - 1], xs[n - k]


def median_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> tuple[float, float]:
    """Bootstrap confidence interval of the median of ``values`` (``resamples`` draws
    with replacement, seeded: the same values give the same interval)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    a = np.asarray(values)
    meds = np.median(rng.choice(a, size=(resamples, len(a)), replace=True), axis=1)
    return (float(np.quantile(meds, (1 - level) / 2)),
            float(np.quantile(meds, (1 + level) / 2)))


def coefficient_of_variation(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


def comm_seconds(bytes_per_ps: Sequence[float], num_workers: int, rate_bits: float) -> float:
    """Transfer time of one step's parameter pulls over the bottleneck link.

    Every task has one link of ``rate_bits`` each way. PS ``p`` sends ``bytes_per_ps[p]``
    to each of the ``num_workers`` workers through its one egress; each worker receives
    the sum through its one ingress; the busiest of these links bounds the step.
    """
    if rate_bits <= 0:
        raise ValueError(f"rate_bits must be > 0, got {rate_bits}")
    if not bytes_per_ps:
        return 0.0
    per_ps = max(bytes_per_ps) * max(1, num_workers)
    return 8.0 * max(per_ps, sum(bytes_per_ps)) / rate_bits


def rendezvous_counts(records: Iterable[GateStep]) -> GateCounts:
    """Violations and matched share from the gates' step records (one per step, worker
    and PS): transfers that broke the installed order (``violations``), their share
    of all transfers, ``reordered`` (handed back behind a later-listed transfer sent
    with it in the look-ahead window), and the share of transfers the installed
    schedule named."""
    transfers = violations = unlisted = skips = reordered = 0
    scheduled = 0
    served: dict[tuple[int, str], int] = {}  # (step, worker) -> bytes over every PS
    for r in records:
        served[(r.step_id, r.worker)] = served.get((r.step_id, r.worker), 0) + r.bytes
        n = len(r.order)
        transfers += n
        violations += r.violations
        skips += r.skips
        reordered += r.reordered
        if r.scheduled:
            scheduled += n
            unlisted += len(r.unlisted)
    return GateCounts(
        transfers=transfers,
        violations=violations,
        violation_pct=100.0 * violations / transfers if transfers else None,
        skips=skips,
        reordered=reordered,
        matched=(scheduled - unlisted) / scheduled if scheduled else None,
        # what the PSes really served a worker per step (the comm oracle assumes bytes)
        bytes_per_worker_step=statistics.median(served.values()) if served else None,
    )


def unscheduled_transfers(records: Iterable[GateStep], late: Iterable[str] = (),
                          in_graph: Iterable[str] = ()) -> tuple[UnscheduledTransfer, ...]:
    """The transfers the installed order did not name (``unlisted`` in scheduled steps),
    largest first: name, bytes (as last served), steps it was seen in, and why the
    schedule left it out: ``late`` (graph/tf/traced.py left it unscheduled: it depends
    on work of the same step, e.g. a read after the update it feeds, or it is a PS
    tensor that is no parameter read), or ``not in the traced DAG``."""
    late, in_graph = set(late), set(in_graph) - set(late)
    seen: dict[str, list[int]] = {}  # name -> [bytes, steps]
    for r in records:
        if not r.scheduled:
            continue
        sizes = {t.name: t.bytes for t in r.transfers}
        for name in r.unlisted:
            entry = seen.setdefault(name, [0, 0])
            entry[0] = sizes.get(name, entry[0])
            entry[1] += 1
    out = [UnscheduledTransfer(name, nbytes, steps,
                               "late" if name in late else
                               "in the DAG, not in the order" if name in in_graph else
                               "not in the traced DAG")
           for name, (nbytes, steps) in seen.items()]
    return tuple(sorted(out, key=lambda e: (-e.bytes, e.name)))


def summarize(steps: Sequence[ClientStep], global_batch: int, comp: float | None = None,
              comm: float | None = None) -> ScheduleSummary:
    """The metrics of one schedule's steps (see the module docstring)."""
    if not steps:
        raise ValueError("no steps to summarize")
    times = [s.step_time for s in steps]
    effs: list[float] = []
    unbounded = 0
    if comp is not None and comm is not None:
        for s in steps:
            e = efficiency(s.makespan, comp + comm, max(comp, comm))  # U, L of Eq. 4
            if e is not None:
                effs.append(e)
            elif comm + comp - max(comp, comm) > 1e-12:
                unbounded += 1
    note = None
    if unbounded:
        low, high = max(comp, comm), comp + comm
        note = (f"{unbounded} of {len(steps)} steps had a makespan outside [L, U] = "
                f"[{low:.4f}, {high:.4f}] s (comp {comp:.4f} s, comm {comm:.4f} s): the "
                "time oracle does not bound them, so E is not reported for them")
    straggler = [s.straggler_pct() for s in steps]
    return ScheduleSummary(
        steps=len(steps),
        throughput=global_batch * len(times) / sum(times),
        step_time_mean=statistics.fmean(times),
        step_time_median=statistics.median(times),
        step_time_p95=quantile(times, 0.95),
        step_time_cv=coefficient_of_variation(times),
        straggler_pct=statistics.fmean(straggler),
        straggler_pct_p95=quantile(straggler, 0.95),
        efficiency_median=statistics.median(effs) if effs else None,
        efficiency_steps=len(effs),
        efficiency_note=note,
        makespan_median=statistics.median(s.makespan for s in steps),
    )


def compare(results: Mapping[str, ScheduleSummary], baseline: str = "none"
            ) -> dict[str, Comparison]:
    """Per schedule, ratios against ``baseline``: throughput gain (%), CV cut (x),
    straggler cut (x)."""
    base = results.get(baseline)
    out: dict[str, Comparison] = {}
    if not base:
        return out
    for name, r in results.items():
        out[name] = Comparison(
            throughput_gain_pct=100.0 * (r.throughput / base.throughput - 1.0),
            cv_cut=_ratio(base.step_time_cv, r.step_time_cv),
            straggler_cut=_ratio(base.straggler_pct, r.straggler_pct),
        )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b
