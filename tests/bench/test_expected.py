"""bench/expected.py: the runs against the expected figures (gains over the fastest
baseline, CV and straggler cuts, E, the peers' orders, the order check's schedule)."""

from __future__ import annotations

import dataclasses

import pytest

from tictac_hooks.bench import metrics
from tictac_hooks.records import CheckSummary, ClientStep

from .results import sweep_result as _sweep_result, with_run


def test_targets_compare_tictac_with_layer_order_per_run():
    from tictac_hooks.bench.expected import targets
    result = _sweep_result()
    for i, layer_step in enumerate((0.8, 1.7)):  # tic 0.9 s and 1.6 s
        result = with_run(result, i, schedules={"layer": metrics.summarize(
            [ClientStep("layer", layer_step, (layer_step,) * 2)] * 4, 4, 0.5, 0.5)})
    (line,) = [t for t in targets([result]) if "against first-use" in t]
    assert "at least as fast on 1 of 2 runs (behind: resnet50/training/W2/P1 @ 200mbit" in line
    assert ">= 3 % faster on 1 (resnet50/training/W2/P1 @ 50mbit +6.2 %)" in line


def test_gains_count_against_the_fastest_baseline_stock_included():
    from tictac_hooks.bench.expected import targets
    from tictac_hooks.bench.gains import smallest_gain
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
    from tictac_hooks.bench.expected import targets
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
    from tictac_hooks.bench.expected import checked_targets, targets
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
