"""Benchmark workloads: Keras application models, or a PS workload of one's own (the
built-in dlrm and transformer, or PATH.py:FUNCTION: bench/user_model.py), in-graph
replicated (tf.compat.v1).

The variables live on the PS tasks (``replica_device_setter``, round-robin), one tower
per worker reads them and computes on synthetic input (random images on the worker, as
the paper's synthetic ImageNet; for a model of one's own, the batch its function
returned, with its compiled loss). Training: each tower's gradients, averaged on the PS
that holds the variable, update it with SGD (synchronous, as in the paper); an
embedding's gradient (the rows looked up) updates those rows only.
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


def check_model(name: str) -> None:
    """Raises ValueError for a model this bench cannot build: an unknown CNN, or a PS
    workload whose file or function is wrong (:class:`UserModelError`, naming it)."""
    from tictac_hooks.bench import user_model
    if user_model.is_model_spec(name):
        user_model.resolve(name)
    else:
        model_key(name)


def default_batch(model: str, mode: str) -> int:
    from tictac_hooks.bench import user_model
    if user_model.is_model_spec(model):
        from tictac_hooks.bench.models import DEFAULT_BATCH
        return DEFAULT_BATCH.get(model, user_model.DEFAULT_BATCH)
    return MODELS[model_key(model)][2 if mode == "training" else 3]


def model_key(name: str) -> str:
    """The CNN's key, or for a PS workload (a built-in of bench/models.py or
    PATH.py:FUNCTION, bench/user_model.py) its label, made fit for file names
    ("dlrm", "my_model-make"; the file is not imported: :func:`check_model` does)."""
    from tictac_hooks.bench import user_model
    if user_model.is_model_spec(name):
        return user_model.label_of(name).replace(".py:", "-").replace(":", "-")
    key = name.lower().replace("-", "").replace("_", "")
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}, a "
                         "built-in PS workload (dlrm, transformer) or PATH.py:FUNCTION")
    return key


@dataclasses.dataclass
class TowerSet:
    """The fetches of one set of worker tasks: ``step`` runs one iteration and returns
    the per-tower finish timestamps (wall-clock seconds) as its last elements."""

    workers: list[int]
    fetches: list[Any]
    num_timestamps: int
    # the fetches hold each tower's start timestamp just before the finishes
    # (bench/replay.py's compute reference: the emulated compute as each worker ran it)
    spans: bool = False


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


def _user_tower(net: Any, variables: list, mode: str, x: Any, y: Any) -> tuple[list, list]:
    """:func:`_tower` for a PS workload of one's own: its compiled loss on its own
    targets."""
    import tensorflow as tf
    import tf_keras
    if mode == "training":
        pred = net(x, training=True)
        if isinstance(net.loss, str) or callable(net.loss):
            loss = tf.reduce_mean(tf_keras.losses.get(net.loss)(y, pred))
        else:  # per-output losses: the compiled container sums them
            loss = net.compiled_loss(y, pred)
        grads = tf.gradients(loss, variables)
        return [g.values if isinstance(g, tf.IndexedSlices) else g
                for g in grads if g is not None], grads
    pred = net(x, training=False)
    return [tf.add_n([tf.reduce_sum(t) for t in tf.nest.flatten(pred)])], []


def _constants(value: Any) -> Any:
    """An array, or a dict of arrays, as constants of the graph (on the current device)."""
    import tensorflow as tf
    return tf.nest.map_structure(tf.constant, value)


def _sgd_update(var: Any, grads: list, learning_rate: float) -> Any:
    """``var -= learning_rate * mean(grads)``, colocated with ``var`` (its PS). A gather's
    gradient (IndexedSlices: the rows looked up) updates those rows only, as
    ParameterServerStrategy's optimizers do, so the pushes stay rows."""
    import tensorflow as tf
    n = float(len(grads))
    with tf.compat.v1.colocate_with(var):
        if all(isinstance(g, tf.IndexedSlices) for g in grads):
            values = tf.concat([g.values for g in grads], 0) * (learning_rate / n)
            indices = tf.concat([g.indices for g in grads], 0)
            return var.scatter_sub(tf.IndexedSlices(values, indices)).op
        dense = [tf.convert_to_tensor(g) for g in grads]
        return var.assign_sub(learning_rate * tf.add_n(dense) / n).op


def build(model: str, mode: str, worker_sets: Sequence[Sequence[int]], num_ps: int,
          batch: int, seed: int = 7, learning_rate: float = 1e-3,
          compute_workers: Sequence[int] = ()) -> Workload:
    """One graph: the model's variables on the PS tasks and, for each worker set, one
    tower per worker task of that set (the sets share the variables); with
    ``compute_workers``, the compute reference (module docstring). The graph is a
    ``tf.Graph`` of its own (run it with ``tf.compat.v1.Session(graph=...)``); eager
    execution is left as it was."""
    import os
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras

    from tictac_hooks.bench import user_model
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    source = user_model.resolve(model) if user_model.is_model_spec(model) else None
    # Graph mode inside this graph only: the process's eager mode stays as it was (a
    # process-wide disable_eager_execution() broke eager work that came after, e.g.
    # graph/tf/analyze's profiling); callers run the graph in a Session of their own.
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        if source is not None:
            # the user's model (bench/user_model.py), its variables on the PSes; the one
            # batch it returned is every worker's, as in fit mode
            with tf.compat.v1.device(
                    tf.compat.v1.train.replica_device_setter(ps_tasks=num_ps)):
                loaded = user_model.load(source, batch, tf_keras)
            net, tower = loaded.model, _user_tower

            def new_net() -> Any:
                return user_model.load(source, batch, tf_keras).model

            def _inputs(w: int) -> tuple[Any, Any]:
                return (_constants(loaded.inputs),
                        _constants(loaded.targets) if mode == "training" else None)
        else:
            attr, side = MODELS[model_key(model)][:2]

            def new_net() -> Any:
                return getattr(tf_keras.applications, attr)(
                    weights=None, input_shape=(side, side, 3), classes=CLASSES)

            with tf.compat.v1.device(
                    tf.compat.v1.train.replica_device_setter(ps_tasks=num_ps)):
                net = new_net()
            tower = _tower

            def _inputs(w: int) -> tuple[Any, Any]:  # worker w's synthetic batch
                x = tf.random.uniform([batch, side, side, 3], seed=seed + w)
                labels = tf.random.uniform([batch], maxval=CLASSES, dtype=tf.int32,
                                           seed=seed + 100 + w)
                return x, labels if mode == "training" else None
        variables = list(net.trainable_variables)
        all_variables = list(net.variables)

        compute = None
        if compute_workers:
            lasts, stamps = [], []
            for w in compute_workers:
                with tf.device(f"/job:worker/task:{w}"), tf.name_scope(f"compute{w}"):
                    local = new_net()
                    last, _ = tower(local, list(local.trainable_variables), mode,
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
                    last, grads = tower(net, variables, mode, *_inputs(w))
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
                    if grads_i:
                        updates.append(_sgd_update(var, grads_i, learning_rate))
                fetches.append(tf.group(*updates))
            sets.append(TowerSet(list(tasks), fetches + stamps, len(stamps)))
        init = tf.compat.v1.global_variables_initializer()
        # declaration order: a keras.applications model creates its variables in it; a
        # model of one's own lists them in model.trainable_variables (a subclassed
        # model creates them where first called, in use order)
        declared = (list(net.trainable_variables) if source is not None
                    else list(tf.compat.v1.trainable_variables()))
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
