"""`tictac bench`: metrics on synthetic step records (fast), and one real --quick run
on a shaped network (root only)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import statistics
import sys

import pytest

from tictac_hooks.bench import metrics
from tictac_hooks.records import ClientStep, GateStep, TransferRecord
from tictac_hooks.graph.simulate import efficiency

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    assert s["efficiency_median"] == pytest.approx(0.5) and s["efficiency_steps"] == 1
    assert "1 of 2 steps" in s["efficiency_note"]
    for e in (efficiency(m / 10, 1.0 + 1.0, max(1.0, 1.0)) for m in range(0, 40)):
        assert e is None or 0.0 <= e <= 1.0


def test_summarize_and_compare():
    base = [ClientStep("none", t, (t * 0.5, t * 0.9)) for t in (1.0, 2.0, 1.0, 2.0)]
    tic = [ClientStep("tic", t, (t * 0.89, t * 0.9)) for t in (1.0, 1.0, 1.0, 1.1)]
    a = metrics.summarize(base, global_batch=8, comp=0.6, comm=0.6)
    b = metrics.summarize(tic, global_batch=8, comp=0.6, comm=0.6)
    assert a["throughput"] == pytest.approx(8 * 4 / 6.0)
    assert a["step_time_median"] == pytest.approx(1.5)
    assert a["step_time_p95"] == pytest.approx(2.0)
    assert a["straggler_pct"] == pytest.approx(40.0)
    assert b["step_time_cv"] < a["step_time_cv"]
    vs = metrics.compare({"none": a, "tic": b})
    assert vs["tic"]["throughput_gain_pct"] == pytest.approx(100 * (6.0 / 4.1 - 1))
    assert vs["tic"]["straggler_cut"] == pytest.approx(40.0 / b["straggler_pct"])
    assert vs["none"]["throughput_gain_pct"] == pytest.approx(0.0)
    with pytest.raises(ValueError):
        metrics.summarize([], 1)


def test_quantile_nearest_rank():
    assert metrics.quantile([3, 1, 2, 4], 0.5) == 2
    assert metrics.quantile(list(range(1, 101)), 0.95) == 95
    assert metrics.quantile([5], 0.95) == 5


def _gate_step(order, violations, skips, version, unlisted=()):
    return GateStep(step_id=1, worker="/job:worker/replica:0/task:0/device:CPU:0",
                    schedule_version=version, algorithm=None, complete=True,
                    order=tuple(order), transfers=(), bytes=0, start=0.0, end=0.0,
                    skipped=(), skips=skips, violations=violations, reordered=0,
                    unlisted=tuple(unlisted))


def test_rendezvous_counts():
    records = [
        _gate_step(["a", "b", "c"], violations=1, skips=0, version=3, unlisted=["c"]),
        _gate_step(["a", "b"], violations=0, skips=1, version=3),
        _gate_step(["a"], violations=0, skips=0, version=None),
    ]
    c = metrics.rendezvous_counts(records)
    assert c["transfers"] == 6 and c["violations"] == 1 and c["skips"] == 1
    assert c["violation_pct"] == pytest.approx(100 / 6)
    assert c["matched"] == pytest.approx(4 / 5)
    assert metrics.rendezvous_counts([])["matched"] is None
    # Bytes a worker was served per step: summed over the PSes of a step, median over steps.
    per_ps = [dataclasses.replace(records[0], step_id=s, ps=ps, bytes=b)
              for s, ps, b in ((1, "a:1", 100), (1, "b:1", 50), (2, "a:1", 300), (3, "a:1", 10))]
    assert metrics.rendezvous_counts(per_ps)["bytes_per_worker_step"] == 150
    assert metrics.rendezvous_counts([])["bytes_per_worker_step"] is None


def test_rotation_balances_positions():
    from tictac_hooks.bench.client import _rotation
    names = ["none", "rendezvous", "tic"]
    assert _rotation(names, 0) == ["none", "rendezvous", "tic"]
    assert _rotation(names, 1) == ["none", "tic", "rendezvous"]
    firsts = {_rotation(names, r)[0] for r in range(6)}
    assert firsts == set(names)


def test_config_validation_and_rates():
    from tictac_hooks.bench.runner import BenchConfig, parse_rates
    assert parse_rates(["auto", "auto:2", "500mbit"]) == [
        {"kind": "ratio", "value": 1.0, "spec": "auto"},
        {"kind": "ratio", "value": 2.0, "spec": "auto:2"},
        {"kind": "rate", "value": 500_000_000, "spec": "500mbit"}]
    BenchConfig(schedules=["none", "stock", "tic", "tic-fifo", "tic-aligned",
                           "tic-nopace"]).validate()
    # the baselines; "layer" (first-use's old name) is accepted, as such, and said once
    import logging
    from tictac_hooks.graph import algorithms
    algorithms._aliases_said.discard("layer")
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("tictac").addHandler(handler)
    try:
        config = BenchConfig(schedules=["none", "layer", "layer-aligned", "declared",
                                        "declared-wc"])
        config.validate()
        assert config.schedules == ["none", "first-use", "first-use-aligned", "declared",
                                    "declared-wc"]
        BenchConfig(schedules=["layer-fifo", "first-use-nopace"]).validate()
    finally:
        logging.getLogger("tictac").removeHandler(handler)
    assert [m for m in said if "'layer' is now called 'first-use'" in m] == [said[0]]
    assert len(said) == 1
    from tictac_hooks.bench.runner import default_schedules
    assert {"first-use", "declared"} <= set(default_schedules("native"))
    assert "layer" not in default_schedules("native")
    for bad in (dict(model="alexnet"), dict(workers=0), dict(schedules=["tic", "fifo"]),
                dict(schedules=["layer", "first-use"]), dict(schedules=["layered"]),
                dict(schedules=["stock", "tic"], backend="proxy"),
                dict(schedules=["none-fifo"]), dict(check_rounds=0),
                dict(check_block_steps=1), dict(check_block_steps=2),
                dict(bandwidth=["auto:x"]), dict(mode="eval")):
        with pytest.raises(ValueError):
            BenchConfig(**bad).validate()


def _result(shaped: bool = True) -> dict:
    steps = {"none": [1.0, 1.2, 1.4, 1.1], "tic": [0.8, 0.8, 0.81, 0.8]}
    sched = {}
    for name, times in steps.items():
        recs = [ClientStep(name, t, (t * 0.7, t * 0.9)) for t in times]
        sched[name] = metrics.summarize(recs, 4, 0.5, 0.5)
        sched[name].update(violations=0 if name == "tic" else None,
                           violation_pct=0.0 if name == "tic" else None,
                           matched=1.0 if name == "tic" else None)
    run = {"rate": "100mbit", "rate_bits": 1e8, "comm_comp_ratio": 1.0, "schedules": sched,
           "vs_default": metrics.compare(sched), "step_times": steps}
    return {"config": {"label": "resnet50/training/W2/P1", "batch": 2, "mode": "training",
                       "workers": 2, "steps": 4, "block_steps": 2},
            "network": {"shaped": shaped, "reason": "" if shaped else "not root"},
            "machine": {"before": {"loadavg_1m": 0.5, "cpus": 2},
                        "after": {"loadavg_1m": 1.0, "cpus": 2}},
            "wall_s": 10.0, "runs": [run], "schedules": sched}


def _sweep_result() -> dict:
    """One configuration at comm/comp 0.5 and 2 with the simulator's predictions."""
    result = _result()
    runs = []
    for ratio, (none, tic), (sim_none, sim_tic) in ((0.5, (1.0, 0.9), (1.0, 0.92)),
                                                    (2.0, (2.0, 1.6), (2.1, 1.2))):
        steps = {"none": [none] * 4, "tic": [tic] * 4}
        sched = {n: metrics.summarize([ClientStep(n, t, (t, t)) for t in ts], 4, 0.5, 0.5)
                 for n, ts in steps.items()}
        runs.append({"rate": f"{int(100 / ratio)}mbit", "rate_bits": 1e8 / ratio,
                     "comm_comp_ratio": ratio, "schedules": sched,
                     "vs_default": metrics.compare(sched), "step_times": steps,
                     "predicted_step_s": {"scaled": {"none": sim_none, "tic": sim_tic},
                                          "overhead": {"none": none * 1.3, "tic": tic * 1.3}}})
    result["runs"] = runs
    return result


