"""The DAG of a traced ``tf.function`` step: Keras fit's train/test/predict function, or
the step a custom ``ClusterCoordinator`` loop schedules. Shared by TicTac and
TicTacLoop; TensorFlow is imported when called."""

from __future__ import annotations

from typing import Any, Mapping

from tictac_hooks.callbacks.controller import TicTacSetupError
from tictac_hooks.callbacks.frontend import StepDAG


def traced_function(step_function: Any, what: str) -> Any:
    """The concrete function the step last ran as (clear error if never traced)."""
    from tictac_hooks.patches import keras_internals
    functions = keras_internals.traced_step_functions(step_function)
    if not functions:
        raise TicTacSetupError(f"{what} has not been traced yet")
    return functions[-1]


def dag_of(concrete: Any, compute_times: Mapping[str, float] | None = None,
           bandwidth: float | None = None) -> StepDAG:
    """The DAG of a traced step function: its reads of PS variables are the recvs.
    Reads ordered after same-step work (their inputs were dropped) are left
    unscheduled (``late``)."""
    from tictac_hooks.graph.tf.functions import extract_concrete_function
    extraction = extract_concrete_function(concrete, remote_variables=["/job:ps"])
    return StepDAG(extraction.graph, compute_times, late=frozenset(extraction.dropped_inputs),
                   bandwidth=bandwidth)
