"""Benchmark workloads: Keras application models, in-graph replicated (tf.compat.v1).

The variables live on the PS tasks (``replica_device_setter``, round-robin), one tower
per worker reads them and computes on synthetic input (random images on the worker, as
the paper's synthetic ImageNet). Training: each tower's gradients, averaged on the PS
that holds the variable, update it with SGD (synchronous, as in the paper).
Inference: the forward pass alone. Each tower ends in a ``tf.timestamp()`` on its
worker that depends on the tower's last output: the client fetches it to know when
each worker finished (straggler time, makespan).

``compute_workers`` adds the compute reference: on each of those workers a tower of its
own copy of the model, its variables on that worker, so that a step of these towers is
the workers' computation with no transfer at all (E's comp in the benchmark; a step over
a fast link still pays the transfers' CPU: VGG-16 inference 378 ms against 311 ms of
computation on two cores).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

# name -> (keras.applications attribute, input side, default per-worker batch for
# training, for inference). Small inputs so that two CPU cores can run every task
# (Inception-v3 needs >= 75); batches large enough that a step takes about a second, so
# that the link rate that balances communication and computation stays near 1 Gbit/s.
MODELS = {
    "resnet50": ("ResNet50", 32, 32, 96),
    "inceptionv3": ("InceptionV3", 75, 16, 48),
    "vgg16": ("VGG16", 32, 32, 96),
    "mobilenetv2": ("MobileNetV2", 32, 64, 256),
}
CLASSES = 10
MODES = ("training", "inference")


def default_batch(model: str, mode: str) -> int:
    return MODELS[model_key(model)][2 if mode == "training" else 3]


def model_key(name: str) -> str:
    key = name.lower().replace("-", "").replace("_", "")
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    return key


@dataclasses.dataclass
class TowerSet:
    """The fetches of one set of worker tasks: ``step`` runs one iteration and returns
    the per-tower finish timestamps (wall-clock seconds) as its last elements."""

    workers: list[int]
    fetches: list[Any]
    num_timestamps: int


@dataclasses.dataclass
class Workload:
    graph: Any
    init: Any
    sets: list[TowerSet]
    variables: list[Any]
    param_bytes: int
    all_variables: list[Any] = dataclasses.field(default_factory=list)
    compute: TowerSet | None = None  # the towers on worker-local copies (compute_workers)
    # the variables in declaration order (the "declared" baseline): what
    # tf.compat.v1.trainable_variables() returns, then the other global variables
    declared: list[Any] = dataclasses.field(default_factory=list)


def _tower(net: Any, variables: list, mode: str, x: Any, labels: Any) -> tuple[list, list]:
    """The tower's last ops (what its timestamp waits for) and its gradients (training)."""
    import tensorflow as tf
    import tf_keras
    if mode == "training":
        logits = net(x, training=True)
        loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(labels, logits))
        grads = tf.gradients(loss, variables)
        return [g for g in grads if g is not None], grads
    # A fetched scalar: Grappler turns compute that only feeds control edges into NoOps
    # (it would never run).
    return [tf.reduce_sum(net(x, training=False))], []