def test_prediction_section_errors_ranking_and_sweep_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from tictac_hooks.bench.report import (best_model, prediction_rows, ranking_agreement,
                                           sweep_groups, write_report)
    result = _sweep_result()
    rows = prediction_rows([result])
    by = {(r["ratio"], r["order"]): r for r in rows}
    assert by[(2.0, "tic")]["scaled_error"] == pytest.approx(1.2 / 1.6 - 1)
    assert by[(0.5, "none")]["overhead_error"] == pytest.approx(0.3)
    # scaled: errors 0, 2.2 %, 5 %, 25 %; overhead: 30 % everywhere
    assert best_model(rows) == "scaled"
    # the largest error decides (the target bounds every point), not the median
    mixed = [{"a_error": e, "b_error": f} for e, f in ((0.01, 0.05), (0.01, 0.06), (0.2, 0.07))]
    assert best_model(mixed) == "b"
    assert best_model([{"a_error": 0.1, "b_error": 0.1}, {"a_error": 0.0, "b_error": 0.05},
                       {"a_error": 0.0, "b_error": 0.05}]) == "a"  # a tie: the median
    assert ranking_agreement(rows, "scaled") == (2, 2)
    assert list(sweep_groups([result])) == ["resnet50/training/W2/P1"]
    assert sweep_groups([_result()]) == {}  # one ratio: no sweep
    path = tmp_path / "s.json"
    path.write_text(json.dumps(result))
    text = open(write_report([str(path)], str(tmp_path / "out"))).read()
    assert "## Simulated against measured step time" in text
    assert ("| resnet50/training/W2/P1 | 50mbit | 2.00 | tic | 1600 | 2080 | +30.0% | 1200 "
            "| -25.0% |") in text
    assert "model scaled: median |error| 5.0%, largest 25.0% (target <= 10 %: MISSED)" in text
    assert "model overhead: median |error| 30.0%" in text
    assert "the sweep plots use, per configuration, the model whose largest |error| on " \
        "it is the smallest (resnet50/training/W2/P1: scaled, median |error| 5.0%, " \
        "largest 25.0%)" in text
    assert "![resnet50/training/W2/P1: gain against comm/comp](sweep-resnet50-training-w2-p1.png)" \
        in text
    assert os.path.getsize(tmp_path / "out" / "sweep-resnet50-training-w2-p1.png") > 1000


