"""The TicTac Keras callback on real local clusters (tf_keras + ParameterServerStrategy).

The example program is the test subject: each run starts its own cluster (1 PS behind
the rendezvous, workers, the coordinator) in a child process.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tictac_hooks.callbacks.controller import Controller, Settings, TicTacSetupError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "keras_ps_train.py")


def run_example(*args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.cluster
def test_fit_switches_after_n_steps_and_every_later_step_follows_the_order(tmp_path):
    n = 12
    out = run_example("--steps=40", "--steps_per_epoch=10", f"--tictac_profile_steps={n}",
                      f"--log_dir={tmp_path / 'tb'}", f"--summary_json={tmp_path / 's.json'}")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "median step time before" in out.stdout and "TensorBoard:" in out.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["algorithm"] == "tic" and summary["scheduled_transfers"] >= 10
    order = summary["order"]
    assert order["scheduled_steps"] >= 20
    assert order["followed"] == order["scheduled_steps"], order
    assert order.get("skips", 0) == 0 and order.get("violations", 0) == 0
    assert len(summary["workers"]) == 2

    from tictac_hooks.callbacks.tensorboard import read_scalars
    scalars = read_scalars(str(tmp_path / "tb"))
    profiled = 0
    for run in ("worker_0", "worker_1"):
        tags = scalars[run]
        assert len(tags["tictac/step_time"]) >= 10
        phases = [v for _, v in sorted(tags["tictac/phase"])]
        assert set(phases) == {0.0, 1.0}
        assert phases == sorted(phases)  # profiling, then scheduled, never back
        profiled += phases.count(0.0)
        assert all(v > 0 for _, v in tags["tictac/throughput"])
    # The switch happens after exactly N steps (shared among the workers).
    assert profiled == n
    trace = json.loads((tmp_path / "tb" / "tictac_transfers.trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


@pytest.mark.cluster
def test_same_seed_trains_the_same_weights_with_and_without_tictac(tmp_path):
    runs = {"none": ["--tictac_algorithm=none"], "tic": ["--tictac_algorithm=tic"],
            "plain": ["--notictac"]}
    weights = {}
    for name, args in runs.items():
        path = tmp_path / f"{name}.npz"
        out = run_example("--workers=1", "--steps=24", "--steps_per_epoch=8",
                          "--tictac_profile_steps=6", f"--log_dir={tmp_path / name}",
                          f"--save_weights={path}", *args)
        assert out.returncode == 0, out.stderr[-4000:]
        with np.load(path) as f:
            weights[name] = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
    for name in ("none", "tic"):
        assert len(weights[name]) == len(weights["plain"])
        for a, b in zip(weights[name], weights["plain"]):
            np.testing.assert_array_equal(a, b)


def test_an_invalid_flag_value_fails_with_absl_message():
    out = run_example("--tictac_algorithm=fastest", timeout=120)
    assert out.returncode != 0
    assert "--tictac_algorithm" in out.stderr and "value should be one of" in out.stderr


@pytest.mark.cluster
def test_a_ps_without_rendezvous_gives_an_actionable_error():
    from tictac_hooks.enforce.launcher import LocalCluster
    with LocalCluster(num_ps=1, num_workers=1, rendezvous=False) as cluster:
        controller = Controller(cluster.ps_addresses, Settings.resolve())
        with pytest.raises(TicTacSetupError, match=r"ps:0 .*tictac ps --cluster-spec"):
            controller.connect()


def test_unreachable_ps_gives_an_actionable_error():
    from tictac_hooks.enforce.server import free_port
    controller = Controller([f"127.0.0.1:{free_port()}"], Settings.resolve())
    with pytest.raises(TicTacSetupError, match="cannot reach|rendezvous"):
        controller.connect()


def test_settings_arguments_win_over_flags_and_flags_over_defaults():
    from absl import flags
    import tictac_hooks.flags  # noqa: F401
    assert Settings.resolve().algorithm == "tic"
    flags.FLAGS(["prog", "--tictac_algorithm=tac", "--tictac_profile_steps=9"])
    try:
        s = Settings.resolve()
        assert (s.algorithm, s.profile_steps) == ("tac", 9)
        assert Settings.resolve(algorithm="none", profile_steps=3).algorithm == "none"
        assert Settings.resolve(profile_steps=3).profile_steps == 3
    finally:
        flags.FLAGS.unparse_flags()
    with pytest.raises(ValueError, match="unknown TicTac algorithm 'fifo'"):
        Settings.resolve(algorithm="fifo")
    with pytest.raises(ValueError, match="profile_steps must be >= 1"):
        Settings.resolve(profile_steps=0)


def test_keras_internals_the_callback_relies_on_still_exist():
    """Fails loudly when tf_keras changes what patches/keras_internals.py reads."""
    import tf_keras as keras
    from tictac_hooks.patches import keras_internals
    model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    model.compile("sgd", "mse")
    model.fit(np.zeros((4, 3)), np.zeros((4, 2)), epochs=1, verbose=0)
    keras_internals.check_upstream(model)
    (fn,) = keras_internals.traced_step_functions(model.train_function)[-1:]
    assert any(op.type == "ReadVariableOp" for op in fn.graph.get_operations())
