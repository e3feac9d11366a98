"""Private Keras / TensorFlow attributes the TicTac callback needs.

Tested on: tf_keras 2.21 (tf.keras with TF_USE_LEGACY_KERAS=1), Keras 3.15,
TensorFlow 2.21.

* tf_keras keeps the ``tf.function`` that fit runs as ``Model.train_tf_function`` (and
  ``test_tf_function``/``predict_tf_function``); its traced ``ConcreteFunction``s come
  from ``tf.function``'s private ``_list_all_concrete_functions()``.
* Under ParameterServerStrategy, tf_keras keeps the coordinator as
  ``Model._cluster_coordinator``; ``join()`` on it waits for every scheduled step.
* ``ParameterServerStrategy`` (V2) leaves the public ``cluster_resolver`` property None
  and keeps the resolver as ``strategy._cluster_resolver``.
* ``model.train_function`` is read by the fit loop on every step, so replacing it in
  ``on_train_begin`` wraps each step (documented behaviour of neither Keras).

:func:`check_upstream` checks these on a model; ``tests/test_keras_callback.py`` calls it
so an upstream change fails loudly.
"""

from __future__ import annotations

from typing import Any

TF_FUNCTION_ATTRS = {"train": "train_tf_function", "test": "test_tf_function",
                     "predict": "predict_tf_function"}


class KerasInternalsError(RuntimeError):
    """The installed Keras no longer has an internal attribute TicTac relies on."""


def traced_step_functions(model: Any, mode: str = "train") -> list[Any]:
    """The ConcreteFunctions fit/evaluate/predict has traced for ``model`` (newest last)."""
    attr = TF_FUNCTION_ATTRS[mode]
    fn = getattr(model, attr, None)
    if fn is None:
        raise KerasInternalsError(
            f"{type(model).__module__}.{type(model).__name__} has no {attr!r}: TicTac's "
            "Keras callback supports tf_keras (TF_USE_LEGACY_KERAS=1) model.fit; for "
            "Keras 3 use tictac_hooks.TicTacLoop in a custom ClusterCoordinator loop")
    lister = getattr(fn, "_list_all_concrete_functions", None)
    if lister is None:
        raise KerasInternalsError(
            "tf.function no longer has _list_all_concrete_functions(); update "
            "patches/keras_internals.py for this TensorFlow version")
    return list(lister())


def cluster_coordinator(model: Any) -> Any | None:
    """tf_keras's ClusterCoordinator of a model trained under ParameterServerStrategy."""
    return getattr(model, "_cluster_coordinator", None)


def strategy_cluster_spec(strategy: Any) -> dict[str, Any]:
    """The cluster spec (as a dict) a distribution strategy was built with."""
    resolver = getattr(strategy, "cluster_resolver", None) or \
        getattr(strategy, "_cluster_resolver", None)
    if resolver is None:
        raise KerasInternalsError(
            f"cannot find the cluster resolver of {type(strategy).__name__}; update "
            "patches/keras_internals.py for this TensorFlow version")
    return resolver.cluster_spec().as_dict()


def check_upstream(model: Any) -> None:
    """Raises KerasInternalsError if a tf_keras model trained by fit lacks what we use."""
    for attr in ("train_function", "train_tf_function"):
        if not hasattr(model, attr):
            raise KerasInternalsError(f"tf_keras Model has no {attr!r} any more")
    traced_step_functions(model, "train")