def test_report_markdown_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from tictac_hooks.bench.report import text_table, write_report
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_result()))
    md = write_report([str(path)], str(tmp_path / "out"))
    text = open(md).read()
    assert "| resnet50/training/W2/P1 b2 | 100mbit |" in text
    assert "best training gain: tic" in text
    assert os.path.exists(tmp_path / "out" / "throughput.png")
    assert any(p.startswith("cdf-") for p in os.listdir(tmp_path / "out"))
    assert "LOOPBACK FALLBACK" in text_table([_result(shaped=False)])


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.root
def test_quick_bench_on_a_shaped_network(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the benchmark builds network namespaces shaped with tc")
    from tictac_hooks.cluster import netns
    ok, why = netns.available()
    if not ok:
        pytest.skip(f"no shaped network here: {why}")
    out = tmp_path / "quick.json"
    # Popen, for the pid that names the run's namespaces (checked removed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tictac_hooks.cli", "bench", "--quick", "--json", str(out),
         "--schedules", "none,rendezvous,stock,tic,tac,random,layer,declared,checked",
         "--check-rounds", "1", "--check-block-steps", "3"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["network"]["shaped"] is True
    # "layer" is first-use's old name; declared: tf.compat.v1.trainable_variables()
    assert set(result["schedules"]) == {"none", "rendezvous", "stock", "tic", "tac", "random",
                                        "first-use", "declared", "checked"}
    for name, m in result["schedules"].items():
        for key in ("throughput", "step_time_median", "step_time_p95", "step_time_cv",
                    "straggler_pct", "efficiency_median", "violations", "matched"):
            assert key in m, (name, key)
        assert m["throughput"] > 0
    # the gate was bypassed for "stock" only: the orders after it were enforced again
    assert result["schedules"]["stock"]["matched"] is None
    assert result["schedules"]["tic"]["matched"] > 0.9
    # "checked" ran TicTac's order check (1 round: a TIC and a TAC block pair, 3 steps
    # each) and its blocks ran what it kept: that order enforced, or none at all
    check = result["schedules"]["checked"]["check"]
    assert check["steps"] == 12 and check["decision"] in ("tictac", "default"), check
    assert set(check["candidates"]) == {"tic", "tac"}, check
    assert (check["kept"] in ("tic", "tac")) == (check["decision"] == "tictac"), check
    if check["kept"]:
        assert result["schedules"]["checked"]["matched"] > 0.9
    else:
        assert not result["schedules"]["checked"]["matched"]
    assert "[bench mobilenetv2/inference/W2/P1] order check (12 steps" in stderr
    # each round held the calibration blocks, and the simulator got their medians
    from tictac_hooks.bench.predict import load_inputs
    (run,) = result["runs"]
    assert len(run["in_run"]["fast_link_steps"]) == len(run["in_run"]["compute_steps"]) == 4
    assert run["in_run"]["fast_link_s"] > 0 and run["in_run"]["compute_s"] > 0
    assert load_inputs(str(out))[0]["compute_s"] == run["in_run"]["fast_link_s"]
    assert load_inputs(str(out))[0]["reference_s"] == run["in_run"]["compute_s"]
    assert "| mobilenetv2/inference/W2/P1" in stdout
    assert not [ns for ns in netns._namespaces() if ns.startswith(f"{netns.PREFIX}-")
                and ns.split("-")[1] == str(proc.pid)]


def test_unscheduled_transfers_are_listed_with_sizes_and_reasons():
    def step(version, order, unlisted, sizes):
        transfers = tuple(TransferRecord(n, "pass" if n in unlisted else "listed", -1, sizes[n],
                                         1.0, 1.0, -1, 2.0) for n in order)
        return dataclasses.replace(_gate_step(order, 0, 0, version, unlisted),
                                   transfers=transfers)
    sizes = {"a": 10, "b": 400, "c": 30, "d": 5}
    records = [step(1, ["a", "b", "c"], ["b", "c"], sizes),
               step(1, ["a", "b", "c", "d"], ["b", "d"], sizes),
               step(None, ["a", "b"], ["a", "b"], sizes)]  # TensorFlow's order: not counted
    out = metrics.unscheduled_transfers(records, late={"b"}, in_graph={"a", "b", "c"})
    assert [(e["name"], e["bytes"], e["steps"], e["reason"]) for e in out] == [
        ("b", 400, 2, "late"), ("c", 30, 1, "in the DAG, not in the order"),
        ("d", 5, 1, "not in the traced DAG")]


def test_compute_is_measured_once_the_step_time_has_settled():
    from tictac_hooks.bench.client import settled_makespans
    # Start-up steps (allocation, kernel selection) are slow; the median of three
    # settles at 1.0 and is what counts.
    times = iter([3.0, 2.0, 1.6, 1.2, 1.0, 1.0, 1.0, 1.01, 0.99, 1.0, 1.0])
    assert settled_makespans(lambda: next(times), 3, steps=11) == [0.99, 1.0, 1.0]
    # A plateau on the way down does not end it: the lower level counts.
    plateau = iter([3.0, 1.3, 1.3, 1.3, 1.3, 1.3, 1.0, 1.0, 1.0, 1.0])
    assert settled_makespans(lambda: next(plateau), 2, steps=10) == [1.0, 1.0]
    # A slow spike after settling does not count; one fast step alone does not either.
    spiky = iter([1.0, 1.0, 1.0, 1.6, 1.7, 0.2, 1.9, 1.8])
    assert statistics.median(settled_makespans(lambda: next(spiky), 3, steps=8)) == 1.0
    # The number of steps: as asked, and at least two windows.
    calls = []
    assert settled_makespans(lambda: calls.append(1) or 1.0, 5, steps=4) == [1.0] * 5
    assert len(calls) == 10


def test_calibration_blocks_measure_the_fast_link_and_the_compute_in_the_rounds(monkeypatch):
    from tictac_hooks.bench import client
    asked = []
    monkeypatch.setattr(client, "_ask", lambda event: asked.append(event) or "shaped")

    class Runner:  # steps of 1.1, 1.2, ... s over the link, 0.5 s with no transfer
        def __init__(self):
            self.calls = []

        def step(self, which):
            self.calls.append(("step", which))
            return ClientStep("", 1.0 + 0.1 * len(self.calls), ())

        def compute_step(self):
            self.calls.append(("compute", None))
            return ClientStep("", 0.5, ())
    cfg = {"shaped": True, "profile_rate_bits": 1e11, "settle_steps": 1, "block_steps": 3}
    r = Runner()
    fast = client._calibration_block(cfg, r, client.FAST_LINK, 2e9)
    # the link goes to the profiling rate for the block and back to the run's rate; the
    # settle step is not measured
    assert asked == [{"event": "reshape", "rate_bits": 1e11},
                     {"event": "reshape", "rate_bits": 2e9}]
    assert fast == pytest.approx([1.2, 1.3, 1.4]) and r.calls == [("step", 0)] * 4
    asked.clear()
    assert client._calibration_block(cfg, r, client.NO_TRANSFER, 2e9) == [0.5] * 3
    assert not asked  # the compute reference moves nothing: no reshape
    # a failing step still gives the link back its rate
    r.step = lambda which: 1 / 0
    with pytest.raises(ZeroDivisionError):
        client._calibration_block(cfg, r, client.FAST_LINK, 2e9)
    assert asked[-1] == {"event": "reshape", "rate_bits": 2e9}
    asked.clear()
    client._calibration_block(dict(cfg, shaped=False), Runner(), client.FAST_LINK, 2e9)
    assert not asked  # loopback: nothing to reshape
    # the medians the simulator gets, and none without both kinds of block
    got = client.in_run_compute({client.FAST_LINK: [0.3, 0.1, 0.2],
                                 client.NO_TRANSFER: [0.05, 0.07]})
    assert got["fast_link_s"] == pytest.approx(0.2) and got["compute_s"] == pytest.approx(0.06)
    assert client.in_run_compute({client.FAST_LINK: [0.3], client.NO_TRANSFER: []}) is None


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


def test_report_gives_the_error_beyond_the_measured_medians_interval():
    from tictac_hooks.bench.report import _beyond_interval, prediction_rows, prediction_section
    result = _sweep_result()
    for run in result["runs"]:  # 20 steps from 0.90x to 1.09x each median
        run["step_times"] = {n: [v[0] * (0.9 + 0.01 * i) for i in range(20)]
                             for n, v in run["step_times"].items()}
    rows = prediction_rows([result])
    tic2 = next(r for r in rows if r["ratio"] == 2.0 and r["order"] == "tic")
    assert tic2["interval"] == pytest.approx((1.6 * 0.95, 1.6 * 1.04))
    # scaled predicts 1.2 s for tic at 2 (measured 1.6): 21 % below the interval's low end
    beyond = _beyond_interval(rows, "scaled")
    assert beyond[-1] == pytest.approx((1.6 * 0.95 - 1.2) / (1.6 * 0.95))
    assert beyond[0] == 0.0  # 0.92 s for tic at 0.5 (measured 0.9) is inside
    text = "\n".join(prediction_section([result]))
    assert "outside the measured median's 95 % interval by at most 21.1% over 4 points " \
           "(within 10 % of the interval: MISSED)" in text
    # overhead predicts 1.3x every median: 25 % above each interval's high end (1.04x)
    assert "by at most 25.0% over 4 points (within 10 % of the interval: MISSED)" in text


def test_report_names_the_compute_the_simulator_got_per_run():
    from tictac_hooks.bench.report import prediction_section
    result = _sweep_result()
    result["compute"] = {"fast_link_s": 0.27, "compute_s": 0.14}
    result["runs"][0]["in_run"] = {"fast_link_s": 0.31, "compute_s": 0.15}
    text = "\n".join(prediction_section([result]))
    assert "| resnet50/training/W2/P1 | 200mbit | 310 | 270 | 150 | 140 |" in text
    # that run had no calibration blocks: no row
    assert "| 50mbit |" not in text.split("fast link ms")[1]
    del result["compute"]  # no profiling-phase values: a dash, not 0
    assert "| resnet50/training/W2/P1 | 200mbit | 310 | - | 150 | - |" in \
        "\n".join(prediction_section([result]))


def test_readme_block_is_generated_between_its_markers():
    from tictac_hooks.bench.report import (README_BEGIN, README_END, readme_block,
                                           replace_readme_block)
    block = readme_block([_sweep_result()], "benchmarks/results/sweep", "bench_tictac.py x")
    assert block[0] == README_BEGIN and block[-1] == README_END
    text = "\n".join(block)
    assert "by `bench_tictac.py x`" in text and "best training gain: tic" in text
    assert "model scaled: median |error| 5.0%" in text
    assert "(benchmarks/results/sweep/sweep-resnet50-training-w2-p1.png)" in text
    readme = f"# R\n\nhand-written\n\n{README_BEGIN}\nold\n{README_END}\n\nafter\n"
    new = replace_readme_block(readme, block)
    assert "old" not in new and "hand-written" in new and new.endswith("\n\nafter\n")
    assert replace_readme_block(new, block) == new  # idempotent
    with pytest.raises(ValueError, match="no <!-- bench-results:begin -->"):
        replace_readme_block("# R\n", block)


def test_gain_errors_compare_the_gains_over_the_gate_with_no_order():
    from tictac_hooks.bench.report import gain_errors
    result = _sweep_result()
    run = result["runs"][0]
    run["schedules"]["rendezvous"] = dict(run["schedules"]["none"])  # 1.0 s a step
    run["predicted_step_s"]["scaled"]["rendezvous"] = 1.0
    # tic measured 0.9 s (+11.1 %), simulated 0.92 s (+8.7 %)
    ((name, measured, simulated),) = gain_errors([result], "scaled")
    assert name == "tic"
    assert measured == pytest.approx(100 * (1 / 0.9 - 1), rel=1e-3)
    assert simulated == pytest.approx(100 * (1 / 0.92 - 1), rel=1e-6)
    assert gain_errors([result], "overhead") == []  # no prediction for the gate there


def test_targets_compare_tictac_with_layer_order_per_run():
    from tictac_hooks.bench.report import targets
    result = _sweep_result()
    for run, layer_step in zip(result["runs"], (0.8, 1.7)):  # tic 0.9 s and 1.6 s
        run["schedules"]["layer"] = metrics.summarize(
            [ClientStep("layer", layer_step, (layer_step,) * 2)] * 4, 4, 0.5, 0.5)
    (line,) = [t for t in targets([result]) if "against layer order" in t]
    assert "at least as fast on 1 of 2 runs (behind: resnet50/training/W2/P1 @ 200mbit" in line
    assert ">= 3 % faster on 1 (resnet50/training/W2/P1 @ 50mbit +6.2 %)" in line


def test_comm_bytes_are_what_each_ps_served_a_worker_per_step():
    from tictac_hooks.bench.client import served_bytes_per_ps
    base = _gate_step(["a"], violations=0, skips=0, version=None)
    recs = [dataclasses.replace(base, ps=ps, step_id=s, bytes=b)
            for ps, s, b in (("p0", 1, 100), ("p0", 2, 120), ("p0", 3, 90), ("p1", 1, 40),
                             ("p1", 2, 0))]  # a step with nothing served does not count
    assert served_bytes_per_ps(recs, ["p0", "p1"]) == [100.0, 40.0]
    assert served_bytes_per_ps(recs, ["p0", "p1", "p2"]) is None  # p2 recorded nothing


def test_bytes_per_transfer_names_each_edge_of_a_tensor_sent_over_two():
    from tictac_hooks.records import TransferRecord, bytes_per_transfer
    def rec(step, *sizes):
        return dataclasses.replace(
            _gate_step([], violations=0, skips=0, version=None), step_id=step,
            transfers=tuple(TransferRecord(n, "pass", -1, b, 0.0, 0.0, -1, 0.0,
                                           tensor=tensor)
                            for n, b, tensor in sizes))
    records = [
        # an older gate, no order installed: both edges of "w" under its node name
        rec(1, ("w", 400, ""), ("w", 8, ""), ("v", 100, "")),
        # an order naming the edges: the gate records each by its own name
        rec(2, ("edge_1_w", 400, ""), ("edge_2_w", 8, ""), ("v", 120, ""), ("other", 5, "")),
        rec(3, ("edge_1_w", 402, ""), ("edge_2_w", 8, ""), ("v", 110, "")),
    ]
    names = ["edge_1_w", "edge_2_w", "v", "absent"]
    assert bytes_per_transfer(records, names) == {"edge_1_w": 401.0, "edge_2_w": 8.0,
                                                  "v": 110.0}
    assert bytes_per_transfer(records[:1], ["w"]) == {}  # ambiguous in every step
    # no order installed, the gate saying which edge each copy was
    profiled = [rec(4, ("w", 398, "edge_1_w"), ("w", 8, "edge_2_w"), ("v", 100, ""))]
    assert bytes_per_transfer(profiled) == {"edge_1_w": 398.0, "edge_2_w": 8.0, "v": 100.0}
    # an errored call says nothing about its size
    failed = [dataclasses.replace(profiled[0], transfers=(
        dataclasses.replace(profiled[0].transfers[0], error="CANCELLED"),))]
    assert bytes_per_transfer(failed) == {}


def test_prediction_times_each_recv_by_its_own_served_bytes():
    from tictac_hooks.bench.predict import predictions, timed
    from tictac_hooks.graph import Graph, Op, Schedule
    # a tensor over two edges: the trace gives both 300 B; the PS serves one 300 B, the
    # other (feeding only z, the backward) 0 B
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100),
               Op("e1", "recv", channel="ps:0", bytes=300),
               Op("e2", "recv", channel="ps:0", bytes=300),
               Op("x", "compute", ("a", "e1")), Op("z", "compute", ("x", "e2"))])
    compute = {"x": 1.0, "z": 1.0}
    known = {"e1": 300.0, "e2": 0.0}
    # served 400 B: e1 and e2 take what they were served, a the rest (100 B)
    t = timed(g, compute, 1.0, 100.0, served={"ps:0": 400.0}, transfer_bytes=known)
    assert [t[n].time for n in ("a", "e1", "e2")] == pytest.approx([1.0, 3.0, 0.0])
    # without them the channel's 700 traced bytes are scaled to 400 (4/7 each)
    t = timed(g, compute, 1.0, 100.0, served={"ps:0": 400.0})
    assert [t[n].time for n in ("a", "e1", "e2")] == pytest.approx([4 / 7, 12 / 7, 12 / 7])
    # the channel left short: the unknown recvs get nothing, never a negative time
    t = timed(g, compute, 1.0, 100.0, served={"ps:0": 250.0}, transfer_bytes=known)
    assert t["a"].time == 0.0
    # an order that sends the empty copy last: the forward waits for a and e1 only
    order = Schedule.from_order("tic", ["a", "e1", "e2"])
    step = predictions({"tic": [(g, order)]}, compute, 2.0, 8 * 100.0, 1, 1,
                       served={"ps:0": 400.0}, transfer_bytes=known)["tic"]
    assert step == pytest.approx(1.0 + 3.0 + 1.0 + 1.0)  # a, e1, then x, z


