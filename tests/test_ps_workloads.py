"""The models PS users train (examples/ps_models.py), under tf_keras ``fit`` with
ParameterServerStrategy and ``TicTac()`` on real local clusters (loopback): the example
program examples/ps_workloads_train.py is the test subject, each run in a child process
with its own cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ps_workloads_train.py")


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