def build(model: str, mode: str, worker_sets: Sequence[Sequence[int]], num_ps: int,
          batch: int, seed: int = 7, learning_rate: float = 1e-3,
          compute_workers: Sequence[int] = ()) -> Workload:
    """One graph: the model's variables on the PS tasks and, for each worker set, one
    tower per worker task of that set (the sets share the variables); with
    ``compute_workers``, the compute reference (module docstring)."""
    import os
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    attr, side = MODELS[model_key(model)][:2]
    tf.compat.v1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(ps_tasks=num_ps)):
            net = getattr(tf_keras.applications, attr)(
                weights=None, input_shape=(side, side, 3), classes=CLASSES)
        variables = list(net.trainable_variables)
        all_variables = list(net.variables)

        def _inputs(w: int) -> tuple[Any, Any]:  # worker w's synthetic batch
            x = tf.random.uniform([batch, side, side, 3], seed=seed + w)
            labels = tf.random.uniform([batch], maxval=CLASSES, dtype=tf.int32,
                                       seed=seed + 100 + w)
            return x, labels if mode == "training" else None

        compute = None
        if compute_workers:
            lasts, stamps = [], []
            for w in compute_workers:
                with tf.device(f"/job:worker/task:{w}"), tf.name_scope(f"compute{w}"):
                    local = getattr(tf_keras.applications, attr)(
                        weights=None, input_shape=(side, side, 3), classes=CLASSES)
                    last, _ = _tower(local, list(local.trainable_variables), mode,
                                     *_inputs(w))
                    # one fetched scalar that needs every gradient (see _tower), at the
                    # cost of one element read from each
                    value = last[0] if mode == "inference" else tf.add_n(
                        [tf.reshape(g, [-1])[0] for g in last])
                    with tf.control_dependencies([value]):
                        stamps.append(tf.timestamp())
                    lasts.append(value)
            compute = TowerSet(list(compute_workers), lasts + stamps, len(stamps))
        sets = []
        for tasks in worker_sets:
            tower_grads, stamps, outputs = [], [], []
            for w in tasks:
                with tf.device(f"/job:worker/task:{w}"), tf.name_scope(f"tower{w}"):
                    last, grads = _tower(net, variables, mode, *_inputs(w))
                    if mode == "training":
                        tower_grads.append(grads)
                    else:
                        outputs.append(last[0])
                    with tf.control_dependencies(last):
                        stamps.append(tf.timestamp())
            fetches: list[Any] = list(outputs)
            if mode == "training":
                updates = []
                for i, var in enumerate(variables):
                    grads_i = [g[i] for g in tower_grads if g[i] is not None]
                    if not grads_i:
                        continue
                    with tf.compat.v1.colocate_with(var):
                        mean = tf.add_n(grads_i) / float(len(grads_i))
                        updates.append(var.assign_sub(learning_rate * mean).op)
                fetches.append(tf.group(*updates))
            sets.append(TowerSet(list(tasks), fetches + stamps, len(stamps)))
        init = tf.compat.v1.global_variables_initializer()
        declared = list(tf.compat.v1.trainable_variables())
        declared += [v for v in tf.compat.v1.global_variables()
                     if all(v is not d for d in declared)]
    param_bytes = sum(v.shape.num_elements() * v.dtype.size for v in variables)
    return Workload(graph, init, sets, variables, param_bytes, all_variables, compute,
                    declared)


def comm_heavy(worker: int, num_vars: int = 16, var_mib: int = 4, ps: int = 0
               ) -> tuple[Any, Any, Any]:
    """(graph, initializer, train op) of a model that is nearly all communication:
    ``num_vars`` square float32 variables of ``var_mib`` MiB each on PS task ``ps``,
    one matmul each on worker task ``worker`` (batch 8), plain SGD. The gate-cost
    benchmarks (benchmarks/bench_rendezvous.py, bench_shaped_overhead.py) step it."""
    import numpy as np
    import tensorflow as tf
    g = tf.Graph()
    with g.as_default():
        n = int((var_mib << 18) ** 0.5)
        with tf.device(f"/job:ps/task:{ps}"):
            ws = [tf.compat.v1.get_variable(f"w{i}", shape=[n, n],
                  initializer=tf.compat.v1.glorot_uniform_initializer(seed=i))
                  for i in range(num_vars)]
        with tf.device(f"/job:worker/task:{worker}"):
            x = tf.constant(np.random.RandomState(0).randn(8, n).astype("float32"))
            loss = tf.add_n([tf.reduce_mean((x @ w) ** 2) for w in ws])
            train = tf.compat.v1.train.GradientDescentOptimizer(1e-4).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    return g, init, train
