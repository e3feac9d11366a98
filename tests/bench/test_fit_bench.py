"""`tictac bench --frontend fit` and `--model PATH.py:FUNCTION` (issue #36).

- the user-model loader's errors, each naming the file and the function;
- the built-in workloads (dlrm, transformer) and examples/my_model.py build trainable
  models;
- the per-order results of an order check's block pairs;
- one short run on a loopback cluster (2 PS, 2 workers) whose JSON has every order's
  median step time and ratio per worker.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tictac_hooks import cli
from tictac_hooks.bench import fit_mode, fit_report, user_model
from tictac_hooks.bench.user_model import UserModelError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MY_MODEL = os.path.join(ROOT, "examples", "my_model.py")


def user_file(tmp_path, body: str, name: str = "model.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


# --- resolving PATH.py:FUNCTION (no TensorFlow needed) -------------------------------------

def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(UserModelError) as e:
        user_model.resolve(f"{missing}:make")
    assert f"{missing}:make" in str(e.value) and "no such file" in str(e.value)


def test_missing_function_is_named_with_the_files_functions(tmp_path):
    path = user_file(tmp_path, """
        def build(batch_size):
            return None
        """)
    with pytest.raises(UserModelError) as e:
        user_model.resolve(f"{path}:make")
    message = str(e.value)
    assert f"{path}:make" in message and "has no function 'make'" in message
    assert "build" in message  # what the file has


def test_not_a_function(tmp_path):
    path = user_file(tmp_path, "make = 3\n")
    with pytest.raises(UserModelError, match=r"'make' in .*model.py is a int, not a function"):
        user_model.resolve(f"{path}:make")


def test_file_that_fails_to_import(tmp_path):
    path = user_file(tmp_path, "import no_such_module_here\n")
    with pytest.raises(UserModelError) as e:
        user_model.resolve(f"{path}:make")
    assert f"{path}:make" in str(e.value)
    assert "ModuleNotFoundError" in str(e.value) and "no_such_module_here" in str(e.value)


@pytest.mark.parametrize("spec", ["resnet", "file.py", "file.py:", ":make"])
def test_spec_that_names_no_function(spec, tmp_path):
    with pytest.raises(UserModelError, match="PATH.py:FUNCTION"):
        user_model.resolve(spec)


def test_builtins_resolve_by_name():
    for name in ("dlrm", "transformer"):
        source = user_model.resolve(name)
        assert source.path is None and source.label == name and callable(source.builder)
    assert user_model.is_model_spec("dlrm") and user_model.is_model_spec("x.py:make")
    assert not user_model.is_model_spec("resnet50")


def test_graph_frontend_names_a_bad_model_and_refuses_sharding(tmp_path, capsys):
    path = user_file(tmp_path, "def build(batch_size):\n    return None\n")
    assert cli.main(["bench", "--model", f"{path}:make"]) == 2
    assert "has no function 'make'" in capsys.readouterr().err
    assert cli.main(["bench", "--min-shard-bytes", "1000"]) == 2
    assert "--min-shard-bytes applies to --frontend fit" in capsys.readouterr().err
    assert cli.main(["bench", "--verify-rounds", "2"]) == 2
    assert "--verify-rounds applies to --frontend fit" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--mode", "inference"], "--mode inference"),
    (["--bandwidth", "auto:2"], "one link rate"),
    (["--bandwidth", "1gbit,2gbit"], "one link rate"),
    (["--schedules", "tic,layer"], "distinct names from declared,first-use,random,tf-again,tic,tac"),
    (["--check-block-steps", "2"], "--check-block-steps must be in 3..1000"),
    (["--backend", "proxy"], "leave out --backend proxy"),
])
def test_fit_frontend_refuses_what_it_cannot_run(argv, message, capsys):
    assert cli.main(["bench", "--frontend", "fit", *argv]) == 2
    assert message in capsys.readouterr().err


def test_fit_frontend_names_a_bad_model_before_starting_a_cluster(tmp_path, capsys):
    path = user_file(tmp_path, "def build(batch_size):\n    return None\n")
    assert cli.main(["bench", "--frontend", "fit", "--model", f"{path}:make"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:make" in err and "has no function 'make'" in err


def test_orders_are_labelled_with_the_peer_they_stand_for():
    assert "BytePS" in fit_report.label_of("declared")
    assert "ByteScheduler TF" in fit_report.label_of("first-use")
    assert fit_report.label_of("random").endswith("paced as TicTac's")
    assert fit_report.label_of("default") == "TensorFlow's order (no schedule)"
    assert fit_report.label_of("tic") == "TIC"


# --- what the builder returns (TensorFlow) ------------------------------------------------

def load(tmp_path, body: str, batch: int = 4):
    path = user_file(tmp_path, "import numpy as np\nimport tf_keras as keras\n"
                     + textwrap.dedent(body))
    return user_model.load(user_model.resolve(f"{path}:make"), batch), path


@pytest.mark.slow
@pytest.mark.parametrize("body, says", [
    ("""
     def make(batch_size):
         return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
     """, "returned a Sequential; expected a tuple (model, inputs, targets)"),
    ("""
     def make(batch_size):
         return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), np.zeros((4, 3))
     """, "returned a tuple of 2 (Sequential, ndarray); expected a tuple"),
    ("""
     def make(batch_size):
         return "model", np.zeros((4, 3)), np.zeros(4)
     """, "returned a str as the model"),
    ("""
     def make(batch_size):
         return (keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
                 [1.0, 2.0], np.zeros(4))
     """, "as the inputs: not an array"),
    ("""
     def make(batch_size):
         return (keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
                 {"x": np.zeros((4, 3)), "y": "text"}, np.zeros(4))
     """, "its item 'y' is not an array"),
    ("""
     def make(batch_size):
         return (keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
                 np.zeros((4, 3)), np.float32(1))
     """, "as the targets: a scalar, not a batch"),
    ("""
     def make(batch_size):
         raise RuntimeError("out of ideas")
     """, "make(4) raised RuntimeError: out of ideas"),
])
def test_wrong_return_value_says_what_and_where(tmp_path, body, says):
    with pytest.raises(UserModelError) as e:
        load(tmp_path, body)
    assert says in str(e.value)
    assert f"{tmp_path / 'model.py'}:make" in str(e.value)


@pytest.mark.slow
def test_model_that_does_not_build(tmp_path):
    body = """
    import tensorflow as tf

    class Broken(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            return tf.reshape(self.dense(x), (3, 7))

    def make(batch_size):
        return Broken(), np.zeros((batch_size, 3), "float32"), np.zeros(batch_size)
    """
    with pytest.raises(UserModelError) as e:
        load(tmp_path, body)
    assert "does not build on the inputs it returned" in str(e.value)
    assert f"{tmp_path / 'model.py'}:make" in str(e.value)


@pytest.mark.slow
def test_model_without_trainable_variables(tmp_path):
    body = """
    def make(batch_size):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Flatten()])
        return model, np.zeros((batch_size, 3), "float32"), np.zeros(batch_size)
    """
    with pytest.raises(UserModelError, match="no trainable variables"):
        load(tmp_path, body)


def _train(loaded, steps: int = 3):
    import numpy as np
    import tensorflow as tf
    before = [v.numpy().copy() for v in loaded.model.trainable_variables]
    history = loaded.model.fit(user_model.dataset(tf, loaded), steps_per_epoch=steps,
                               epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    changed = [not np.array_equal(b, v.numpy())
               for b, v in zip(before, loaded.model.trainable_variables)]
    assert all(changed), [v.name for v, c in zip(loaded.model.trainable_variables, changed)
                          if not c]


@pytest.mark.slow
def test_my_model_example_is_compiled_by_the_bench_and_trains():
    loaded = user_model.load(user_model.resolve(f"{MY_MODEL}:make"), 8)
    assert loaded.compiled_by == user_model.DEFAULT_COMPILE
    names = [v.name.split("/")[1] for v in loaded.model.trainable_variables]
    assert names[0] == "head" and names[-1] == "tokens"  # declared head first
    _train(loaded)


@pytest.mark.slow
def test_dlrm_declares_tables_by_name_and_uses_its_own_order():
    from tictac_hooks.bench import models
    loaded = user_model.load(user_model.resolve("dlrm"), 16)
    assert loaded.compiled_by == "the model's own compile"
    params = fit_mode.parameters(loaded.model.trainable_variables)
    tables = [p["name"].split("/")[1].removesuffix("_table") for p in params[:6]]
    assert tables == sorted(models.DLRM_TABLES)  # declared in feature-name order
    assert list(models.DLRM_USE_ORDER) != tables and set(models.DLRM_USE_ORDER) == set(tables)
    sizes = {t: p["bytes"] for t, p in zip(tables, params)}
    big = {t for t, b in sizes.items() if b > 256 << 10}  # sharded at the default
    assert big == {"user_id", "ad_id"} and len(set(sizes.values())) == len(sizes)
    assert loaded.model(loaded.inputs).shape == (16, 1)
    _train(loaded)


@pytest.mark.slow
def test_transformer_ties_its_embeddings():
    from tictac_hooks.bench import models
    loaded = user_model.load(user_model.resolve("transformer"), 4)
    assert loaded.compiled_by == user_model.DEFAULT_COMPILE
    vocab, dim = models.TRANSFORMER["vocab"], models.TRANSFORMER["dim"]
    assert loaded.model(loaded.inputs).shape == (4, models.TRANSFORMER["seq"], vocab)
    shapes = [tuple(v.shape) for v in loaded.model.trainable_variables]
    assert shapes.count((vocab, dim)) == 1 and (dim, vocab) not in shapes  # one table
    assert type(loaded.model).__name__ == "TiedTransformer"  # subclassed
    _train(loaded, steps=2)


# --- results per order (no TensorFlow) ---------------------------------------------------------

def test_order_results_per_worker():
    """From the check's own statistics (order_check.decide on step records)."""
    from tictac_hooks.run import order_check
    from tictac_hooks.records import CHECK, SCHEDULED, WorkerStep
    w0 = "/job:worker/replica:0/task:0/device:CPU:0"
    w1 = "/job:worker/replica:0/task:1/device:CPU:0"
    from check_blocks import build
    blocks = []
    for r, (tic_t, tic_d, rnd_t, rnd_d) in enumerate(((1.0, 1.2, 1.5, 1.2),
                                                      (1.0, 1.1, 1.5, 1.2))):
        w1_times = (lambda x: {w1: [x] * 3}) if r == 0 else (lambda x: {})
        blocks += [(r, "tic", True, {w0: [tic_t] * 3, **w1_times(2.0)}),
                   (r, "tic", False, {w0: [tic_d] * 3, **w1_times(2.0)}),
                   (r, "random", True, {w0: [rnd_t] * 3}),
                   (r, "random", False, {w0: [rnd_d] * 3})]
    records, windows = build(blocks)
    check = order_check.decide(records, order_check.CheckPlan(2, 4, ("tic", "random")),
                               windows).to_json()
    out = fit_report.order_results(check, {"declared": "a recv without its position"})
    tic = out["tic"]["workers"]["worker:0"]
    assert tic["median_step_time_s"] == 1.0 and tic["pairs"] == 2
    assert tic["default_median_step_time_s"] == pytest.approx(1.15)
    assert tic["ratio_median"] == pytest.approx(1.15)
    assert tic["ratio_min"] == pytest.approx(1.1) and tic["ratio_max"] == pytest.approx(1.2)
    assert out["random"]["workers"]["worker:0"]["ratio_median"] == pytest.approx(0.8)
    assert set(out["random"]["workers"]) == {"worker:0"}  # no random block on worker 1
    # per round, every worker's steps pooled: 2.0/1.0 ... the pooled medians
    assert out["tic"]["pairs"] == 2
    # TensorFlow's order: the median of every TensorFlow block of the worker
    assert out["default"]["workers"]["worker:0"] == {"median_step_time_s": 1.2, "blocks": 4}
    assert out["default"]["workers"]["worker:1"]["median_step_time_s"] == 2.0
    assert out["declared"] == {"label": fit_report.label_of("declared"), "workers": {},
                               "off": "a recv without its position"}
    result = {"config": {"model": "m", "workers": 2, "ps": 2, "batch": 4, "rounds": 2,
                         "block_steps": 4},
              "network": {"shaped": False, "reason": "--loopback given"},
              "stragglers": fit_report.STRAGGLERS, "orders": out, "model": {}}
    table = fit_report.text_table(result)
    assert "LOOPBACK" in table and "stragglers do not apply" in table
    assert "declared   off: a recv without its position" in table
    assert "tic        worker:0     1000.0  1.150 (1.100..1.200, 2)" in table


