"""Iteration DAGs of Keras models' train (or predict) steps (docs/ALGORITHMS.md, "Model").

:func:`graph_from_keras_model` -- traces a tf_keras or Keras 3 model's train (or
predict) step and extracts it with
:func:`~tictac_hooks.graph.tf.functions.extract_concrete_function`, returning the
function so a profiler can run it.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

from typing import Any, Sequence

from tictac_hooks.graph.dag import Graph, GraphError
from tictac_hooks.graph.tf.extraction import Extraction
from tictac_hooks.graph.tf.functions import extract_concrete_function


def keras_step_function(model: Any, batch_size: int, training: bool = True,
                        input_shape: Sequence[int] | None = None,
                        num_classes: int | None = None, example: Any = None
                        ) -> tuple[Any, tuple[Any, ...]]:
    """A concrete function of one train (or predict) step of a Keras model, and its args.

    Training traces ``model.train_step((x, y))`` inside a ``tf.function``: forward,
    loss, gradients and the optimizer update, the same call that ``fit``'s per-step
    function makes (fit adds only the iterator's ``get_next`` and, in tf_keras, a step
    counter). Inference traces ``model.predict_step(x)``. Inputs are random tensors of
    the model's input shape (``input_shape`` overrides it, batch dimension excluded);
    labels are integer classes when the loss is sparse, else tensors shaped like the
    output. ``example``, an ``(inputs, targets)`` batch (arrays or dicts of arrays, as
    ``tictac bench --model PATH.py:FUNCTION`` takes them), replaces the random tensors:
    a model with several inputs, ids or its own targets is traced on its own batch
    (``batch_size`` is then the batch's first dimension, for the caller). The model
    must be compiled for training.

    Works for tf_keras (``TF_USE_LEGACY_KERAS=1``) and Keras 3 with the TensorFlow
    backend.
    """
    import numpy as np
    import tensorflow as tf

    if batch_size < 1:
        raise GraphError(f"batch_size must be >= 1, got {batch_size}")
    if training and getattr(model, "optimizer", None) is None:
        raise GraphError("the model is not compiled: call model.compile(optimizer=..., "
                         "loss=...) before extracting its training step")
    rng = np.random.default_rng(0)
    if example is not None:
        x = tf.nest.map_structure(tf.constant, example[0])
    else:
        shape = (tuple(input_shape) if input_shape is not None
                 else tuple(model.inputs[0].shape[1:]))
        if any(d is None for d in shape):
            raise GraphError(f"model input shape {shape} has unknown dimensions: pass "
                             "input_shape=(...) without the batch dimension")
        x = tf.constant(rng.standard_normal((batch_size,) + shape).astype("float32"))
    if not training:
        fn = tf.function(lambda x: model.predict_step(x))
        return fn.get_concrete_function(x), (x,)
    if example is not None:
        y = tf.nest.map_structure(tf.constant, example[1])
    else:
        out_shape = tuple(model.outputs[0].shape[1:])
        classes = num_classes or (out_shape[-1] if out_shape else 1)
        if _sparse_loss(model):
            y = tf.constant(rng.integers(0, classes, size=(batch_size,)).astype("int64"))
        else:
            y = tf.constant(rng.random((batch_size,) + out_shape).astype("float32"))
    fn = tf.function(lambda x, y: model.train_step((x, y)))
    return fn.get_concrete_function(x, y), (x, y)


def _sparse_loss(model: Any) -> bool:
    loss = getattr(model, "loss", None)
    name = loss if isinstance(loss, str) else type(loss).__name__ + getattr(loss, "__name__", "")
    return "sparse" in str(name).lower()


def graph_from_keras_model(model: Any, batch_size: int, training: bool = True,
                           input_shape: Sequence[int] | None = None,
                           remote_variables: Any = None
                           ) -> tuple[Graph, Any, tuple[Any, ...]]:
    """(DAG, concrete function, example args) of one step of a Keras model.

    The function and args can be handed to
    :func:`tictac_hooks.graph.tf.profiler.measure_compute_times`. See
    :func:`keras_step_function` for what is traced and
    :func:`extract_concrete_function` for how it becomes a DAG (by default every
    variable, optimizer and metric variables included, counts as living on a PS).
    Each recv carries its variable's position in the model's variable list
    (``Op.declared``: ``trainable_variables``, then the others; graph/tf/declared.py).
    """
    ext, fn, args = extract_keras_model(model, batch_size, training, input_shape,
                                        remote_variables)
    return ext.graph, fn, args


def extract_keras_model(model: Any, batch_size: int, training: bool = True,
                        input_shape: Sequence[int] | None = None,
                        remote_variables: Any = None, example: Any = None
                        ) -> tuple[Extraction, Any, tuple[Any, ...]]:
    """Like :func:`graph_from_keras_model`, with the full :class:`Extraction`
    (``example``: see :func:`keras_step_function`)."""
    fn, args = keras_step_function(model, batch_size, training, input_shape,
                                   example=example)
    return extract_concrete_function(fn, remote_variables, declared=model), fn, args
