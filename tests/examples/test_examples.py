"""Every example runs end to end on a real local cluster, switches, and follows the order.

(The Keras fit example is covered in depth by test_keras_callback.py.)
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.cluster
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(example, *args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", example), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def check_followed(summary_path, min_scheduled):
    s = json.loads(summary_path.read_text())
    order = s["order"]
    assert s["scheduled_transfers"] > 0
    assert order["scheduled_steps"] >= min_scheduled, s
    assert order["followed"] == order["scheduled_steps"], s
    assert order.get("skips", 0) == 0 and order.get("violations", 0) == 0, s
    return s


def test_graph_mode_in_graph_replication_follows_the_order_and_trains_the_same(tmp_path):
    common = ["--steps=30", "--tictac_profile_steps=8"]
    # the check's first TicTac block holds the 20 steps after the switch, on both towers
    out = run("graph_mode_train.py", *common, "--tictac_check_block_steps=20",
              f"--log_dir={tmp_path / 'tb'}",
              f"--summary_json={tmp_path / 's.json'}", f"--save_weights={tmp_path / 'a.npz'}")
    s = check_followed(tmp_path / "s.json", min_scheduled=30)
    assert len(s["workers"]) == 2  # each tower's worker got its own order
    assert "median step time before" in out.stdout
    run("graph_mode_train.py", *common, "--notictac", f"--save_weights={tmp_path / 'b.npz'}")
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k])


def test_graph_mode_between_graph_every_worker_follows_the_chiefs_order(tmp_path):
    # the check's first TicTac block holds the 20 steps after the switch, on each worker
    out = run("graph_mode_train.py", "--replication=between", "--steps=30",
              "--tictac_profile_steps=8", "--tictac_check_block_steps=20",
              f"--log_dir={tmp_path / 'tb'}",
              f"--summary_json={tmp_path / 's.json'}")
    assert "[worker 0]" in out.stdout and "[worker 1]" in out.stdout
    chief = check_followed(tmp_path / "s.json", min_scheduled=20)
    assert chief["scheduled_transfers"] >= 10
    # Worker 1's client installs nothing but reports what the PS did for everyone.
    other = json.loads((tmp_path / "s.json.worker1").read_text())
    assert other["order"]["followed"] == other["order"]["scheduled_steps"] > 0
    assert other["order"].get("violations", 0) == 0


def test_inference_with_evaluate_follows_the_order(tmp_path):
    # --tictac_check_rounds=0: every step after the switch runs TicTac's order here (the
    # order check has its own tests in test_keras_callback.py and test_order_check.py).
    # --notictac_measure_compute: the switch (on a thread of its own while evaluate goes
    # on in TensorFlow's order) installs TIC within a second, without the profile.
    run("inference.py", "--network=loopback", "--tictac_check_rounds=0", "--steps=80",
        "--tictac_profile_steps=12", "--notictac_measure_compute",
        f"--log_dir={tmp_path / 'tb'}", f"--summary_json={tmp_path / 's.json'}")
    check_followed(tmp_path / "s.json", min_scheduled=20)


def test_keras3_custom_loop_follows_the_order(tmp_path):
    run("keras3_custom_loop.py", "--network=loopback", "--tictac_check_rounds=0",
        "--steps=40", "--tictac_profile_steps=12",
        f"--log_dir={tmp_path / 'tb'}", f"--summary_json={tmp_path / 's.json'}")
    check_followed(tmp_path / "s.json", min_scheduled=20)
