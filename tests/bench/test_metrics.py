"""bench/metrics.py: per-schedule metrics on synthetic step records."""

from __future__ import annotations

import dataclasses

import pytest

from tictac_hooks.bench import metrics
from tictac_hooks.graph.simulate import efficiency
from tictac_hooks.records import ClientStep, TransferRecord

from .results import gate_step


def test_straggler_is_largest_wait_share_of_the_step():
    step = ClientStep("none", 2.0, (1.0, 1.5, 1.8))
    assert step.straggler_pct() == pytest.approx(100 * 0.8 / 2.0)
    assert ClientStep("none", 2.0, (1.0,)).straggler_pct() == 0.0
    assert step.makespan == 1.8


def test_comm_seconds_takes_the_bottleneck_link():
    # 1 PS, 2 workers: the PS egress carries both workers' bytes.
    assert metrics.comm_seconds([1e6], 2, 8e6) == pytest.approx(2.0)
    # 2 PS, 1 worker: the worker ingress carries both PSes' bytes.
    assert metrics.comm_seconds([1e6, 1e6], 1, 8e6) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        metrics.comm_seconds([1.0], 1, 0)


def test_efficiency_paper_eq4():
    # comp 1, comm 1: U = 2, L = 1; m = L -> 1, m = U -> 0.
    assert efficiency(1.0, 1.0 + 1.0, max(1.0, 1.0)) == pytest.approx(1.0)
    assert efficiency(2.0, 1.0 + 1.0, max(1.0, 1.0)) == pytest.approx(0.0)
    assert efficiency(1.5, 1.0 + 1.0, max(1.0, 1.0)) == pytest.approx(0.5)
    assert efficiency(1.0, 1.0 + 0.0, max(1.0, 0.0)) is None


@pytest.mark.parametrize("makespan", [0.5, 0.99, 2.01, 3.0])
def test_efficiency_is_never_outside_zero_one(makespan):
    # L = 1, U = 2: a makespan outside [L, U] gives no E, never a value outside [0, 1].
    assert efficiency(makespan, 1.0 + 1.0, max(1.0, 1.0)) is None
    steps = [ClientStep("tic", makespan, (makespan,)),
             ClientStep("tic", 1.5, (1.5,))]
    s = metrics.summarize(steps, 8, comp=1.0, comm=1.0)
    assert s.efficiency_median == pytest.approx(0.5) and s.efficiency_steps == 1
    assert "1 of 2 steps" in s.efficiency_note
    for e in (efficiency(m / 10, 1.0 + 1.0, max(1.0, 1.0)) for m in range(0, 40)):
        assert e is None or 0.0 <= e <= 1.0


def test_summarize_and_compare():
    base = [ClientStep("none", t, (t * 0.5, t * 0.9)) for t in (1.0, 2.0, 1.0, 2.0)]
    tic = [ClientStep("tic", t, (t * 0.89, t * 0.9)) for t in (1.0, 1.0, 1.0, 1.1)]
    a = metrics.summarize(base, global_batch=8, comp=0.6, comm=0.6)
    b = metrics.summarize(tic, global_batch=8, comp=0.6, comm=0.6)
    assert a.throughput == pytest.approx(8 * 4 / 6.0)
    assert a.step_time_median == pytest.approx(1.5)
    assert a.step_time_p95 == pytest.approx(2.0)
    assert a.straggler_pct == pytest.approx(40.0)
    assert b.step_time_cv < a.step_time_cv
    vs = metrics.compare({"none": a, "tic": b})
    assert vs["tic"].throughput_gain_pct == pytest.approx(100 * (6.0 / 4.1 - 1))
    assert vs["tic"].straggler_cut == pytest.approx(40.0 / b.straggler_pct)
    assert vs["none"].throughput_gain_pct == pytest.approx(0.0)
    with pytest.raises(ValueError):
        metrics.summarize([], 1)


def test_quantile_nearest_rank():
    assert metrics.quantile([3, 1, 2, 4], 0.5) == 2
    assert metrics.quantile(list(range(1, 101)), 0.95) == 95
    assert metrics.quantile([5], 0.95) == 5


