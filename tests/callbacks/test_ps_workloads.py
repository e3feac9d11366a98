"""The models PS users train (examples/ps_models.py), under tf_keras ``fit`` with
ParameterServerStrategy and ``TicTac()`` on real local clusters (loopback): the example
program examples/ps_workloads_train.py is the test subject, each run in a child process
with its own cluster (PS tasks behind the gate, workers, the coordinator).

- TensorFlow's tutorial with ``steps_per_execution=10`` and its callbacks;
- TAC on each workload (its compute profile works), and what is trained does not
  change (same seed, one worker, with and without TicTac).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.cluster
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "ps_workloads_train.py")
# Short runs: 8 profiled steps, then TAC's order once the switch (the compute profile
# takes seconds, while fit goes on in TensorFlow's order) installed it; no order check
# (it has its own tests), no tutorial callbacks (checkpoints cost seconds and change
# nothing here).
QUICK = ("--network=loopback", "--steps_per_execution=1", "--steps=300",
         "--steps_per_epoch=100", "--tictac_profile_steps=8", "--tictac_check_rounds=0",
         "--notutorial_callbacks", "--ps=2")


def run_both(tmp_path, algorithm, *args, timeout=400):
    """The same training with TicTac (``algorithm``) and without, at once (each on its
    own cluster; one worker, so what is trained does not depend on timing). Returns
    the TicTac run's output and summary, and both runs' weights."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    runs = {"tictac": [f"--tictac_algorithm={algorithm}",
                       f"--summary_json={tmp_path / 's.json'}", f"--log_dir={tmp_path / 'tb'}"],
            "plain": ["--notictac", f"--log_dir={tmp_path / 'tb-plain'}"]}
    procs = {name: subprocess.Popen(
        [sys.executable, EXAMPLE, *QUICK, "--workers=1", *args, *extra,
         f"--save_weights={tmp_path / name}.npz"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        for name, extra in runs.items()}
    outs, weights = {}, {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        finally:
            proc.kill()
        assert proc.returncode == 0, (name, stdout[-2000:], stderr[-4000:])
        outs[name] = subprocess.CompletedProcess(proc.args, 0, stdout, stderr)
        with np.load(tmp_path / f"{name}.npz") as f:
            weights[name] = {k: f[k] for k in f.files}
    return outs["tictac"], json.loads((tmp_path / "s.json").read_text()), weights


def check_ran(out, summary, algorithm):
    """The order was computed (TAC from a measured compute profile) and every
    scheduled step followed it."""
    assert "[tictac] compute profile:" in out.stdout, out.stdout
    assert "no compute profile" not in out.stderr, out.stderr[-3000:]
    assert f"[tictac] {algorithm.upper()} order of" in out.stdout, out.stdout
    assert summary["algorithm"] == algorithm and "tac_off" not in summary, summary
    assert summary["scheduled_transfers"] > 0
    order = summary["order"]
    assert order["scheduled_steps"] > 0, order
    assert order["followed"] == order["scheduled_steps"], order  # every scheduled step


def check_coverage(summary):
    """The order lists at least 95 % of the bytes the PSes served, measured from the
    gates' own records, at each of the 2 PS."""
    coverage = summary["coverage"]
    assert coverage["bytes_share"] >= 0.95, coverage
    assert len(coverage["per_ps"]) == 2, coverage
    for ps in coverage["per_ps"].values():
        assert ps["bytes"] > 0 and ps["bytes_share"] >= 0.95, coverage


@pytest.mark.parametrize("model", ["tutorial", "recommender", "tied_transformer",
                                   "sharded_mlp", "reverse_declared"])
def test_the_workload_is_ordered_and_trains_the_same_weights(model, tmp_path):
    """Each workload on 2 PS, one worker, with TicTac and without: TAC's compute
    profile works for it (TAC orders every workload but the sharded MLP, where TIC's
    layer-by-layer order is the point); the order covers at least 95 % of the served
    bytes (embedding gathers, tied and sharded variables included) and every
    scheduled step follows it; the weights are bit for bit those of fit without
    TicTac."""
    algorithm = "tic" if model == "sharded_mlp" else "tac"
    extra = ["--min_shard_bytes=65536"] if model == "sharded_mlp" else []
    # steps of a few ms (the tutorial's 15): TAC's compute profile takes ~7 s, so the
    # order is in place after 100-130 steps on an idle machine (the tied transformer:
    # 125 of 900); 500 leave it 370 scheduled steps, or 240 at half the speed. The
    # reverse-declared model steps fastest: at 500 one CI run ended before its order
    # was in place (0 scheduled steps), so it trains 900.
    extra.append("--steps=900" if model == "reverse_declared" else "--steps=500")
    out, summary, weights = run_both(tmp_path, algorithm, f"--model={model}", *extra)
    check_ran(out, summary, algorithm)
    check_coverage(summary)
    assert "% of the bytes" in out.stdout
    assert sorted(weights["tictac"]) == sorted(weights["plain"])
    for k in weights["tictac"]:
        np.testing.assert_array_equal(weights["tictac"][k], weights["plain"][k], err_msg=k)
    if model == "sharded_mlp":  # every kernel sharded over both PS: TIC, layer by layer
        schedule = summary["schedule"]
        layers = [name.split("/")[1] for name in schedule["order"]]
        assert any("concat" in n for n in schedule["order"]), schedule  # sharded reads
        rank = {"fc1": 1, "fc2": 2, "fc3": 3, "logits": 4}
        assert [rank[x] for x in layers] == sorted(rank[x] for x in layers), schedule
        priorities = [schedule["priority"][n] for n in schedule["order"]]
        fc1_bias = schedule["priority"]["sharded_mlp/fc1/BiasAdd/ReadVariableOp"]
        assert fc1_bias < min(p for n, p in zip(schedule["order"], priorities)
                              if n.startswith("sharded_mlp/fc2/")), schedule


def run_workload(tmp_path, *args, timeout=400):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, EXAMPLE, "--network=loopback",
                          f"--log_dir={tmp_path / 'tb'}",
                          f"--summary_json={tmp_path / 'summary.json'}", *args],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "Traceback" not in out.stderr, out.stderr[-5000:]
    return out, json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.cluster
def test_the_tutorial_with_steps_per_execution_10_trains_in_tictacs_order(tmp_path):
    """TensorFlow's PS tutorial, Keras fit section: the partitioner over 2 PS,
    StringLookup + Embedding + Dense, steps_per_execution=10, DatasetCreator, its
    TensorBoard / ModelCheckpoint / BackupAndRestore callbacks, plus TicTac(). fit
    finishes; the switch begins after 20 training steps (2 calls), and every
    scheduled training step (each iteration of a call) follows it; the per-worker
    step counts add up to the training steps."""
    steps = 300
    out, summary = run_workload(
        tmp_path, "--model=tutorial", "--ps=2", "--workers=2", f"--steps={steps}",
        "--steps_per_epoch=100", "--steps_per_execution=10", "--tictac_profile_steps=20",
        "--tictac_check_rounds=1", "--tictac_check_block_steps=5",
        "--notictac_measure_compute")
    assert "[tictac] profiling 20 steps" in out.stdout, out.stdout
    assert "[tictac] installed on" in out.stdout, out.stdout
    assert "own transfer order kept" not in out.stdout, out.stdout
    assert "not_ordered" not in summary, summary["not_ordered"]
    assert summary["scheduled_transfers"] >= 3
    check_coverage(summary)  # the embedding shards' gathers, in the loop, are listed
    order = summary["order"]
    assert order["scheduled_steps"] >= 10, order  # the check's TicTac block at least
    assert order["followed"] == order["scheduled_steps"], order
    assert order.get("skips", 0) == 0 and order.get("violations", 0) == 0, order
    assert sum(w["steps"] for w in summary["workers"].values()) == steps, summary["workers"]
    assert summary["check"]["decision"] in ("tictac", "default"), summary["check"]
    # The tutorial's own callbacks ran beside TicTac.
    assert (tmp_path / "tb" / "keras" / "train").is_dir()
    # The coverage is in TensorBoard too, as the summary has it.
    from tictac_hooks.run.tensorboard import read_scalars
    scalars = read_scalars(str(tmp_path / "tb"))
    shown = [v for run in ("worker_0", "worker_1")
             for _, v in scalars.get(run, {}).get("tictac/order_coverage_bytes", [])]
    assert shown and all(abs(v - summary["coverage"]["bytes_share"]) < 1e-6 for v in shown)
