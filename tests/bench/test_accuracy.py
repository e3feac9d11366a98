"""bench/accuracy.py: the simulator's step time against the measured one, its error per
model, the ranking of the orders and the compute it was given (and the sweep plot drawn
with the best model)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tictac_hooks.records import InRunCompute, ProfiledCompute

from .results import result as _result, sweep_result as _sweep_result, with_run


def test_prediction_section_errors_ranking_and_sweep_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from tictac_hooks.bench.accuracy import best_model, prediction_rows, ranking_agreement
    from tictac_hooks.bench.plots import sweep_groups
    from tictac_hooks.bench.report import write_report
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


def test_report_gives_the_error_beyond_the_measured_medians_interval():
    from tictac_hooks.bench.accuracy import _beyond_interval, prediction_rows, prediction_section
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
    from tictac_hooks.bench.accuracy import prediction_section
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
    from tictac_hooks.bench.accuracy import gain_errors
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


def test_a_configuration_without_predictions_beside_one_with_them():
    from tictac_hooks.bench.accuracy import best_models, prediction_rows, prediction_section
    unpredicted = dataclasses.replace(
        _result(), config=dataclasses.replace(_result().config, label="vgg16/inference/W1/P1"))
    results = [_sweep_result(), unpredicted]
    assert best_models(prediction_rows(results))["vgg16/inference/W1/P1"] is None
    (line,) = [t for t in prediction_section(results) if t.startswith("- the sweep plots")]
    assert "(resnet50/training/W2/P1: scaled, median |error| 5.0%" in line
    assert "vgg16" not in line
