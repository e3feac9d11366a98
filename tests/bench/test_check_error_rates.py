"""The order check's error rates on the step streams recorded on this machine
(benchmarks/results/check-rates/, by benchmarks/check_error_rates.py): the rule as the
product runs it, replayed on the recorded blocks (no cluster). This holds the rates
RESULTS.md states at the default block (10 steps per worker; dlrm under fit, 2 and 4
workers): an order no faster than TensorFlow's (A/A) is kept in at most 5 % of checks
(measured 1.7-2.0 %); the power is what this noisy machine gives (a round's value
varies by 10-20 % here): a true +10 % is kept in about a quarter of checks, +20 % in
about two thirds, and those floors are held so that a change to the rule cannot lose
power unseen. The issue's target of 90 % at +10 % is not met here (RESULTS.md)."""

from __future__ import annotations

import glob
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "check-rates", "*.json.gz")))


def _script():
    path = os.path.join(ROOT, "benchmarks", "check_error_rates.py")
    spec = importlib.util.spec_from_file_location("check_error_rates", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_recorded_runs_are_there():
    assert len(RUNS) >= 6, RUNS


@pytest.mark.parametrize("workers", [2, 4])
def test_aa_is_rarely_kept_and_the_measured_power_holds(workers):
    mod = _script()
    runs = [r for r in map(mod.load, RUNS) if r["workers"] == workers
            and r["block_steps"] == mod.DEFAULT_BLOCK]
    assert runs, f"no recorded run at {workers} workers with the default block"
    m = mod.measure(runs, checks=200, seed=1)
    aa, plus10, plus20 = m["aa"], m["plus10"], m["plus20"]
    assert aa["of"] >= 150 and plus10["of"] >= 150
    assert aa["kept"] / aa["of"] <= 0.05, m
    assert plus10["kept"] / plus10["of"] >= 0.15, m
    assert plus20["kept"] / plus20["of"] >= 0.50, m
    # the real A/A runs: TensorFlow's order as a candidate was never kept
    assert m["real_aa"]["kept"] <= max(0, m["real_aa"]["of"] // 20), m["real_aa"]


def test_a_resampled_check_runs_abba_rounds_on_the_streams():
    mod = _script()
    from tictac_hooks.run.sequential import Rule
    import random
    streams = {"w0": [1.0] * 400, "w1": [1.0] * 400}
    rule = Rule()
    assert mod.resample(streams, 9, 0.10, rule, random.Random(0)) == (True, 3)
    assert mod.resample(streams, 9, 0.0, rule, random.Random(0)) == (False, 3)
    assert mod.resample({"w0": [1.0] * 10}, 9, 0.0, rule, random.Random(0)) is None
    assert mod.decide_sequentially([0.1, 0.1, 0.1, 0.1], rule) == (True, 3)


def test_the_auto_block_gains_power_at_its_stated_cost():
    """check_block_steps 0 on the recorded 40-step runs: each run's block from its first
    steps' spread (the cap, 31, on this machine), A/A near the 5 % limit (5.0 % of 400
    in RESULTS.md), and more power than the default block's."""
    mod = _script()
    runs = [r for r in map(mod.load, RUNS) if r["block_steps"] == 40]
    assert runs
    m = mod.measure(runs, checks=200, seed=1, block_steps=mod.AUTO)
    from tictac_hooks.run import sequential
    assert all(sequential.MIN_AUTO_BLOCK <= b <= 31 for b in m["auto_blocks"]), m
    aa, plus10 = m["aa"], m["plus10"]
    assert aa["of"] >= 150 and aa["kept"] / aa["of"] <= 0.075, m
    default = mod.measure(runs, checks=200, seed=1, block_steps=mod.DEFAULT_BLOCK)
    assert plus10["kept"] / plus10["of"] >= default["plus10"]["kept"] / \
        default["plus10"]["of"] + 0.10, (m, default)
