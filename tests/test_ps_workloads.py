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
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ps_workloads_train.py")
# Short runs: 8 profiled steps, then TAC's order; no order check (it has its own
# tests), no tutorial callbacks (checkpoints cost seconds and change nothing here).
QUICK = ("--network=loopback", "--steps_per_execution=1", "--steps=24",
         "--steps_per_epoch=12", "--tictac_profile_steps=8", "--tictac_check_rounds=0",
         "--notutorial_callbacks", "--ps=2")


def run(*args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, EXAMPLE, *QUICK, *args], capture_output=True,
                         text=True, timeout=timeout, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def check_tac_ran(out, summary_path):
    """TAC's order was computed from a measured profile and every scheduled step
    followed it."""
    assert "[tictac] compute profile:" in out.stdout, out.stdout
    assert "no compute profile" not in out.stderr, out.stderr[-3000:]
    assert "[tictac] TAC order of" in out.stdout, out.stdout
    s = json.loads(summary_path.read_text())
    assert s["algorithm"] == "tac" and "tac_off" not in s, s
    assert s["scheduled_transfers"] > 0
    order = s["order"]
    assert order["scheduled_steps"] > 0 and order["followed"] == order["scheduled_steps"], s


@pytest.mark.parametrize("model", ["recommender", "tied_transformer", "sharded_mlp"])
def test_tac_runs_on_the_workload(model, tmp_path):
    out = run(f"--model={model}", "--workers=2", "--tictac_algorithm=tac",
              f"--summary_json={tmp_path / 's.json'}", f"--log_dir={tmp_path / 'tb'}")
    check_tac_ran(out, tmp_path / "s.json")


@pytest.mark.parametrize("model", ["reverse_declared", "tutorial"])
def test_tac_trains_the_same_weights_as_no_tictac(model, tmp_path):
    """Same seed, one worker: the weights after fit with TicTac(algorithm="tac") (its
    profile included) are those of fit without TicTac."""
    out = run(f"--model={model}", "--workers=1", "--tictac_algorithm=tac",
              f"--summary_json={tmp_path / 's.json'}", f"--log_dir={tmp_path / 'tb'}",
              f"--save_weights={tmp_path / 'a.npz'}")
    check_tac_ran(out, tmp_path / "s.json")
    run(f"--model={model}", "--workers=1", "--notictac", f"--save_weights={tmp_path / 'b.npz'}")
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k])



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
    finishes; the order is installed after 20 training steps (2 calls) and every
    scheduled training step (each iteration of a call) follows it; the per-worker
    step counts add up to the training steps."""
    steps = 120
    out, summary = run_workload(
        tmp_path, "--model=tutorial", "--ps=2", "--workers=2", f"--steps={steps}",
        "--steps_per_epoch=60", "--steps_per_execution=10", "--tictac_profile_steps=20",
        "--tictac_check_rounds=1", "--tictac_check_block_steps=10")
    assert "[tictac] profiling 20 steps" in out.stdout, out.stdout
    assert "[tictac] installed on" in out.stdout, out.stdout
    assert "own transfer order kept" not in out.stdout, out.stdout
    assert "not_ordered" not in summary, summary["not_ordered"]
    assert summary["scheduled_transfers"] >= 3
    order = summary["order"]
    assert order["scheduled_steps"] >= 10, order  # the check's TicTac block at least
    assert order["followed"] == order["scheduled_steps"], order
    assert order.get("skips", 0) == 0 and order.get("violations", 0) == 0, order
    assert sum(w["steps"] for w in summary["workers"].values()) == steps, summary["workers"]
    assert summary["check"]["decision"] in ("tictac", "default"), summary["check"]
    # The tutorial's own callbacks ran beside TicTac.
    assert (tmp_path / "tb" / "keras" / "train").is_dir()
