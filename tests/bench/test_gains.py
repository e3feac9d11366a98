"""bench/gains.py: TicTac's gain split at the paced random order into the service's
share and the order's, on runs whose answer is known."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from .results import rate_run, result as _result


def _run(**steps: float):
    """A run whose schedules take the given step times (4 samples a step: throughput
    4 / step)."""
    return rate_run({n.replace("_", "-"): [t] * 4 for n, t in steps.items()})


# The issue's ResNet-50 training run: over TensorFlow's default, TIC +27.8 %, the paced
# random order +22.0 %, first-use ("layer" in older results) +28.0 %.
ISSUE = dict(none=1.278, rendezvous=1.4, tic=1.0, tac=1.05, random=1.278 / 1.22,
             layer=1.278 / 1.28)


def test_decompose_splits_the_gain_at_the_paced_random_order():
    from tictac_hooks.bench.gains import decompose
    d = decompose(_run(**ISSUE))
    assert (d.baseline, d.best) == ("none", "tic")  # the fastest baseline, the faster
    assert d.total_pct == pytest.approx(27.8)
    assert d.service_pct == pytest.approx(22.0)
    assert d.order_pct == pytest.approx(100 * (1.278 / 1.22 - 1))  # +4.75 %
    # the parts multiply to the whole
    assert (1 + d.service_pct / 100) * (1 + d.order_pct / 100) == \
        pytest.approx(1 + d.total_pct / 100)
    assert d.service_share == pytest.approx(math.log(1.22) / math.log(1.278))  # 0.81
    assert d.peers_pct == pytest.approx({"first-use": 100 * (1.28 / 1.22 - 1)})
    # stock faster than the twin: it is the baseline, and the service is counted from it
    d = decompose(_run(**ISSUE, stock=1.2))
    assert d.baseline == "stock"
    assert d.service_pct == pytest.approx(100 * (1.2 / (1.278 / 1.22) - 1))
    # TicTac slower than the baseline: no gain to share
    d = decompose(_run(none=1.0, tic=1.1, random=1.05))
    assert d.order_pct < 0 and d.total_pct < 0 and d.service_share is None
    # a service slower than the baseline (inference at a low comm/comp): no share
    d = decompose(_run(none=1.0, tic=0.9, random=1.05))
    assert d.service_pct < 0 < d.order_pct and d.service_share is None


def test_decompose_needs_random_tictac_and_a_baseline():
    from tictac_hooks.bench.gains import decompose
    assert decompose(_run(none=1.0, tic=0.9)) is None            # no random
    assert decompose(_run(none=1.0, random=0.9)) is None         # no TIC/TAC
    assert decompose(_run(tic=0.9, random=0.95)) is None         # no baseline


def test_the_report_shows_the_decomposition_per_run(tmp_path, monkeypatch):
    import sys
    from tictac_hooks.bench.gains import decomposition_section
    from tictac_hooks.bench.report import write_report
    with_random = dataclasses.replace(_result(), runs=(_run(**ISSUE), _run(none=1.0, tic=0.9)))
    lines = decomposition_section([with_random])
    assert ("| resnet50/training/W2/P1 | 100mbit | 1.00 | none | tic +27.8 % | +22.0 % "
            "| +4.8 % | 81 % | +4.9 % | - |") in lines
    assert ("- resnet50/training/W2/P1 @ 100mbit: TIC +27.8 % over none = +22.0 % from the "
            "service (the paced random order over none) and +4.8 % from the order (TIC over "
            "the paced random order); 81 % of the gain from the service; first-use order "
            "+4.9 % over the paced random order") in lines
    # the run without the paced random order is named, not left out silently
    assert lines[-1] == ("- without the paced random order, TIC/TAC or a baseline (no "
                         "decomposition): resnet50/training/W2/P1 @ 100mbit")
    assert decomposition_section([_result()]) == []  # no run with it: no section
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the tables only
    path = tmp_path / "a.json"
    path.write_text(json.dumps(with_random.to_json()))
    text = open(write_report([str(path)], str(tmp_path / "out"), say=lambda m: None)).read()
    assert "## Where the gain comes from: the service and the order" in text
    assert "+4.8 % from the order (TIC over the paced random order)" in text


def test_every_default_run_has_the_paced_random_order():
    from tictac_hooks.bench.runner import BenchConfig, default_schedules
    for backend in ("native", "proxy"):
        assert "random" in default_schedules(backend)
    for mode in ("training", "inference"):
        assert "random" in BenchConfig(mode=mode).schedules
