"""bench/report.py: the Markdown tables, the expected figures, the simulator's fit and
the plots, from BenchRun records."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys

import pytest

from tictac_hooks.bench import metrics
from tictac_hooks.records import ClientStep, CheckSummary, InRunCompute, ProfiledCompute

from .results import result as _result, sweep_result as _sweep_result, with_run


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
    path.write_text(json.dumps(result.to_json()))
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
    path.write_text(json.dumps(_result().to_json()))
    md = write_report([str(path)], str(tmp_path / "out"))
    text = open(md).read()
    assert "| resnet50/training/W2/P1 b2 | 100mbit |" in text
    assert "best training gain: tic" in text
    assert os.path.exists(tmp_path / "out" / "throughput.png")
    assert any(p.startswith("cdf-") for p in os.listdir(tmp_path / "out"))
    assert "LOOPBACK FALLBACK" in text_table([_result(shaped=False)])


def test_report_gives_the_error_beyond_the_measured_medians_interval():
    from tictac_hooks.bench.report import _beyond_interval, prediction_rows, prediction_section
    result = _sweep_result()
    for i, run in enumerate(result.runs):  # 20 steps from 0.90x to 1.09x each median
        result = with_run(result, i, step_times={
            n: [v[0] * (0.9 + 0.01 * i) for i in range(20)] for n, v in run.step_times.items()})
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
    result = dataclasses.replace(result, compute=ProfiledCompute(
        comp_s=0.27, compute_s=0.14, fast_link_s=0.27, trace_op_sum_s=0.2))
    result = with_run(result, 0, in_run=InRunCompute(0.31, 0.15, (0.31,), (0.15,)))
    text = "\n".join(prediction_section([result]))
    assert "| resnet50/training/W2/P1 | 200mbit | 310 | 270 | 150 | 140 |" in text
    # that run had no calibration blocks: no row
    assert "| 50mbit |" not in text.split("fast link ms")[1]
    result = dataclasses.replace(result, compute=None)  # none: a dash, not 0
    assert "| resnet50/training/W2/P1 | 200mbit | 310 | - | 150 | - |" in \
        "\n".join(prediction_section([result]))


def test_gain_errors_compare_the_gains_over_the_gate_with_no_order():
    from tictac_hooks.bench.report import gain_errors
    result = _sweep_result()
    run = result.runs[0]
    predicted = dict(run.predicted_step_s)
    predicted["scaled"] = dict(predicted["scaled"], rendezvous=1.0)
    result = with_run(result, 0, schedules={"rendezvous": run.schedules["none"]},  # 1.0 s
                      predicted_step_s=predicted)
    # tic measured 0.9 s (+11.1 %), simulated 0.92 s (+8.7 %)
    ((name, measured, simulated),) = gain_errors([result], "scaled")
    assert name == "tic"
    assert measured == pytest.approx(100 * (1 / 0.9 - 1), rel=1e-3)
    assert simulated == pytest.approx(100 * (1 / 0.92 - 1), rel=1e-6)
    assert gain_errors([result], "overhead") == []  # no prediction for the gate there


def test_targets_compare_tictac_with_layer_order_per_run():
    from tictac_hooks.bench.report import targets
    result = _sweep_result()
    for i, layer_step in enumerate((0.8, 1.7)):  # tic 0.9 s and 1.6 s
        result = with_run(result, i, schedules={"layer": metrics.summarize(
            [ClientStep("layer", layer_step, (layer_step,) * 2)] * 4, 4, 0.5, 0.5)})
    (line,) = [t for t in targets([result]) if "against first-use" in t]
    assert "at least as fast on 1 of 2 runs (behind: resnet50/training/W2/P1 @ 200mbit" in line
    assert ">= 3 % faster on 1 (resnet50/training/W2/P1 @ 50mbit +6.2 %)" in line


def test_gains_count_against_the_fastest_baseline_stock_included():
    from tictac_hooks.bench.report import smallest_gain, targets
    result = _sweep_result()
    run = result.runs[0]  # none 1.0 s a step, tic 0.9 s
    assert smallest_gain(run, "tic") == pytest.approx(100 * (1 / 0.9 - 1))
    # TensorFlow's own code in the gated PS ran faster than the twin: it is the baseline
    result = with_run(result, 0, schedules={"stock": metrics.summarize(
        [ClientStep("stock", 0.95, (0.95,) * 2)] * 4, 4, 0.5, 0.5)})
    run = result.runs[0]
    assert smallest_gain(run, "tic") == pytest.approx(100 * (0.95 / 0.9 - 1))
    line = next(t for t in targets([result]) if "@ 200mbit: throughput" in t)
    assert "tic +5.6 % (over the fastest of none, stock)" in line
    assert smallest_gain(run, "absent") is None


def test_targets_tally_cv_only_where_the_default_varies_and_stragglers_and_e():
    from tictac_hooks.bench.report import targets
    result = _sweep_result()
    # run 1: the default varies (CV 0.1), tic much less (CV 0.01): a 10x cut
    schedules = {
        "none": metrics.summarize(
            [ClientStep("none", t, (t, t)) for t in (0.9, 1.1, 0.9, 1.1)], 4, 0.5, 0.5),
        "tic": metrics.summarize(
            [ClientStep("tic", t, (t, t)) for t in (0.891, 0.909, 0.891, 0.909)], 4, 0.5, 0.5)}
    result = with_run(result, 0, schedules=schedules, vs_default=metrics.compare(schedules))
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
    # none 1.0 / 2.0 s a step
    for i, t, kept in ((0, 1.005, None), (1, 1.6, "tic")):
        result = with_run(result, i, schedules={"checked": dataclasses.replace(
            metrics.summarize([ClientStep("checked", t, (t,) * 2)] * 4, 4, 0.5, 0.5),
            check=CheckSummary(decision="tictac" if kept else "default", kept=kept,
                               seconds=60.0, steps=240,
                               candidates={"tic": 0.95, "tac": 0.9}))})
    line = checked_targets([result])[0]
    assert line.startswith("- with TicTac's order check on (schedule checked): worst -0.5 % "
                           "on resnet50/training/W2/P1 @ 200mbit")
    assert ": met (" in line and "kept TensorFlow's order, -0.5 %" in line
    # 60 steps each at 1/0.95 and 1/0.9 of TensorFlow's step time, every 5000 + 240 steps
    cost = 100 * 60 * (1 / 0.95 - 1 + 1 / 0.9 - 1) / 5240
    assert f"the check itself {cost:+.2f} % of the time over 5000 steps" in line
    assert "kept tic, +25.0 % over the fastest baseline" in line
    # per round, against the fastest baseline's block of the same round (blocks of 2)
    fast = result.runs[0]
    result = with_run(result, 0, step_times={**fast.step_times,  # none: 1.0 s a step
                                             "checked": [1.0, 1.0, 1.1, 1.1]})
    assert "(per round against none: median -4.5 %, -9.1 to +0.0 % over 2 rounds)" in \
        checked_targets([result])[0]
    checked = result.runs[0].schedules["checked"]  # now 2.5 % slower than the default:
    result = with_run(result, 0, schedules={"checked": dataclasses.replace(
        checked, throughput=checked.throughput * 0.98)})
    assert ": MISSED (" in checked_targets([result])[0]
    assert checked_targets([result])[0] in targets([result])


def test_table_gives_the_wire_time_over_the_compute_reference():
    from tictac_hooks.bench.report import text_table, wire_compute
    result = _result()
    run = result.runs[0]
    assert wire_compute(run) is None  # a result from before the compute reference
    assert "| 100mbit | 1.00 | - | none |" in text_table([result])
    result = with_run(result, 0, comm_s=0.5, compute_s=0.2)
    run = result.runs[0]
    assert wire_compute(run) == pytest.approx(2.5)
    assert "| 100mbit | 1.00 | 2.50 | none |" in text_table([result])


def test_without_matplotlib_the_report_is_written_and_names_the_extra(tmp_path, monkeypatch):
    from tictac_hooks.bench.report import write_report
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_result().to_json()))
    said = []
    md = write_report([str(path)], str(tmp_path / "out"), say=said.append)
    assert said == ["no plots: matplotlib is not installed "
                    "(pip install 'tictac-hooks[bench]')"]
    text = open(md).read()
    assert "| resnet50/training/W2/P1 b2 | 100mbit |" in text  # the tables all the same
    assert "best training gain: tic" in text
    assert "## Plots" not in text and os.listdir(tmp_path / "out") == ["report.md"]


def test_without_matplotlib_the_cli_prints_one_line_and_the_report(tmp_path, monkeypatch,
                                                                     capsys):
    from tictac_hooks.bench import cli
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_result().to_json()))
    args = argparse.Namespace(inputs=[str(path)], out=str(tmp_path / "out"), repredict=False)
    assert cli._report(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["no plots: matplotlib is not installed (pip install 'tictac-hooks[bench]')",
                   f"wrote {tmp_path / 'out' / 'report.md'}"]


def test_report_header_gives_each_results_commit_and_command(tmp_path):
    pytest.importorskip("matplotlib")
    from tictac_hooks.bench.report import source_line, write_report
    recorded = dataclasses.replace(_result(), commit="0123456789abcdef" * 2 + "01234567",
                                   dirty=True, command="tictac bench --quick")
    assert source_line(recorded) == ("commit 0123456789ab with uncommitted changes, "
                                     "command `tictac bench --quick`")
    assert source_line(dataclasses.replace(recorded, dirty=False)) == \
        "commit 0123456789ab, command `tictac bench --quick`"
    assert source_line(dataclasses.replace(recorded, commit="")) == \
        "commit unknown (not a git checkout), command `tictac bench --quick`"
    assert source_line(_result()) == "commit unknown, command unknown"  # an older result
    for name, res in (("new.json", recorded), ("old.json", _result())):
        (tmp_path / name).write_text(json.dumps(res.to_json()))
    text = open(write_report([str(tmp_path / "new.json"), str(tmp_path / "old.json")],
                             str(tmp_path / "out"))).read()
    (new, old) = [line for line in text.splitlines() if line.startswith("- `")]
    assert new.startswith("- `new.json`: resnet50/training/W2/P1, batch 2/worker")
    assert new.endswith("10 s; commit 0123456789ab with uncommitted changes, command "
                        "`tictac bench --quick`")
    assert old.endswith("10 s; commit unknown, command unknown")


RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks", "results")


def test_the_results_kept_in_the_repository_still_make_a_report(tmp_path, monkeypatch):
    from tictac_hooks.bench.report import load_results, write_report
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the tables only: fast
    paths = sorted(glob.glob(os.path.join(RESULTS, "sweep", "*.json")))
    if not paths:
        pytest.skip("no sweep results in this checkout")
    results = load_results(paths)
    assert all(r.commit == "" and r.command == "" for r in results)  # written before both
    text = open(write_report(paths, str(tmp_path), say=lambda m: None)).read()
    assert "## Simulated against measured step time" in text
    assert text.count("commit unknown, command unknown") == len(paths)


def test_a_configuration_without_predictions_beside_one_with_them():
    from tictac_hooks.bench.report import best_models, prediction_rows, prediction_section
    unpredicted = dataclasses.replace(
        _result(), config=dataclasses.replace(_result().config, label="vgg16/inference/W1/P1"))
    results = [_sweep_result(), unpredicted]
    assert best_models(prediction_rows(results))["vgg16/inference/W1/P1"] is None
    (line,) = [t for t in prediction_section(results) if t.startswith("- the sweep plots")]
    assert "(resnet50/training/W2/P1: scaled, median |error| 5.0%" in line
    assert "vgg16" not in line