def test_prediction_uses_the_bytes_the_ps_served_and_the_fair_share_of_the_link():
    from tictac_hooks.bench.predict import OVERHEAD, SCALED, predictions, timed
    from tictac_hooks.graph import Graph, Op, Schedule
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100), Op("b", "recv", channel="ps:0",
                                                               bytes=300),
               Op("x", "compute", ("a",)), Op("y", "compute", ("x", "b"))])
    compute = {"x": 1.0, "y": 1.0}
    t = timed(g, compute, 2.0, 100.0, served={"ps:0": 200.0})  # traced 400 B, served 200
    assert [op.time for op in t.ops] == [0.5, 1.5, 2.0, 2.0]
    order = Schedule.from_order("tic", ["a", "b"])
    # 2 workers share the link: 800 B/s -> 400 B/s each; a 0.25 s, b 0.75 s after it.
    steps = predictions({"tic": [(g, order)] * 2}, compute, 4.0, 8 * 800.0, workers=2, ps=1,
                        served={"ps:0": 400.0})
    # compute scaled to 4 s (2 s per op): x [0.25, 2.25], y [2.25, 4.25]
    assert steps["tic"] == pytest.approx(4.25)
    overhead = predictions({"tic": [(g, order)]}, compute, 4.0, 8 * 800.0, workers=2, ps=1,
                           model=OVERHEAD, served={"ps:0": 400.0})
    # ops at their traced 1 s (x [0.25, 1.25], y [1.25, 2.25]) + the 2 s untraced after
    assert overhead["tic"] == pytest.approx(4.25)
    with pytest.raises(ValueError, match="model must be"):
        predictions({"tic": [(g, order)]}, compute, 4.0, 800.0, 1, 1, model="x")
    assert SCALED != OVERHEAD
    # TensorFlow's order (no schedule): SHARED, a and b sent at once on 400 B/s, a done
    # at 0.5 s, b at 1.0 s; SERIAL, a random order per seed: a then b (a 0.25, b 1.0),
    # or b then a (b 0.75, a 1.0), so x starts at 0.25 or 1.0 s.
    none = {"none": [(g, None)]}
    shared = predictions(none, compute, 4.0, 8 * 800.0, 2, 1, served={"ps:0": 400.0})
    assert shared["none"] == pytest.approx(0.5 + 4.0)
    serial = predictions(none, compute, 4.0, 8 * 800.0, 2, 1, model="scaled-serial",
                         served={"ps:0": 400.0}, seeds=64)
    assert 4.25 + 0.1 < serial["none"] < 5.0 - 0.1  # between the two orders' 4.25 / 5.0
    # an installed order is modelled the same either way
    assert predictions({"tic": [(g, order)]}, compute, 4.0, 8 * 800.0, 2, 1,
                       model="scaled-serial", served={"ps:0": 400.0}) == pytest.approx(
        predictions({"tic": [(g, order)]}, compute, 4.0, 8 * 800.0, 2, 1,
                    served={"ps:0": 400.0}))