def test_with_the_check_is_the_kept_order_in_fresh_blocks_or_tensorflow_order():
    """with_check: the held-out check of the kept order (the second CheckResult), or
    TensorFlow's order by construction where the check kept it."""
    from tictac_hooks.run import order_check
    from tictac_hooks.records import CHECK, SCHEDULED, WorkerStep
    w0 = "/job:worker/replica:0/task:0/device:CPU:0"

    from check_blocks import build

    def result(pattern, candidates):
        """pattern: (phase, order, step time) per block, a round per candidate pair."""
        blocks, names = [], list(candidates)
        for i, (phase, order, t) in enumerate(pattern):
            name = order if phase == SCHEDULED else pattern[i - 1][1]
            blocks.append((i // (2 * len(names)), name, phase == SCHEDULED, {w0: [t] * 3}))
        records, windows = build(blocks)
        rounds = max(b[0] for b in blocks) + 1
        return order_check.decide(records, order_check.CheckPlan(rounds, 4, candidates),
                                  windows)
    first = result([(SCHEDULED, "tic", 1.0), (CHECK, None, 1.2)] * 2, ("tic",))
    held_out = result([(SCHEDULED, "tic", 1.0), (CHECK, None, 1.18),
                       (SCHEDULED, "tic", 1.0), (CHECK, None, 1.22),
                       (SCHEDULED, "tic", 1.0), (CHECK, None, 1.2)], ("tic",))
    w = fit_report.with_check(first, held_out, 3)
    assert (w["decision"], w["kept"], w["kept_after"], w["pairs"]) == ("tictac", "tic",
                                                                         "tic", 3)
    assert w["ratio_median"] == pytest.approx(1.2)
    assert (w["ratio_min"], w["ratio_max"]) == (pytest.approx(1.18), pytest.approx(1.22))
    assert w["workers"]["worker:0"]["pairs"] == 3
    # the check's TIC blocks: 2 rounds x 4 steps at 1 / 1.2 of a TensorFlow-order step
    assert w["check_cost_steps"] == pytest.approx(8 * (1 / 1.2 - 1))
    line = fit_report.with_check_line(w)
    assert line == ("with the order check: TicTac's check keeps TIC; held out, 3 fresh "
                    "block pairs: "
                    "ratio 1.200 (1.180..1.220) vs TensorFlow's order; TIC kept; the "
                    "check's TIC/TAC blocks cost -1.3 TensorFlow-order steps")
    slower = result([(SCHEDULED, "tic", 1.3), (CHECK, None, 1.0)] * 2, ("tic",))
    w = fit_report.with_check(first, slower, 2)
    assert w["kept_after"] is None and w["ratio_median"] == pytest.approx(1 / 1.3)
    assert "; TensorFlow's order kept after it;" in fit_report.with_check_line(w)
    w = fit_report.with_check(slower, None, 2)  # the check kept TensorFlow's order
    assert w["kept"] is None and "ratio 1 by construction" in w["note"]
    assert fit_report.with_check(first, None, 0)["note"].startswith("not measured")
    # the bench's check keeps a baseline (declared); TicTac's own check, TIC and TAC
    # alone, would have kept TIC (ratio 1.1) ...
    both = result([(SCHEDULED, "tic", 1.0), (CHECK, None, 1.1),
                   (SCHEDULED, "declared", 1.0), (CHECK, None, 1.3)] * 2,
                  ("tic", "declared"))
    assert both.chosen == "declared" and fit_report.product_choice(both) == "tic"
    w = fit_report.with_check(both, held_out, 2)
    assert (w["kept"], w["bench_check_kept"]) == ("tic", "declared")
    # ... or TensorFlow's order, where TIC was slower than it
    slow_tic = result([(SCHEDULED, "tic", 1.2), (CHECK, None, 1.0),
                       (SCHEDULED, "declared", 1.0), (CHECK, None, 1.3)] * 2,
                      ("tic", "declared"))
    assert slow_tic.chosen == "declared" and fit_report.product_choice(slow_tic) is None
    assert fit_report.with_check(slow_tic, None, 2)["decision"] == "default"


# --- a short run on a loopback cluster ---------------------------------------------------------

@pytest.mark.slow
@pytest.mark.cluster
def test_fit_bench_on_loopback(tmp_path):
    out = tmp_path / "fit.json"
    argv = [sys.executable, "-m", "tictac_hooks.cli", "bench", "--frontend", "fit",
            "--model", "examples/my_model.py:make", "--loopback", "--quick",
            "--workers", "2", "--ps", "2", "--json", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    result = json.loads(out.read_text())
    assert result["benchmark"] == "fit" and result["commit"]
    assert isinstance(result["dirty"], bool)
    assert result["command"].startswith("tictac bench --frontend fit --model examples/")
    assert result["network"] == {"shaped": False, "reason": "--loopback given"}
    assert "do not apply" in result["stragglers"]
    assert result["model"]["compiled_by"] == user_model.DEFAULT_COMPILE
    # the 640 kB token table, sharded over both PS at the default 256 KiB
    shards = {p["name"].split("/")[1]: p["shards"] for p in result["model"]["variables"]}
    assert shards["tokens"] == 2 and shards["head"] == 1
    expected = {"declared", "first-use", "random", "tic", "tac"}
    orders = result["orders"]
    workers = {"worker:0", "worker:1"}
    assert set(orders["default"]["workers"]) == workers
    for s in orders["default"]["workers"].values():
        assert s["median_step_time_s"] > 0
    for label in expected:
        assert set(orders[label]["workers"]) == workers, (label, orders[label])
        for s in orders[label]["workers"].values():
            assert s["median_step_time_s"] > 0 and s["pairs"] >= 1
            assert 0 < s["ratio_min"] <= s["ratio_median"] <= s["ratio_max"]
    assert not result["off"], result["off"]
    for label in ("default", *expected):
        assert f"\n  {label:<10} worker:0" in proc.stdout, proc.stdout
    # with the check: the kept order measured again in fresh blocks, or TF's order
    w = result["with_check"]
    assert w["decision"] in ("tictac", "default", None) and w["verify_rounds"] == 3
    if w["kept"] is not None:
        assert w["pairs"] >= 1 and 0 < w["ratio_min"] <= w["ratio_median"] <= w["ratio_max"]
        assert "held out" in proc.stdout
    else:
        assert "ratio 1 by construction" in w["note"]


# --- the order check with the baselines as candidates (in-process gate, no cluster) ---------

def test_the_check_measures_the_baselines_beside_tic(monkeypatch):
    """The controller's ``check_extra`` orders are candidates of the check like TIC:
    each gets its blocks, labelled by the gate with its name, and its block pairs; an
    order that cannot be computed is left out with why (``check_off``). ``tf-again`` is
    TensorFlow's own order as a candidate (algorithm "none", the A/A check): its blocks
    clear the gate, and its windows say it ran no order."""
    from callbacks.test_frontends import PS, PROFILE_STEPS, Workers, _dag, _keras

    from tictac_hooks.run import order_check
    from tictac_hooks.run.driver import StepDAG
    from tictac_hooks.enforce import inprocess
    from tictac_hooks.enforce.gate import Gate
    rounds, block = 2, 3
    extra = {label: "none" if label == fit_report.TF_AGAIN else label
             for label in fit_report.BASELINES}
    extra["nonsense"] = "no-such-order"
    graph = _dag()
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, window_bytes=0,
                    check_rounds=rounds, check_block_steps=block, recheck_every=0)
    gate = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, gate):
        cb, begin, step, end = _keras(settings, StepDAG(graph), monkeypatch)
        workers = Workers(gate, graph, seed=4)
        begin()
        cb.controller.check_extra = dict(extra)
        ran, i = [], 0
        while not cb.controller.check_results:
            workers.step()
            ran.append(gate.records()[-1]["algorithm"])
            step(i)
            i += 1
            assert i < 500
        summary = end()
        workers.close()
    off = cb.controller.check_off
    assert "no-such-order" in off["nonsense"] and "tac" in off  # no compute times
    same = cb.controller.runner.same_as  # orders identical to another's: checked once
    measured = ["tic"] + [label for label in extra if label not in off and label not in same]
    assert {"tic", "random"} <= set(measured) and set(same) <= {"declared", "first-use"}
    plan = order_check.CheckPlan(rounds, block, tuple(measured))
    assert cb.controller.runner.plan.candidates == plan.candidates
    plan = dataclasses.replace(plan, seed=cb.controller.runner.plan.seed)  # as it ran
    during = ran[PROFILE_STEPS:PROFILE_STEPS + plan.total_steps + 1]
    labelled = [None if b == fit_report.TF_AGAIN else b  # (its blocks: the gate cleared)
                for b in (plan.block(n) for n in range(plan.total_steps))]
    assert during == ["tic"] + labelled, ran
    windows = cb.controller.runner.windows
    assert {w.ordered for w in windows if w.candidate == fit_report.TF_AGAIN} == {False}
    assert all(w.ordered for w in windows if w.candidate != fit_report.TF_AGAIN)
    check = summary["check"]
    assert set(check["candidates"]) == set(measured)
    assert all(c["pairs"] == rounds for c in check["candidates"].values())
    per_worker = cb.controller.check_results[-1].candidate_workers
    assert set(per_worker) == set(measured)
    results = fit_report.order_results(cb.controller.check_results[-1].to_json()
                                       | {"same_as": dict(same)}, off)
    assert set(results) == set(measured) | set(off) | set(same) | {"default"}
    assert results["random"]["workers"]["worker:0"]["pairs"] == rounds
    for alias, order in same.items():
        assert results[alias]["same_as"] == order
        assert results[alias]["workers"] == results[order]["workers"]


def test_parameters_group_the_shards_of_a_variable():
    import types

    def var(name, n):
        return types.SimpleNamespace(name=name, dtype=types.SimpleNamespace(size=4),
                                     shape=types.SimpleNamespace(num_elements=lambda: n))
    got = fit_mode.parameters([var("m/emb/part_0:0", 6), var("m/emb/part_1:0", 4),
                               var("m/dense/kernel:0", 3)])
    assert got == [{"name": "m/emb", "bytes": 40, "shards": 2, "ps": []},
                   {"name": "m/dense/kernel", "bytes": 12, "shards": 1, "ps": []}]
    placed = var("m/w:0", 2)
    placed.device = "/job:ps/replica:0/task:3/device:CPU:0"
    assert fit_mode.parameters([placed])[0]["ps"] == [3]
