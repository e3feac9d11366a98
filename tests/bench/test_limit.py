"""bench/limit.py: the distance of a run's step to the link's limit, on constructed runs
whose answer is known."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from tictac_hooks.records import InRunCompute

from .results import config, rate_run, result as _result

MIB = 2 ** 20
RATE = 1.464e9  # bits/s


def _bench(workers=2, mode="training", bytes_per_ps=(90 * MIB,), compute_s=0.5,
           **changes):
    """The issue's ResNet-50 training run: 2 workers pull 90 MiB each through one PS at
    1,464 Mbit/s; 500 ms of compute with no transfer (the calibration blocks); TIC's
    median step 1,725 ms, TAC's 1,800, TensorFlow's default 2,229."""
    run = dataclasses.replace(
        rate_run({"none": [2.229] * 4, "tic": [1.725] * 4, "tac": [1.8] * 4},
                 rate_bits=RATE, in_run=InRunCompute(0.6, compute_s, (0.6,), (compute_s,)),
                 **changes), bytes_per_ps=bytes_per_ps)
    res = _result()
    return dataclasses.replace(res, config=config(
        workers=workers, mode=mode, ps=len(bytes_per_ps),
        label=f"resnet50/{mode}/W{workers}/P{len(bytes_per_ps)}"), runs=(run,))


PULLS = 2 * 90 * MIB * 8 / RATE  # 1.0314 s: both workers' pulls out of the PS's link


def test_the_issues_resnet50_case():
    from tictac_hooks.bench.limit import AS_PULLS, IN_RUN, best_tictac, link_limit
    res = _bench()
    limit = link_limit(res, res.runs[0])
    assert PULLS == pytest.approx(1.0314, abs=1e-4)
    assert limit.pull_s == pytest.approx(PULLS)
    # the gradients back into the PS: the same bytes (the result records none)
    assert (limit.push_s, limit.push_source) == (pytest.approx(PULLS), AS_PULLS)
    assert (limit.compute_s, limit.compute_source) == (0.5, IN_RUN)
    assert limit.wire_s == pytest.approx(PULLS)  # the two directions overlap: not 2x
    assert limit.bound_s == pytest.approx(PULLS)
    assert best_tictac(res.runs[0]) == ("tic", 1.725)
    assert limit.over(1.725) == pytest.approx(1.725 / PULLS) == pytest.approx(1.6725, abs=1e-4)
    assert limit.over(2.229) == pytest.approx(2.161, abs=1e-3)
    assert limit.over(None) is None
    # Synchronous training's barrier: the worker served last pushes all its gradients
    # (90 MiB, 516 ms) after the step's last pull: 1,031 + 516 = 1,547 ms, and TIC's
    # 1,725 ms step is 1.12x that.
    assert limit.push_one_s == pytest.approx(PULLS / 2)
    assert limit.sync_s == pytest.approx(1.5 * PULLS)
    # the way into the PS (one worker's pulls, then both workers' pushes) is as long
    # with dense gradients
    assert limit.pull_one_s + limit.push_s == pytest.approx(1.5 * PULLS)
    assert limit.over(1.725, limit.sync_s) == pytest.approx(1.725 / (1.5 * PULLS))
    # compute longer than pulls and pushes: compute bounds both
    slow = _bench(compute_s=2.0)
    assert link_limit(slow, slow.runs[0]).sync_s == 2.0


def test_the_bound_is_the_larger_part():
    from tictac_hooks.bench.limit import PROFILED, TRACED, link_limit
    # compute longer than the wire: the compute bounds the step
    res = _bench(compute_s=1.2)
    assert link_limit(res, res.runs[0]).bound_s == 1.2
    # inference pushes nothing
    res = _bench(mode="inference")
    limit = link_limit(res, res.runs[0])
    assert (limit.push_s, limit.push_source) == (None, "")
    assert limit.bound_s == pytest.approx(PULLS)
    # traced pushes (the simulator's inputs) larger than the pulls: the PS's ingress
    # is the busiest direction; per PS the largest worker's
    pushes = [{"g1": ["ps:0", 100 * MIB], "g2": ["ps:0", 20 * MIB]},
              {"g1": ["ps:0", 110 * MIB]}]
    res = _bench(sim_inputs={"pushes": pushes})
    limit = link_limit(res, res.runs[0])
    assert limit.push_source == TRACED
    assert limit.push_s == pytest.approx(2 * 120 * MIB * 8 / RATE)
    assert limit.bound_s == limit.push_s and limit.pull_s == pytest.approx(PULLS)
    # with the barrier, the path into the PS binds: no gradient before a worker's own
    # 90 MiB of pulls, then both workers' 120 MiB through the PS's ingress (90 + 240 MiB)
    # beats the way out (every pull, 180 MiB, then one worker's 120 MiB)
    assert limit.pull_one_s == pytest.approx(90 * MIB * 8 / RATE)
    assert limit.sync_s == pytest.approx((90 + 2 * 120) * MIB * 8 / RATE)
    # the result records the traced pushes itself (push_bytes_per_ps): the same bound,
    # through the JSON and back, without the simulator's inputs
    from tictac_hooks.bench.limit import traced_push_bytes
    from tictac_hooks.records import BenchRun
    recorded = dataclasses.replace(res.runs[0], sim_inputs=None,
                                   push_bytes_per_ps=traced_push_bytes(pushes, 1))
    res = BenchRun.from_json(dataclasses.replace(res, runs=(recorded,)).to_json())
    assert res.runs[0].push_bytes_per_ps == (120 * MIB,)
    again = link_limit(res, res.runs[0])
    assert again.push_source == TRACED and again.push_s == pytest.approx(limit.push_s)
    # two PSes: the busiest PS's egress (2 x 60 MiB) ...
    res = _bench(bytes_per_ps=(60 * MIB, 30 * MIB))
    assert link_limit(res, res.runs[0]).pull_s == pytest.approx(2 * 60 * MIB * 8 / RATE)
    # ... or, with one worker, the worker's own ingress (60 + 30 MiB)
    res = _bench(workers=1, bytes_per_ps=(60 * MIB, 30 * MIB))
    assert link_limit(res, res.runs[0]).pull_s == pytest.approx(90 * MIB * 8 / RATE)
    # no calibration blocks: the profiled compute reference; none at all: the wire alone
    res = _bench()
    res = dataclasses.replace(res, runs=(dataclasses.replace(res.runs[0], in_run=None,
                                                             compute_s=0.45),))
    limit = link_limit(res, res.runs[0])
    assert (limit.compute_s, limit.compute_source) == (0.45, PROFILED)
    res = dataclasses.replace(res, compute=None, runs=(dataclasses.replace(
        res.runs[0], compute_s=None),))
    limit = link_limit(res, res.runs[0])
    assert (limit.compute_s, limit.compute_source) == (None, "")
    assert limit.bound_s == pytest.approx(PULLS)


def test_the_report_shows_both_parts_and_the_ratio(tmp_path, monkeypatch):
    from tictac_hooks.bench.limit import limit_section
    from tictac_hooks.bench.report import write_report
    lines = limit_section([_bench()])
    assert ("| resnet50/training/W2/P1 | 1464mbit | 500 | 1031 | 1031 | 1031 | tic 1725 "
            "| 1.67x | 2229 | 2.16x | 1547 | 1.12x |") in lines
    assert any("pushes taken as the pulls' bytes" in line for line in lines)
    inference = limit_section([_bench(mode="inference", compute_s=1.2)])
    assert ("| resnet50/inference/W2/P1 | 1464mbit | 1200 | 1031 | - | 1200 | tic 1725 "
            "| 1.44x | 2229 | 1.86x | - | - |") in inference
    assert not any("pushes taken" in line for line in inference)
    assert not any("LOOPBACK" in line for line in lines)
    loopback = dataclasses.replace(_bench(), shaped=False, network_reason="not root")
    assert limit_section([loopback])[-1] == (
        "- LOOPBACK, no link was shaped (resnet50/training/W2/P1): the rate did not bind, "
        "and neither does the wire part of the bound")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the tables only
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_bench().to_json()))
    text = open(write_report([str(path)], str(tmp_path / "out"), say=lambda m: None)).read()
    assert "## Distance to the link's limit" in text
    assert "| tic 1725 | 1.67x | 2229 | 2.16x |" in text
