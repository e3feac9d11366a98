"""TAC's compute profile: the traced step replayed in a child process (no cluster).

A subclassed model with a dict of inputs (integer ids into an embedding, floats), its
layers declared in another order than called, trained by tf_keras fit in this process:
the profile times the DAG's own op names, and leaves this process as it was.
"""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def _fit_subclassed_model():
    """(model, fit's traced train function) of a small subclassed two-input model."""
    import tensorflow as tf
    import tf_keras as keras
    from tictac_hooks.patches import keras_internals

    class Ranker(keras.Model):
        def __init__(self):
            super().__init__(name="ranker")
            self.head = keras.layers.Dense(1, name="head")      # declared first, used last
            self.hidden = keras.layers.Dense(8, "relu", name="hidden")
            self.table = keras.layers.Embedding(8, 4, name="table")

        def call(self, x):
            ids = tf.reduce_mean(self.table(x["ids"]), axis=1)
            return self.head(self.hidden(tf.concat([ids, x["dense"]], axis=1)))

    keras.utils.set_random_seed(3)
    model = Ranker()
    model.compile("sgd", "mse")
    data = tf.data.Dataset.from_tensor_slices(
        ({"ids": np.arange(60).reshape(20, 3) % 8, "dense": np.ones((20, 4), "float32")},
         np.zeros((20, 1), "float32"))).batch(5).repeat()   # batch dimension unknown
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
    return model, keras_internals.traced_step_functions(model.train_function)[-1]


@pytest.mark.slow
def test_the_step_is_replayed_under_the_dags_names_and_this_process_is_untouched():
    import tensorflow as tf
    import tf_keras as keras
    from tictac_hooks.run.compute_profile import profile_step
    from tictac_hooks.graph.tf.functions import extract_concrete_function
    from tictac_hooks.patches import keras_internals

    model, concrete = _fit_subclassed_model()
    assert keras_internals.examples_per_step(model, 2) == 5
    names = [op.name for op in extract_concrete_function(concrete).graph.compute_ops]
    weights = [w.copy() for w in model.get_weights()]
    variables = len(model.variables)

    keras.utils.set_random_seed(11)
    np_state, py_state = np.random.get_state(), random.getstate()
    profile = profile_step(concrete, names, batch_size=5, steps=3)
    np.testing.assert_array_equal(np_state[1], np.random.get_state()[1])
    assert py_state == random.getstate()
    after_profile = tf.random.uniform([4]).numpy()
    keras.utils.set_random_seed(11)
    assert np.array_equal(after_profile, tf.random.uniform([4]).numpy())  # no draw taken

    assert set(profile.times) <= set(names) and profile.coverage > 0.8, profile
    timed = {n.rsplit("/", 1)[-1] for n in profile.times if profile.times[n] > 0}
    assert {"MatMul", "Relu"} <= timed, sorted(profile.times)
    assert any("table" in n for n in profile.times)  # the embedding's ops, valid ids
    assert profile.batch_size == 5 and profile.seconds > 0
    for before, now in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, now)
    assert len(model.variables) == variables


def test_a_step_that_captures_a_table_is_refused_in_one_line(caplog):
    import tensorflow as tf
    from tictac_hooks.run.compute_profile import compute_times_for

    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(["a", "b"], [0, 1], tf.string, tf.int64), -1)
    concrete = tf.function(lambda x: table.lookup(x)).get_concrete_function(
        tf.TensorSpec([None], tf.string))
    with caplog.at_level(logging.INFO, logger="tictac"):
        profile, reason = compute_times_for(concrete, ["x"], None, algorithm="tac")
    assert profile is None and "not a variable" in reason, reason
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert record.getMessage().endswith("TAC is off for this run, TIC instead"), record


def test_the_childs_error_is_its_last_error_line():
    from tictac_hooks.run.compute_profile import _last_error
    stderr = ("Traceback (most recent call last):\n  File \"x\", line 1\n"
              "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph "
              "execution error:\n\nDetected at node x\nInvalidArgumentError: indices[10,0] "
              "= -1 is not in [0, 8)\n\t [[{{node x}}]]\n")
    assert _last_error(stderr, 1) == "InvalidArgumentError: indices[10,0] = -1 is not in [0, 8)"
    assert _last_error("Killed\n", -9) == "the profiling child exited with status -9"


@pytest.mark.parametrize("dtype, expected", [("int64", 0), ("int32", 0), ("bool", False),
                                             ("string", b"")])
def test_synthetic_inputs_are_valid_ids_by_construction(dtype, expected):
    from tictac_hooks.graph.tf.replay import Tensor, synthetic_value
    value = synthetic_value(Tensor(dtype, (None, 3)), batch_size=4)
    assert value.shape == (4, 3) and (value == expected).all()
    floats = synthetic_value(Tensor("float32", (2, None)), batch_size=4)
    assert floats.shape == (2, 4) and floats.dtype == np.float32
    assert ((floats >= 0) & (floats < 1)).all()  # cast to an id: 0
