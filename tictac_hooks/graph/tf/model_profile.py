"""A Keras model's profile (:class:`tictac_hooks.graph.profile.Profile`) from one traced
and measured step on this machine: the DAG of :mod:`tictac_hooks.graph.tf.analyze`
(compute op times measured, recvs sized), its parameters in the model's creation order
with the bytes of each variable and of its gradient, and the partitioner's rule.

Reads that do not cross the network under ParameterServerStrategy are dropped: the
optimizer's reads of its own state (the update runs on the variable's PS). TensorFlow
is imported when these functions are called.
"""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.profile import Parameter, Profile
from tictac_hooks.graph.tf import analyze
from tictac_hooks.graph.tf.declared import parameter_name

MIN_SHARD_BYTES = 256 << 10  # TensorFlow's PS tutorial, and `tictac bench`'s default
NOMINAL_RATE = 1e9 / 8      # recv times in the saved DAG only; whatif re-times them


def profile_of_graph(graph: Graph, model: Any, name: str, training: bool, batch: int,
                     min_shard_bytes: int | None = MIN_SHARD_BYTES) -> Profile:
    """The profile of ``model`` from its timed DAG (:func:`analyze.analyzed_model`)."""
    optimizer = getattr(model, "optimizer", None)
    optimizer_state = {parameter_name(v.name) for v in getattr(optimizer, "variables", [])
                       or []} if optimizer is not None else set()
    model_vars = {parameter_name(v.name): v for v in model.variables}
    optimizer_state -= set(model_vars)
    kept = [op for op in graph.recvs if op.param not in optimizer_state]
    graph = graph.with_recvs_only({op.name for op in kept})
    trainable = {parameter_name(v.name) for v in model.trainable_variables}
    pulled: dict[str, int] = {}
    gathered: dict[str, int] = {}
    first: dict[str, tuple[int, str]] = {}
    for op in graph.recvs:
        key = op.param or op.name
        pulled[key] = max(pulled.get(key, 0), op.bytes or 0)
        if op.inputs:  # a lookup: the gradient is the rows it read
            gathered[key] = gathered.get(key, 0) + (op.bytes or 0)
        first.setdefault(key, (op.declared if op.declared is not None else 1 << 30, key))
    params = []
    for key in sorted(first, key=first.__getitem__):
        var = model_vars.get(key)
        whole = _variable_bytes(var) if var is not None else pulled[key]
        push = (gathered.get(key, whole) if key in trainable else 0)
        params.append(Parameter(key, whole, push))
    graph = Graph(op if not op.is_recv or op.param else _with_param(op)
                  for op in graph.ops)
    return Profile(model=name, training=training, batch=batch, graph=graph,
                   parameters=tuple(params), min_shard_bytes=min_shard_bytes,
                   source=source())


def keras_profile(model: Any, example: Any, name: str, training: bool = True,
                  min_shard_bytes: int | None = MIN_SHARD_BYTES,
                  progress: bool = True) -> Profile:
    """Traces and measures ``model`` on ``example`` ((inputs, targets)) and profiles it."""
    graph = analyze.analyzed_model(model, example, training, NOMINAL_RATE, progress=progress)
    inputs = example[0]
    first = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs
    return profile_of_graph(graph, model, name, training, len(first), min_shard_bytes)


def application_profile(name: str, training: bool, batch: int, image_size: int | None,
                        min_shard_bytes: int | None = MIN_SHARD_BYTES,
                        progress: bool = True) -> Profile:
    """The profile of a ``keras.applications`` model (random weights, random images)."""
    import numpy as np
    model = analyze.build_application_model(name, training, batch, image_size)
    side = int(model.input_shape[1])
    rng = np.random.default_rng(0)
    example = (rng.normal(size=(batch, side, side, 3)).astype("float32"),
               rng.integers(0, int(model.output_shape[-1]), size=(batch,)))
    return keras_profile(model, example, name.lower(), training, min_shard_bytes, progress)


def _variable_bytes(var: Any) -> int:
    return int(var.shape.num_elements() or 0) * int(var.dtype.size)


def _with_param(op: Any) -> Any:
    import dataclasses
    return dataclasses.replace(op, param=op.name)


def source() -> dict[str, Any]:
    """Where a profile's times were measured."""
    import tensorflow as tf
    return {"machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),  # other jobs sharing the CPU
            "tensorflow": tf.__version__, "keras": analyze.keras_module().__name__,
            "date": datetime.date.today().isoformat()}