def test_cpu_model_puts_the_transfers_cpu_after_each_pull_and_before_each_push():
    from tictac_hooks.bench.predict import CPU, predictions, with_transfer_cpu
    from tictac_hooks.graph import Graph, Op, Schedule
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100), Op("b", "recv", channel="ps:0",
                                                               bytes=300),
               Op("x", "compute", ("a",)), Op("y", "compute", ("x", "b"))])
    timed_g = g.with_times({"a": 1.0, "b": 3.0, "x": 1.0, "y": 1.0})  # 100 B/s
    cpu_g, pushes = with_transfer_cpu(timed_g, {"y": ("ps:0", 2.0), "gone": ("ps:0", 1.0)},
                                      100.0, 0.01)
    assert cpu_g["x"].inputs == ("a/cpu",) and cpu_g["y"].inputs == ("x", "b/cpu")
    assert cpu_g["a/cpu"].time == pytest.approx(1.0)   # 100 B x 0.01 s/B
    assert cpu_g["b/cpu"].time == pytest.approx(3.0)
    assert cpu_g["y/send_cpu"].time == pytest.approx(2.0) and cpu_g["y/send_cpu"].inputs == ("y",)
    assert pushes == {"y/send_cpu": ("ps:0", 2.0), "gone": ("ps:0", 1.0)}  # a node it lacks
    # One worker, 800 bit/s = 100 B/s; reference 2 s (x, y 1 s each), fast-link step 6 s:
    # 4 s of transfer CPU over the 400 B pulled, 0.01 s/B. a [0, 1], a/cpu [1, 2],
    # x [2, 3], b [1, 4], b/cpu [4, 7], y [7, 8].
    order = Schedule.from_order("tic", ["a", "b"])
    compute = {"x": 1.0, "y": 1.0}
    steps = predictions({"tic": [(g, order)]}, compute, 6.0, 800.0, 1, 1, model=CPU,
                        reference_s=2.0)
    assert steps["tic"] == pytest.approx(8.0)
    # at a link 10x faster the wire hides nothing: 2 s compute + 4 s CPU + a's 0.1 s wait
    fast = predictions({"tic": [(g, order)]}, compute, 6.0, 8000.0, 1, 1, model=CPU,
                       reference_s=2.0)
    assert fast["tic"] == pytest.approx(6.1)
    with pytest.raises(ValueError, match="needs reference_s"):
        predictions({"tic": [(g, order)]}, compute, 6.0, 800.0, 1, 1, model=CPU)