def test_rendezvous_counts():
    records = [
        gate_step(["a", "b", "c"], violations=1, skips=0, version=3, unlisted=["c"]),
        gate_step(["a", "b"], violations=0, skips=1, version=3),
        gate_step(["a"], violations=0, skips=0, version=None),
    ]
    c = metrics.rendezvous_counts(records)
    assert c.transfers == 6 and c.violations == 1 and c.skips == 1
    assert c.violation_pct == pytest.approx(100 / 6)
    assert c.matched == pytest.approx(4 / 5)
    assert metrics.rendezvous_counts([]).matched is None
    # Bytes a worker was served per step: summed over the PSes of a step, median over steps.
    per_ps = [dataclasses.replace(records[0], step_id=s, ps=ps, bytes=b)
              for s, ps, b in ((1, "a:1", 100), (1, "b:1", 50), (2, "a:1", 300), (3, "a:1", 10))]
    assert metrics.rendezvous_counts(per_ps).bytes_per_worker_step == 150
    assert metrics.rendezvous_counts([]).bytes_per_worker_step is None


def test_unscheduled_transfers_are_listed_with_sizes_and_reasons():
    def step(version, order, unlisted, sizes):
        transfers = tuple(TransferRecord(n, "pass" if n in unlisted else "listed", -1, sizes[n],
                                         1.0, 1.0, -1, 2.0) for n in order)
        return dataclasses.replace(gate_step(order, 0, 0, version, unlisted),
                                   transfers=transfers)
    sizes = {"a": 10, "b": 400, "c": 30, "d": 5}
    records = [step(1, ["a", "b", "c"], ["b", "c"], sizes),
               step(1, ["a", "b", "c", "d"], ["b", "d"], sizes),
               step(None, ["a", "b"], ["a", "b"], sizes)]  # TensorFlow's order: not counted
    out = metrics.unscheduled_transfers(records, late={"b"}, in_graph={"a", "b", "c"})
    assert [(e.name, e.bytes, e.steps, e.reason) for e in out] == [
        ("b", 400, 2, "late"), ("c", 30, 1, "in the DAG, not in the order"),
        ("d", 5, 1, "not in the traced DAG")]


def test_median_interval_is_the_binomial_order_statistics():
    # 20 steps: x(6) and x(15); P(Bin(20, 1/2) <= 5) = 0.0207 <= 0.025 < P(<= 6) = 0.0577
    assert metrics.median_interval(list(range(20, 0, -1))) == (6, 15)
    assert metrics.median_interval(range(1, 7)) == (1, 6)  # 6 steps: the extremes (96.9 %)
    assert metrics.median_interval(range(1, 6)) is None  # 5: no 95 % interval at all
    assert metrics.median_interval(range(1, 6), confidence=0.9) == (1, 5)
    # coverage by simulation: a median of 20 uniform draws lies in it about 96 % of times
    import random
    rng = random.Random(7)
    hits = sum(lo <= 0.5 <= hi for lo, hi in
               (metrics.median_interval([rng.random() for _ in range(20)])
                for _ in range(2000)))
    assert 0.94 <= hits / 2000 <= 0.975


def test_median_ci_is_a_seeded_bootstrap_interval_around_the_median():
    values = [1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 0.8, 1.0, 1.02, 0.98]
    lo, hi = metrics.median_ci(values)
    assert lo <= 1.0 <= hi and min(values) <= lo < hi <= max(values)
    assert metrics.median_ci(values) == (lo, hi)  # seeded: the same interval again
    narrow = metrics.median_ci(values, level=0.5)
    assert lo <= narrow[0] <= narrow[1] <= hi
    assert metrics.median_ci([2.0] * 5) == (2.0, 2.0)


def test_procstat_reads_a_process_cpu_seconds_and_memory():
    import os

    from benchmarks.lab.procstat import cpu_seconds, rss_mib
    t0 = cpu_seconds(os.getpid())
    sum(i * i for i in range(3_000_000))
    assert cpu_seconds(os.getpid()) > t0 > 0
    assert 1.0 < rss_mib(os.getpid()) < 1 << 20
    with pytest.raises(OSError):
        cpu_seconds(2 ** 22 + 1)  # above the kernel's largest pid: no such process
