"""The DAG of a traced ``tf.function`` step: Keras fit's train/test/predict function, or
the step a custom ``ClusterCoordinator`` loop schedules, and its compute profile.
Shared by TicTac and TicTacLoop; TensorFlow is imported when called."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from tictac_hooks.run.controller import Controller
from tictac_hooks.run.settings import TicTacSetupError
from tictac_hooks.run.driver import StepDAG
from tictac_hooks.graph.dag import Graph


def traced_function(step_function: Any, what: str) -> Any:
    """The concrete function the step last ran as (clear error if never traced)."""
    from tictac_hooks.patches import keras_internals
    functions = keras_internals.traced_step_functions(step_function)
    if not functions:
        raise TicTacSetupError(f"{what} has not been traced yet")
    return functions[-1]


def dag_of(concrete: Any, compute_times: Mapping[str, float] | None = None,
           model: Any = None) -> StepDAG:
    """The DAG of a traced step function: its reads of PS variables are the recvs.
    Reads ordered after same-step work (their inputs were dropped) are left
    unscheduled (``late``). With ``model``, each recv carries its variable's position
    in the model's variable list (``Op.declared``, for the ``declared`` baseline)."""
    from tictac_hooks.graph.tf.functions import extract_concrete_function
    try:
        extraction = extract_concrete_function(concrete, remote_variables=["/job:ps"],
                                               declared=model)
    except Exception as e:  # noqa: BLE001 -- only the baseline's positions are lost
        if model is None:
            raise
        logging.getLogger("tictac").warning(
            "the model's declaration order could not be read (%s: %s); the DAG goes "
            "without it (only the 'declared' baseline needs it)", type(e).__name__, e)
        extraction = extract_concrete_function(concrete, remote_variables=["/job:ps"])
    return StepDAG(extraction.graph, compute_times, late=frozenset(extraction.dropped_inputs))


def profile_for(controller: Controller, concrete: Any, dag: StepDAG,
                batch_size: int | None) -> dict[str, float] | None:
    """Per-op compute times of the traced step ``concrete``, keyed by ``dag``'s op
    names (compute_profile.py). None when the profile fails: one warning line, TAC is
    off for this run (the controller is told why), training goes on."""
    from tictac_hooks.run.compute_profile import compute_times_for
    graph = dag.graphs if isinstance(dag.graphs, Graph) else next(iter(dag.graphs.values()))
    profile, reason = compute_times_for(concrete, [op.name for op in graph.compute_ops],
                                        batch_size, controller.settings.algorithm)
    if profile is None:
        controller.compute_profile_failed(reason)
        return None
    controller.say(f"compute profile: {len(profile.times)} ops, "
                   f"{sum(profile.times.values()) * 1e3:.1f} ms per step at batch "
                   f"{profile.batch_size} ({profile.coverage:.0%} of the profiled op time "
                   f"matched), measured in {profile.seconds:.1f} s in a child process")
    return profile.times
