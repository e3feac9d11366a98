"""Private Keras / TensorFlow attributes the TicTac callback needs.

Tested on: tf_keras 2.21 (tf.keras with TF_USE_LEGACY_KERAS=1), Keras 3.15,
TensorFlow 2.21.

* tf_keras's ``Model.train_function`` / ``test_function`` / ``predict_function`` are
  the ``tf.function`` or a lambda (``coordinator.schedule``) closing over it; the
  traced ``ConcreteFunction``s come from ``tf.function``'s private
  ``_list_all_concrete_functions()``.
* Under ParameterServerStrategy, tf_keras keeps the coordinator as
  ``Model._cluster_coordinator``; ``join()`` on it waits for every scheduled step.
* ``ParameterServerStrategy`` (V2) leaves the public ``cluster_resolver`` property None
  and keeps the resolver as ``strategy._cluster_resolver``.
* tf_keras's compiled loss is tracked by a ``Mean`` metric named ``"loss"`` (the first
  of ``Model.metrics``) that it updates once per step with ``sample_weight`` = the
  batch's leading dimension: its ``count`` variable sums the examples of the epoch's
  steps so far (reset at each epoch's start).
* tf_keras's ``BackupAndRestore`` keeps its state as ``model._training_state`` during
  fit; that state's ``read_checkpoint_manager.directory`` is ``<backup_dir>/chief``.
* tf_keras refuses batch-level callbacks under ParameterServerStrategy unless the
  callback sets ``_supports_tf_logs = True`` (it then gets the logs as RemoteValues,
  unsynchronised); TicTac's callback reads no logs, it only counts steps.

:func:`check_upstream` checks these on a model; ``tests/test_keras_callback.py`` calls it
so an upstream change fails loudly.
"""

from __future__ import annotations

import os
from typing import Any

class KerasInternalsError(RuntimeError):
    """The installed Keras no longer has an internal attribute TicTac relies on."""


def tf_function_of(step_function: Any, depth: int = 3) -> Any:
    """The ``tf.function`` behind a Keras step function: the function itself, or one
    found in the closures of the wrappers around it (tf_keras wraps evaluate's and, under
    ParameterServerStrategy, fit's in a ``coordinator.schedule`` lambda)."""
    frontier = [step_function]
    for _ in range(depth + 1):
        nxt = []
        for fn in frontier:
            if hasattr(fn, "_list_all_concrete_functions"):
                return fn
            for cell in getattr(fn, "__closure__", None) or ():
                try:
                    nxt.append(cell.cell_contents)
                except ValueError:  # empty cell
                    continue
        frontier = nxt
    raise KerasInternalsError(
        f"no tf.function found behind {step_function!r}: TicTac's Keras callback "
        "supports tf_keras (TF_USE_LEGACY_KERAS=1) model.fit/evaluate/predict (not "
        "run_eagerly); for Keras 3 use tictac_hooks.TicTacLoop in a custom "
        "ClusterCoordinator loop")


def traced_step_functions(step_function: Any) -> list[Any]:
    """The ConcreteFunctions traced so far for a Keras step function (newest last)."""
    return list(tf_function_of(step_function)._list_all_concrete_functions())


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


def examples_per_step(model: Any, steps: int) -> int | None:
    """The batch size fit fed, from the loss metric's example count over the ``steps``
    of the current epoch that ran (None where the model keeps no such metric: a custom
    ``train_step``, Keras 3). Reads one variable; changes nothing."""
    examples = examples_this_epoch(model) if steps >= 1 else None
    if examples is None:
        return None
    batch = round(examples / steps)
    return batch if batch >= 1 else None


def steps_run(model: Any) -> int | None:
    """Training steps the model ran so far, over every fit (tf_keras's
    ``_train_counter``, which each step increments; None where unreadable). Reads one
    variable; changes nothing."""
    counter = getattr(model, "_train_counter", None)
    if counter is None:
        return None
    try:
        return int(counter.numpy())
    except Exception:  # noqa: BLE001 - unreadable: no answer, not an error
        return None


def examples_this_epoch(model: Any) -> float | None:
    """The examples fit's loss metric counted in the current epoch (None where the
    model keeps no such metric). Reads one variable; changes nothing."""
    for metric in getattr(model, "metrics", ()):
        count = getattr(metric, "count", None)
        if getattr(metric, "name", None) == "loss" and count is not None:
            try:
                return float(count.numpy())
            except Exception:  # noqa: BLE001 - unreadable: no answer, not an error
                return None
    return None


def backup_dir(model: Any) -> str | None:
    """The ``backup_dir`` of the ``BackupAndRestore`` callback fit runs with (None:
    none). tf_keras's callback keeps its state as ``model._training_state`` from its
    ``on_train_begin`` to its ``on_train_end``; the state's ``read_checkpoint_manager``
    reads ``<backup_dir>/chief``."""
    state = getattr(model, "_training_state", None)
    manager = getattr(state, "read_checkpoint_manager", None)
    directory = getattr(manager, "directory", None)
    if not isinstance(directory, str) or not directory:
        return None
    return os.path.dirname(directory.rstrip("/"))


def allow_batch_hooks_under_pss(callback: Any) -> None:
    """Lets ``callback`` implement ``on_*_batch_end`` under ParameterServerStrategy."""
    callback._supports_tf_logs = True


def check_upstream(model: Any) -> None:
    """Raises KerasInternalsError if a tf_keras model trained by fit lacks what we use."""
    if not hasattr(model, "train_function"):
        raise KerasInternalsError("tf_keras Model has no 'train_function' any more")
    if not traced_step_functions(model.train_function):
        raise KerasInternalsError("fit's train function has no traced concrete function")
    loss = [m for m in model.metrics if getattr(m, "name", None) == "loss"]
    if not loss or getattr(loss[0], "count", None) is None:
        raise KerasInternalsError("fit's loss metric ('loss', with its example 'count') is "
                                  "gone: update examples_per_step")