def test_saved_simulator_inputs_repredict_the_same_steps_and_rebuild_the_report(tmp_path):
    pytest.importorskip("matplotlib")
    from tictac_hooks.bench.predict import (MODELS, inputs_to_json, load_inputs, predictions,
                                            repredict, save_inputs)
    from tictac_hooks.bench.report import load_results
    from tictac_hooks.graph import Graph, Op, Schedule
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100), Op("b", "recv", channel="ps:0",
                                                               bytes=300),
               Op("x", "compute", ("a",)), Op("y", "compute", ("x", "b"))])
    h = g.with_recvs_only({"b"})
    orders = {"tic": [(g, Schedule.from_order("tic", ["a", "b"]))] * 2,
              "none": [(g, None), (h, None)]}
    compute, pushes = {"x": 1.0, "y": 1.0, "unused": 9.0}, [{"y": ("ps:0", 50)}] * 2
    align = {"tic": False, "none": True}
    sizes = {"a": 50.0}
    data = inputs_to_json(orders, compute, 6.0, 800.0, 2, 1, {"ps:0": 400.0}, pushes,
                          align, 2.0, sizes)
    assert len(data["graphs"]) == 2 and "unused" not in data["compute"]  # each DAG once
    data = json.loads(json.dumps(data))
    again = repredict(data)
    assert set(again) == set(MODELS)
    for model in MODELS:
        direct = predictions(orders, compute, 6.0, 800.0, 2, 1, model=model,
                             served={"ps:0": 400.0}, pushes=pushes, align=align,
                             reference_s=2.0, transfer_bytes=sizes)
        assert again[model] == pytest.approx(direct), model
    # inputs saved before the per-transfer bytes (version 1) still re-predict
    old = dict(data, version=1)
    del old["transfer_bytes"]
    assert repredict(old)["scaled"] == pytest.approx(predictions(
        orders, compute, 6.0, 800.0, 2, 1, served={"ps:0": 400.0}, pushes=pushes,
        align=align))
    assert "cpu" not in repredict(dict(data, reference_s=None))
    with pytest.raises(ValueError, match="version"):
        repredict(dict(data, version=0))
    # a result with its inputs saved beside it: --repredict replaces its predictions
    result = _sweep_result()
    result["runs"] = result["runs"][:1]
    path = str(tmp_path / "r.json")
    with open(path, "w") as f:
        json.dump(result, f)
    assert load_inputs(path) is None
    assert load_results([path], repredict=True)[0] == result  # nothing saved: unchanged
    save_inputs(path, [data])
    assert load_inputs(path) == [data]
    (run,) = load_results([path], repredict=True)[0]["runs"]
    assert run["predicted_step_s"] == again
    assert load_results([path])[0]["runs"][0]["predicted_step_s"] == \
        result["runs"][0]["predicted_step_s"]
    save_inputs(path, [data, data])
    with pytest.raises(ValueError, match="1 runs but simulator inputs for 2"):
        load_results([path], repredict=True)


def test_pushes_end_the_step_when_the_last_has_crossed():
    from tictac_hooks.bench.predict import assign_pushes, predictions, pushed_makespan
    from tictac_hooks.graph import Graph, Op, Schedule
    from tictac_hooks.graph.simulate import simulate
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100, time=1.0),
               Op("x", "compute", ("a",), time=1.0), Op("y", "compute", ("x",), time=1.0)])
    sim = simulate(g)  # a [0, 1], x [1, 2], y [2, 3]
    assert sim.finish == {"a": 1.0, "x": 2.0, "y": 3.0}
    assert pushed_makespan(sim, {}) == 3.0
    # x's gradient leaves at 2 s and takes 0.5 s: inside the compute, no tail
    assert pushed_makespan(sim, {"x": ("ps:0", 0.5)}) == 3.0
    # two pushes on one channel go one after the other: x at 2 -> 3.5, y at 3 -> 4.5
    assert pushed_makespan(sim, {"x": ("ps:0", 1.5), "y": ("ps:0", 1.0)}) == 4.5
    # on two channels they overlap; a node the DAG lacks leaves at the compute's end
    assert pushed_makespan(sim, {"x": ("ps:0", 1.5), "y": ("ps:1", 1.0)}) == 4.0
    assert pushed_makespan(sim, {"gone": ("ps:0", 1.0)}) == 4.0
    # each DAG gets the pushes that leave its own nodes
    h = Graph([Op("b", "recv", channel="ps:0", bytes=100), Op("z", "compute", ("b",))])
    mine, theirs = {"z": ("ps:0", 7)}, {"y": ("ps:0", 5)}
    assert assign_pushes([g, h], [mine, theirs]) == [theirs, mine]
    assert assign_pushes([g, h], [{"q": ("ps:0", 1)}, {}]) == [{"q": ("ps:0", 1)}, {}]
    with pytest.raises(ValueError, match="pushes of 1 workers for 2"):
        assign_pushes([g, h], [mine])
    # in a prediction, on the worker's fair share: 100 B at 100 B/s is 1 s after y
    order = Schedule.from_order("tic", ["a"])
    compute = {"x": 1.0, "y": 1.0}
    plain = predictions({"tic": [(g, order)]}, compute, 2.0, 8 * 100.0, 1, 1)
    pushed = predictions({"tic": [(g, order)]}, compute, 2.0, 8 * 100.0, 1, 1,
                         pushes=[{"y": ("ps:0", 100)}])
    assert pushed["tic"] == pytest.approx(plain["tic"] + 1.0)


def test_joint_model_serves_the_workers_of_a_step_on_one_channel():
    from tictac_hooks.bench.predict import joint, joint_step
    from tictac_hooks.graph import Graph, Op, Schedule
    # per worker: a 1 s and a 1 s pull, compute 1 s after each; one PS channel for both
    g = Graph([Op("a", "recv", channel="ps:0", time=1.0), Op("b", "recv", channel="ps:0", time=1.0),
               Op("x", "compute", ("a",), time=1.0), Op("y", "compute", ("x", "b"), time=1.0)])
    order = Schedule.from_order("tic", ["a", "b"])
    graph, schedule, resources = joint([(g, order), (g, order)], align=True)
    assert len(graph) == 8 and resources["w1/x"] == "w1" and "w0/a" not in resources
    assert list(schedule.order) == ["w0/a", "w1/a", "w0/b", "w1/b"]
    _, staggered, _ = joint([(g, order), (g, order)], align=False)
    assert list(staggered.order) == ["w0/a", "w0/b", "w1/a", "w1/b"]
    # aligned: a's at 1, 2, b's at 3, 4: w0's y 3-4, w1's y 4-5
    assert joint_step([(g, order)] * 2, None, align=True, seeds=1) == 5.0
    # staggered: w0's a, b at 1, 2 (y 2-3), w1's at 3, 4 (x 3-4, y 4-5)
    assert joint_step([(g, order)] * 2, None, align=False, seeds=1) == 5.0
    # each worker computes on its own processor: one worker alone ends at 3
    assert joint_step([(g, order)], None, align=True, seeds=1) == 3.0
    # the pushes of both workers share the PS's ingress, 2 s each after its y: served
    # one after the other, w0 pushes while w1 still pulls (3-5, 5-7); aligned, both
    # wait to the end (4-6, 6-8). This is what makes the staggered service faster.
    pushes = [{"y": ("ps:0", 2.0)}, {"y": ("ps:0", 2.0)}]
    assert joint_step([(g, order)] * 2, pushes, align=False, seeds=1) == 7.0
    assert joint_step([(g, order)] * 2, pushes, align=True, seeds=1) == 8.0


def test_relaunch_overhead_rounds_rotate_and_ratio_each_round_to_its_plain_launch():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "bench_shaped_overhead.py")
    spec = importlib.util.spec_from_file_location("bench_shaped_overhead", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    orders = list(mod.rotations(4))
    # every round launches each kind once; each kind takes each position once in 3 rounds
    assert all(sorted(o) == sorted(mod.KINDS) for o in orders)
    assert {o[0] for o in orders[:3]} == set(mod.KINDS)
    assert orders[3] == orders[0]
    steps = {"plain": [[1.0, 1.2, 1.0], [2.0, 2.0, 9.0]],  # launch medians 1.0 and 2.0
             "gate": [[1.01, 1.01, 5.0], [2.04, 2.04, 2.0]],
             "plain again": [[0.99, 0.99, 0.99], [2.0, 2.0, 2.0]]}
    ratios = mod.relaunch_ratios(steps)
    assert ratios["gate"] == pytest.approx([1.01, 1.02])
    assert ratios["plain again"] == pytest.approx([0.99, 1.0])
    assert "plain" not in ratios
    # the CPU bound: PS CPU per step of each kind over all its blocks, the gate's extra
    # as a share of the plain median step (1.6 s here: the median of the six steps)
    cpu = {"plain": [0.3, 0.3], "gate": [0.33, 0.33], "plain again": [0.3, 0.24]}
    b = mod.cpu_bound(steps, cpu)
    assert b["cpu_per_step"]["gate"] == pytest.approx(0.11)
    assert b["gate_extra"] == pytest.approx(0.01) and b["aa_extra"] == pytest.approx(-0.01)
    assert b["plain_step"] == pytest.approx(1.6) and b["bound"] == pytest.approx(0.01 / 1.6)
    # this process's CPU seconds, as /proc reports them: positive, and they grow
    t0 = mod.process_cpu_s(os.getpid())
    sum(i * i for i in range(3_000_000))
    assert mod.process_cpu_s(os.getpid()) > t0 > 0


def test_gains_count_against_the_fastest_baseline_stock_included():
    from tictac_hooks.bench.report import smallest_gain, targets
    result = _sweep_result()
    run = result["runs"][0]  # none 1.0 s a step, tic 0.9 s
    assert smallest_gain(run, "tic") == pytest.approx(100 * (1 / 0.9 - 1))
    # TensorFlow's own code in the gated PS ran faster than the twin: it is the baseline
    run["schedules"]["stock"] = metrics.summarize(
        [ClientStep("stock", 0.95, (0.95,) * 2)] * 4, 4, 0.5, 0.5)
    assert smallest_gain(run, "tic") == pytest.approx(100 * (0.95 / 0.9 - 1))
    line = next(t for t in targets([result]) if "@ 200mbit: throughput" in t)
    assert "tic +5.6 % (over the fastest of none, stock)" in line
    assert smallest_gain(run, "absent") is None


def test_targets_tally_cv_only_where_the_default_varies_and_stragglers_and_e():
    from tictac_hooks.bench.report import targets
    result = _sweep_result()
    slow, steady = result["runs"]
    # run 1: the default varies (CV 0.1), tic much less (CV 0.01): a 10x cut
    slow["schedules"]["none"] = metrics.summarize(
        [ClientStep("none", t, (t, t)) for t in (0.9, 1.1, 0.9, 1.1)], 4, 0.5, 0.5)
    slow["schedules"]["tic"] = metrics.summarize(
        [ClientStep("tic", t, (t, t)) for t in (0.891, 0.909, 0.891, 0.909)], 4, 0.5, 0.5)
    slow["vs_default"] = metrics.compare(slow["schedules"])
    lines = targets([result])
    run1 = next(t for t in lines if "@ 200mbit: throughput" in t)
    run2 = next(t for t in lines if "@ 50mbit: throughput" in t)
    assert "(default's CV 0.115; target >= 3x)" in run1  # sample std
    assert "(default's CV 0.000 <= 0.03: no target)" in run2  # steady default: none to cut
    (cv,) = [t for t in lines if t.startswith("- step-time CV cut")]
    assert "met on 1 of 1 runs (resnet50/training/W2/P1 @ 200mbit); best 10.00" in cv
    (e,) = [t for t in lines if t.startswith("- median E")]
    assert "of 2 runs" in e


def test_checked_schedule_is_held_to_never_more_than_1_pct_slower():
    from tictac_hooks.bench.report import checked_targets, targets
    result = _sweep_result()
    assert checked_targets([result]) == []  # no run had the schedule
    fast, slow = result["runs"]  # none 1.0 / 2.0 s a step
    for run, t, kept in ((fast, 1.005, None), (slow, 1.6, "tic")):
        run["schedules"]["checked"] = metrics.summarize(
            [ClientStep("checked", t, (t,) * 2)] * 4, 4, 0.5, 0.5)
        run["schedules"]["checked"]["check"] = {"decision": "tictac" if kept else "default",
                                                "kept": kept, "steps": 240,
                                                "candidates": {"tic": 0.95, "tac": 0.9}}
    line = checked_targets([result])[0]
    assert line.startswith("- with TicTac's order check on (schedule checked): worst -0.5 % "
                           "on resnet50/training/W2/P1 @ 200mbit")
    assert ": met (" in line and "kept TensorFlow's order, -0.5 %" in line
    # 60 steps each at 1/0.95 and 1/0.9 of TensorFlow's step time, every 5000 + 240 steps
    cost = 100 * 60 * (1 / 0.95 - 1 + 1 / 0.9 - 1) / 5240
    assert f"the check itself {cost:+.2f} % of the time over 5000 steps" in line
    assert "kept tic, +25.0 % over the fastest baseline" in line
    # per round, against the fastest baseline's block of the same round (blocks of 2)
    fast["step_times"]["checked"] = [1.0, 1.0, 1.1, 1.1]  # none: 1.0 s a step
    assert "(per round against none: median -4.5 %, -9.1 to +0.0 % over 2 rounds)" in \
        checked_targets([result])[0]
    fast["schedules"]["checked"]["throughput"] *= 0.98  # now 2.5 % slower than the default
    assert ": MISSED (" in checked_targets([result])[0]
    assert checked_targets([result])[0] in targets([result])


def test_table_gives_the_wire_time_over_the_compute_reference():
    from tictac_hooks.bench.report import text_table, wire_compute
    result = _result()
    run = result["runs"][0]
    assert wire_compute(run) is None  # a result from before the compute reference
    assert "| 100mbit | 1.00 | - | none |" in text_table([result])
    run.update(comm_s=0.5, compute_s=0.2)
    assert wire_compute(run) == pytest.approx(2.5)
    assert "| 100mbit | 1.00 | 2.50 | none |" in text_table([result])


class _OneHostCluster:
    """What the bench driver asks of a cluster, with ``spawn_in`` running a stand-in for
    the benchmark client: it saves its first bandwidth the way the client does, then
    hangs where the second would be measured."""
    ps_addresses = ["localhost:1"]
    worker_addresses = ["localhost:2"]
    tasks: list = []

    def __init__(self, saves_a_bandwidth: bool):
        self.saves = saves_a_bandwidth

    def child_env(self):
        return dict(os.environ)

    def spawn_in(self, host, argv, **kw):
        code = ("import json, sys, time\n"
                "from tictac_hooks.bench.client import save_result\n"
                "cfg = json.load(open(sys.argv[1]))\n"
                + ("save_result(cfg['out'], {'runs': [{'rate_bits': 4e8}], "
                   "'compute': {}})\n" if self.saves else "")
                + "time.sleep(60)\n")
        return subprocess.Popen([sys.executable, "-c", code, argv[-1]], cwd=ROOT, **kw)


def test_a_run_cut_short_keeps_the_bandwidths_it_finished(tmp_path):
    from tictac_hooks.bench.runner import _drive
    said = []
    cfg = {"interposed_tasks": [0], "direct_tasks": [], "out": str(tmp_path / "r.json")}
    result = _drive(_OneHostCluster(True), cfg, str(tmp_path), 3.0, None, said.append)
    assert result["runs"] == [{"rate_bits": 4e8}]
    assert result["incomplete"] == "the benchmark client did not finish within 3 s (--timeout)"
    assert "keeping the 1 bandwidth(s) it finished (400 Mbit/s)" in said[-1]
    os.remove(cfg["out"])
    with pytest.raises(TimeoutError, match="before any bandwidth was measured"):
        _drive(_OneHostCluster(False), cfg, str(tmp_path), 3.0, None, said.append)
    from tictac_hooks.bench.report import text_table
    cut = dict(_result(), incomplete=result["incomplete"])
    assert "**INCOMPLETE** (resnet50/training/W2/P1: the benchmark client did not finish" \
        in text_table([cut])
    assert "INCOMPLETE" not in text_table([_result()])
