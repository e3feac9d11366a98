"""Extraction of iteration DAGs from real TensorFlow: Keras 3 and tf_keras models,
nested tf.functions, and a graph-mode step on a real local PS cluster."""

from __future__ import annotations

import collections
import os
import re
import socket

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tictac_hooks.graph import oracle  # noqa: E402
from tictac_hooks.graph.tf import (functions, keras_models, naming,  # noqa: E402
                                   partition, profiler)
from tictac_hooks.graph.dag import GraphError  # noqa: E402


def _dense_model(keras):
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(8, activation="relu", name="d1"),
                              keras.layers.Dense(2, name="d2")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
    return model


def _conv_model(keras):
    model = keras.Sequential([keras.Input((12, 12, 3)),
                              keras.layers.Conv2D(4, 3, activation="relu", name="c1"),
                              keras.layers.BatchNormalization(name="bn"),
                              keras.layers.Flatten(),
                              keras.layers.Dense(3, name="d")])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    return model


def _reads_per_variable(ext):
    return collections.Counter(ext.recv_variables.values())


def _trainable_names(model):
    # Keras 3 names variables by path, tf_keras adds ":0".
    return [getattr(v, "path", None) or v.name for v in model.trainable_variables]


def _var_key(name):
    return name.split(":")[0]


@pytest.fixture(params=["keras3", "tf_keras"])
def keras(request):
    if request.param == "keras3":
        import keras as k
    else:
        k = pytest.importorskip("tf_keras")
    return k


def test_inference_recvs_are_one_read_per_trainable_variable(keras):
    model = _dense_model(keras)
    ext, fn, args = keras_models.extract_keras_model(model, batch_size=8, training=False)
    g = ext.graph
    assert len(g.recvs) == len(model.trainable_variables) == 4
    assert sorted(op.bytes for op in g.recvs) == [8, 32, 64, 128]   # float32 sizes
    assert g.channels == ["ps:0"]
    assert all(not op.inputs for op in g.recvs)
    # Every recv feeds the forward pass; the traced function runs as returned.
    assert all(any(r.name in op.inputs for op in g.ops) for r in g.recvs)
    assert fn(*args).shape == (8, 2)


def test_training_recvs_cover_forward_and_optimizer_reads(keras):
    model = _dense_model(keras)
    ext, fn, args = keras_models.extract_keras_model(model, batch_size=8, training=True)
    g = ext.graph
    reads = _reads_per_variable(ext)
    trainable = [_var_key(v.name) for v in model.trainable_variables]
    read_names = {_var_key(n) for n in reads}
    # Each trainable variable is read once by the forward pass (the backward pass
    # reuses that value)...
    forward = [r for r in g.recvs if "ReadVariableOp" in r.name and
               r.name.startswith("sequential")]
    assert len(forward) == len(trainable) == 4
    assert all(any(t.split("/")[-1] in _var_key(ext.recv_variables[r.name])
                   for t in trainable) for r in forward)
    # ...and the rest are optimizer and metric state read on the worker: the learning
    # rate once per variable (both Kerases), tf_keras' SGD also its momentum slot; the
    # loss tracker's total/count. tf_keras reads the slot a second time, after updating
    # it, only to add it to the variable: that read stays on the PS (one per variable).
    assert any("learning_rate" in n for n in read_names)
    assert len(g.recvs) == {"keras": 13, "tf_keras": 14}[keras.__name__]
    local = [n for n in ext.ps_side if ext.op_types[n] == "ReadVariableOp"]
    assert len(local) == {"keras": 0, "tf_keras": 4}[keras.__name__]
    # No PS-side op waits on a transfer to the worker.
    recvs = {r.name for r in g.recvs}
    assert not any(set(g[n].inputs) & recvs for n in ext.ps_side)
    # Writes to the (remote) variables stay in the DAG as PS-side ops (with the reads
    # only they take).
    assert ext.ps_side and all(ext.op_types[n].startswith("Assign")
                               for n in ext.ps_side if n not in local)
    # Reads ordered after a write (metric results) lost those inputs, recorded.
    assert ext.dropped_inputs and all(n in g for n in ext.dropped_inputs)
    assert all(not op.inputs for op in g.recvs)
    fn(*args)   # one real training step runs


def test_a_read_only_the_ps_takes_is_no_transfer_and_ps_ops_wait_on_none():
    """A PS-side update waits on no transfer to the worker: the reads it takes (its
    data, or the read of its own variable that automatic control dependencies order
    before it) run on the PS too. A read whose value only such ops take never leaves
    the PS: it is a PS-side op, not a recv (else TIC would see an op unblocked by two
    transfers for every variable and put them all in its first tie group)."""
    w = tf.Variable(tf.ones([4]), name="w_local_read")
    m = tf.Variable(tf.zeros([4]), name="m_local_read")

    @tf.function
    def step(x):
        y = tf.reduce_sum(w * x)           # the worker needs w
        m.assign(x)                        # a push
        w.assign_add(m)                    # m read after the write, for the PS's update
        return y

    ext = functions.extract_concrete_function(step.get_concrete_function(tf.ones([4])))
    g = ext.graph
    kinds = {ext.op_types[op.name]: op.kind for op in g.ops if op.kind == "recv"}
    assert len(g.recvs) == 1 and ext.recv_variables[g.recvs[0].name].startswith("w_local")
    assert kinds == {"ReadVariableOp": "recv"}
    m_read = [n for n in ext.ps_side if ext.op_types[n] == "ReadVariableOp"]
    assert len(m_read) == 1 and g[m_read[0]].kind == "compute"
    # It keeps its ordering after the write to m; the update no longer waits on w's recv.
    assert any(ext.op_types[i] == "AssignVariableOp" for i in g[m_read[0]].inputs)
    add = next(n for n in ext.ps_side if ext.op_types[n] == "AssignAddVariableOp")
    assert g.recvs[0].name in ext.dropped_inputs[add]
    assert g.recvs[0].name not in g[add].inputs and m_read[0] in g[add].inputs


def test_conv_model_with_batchnorm_extracts_and_times_run(keras):
    model = _conv_model(keras)
    for training in (True, False):
        ext, fn, args = keras_models.extract_keras_model(model, 4, training)
        trainable = len(model.trainable_variables)
        assert len(ext.graph.recvs) >= trainable
        assert set(ext.recv_variables) == {r.name for r in ext.graph.recvs}
    assert ext.graph.summary()["param_bytes"] > 0


def test_nested_tf_functions_are_inlined_and_remote_handles_followed():
    w = tf.Variable(tf.ones([4, 4]), name="w")

    @tf.function
    def inner(x, v):
        return tf.matmul(x, v)

    @tf.function
    def outer(x):
        return inner(x, w.read_value()) + inner(x, w)

    ext = functions.extract_concrete_function(outer.get_concrete_function(tf.ones([2, 4])))
    g = ext.graph
    assert len(g.recvs) == 2
    inlined = [op for op in g.ops if op.name.endswith("/MatMul")]
    assert len(inlined) == 2
    # The read done inside the second call is a recv feeding that call's MatMul.
    inside = [r for r in g.recvs if "/" in r.name and "PartitionedCall" in r.name]
    assert len(inside) == 1
    assert any(inside[0].name in op.inputs for op in inlined)
    add = next(op for op in g.ops if ext.op_types[op.name] == "AddV2")
    assert all(any(i.startswith(c.name.rsplit("/", 1)[0]) for i in add.inputs)
               for c in inlined)


def test_remote_variables_selection():
    a = tf.Variable(tf.ones([3]), name="a")
    b = tf.Variable(tf.ones([5]), name="b")

    @tf.function
    def f():
        return tf.reduce_sum(a) + tf.reduce_sum(b)

    cf = f.get_concrete_function()
    assert len(functions.graph_from_concrete_function(cf).recvs) == 2
    only_a = functions.extract_concrete_function(cf, remote_variables=[a])
    assert list(only_a.recv_variables.values()) == [a.name]
    assert only_a.graph.recvs[0].bytes == 12
    # b stays local: its handle placeholder and read are ordinary compute ops.
    assert len(only_a.graph.compute_ops) > len(
        functions.graph_from_concrete_function(cf).compute_ops)
    assert not functions.graph_from_concrete_function(cf, remote_variables=["/job:ps"]).recvs
    assert len(functions.graph_from_concrete_function(
        cf, remote_variables=lambda v: v.shape[0] == 5).recvs) == 1


def test_clear_errors():
    with pytest.raises(GraphError, match="ConcreteFunction"):
        functions.extract_concrete_function(lambda x: x)
    with pytest.raises(GraphError, match="remote_variables"):
        functions.extract_concrete_function(
            tf.function(lambda: tf.constant(1)).get_concrete_function(), remote_variables=3)
    with pytest.raises(GraphError, match="output_partition_graphs"):
        partition.extract_partition_graphs([])
    import keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(GraphError, match="not compiled"):
        keras_models.extract_keras_model(model, 4, training=True)
    with pytest.raises(GraphError, match="batch_size"):
        keras_models.extract_keras_model(model, 0, training=False)


def test_sending_node_name_and_task():
    assert (naming.sending_node_name("edge_74_sequential/d1/MatMul/ReadVariableOp")
            == "sequential/d1/MatMul/ReadVariableOp")
    assert naming.sending_node_name("x/edge_3_y") == "x/edge_3_y"
    assert naming.task_of("/job:ps/replica:0/task:1/device:CPU:0") == "ps:1"
    assert naming.task_of("/device:CPU:0") is None


# --- graph mode on a real PS cluster --------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _ps_and_worker():
    """A real in-process PS and worker (tf.distribute.Server) on localhost."""
    spec = tf.train.ClusterSpec({"ps": [f"localhost:{_free_port()}"],
                                 "worker": [f"localhost:{_free_port()}"]})
    return spec, [tf.distribute.Server(spec, job_name=job, task_index=0, start=True)
                  for job in ("ps", "worker")]


class _Traced(list):
    """The traced steps' RunMetadata, with the client's graph and variables."""


@pytest.fixture(scope="module")
def graph_mode_run():
    """Three FULL_TRACE steps of a 2-layer model, variables on a real in-process PS,
    compute on a real in-process worker, talking gRPC over localhost."""
    spec, servers = _ps_and_worker()
    g = tf.Graph()
    with g.as_default(), tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            cluster=spec, worker_device="/job:worker/task:0")):
        x = tf.compat.v1.placeholder(tf.float32, [8, 4])
        y = tf.compat.v1.placeholder(tf.float32, [8, 2])
        w1 = tf.compat.v1.get_variable("w1", [4, 16])
        b1 = tf.compat.v1.get_variable("b1", [16], initializer=tf.compat.v1.zeros_initializer())
        w2 = tf.compat.v1.get_variable("w2", [16, 2])
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) - y))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                      output_partition_graphs=True)
    metadata = _Traced()
    metadata.graph, metadata.variables = g, {"w1": w1, "b1": b1, "w2": w2}
    feed = {x: np.ones([8, 4], np.float32), y: np.ones([8, 2], np.float32)}
    with tf.compat.v1.Session(servers[1].target, graph=g) as sess:
        sess.run(init)
        for _ in range(3):
            md = tf.compat.v1.RunMetadata()
            sess.run(train, feed, options=options, run_metadata=md)
            metadata.append(md)
    return metadata


@pytest.mark.cluster
def test_partition_graph_recvs_are_the_ps_reads(graph_mode_run):
    md = graph_mode_run[-1]
    ext = partition.extract_partition_graphs(md.partition_graphs)
    g = ext.graph
    # Recv names are the PS-side sending nodes (the rendezvous key's edge_<n>_<name>).
    ps_nodes = {n.name for pg in md.partition_graphs for n in pg.node
                if "/job:ps/" in n.device}
    assert len(g.recvs) == 3
    assert all(r.name in ps_nodes and r.name.endswith("ReadVariableOp") for r in g.recvs)
    assert g.channels == ["ps:0"]
    # The map leads from the worker's partition nodes (…_S<k>) to the recv names.
    assert sorted(ext.name_map.values()) == sorted(r.name for r in g.recvs)
    assert all(k != v for k, v in ext.name_map.items())
    # Worker compute: forward, backward and the gradient _Sends to the PS, no PS op.
    assert "worker:0" in naming.task_of(next(
        n.device for pg in md.partition_graphs for n in pg.node if n.name == g.ops[-1].name))
    assert any(t == "_Send" for t in ext.op_types.values())
    assert all(any(r.name in op.inputs for op in g.ops) for r in g.recvs)
    with pytest.raises(GraphError, match="not among"):
        partition.extract_partition_graphs(md.partition_graphs, worker="worker:7")
    assert len(partition.graph_from_partition_graphs(
        md.partition_graphs, worker="/job:worker/task:0")) == len(g)


@pytest.mark.cluster
def test_graph_mode_recvs_carry_the_declaration_order_given(graph_mode_run):
    """traced_worker_graphs(..., declared=(graph, variables)): each recv is placed by
    the variable its PS read reads (the bench's compat.v1 workloads pass
    tf.compat.v1.trainable_variables()); without it, no positions."""
    from tictac_hooks.graph.algorithms import compute_order
    from tictac_hooks.graph.tf.traced import traced_worker_graphs
    v = graph_mode_run.variables
    with graph_mode_run.graph.as_default():
        assert tf.compat.v1.trainable_variables() == [v["w1"], v["b1"], v["w2"]]
    plain, _, _ = traced_worker_graphs(graph_mode_run, ["worker:0"])
    assert all(op.declared is None for op in plain["worker:0"].recvs)
    declared, _, _ = traced_worker_graphs(
        graph_mode_run, ["worker:0"],
        declared=(graph_mode_run.graph, [v["w2"], v["b1"], v["w1"]]))
    g = declared["worker:0"]
    # the reads (named after the PS node) of w1 (x w1), b1 (+ b1) and w2 (h w2)
    reads = {"MatMul/ReadVariableOp": "w1", "add/ReadVariableOp": "b1",
             "MatMul_1/ReadVariableOp": "w2"}
    assert {reads[r.name]: r.declared for r in g.recvs} == {"w2": 0, "b1": 1, "w1": 2}
    assert [reads[n] for n in compute_order(g, "declared").order] == ["w2", "b1", "w1"]
    assert [reads[n] for n in compute_order(g, "first-use").order] == ["w1", "b1", "w2"]


@pytest.mark.cluster
def test_step_stats_oracle_from_the_same_run(graph_mode_run):
    ext = partition.extract_partition_graphs(graph_mode_run[-1].partition_graphs)
    times = profiler.times_from_step_stats(graph_mode_run, ext.name_map,
                                           device="/job:worker/replica:0/task:0")
    compute = {op.name for op in ext.graph.compute_ops}
    assert set(times) <= compute
    assert len(set(times) & compute) >= len(compute) // 2
    assert all(t >= 0 for t in times.values()) and sum(times.values()) > 0
    everything = profiler.transfers_from_step_stats(graph_mode_run)
    # The PS pulls the 3 gradients and the learning rate from the worker, too.
    assert {(t.source, t.destination) for t in everything} == {
        ("ps:0", "worker:0"), ("worker:0", "ps:0")}
    transfers = profiler.transfers_from_step_stats(graph_mode_run, destination="worker:0")
    assert {t.name for t in transfers} == {r.name for r in ext.graph.recvs}
    assert len(transfers) == 3 * 3
    assert sorted(oracle.recv_bytes_from_transfers(transfers).values()) == [64, 128, 256]
    # Partition graphs carry no shapes; sizes come from the transfer records.
    assert all(r.bytes is None for r in ext.graph.recvs)
    sized = partition.with_recv_bytes(ext.graph, oracle.recv_bytes_from_transfers(transfers))
    assert sized.summary()["param_bytes"] == (4 * 16 + 16 + 16 * 2) * 4
    recv_times = oracle.recv_times_from_transfers(transfers)
    assert set(recv_times) == {r.name for r in ext.graph.recvs}
    timed = ext.graph.with_times({**times, **recv_times}, default=0.0)
    assert timed.has_times()


@pytest.mark.cluster
def test_gradient_pushes_are_what_the_ps_pulled_from_the_worker(graph_mode_run):
    from tictac_hooks.graph.tf.traced import gradient_pushes
    pushes = gradient_pushes(graph_mode_run, "worker:0")
    assert {c for c, _ in pushes.values()} == {"ps:0"}
    # the three gradients (w1 4x16, b1 16, w2 16x2 floats), perhaps the learning rate
    sizes = sorted(b for _, b in pushes.values() if b is not None)
    assert [b for b in sizes if b > 4] == [64, 128, 256]
    # each leaves a node of the worker's DAG, which the simulator times
    ext = partition.extract_partition_graphs(graph_mode_run[-1].partition_graphs)
    names = {op.name for op in ext.graph.ops}
    assert set(pushes) <= names
    assert gradient_pushes(graph_mode_run, "worker:7") == {}


def test_a_tensor_received_twice_is_two_recvs_named_by_their_edges():
    """TF may send one PS tensor over two partition edges (a kernel read for the forward
    pass and for its gradient). Each copy is its own recv named by its full tensor name,
    which the gate matches against the rendezvous key, so the forward's copy can go
    first and the gradient's later. (Naming the second copy alone by its edge once let
    the gradient's use decide the kernel's place: a first-layer kernel went last.)"""
    from tensorflow.core.framework import graph_pb2

    from tictac_hooks.graph.algorithms import tic
    ps, worker = "/job:ps/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:0"
    gd = graph_pb2.GraphDef()

    def node(name, op, inputs=(), tensor=None):
        n = gd.node.add(name=name, op=op, device=worker)
        n.input.extend(inputs)
        if tensor:
            n.attr["tensor_name"].s = tensor.encode()
            n.attr["send_device"].s = ps.encode()
        return n
    node("r_k1_again", "_Recv", tensor="edge_9_l1/kernel/read")  # for the gradient
    node("r_k1", "_Recv", tensor="edge_3_l1/kernel/read")
    node("r_k2", "_Recv", tensor="edge_4_l2/kernel/read")
    node("fwd1", "MatMul", ["r_k1"])
    node("fwd2", "MatMul", ["fwd1", "r_k2"])
    node("grad1", "MatMul", ["fwd2", "r_k1_again"])
    ext = partition.extract_partition_graphs([gd])
    g = ext.graph
    assert sorted(r.name for r in g.recvs) == [
        "edge_3_l1/kernel/read", "edge_9_l1/kernel/read", "l2/kernel/read"]
    by_name = {op.name: op for op in g.ops}
    assert by_name["fwd1"].inputs == ("edge_3_l1/kernel/read",)
    assert "edge_9_l1/kernel/read" in by_name["grad1"].inputs
    assert sum("received 2 times" in w for w in ext.warnings) == 2
    order = tic(g).order
    assert order[0] == "edge_3_l1/kernel/read" and order[-1] == "edge_9_l1/kernel/read"
    gd.node[0].input.append("^fwd2")
    assert partition.extract_partition_graphs([gd]).dropped_inputs == {
        "edge_9_l1/kernel/read": ("fwd2",)}


def test_shape_only_consumers_are_not_uses_of_a_recv():
    """A gradient's Shape(kernel) comes early in the partition graph; it must not make
    the kernel look needed at the start of the step (first-use order, TAC's P)."""
    from tensorflow.core.framework import graph_pb2

    from tictac_hooks.graph.algorithms import first_use_order
    ps, worker = "/job:ps/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:0"
    gd = graph_pb2.GraphDef()
    for name, op, inputs, tensor in (
            ("r2", "_Recv", (), "edge_1_l2/kernel/read"),
            ("r1", "_Recv", (), "edge_2_l1/kernel/read"),
            ("shape2", "ShapeN", ("r2",), None),   # the gradient's shapes, listed first
            ("fwd1", "MatMul", ("r1",), None),
            ("fwd2", "MatMul", ("fwd1", "r2"), None),
            ("grad2", "Conv2DBackpropInput", ("shape2", "r2", "fwd2"), None)):
        n = gd.node.add(name=name, op=op, device=worker)
        n.input.extend(inputs)
        if tensor:
            n.attr["tensor_name"].s = tensor.encode()
            n.attr["send_device"].s = ps.encode()
    g = partition.extract_partition_graphs([gd]).graph
    by_name = {op.name: op for op in g.ops}
    assert by_name["shape2"].inputs == ()
    assert "l2/kernel/read" in by_name["grad2"].inputs
    assert first_use_order(g).order == ("l1/kernel/read", "l2/kernel/read")


def _fit_train_function(keras, steps_per_execution):
    """The train function tf_keras's fit traced, for the dense model compiled with
    ``steps_per_execution``."""
    from tictac_hooks.patches import keras_internals
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(8, activation="relu", name="d1"),
                              keras.layers.Dense(2, name="d2")], name="dense_model")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                  steps_per_execution=steps_per_execution)
    data = tf.data.Dataset.from_tensors((tf.zeros([8, 4]), tf.zeros([8, 2]))).repeat()
    model.fit(data, epochs=1, steps_per_epoch=steps_per_execution, verbose=0)
    return keras_internals.traced_step_functions(model.train_function)[-1]


def test_a_step_loop_is_one_iteration_of_its_body():
    """steps_per_execution > 1: tf_keras runs the steps in a while loop of one call.
    The DAG is one iteration of the loop body, with the same reads and dependencies as
    the one-step function, named by the body (the PS numbers the lowered body, which
    canonical_transfer_name takes out); the read of the loop's bound, once per call,
    is not a training step's transfer."""
    keras = pytest.importorskip("tf_keras")
    one = functions.extract_concrete_function(_fit_train_function(keras, 1))
    loop = functions.extract_concrete_function(_fit_train_function(keras, 4))
    assert not loop.warnings, loop.warnings
    (prefix,) = {r.name.split("/body/")[0] for r in loop.graph.recvs}
    strip = lambda n: n.split("/body/", 1)[1].split("/", 1)[1]  # noqa: E731 (name scope)
    assert all(r.name.startswith(f"{prefix}/body/") for r in loop.graph.recvs)
    assert sorted(strip(r.name) for r in loop.graph.recvs) == \
        sorted(r.name for r in one.graph.recvs)
    assert sorted(r.bytes or 0 for r in loop.graph.recvs) == \
        sorted(r.bytes or 0 for r in one.graph.recvs)
    # The same dependencies: each recv feeds as many compute ops in both.
    def fanout(g, name):
        return sum(name in op.inputs for op in g.ops)
    one_fanout = sorted(fanout(one.graph, r.name) for r in one.graph.recvs)
    assert sorted(fanout(loop.graph, r.name) for r in loop.graph.recvs) == one_fanout
    served = f"{prefix}/body/_1/" + loop.graph.recvs[0].name.split("/body/", 1)[1]
    assert naming.canonical_transfer_name(served) == loop.graph.recvs[0].name
    assert naming.canonical_transfer_name(f"edge_7_{served}") == loop.graph.recvs[0].name


@pytest.mark.cluster
def test_an_embedding_gather_on_the_ps_waits_for_the_ids_the_worker_sends():
    """Graph mode, the benchmark's path: an embedding table on a real PS, looked up
    with ids the worker computes. The PS runs the gather on ids it pulls from the
    worker, so the worker's recv of the rows is a recv with inputs: it waits for the
    worker's send of the ids (and so for what the ids are computed from)."""
    spec, servers = _ps_and_worker()
    g = tf.Graph()
    with g.as_default(), tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            cluster=spec, worker_device="/job:worker/task:0")):
        x = tf.compat.v1.placeholder(tf.float32, [8, 4])
        table = tf.compat.v1.get_variable("table", [50, 6], use_resource=True)
        w = tf.compat.v1.get_variable("w", [6, 1], use_resource=True)
        ids = tf.cast(tf.abs(x[:, 0]) * 10.0, tf.int64) % 50
        rows = tf.nn.embedding_lookup(table, ids)
        loss = tf.reduce_mean(tf.matmul(rows, w))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                      output_partition_graphs=True)
    md = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(servers[1].target, graph=g) as sess:
        sess.run(init)
        sess.run(train, {x: np.ones([8, 4], np.float32)}, options=options, run_metadata=md)
    ext = partition.extract_partition_graphs(md.partition_graphs)
    g2 = ext.graph
    with_inputs = [r for r in g2.recvs if r.inputs]
    assert len(with_inputs) == 1, [(r.name, r.inputs) for r in g2.recvs]
    gather = with_inputs[0]
    assert "embedding_lookup" in gather.name, gather.name
    # It waits for a _Send of the worker, which depends on the ids' computation.
    assert all(ext.op_types[i] == "_Send" for i in gather.inputs), gather.inputs
    send_inputs = {i for op in g2.ops if op.name in gather.inputs for i in op.inputs}
    assert any(ext.op_types.get(i) == "Mod" or "mod" in i for i in send_inputs), send_inputs
    # The plain reads have none; the order lists the gather like any recv.
    assert all(not r.inputs for r in g2.recvs if r is not gather)
    from tictac_hooks.graph.algorithms import compute_order
    assert gather.name in compute_order(g2, "tic").order


# --- declaration order (the "declared" baseline) --------------------------------------

def _ps_models():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "examples", "ps_models.py")
    spec = importlib.util.spec_from_file_location("ps_models_for_declared", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model_recvs(ext, model):
    """The recvs of the model's own variables, and each one's variable name."""
    names = {v.name for v in model.variables}
    return [r for r in ext.graph.recvs if ext.recv_variables[r.name] in names]


def test_a_model_declared_in_reverse_of_use_is_reversed_by_declared_order():
    """A subclassed tf_keras model whose __init__ creates its layers head first: each
    recv carries its variable's index in model.trainable_variables, so the declared
    order of the model's reads is first-use's reversed, layer by layer; the optimizer's
    and the loss tracker's variables (not the model's) follow, in creation order."""
    from tictac_hooks.graph.algorithms import compute_order
    keras = pytest.importorskip("tf_keras")
    ps_models = _ps_models()
    model, _ = ps_models.reverse_declared(keras, tf, width=16)
    ps_models.compile_model(keras, model, "reverse_declared")
    index = {v.name: k for k, v in enumerate(model.trainable_variables)}
    assert [v.name.split("/")[0] for v in model.trainable_variables][::2] == \
        ["head", "fc3", "fc2", "fc1"]
    ext, _, _ = keras_models.extract_keras_model(model, 4, training=False,
                                                 input_shape=(16,))
    x, y = tf.ones((4, 16)), tf.zeros((4,), tf.int64)
    step = tf.function(lambda x, y: model.train_step((x, y))).get_concrete_function(x, y)
    trained = functions.extract_concrete_function(step, declared=model)
    for e in (ext, trained):
        g = e.graph
        mine = _model_recvs(e, model)
        assert len(mine) == 8
        assert all(r.declared == index[e.recv_variables[r.name]] for r in mine)
        layer = lambda n: e.recv_variables[n].split("/")[0]  # noqa: E731
        first_use = [layer(n) for n in compute_order(g, "first-use").order
                     if g[n] in mine]
        declared = [layer(n) for n in compute_order(g, "declared").order[:8]]
        assert first_use == ["fc1", "fc1", "fc2", "fc2", "fc3", "fc3", "head", "head"]
        assert declared == first_use[::-1]
    others = [r for r in trained.graph.recvs if r not in _model_recvs(trained, model)]
    assert others and min(r.declared for r in others) == 8  # optimizer slots, counters
    slots = {trained.recv_variables[r.name]: r.declared for r in others
             if "/m/" in trained.recv_variables[r.name]}
    assert list(slots) == sorted(slots, key=slots.get) and len(set(slots.values())) == 8
    # extracted without the model: no positions, and the order says how to get them
    bare = functions.extract_concrete_function(step)
    assert all(r.declared is None for r in bare.graph.recvs)
    with pytest.raises(GraphError, match="Extract the graph again with the model"):
        compute_order(bare.graph, "declared")


def test_a_tied_embedding_is_one_declared_position_for_both_reads():
    """The tied Transformer reads its token embedding twice (the lookup, and the
    logits' matmul at the end): both reads carry the embedding's position, 0."""
    from tictac_hooks.graph.algorithms import compute_order
    keras = pytest.importorskip("tf_keras")
    model, _ = _ps_models().tied_transformer(keras, tf, vocab=50, seq=8)
    ext, _, _ = keras_models.extract_keras_model(model, 2, training=False, input_shape=(8,))
    g = ext.graph
    token = [r for r in g.recvs if ext.recv_variables[r.name].startswith("token_embedding/")]
    assert len(token) == 2 and {r.declared for r in token} == {0}
    assert len(g.recvs) == len(model.trainable_variables) + 1
    assert sorted(r.declared for r in g.recvs) == [0] + list(range(len(g.recvs) - 1))
    # one parameter (param): its two reads go together, first, in every order
    assert len({r.param for r in token}) == 1
    declared = compute_order(g, "declared").order
    assert set(declared[:2]) == {r.name for r in token}
    assert [g[n].declared for n in declared] == sorted(r.declared for r in g.recvs)
    assert set(compute_order(g, "first-use").order[:2]) == {r.name for r in token}


def test_the_shards_of_a_sharded_variable_share_its_position():
    from tensorflow.python.distribute.sharded_variable import ShardedVariable
    from tictac_hooks.graph.algorithms import compute_order
    sharded = ShardedVariable([tf.Variable(tf.ones((3, 4)), name="emb/part_0"),
                               tf.Variable(tf.ones((3, 4)), name="emb/part_1")])
    w = tf.Variable(tf.ones((4, 2)), name="w")

    @tf.function
    def f(ids):
        return tf.matmul(tf.nn.embedding_lookup(sharded, ids), w)

    cf = f.get_concrete_function(tf.constant([0, 4]))
    # the ShardedVariable itself, or its shards listed one by one (next to each other)
    for declared in ([w, sharded], [w] + list(sharded.variables)):
        g = functions.extract_concrete_function(cf, declared=declared).graph
        positions = {r.param: set() for r in g.recvs}
        for r in g.recvs:
            positions[r.param].add(r.declared)
        assert positions == {"w": {0}, "emb": {1}}
        order = compute_order(g, "declared").order
        assert g[order[0]].param == "w" and {g[n].param for n in order[1:]} == {"emb"}
    assert g[compute_order(g, "first-use").order[0]].param == "emb"
    with pytest.raises(GraphError, match="declared must be a model"):
        functions.extract_concrete_function(cf, declared=3)


def test_recvs_no_variable_declares_follow_the_declared_ones_in_graph_order():
    from tictac_hooks.graph.dag import Graph, Op
    from tictac_hooks.graph.tf.declared import with_declared
    g = Graph([Op("late", "recv"), Op("b", "recv"), Op("other", "recv"), Op("a", "recv"),
               Op("y", "compute", ("late", "b", "other", "a"))])
    placed = with_declared(g, {"a": 0, "b": 3})
    assert {r.name: r.declared for r in placed.recvs} == \
        {"a": 0, "b": 3, "late": 4, "other": 5}
    assert all(r.declared is None for r in g.recvs)  # a copy
    assert {r.name: r.declared for r in with_declared(g, lambda n: None).recvs} == \
        {"late": 0, "b": 1, "other": 2, "a": 3}


_PSS_DECLARED = r'''
import json, os, socket, sys
import tensorflow as tf, tf_keras as keras
from tensorflow.python.distribute import multi_worker_test_base as mwtb
sys.path.insert(0, sys.argv[1])
import ps_models
from tictac_hooks.patches import keras_internals
from tictac_hooks.graph.tf.functions import extract_concrete_function


def port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


mwtb.pick_unused_port = port  # no portpicker here
spec = tf.train.ClusterSpec(mwtb.create_in_process_cluster(num_workers=1, num_ps=2,
                                                           rpc_layer="grpc"))
strategy = tf.distribute.ParameterServerStrategy(
    tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"),
    variable_partitioner=ps_models.tutorial_partitioner(tf, 2, 64 << 10))
out = {}
for kind, kw in (("reverse_declared", {"width": 256}),
                 ("tied_transformer", {"vocab": 2000, "seq": 8})):
    with strategy.scope():
        model, dataset_fn = ps_models.BUILDERS[kind](keras, tf, **kw)
        ps_models.compile_model(keras, model, kind)
    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1,
              steps_per_epoch=2, verbose=0)
    (fn,) = keras_internals.traced_step_functions(model.train_function)[-1:]
    ext = extract_concrete_function(fn, remote_variables=["/job:ps"], declared=model)
    out[kind] = {"trainable": [v.name for v in model.trainable_variables],
                 "recvs": [[ext.recv_variables[r.name], r.declared, r.channel]
                           for r in ext.graph.recvs]}
print(json.dumps(out))
'''


@pytest.mark.cluster
def test_declared_positions_under_parameter_server_strategy_with_sharded_kernels(tmp_path):
    """fit under ParameterServerStrategy with MinSizePartitioner (2 PS): tf_keras lists
    each shard of a sharded variable in model.trainable_variables; all shards of one
    variable (on both PSes) share its position, the tied embedding's two reads too."""
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", _PSS_DECLARED, os.path.join(root, "examples")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    def param(name):
        return re.sub(r"/part_\d+$", "", name.split(":")[0])
    for kind, data in out.items():
        params = list(dict.fromkeys(param(n) for n in data["trainable"]))
        assert len(params) < len(data["trainable"]), kind  # some variable is sharded
        seen = collections.defaultdict(set)
        channels = collections.defaultdict(set)
        for variable, declared, channel in data["recvs"]:
            seen[param(variable)].add(declared)
            channels[param(variable)].add(channel)
        for k, p in enumerate(params):  # one position per variable, its list index
            assert seen[p] == {k}, (kind, p, seen[p])
        assert any(len(channels[p]) == 2 for p in params)  # shards on both PSes
        others = {p for p in seen if p not in params}
        assert others and min(min(seen[p]) for p in others) == len(params)
    reads = collections.Counter(param(v) for v, _, _ in out["tied_transformer"]["recvs"])
    assert reads["token_embedding/embeddings"] == 4  # two shards, read twice
    assert list(dict.fromkeys(param(n) for n in out["reverse_declared"]["trainable"])) == \
        [f"{layer}/{w}" for layer in ("head", "fc3", "fc2", "fc1") for w in ("kernel", "bias")]


def embedding_model(keras, rows=50, dim=6, dense=3, unique=False):
    """A tf_keras model whose ids (one per example, shape (batch,)) go through an
    Embedding: the lookup is a ResourceGather of [batch, dim] rows; ``unique``: it
    looks up the distinct ids only (their count is known only when the step runs)."""
    class EmbeddingModel(keras.Model):
        def __init__(self):
            super().__init__()
            self.table = keras.layers.Embedding(rows, dim, name="table")
            self.head = keras.layers.Dense(dense, name="head")

        def call(self, ids):
            if unique:
                import tensorflow as tf
                distinct, index = tf.unique(ids)
                return self.head(tf.gather(self.table(distinct), index))
            return self.head(self.table(ids))
    model = EmbeddingModel()
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("training", [False, True])
def test_an_embedding_gathers_recv_is_sized_by_its_traced_rows(training):
    """The recv of an embedding lookup carries batch x dim x 4 bytes (the gather's
    output in the step traced on the batch), not the table's size and not None; the
    plain reads keep their variable's size."""
    keras = pytest.importorskip("tf_keras")
    model = embedding_model(keras)
    ids = np.array([3, 1, 4, 1, 5], dtype="int64")
    targets = np.array([0, 1, 2, 0, 1], dtype="int64")
    model(ids)
    ext, _, _ = keras_models.extract_keras_model(model, len(ids), training=training,
                                                 example=(ids, targets))
    gathers = [r for r in ext.graph.recvs if ext.op_types[r.name] == "ResourceGather"]
    assert len(gathers) == 1
    assert gathers[0].bytes == 5 * 6 * 4
    assert "table/embeddings" in ext.recv_variables[gathers[0].name]
    reads = [r for r in ext.graph.recvs if r not in gathers]
    assert reads and all(r.bytes is not None for r in reads)
    head = {"/".join(ext.recv_variables[r.name].split(":")[0].split("/")[-2:]): r.bytes
            for r in reads}
    assert head["head/kernel"] == 6 * 3 * 4 and head["head/bias"] == 3 * 4
    # every recv has a size, so the bandwidth oracle times them all
    times = oracle.recv_times_from_bandwidth(ext.graph, 1e6)
    assert times[gathers[0].name] == pytest.approx(120 / 1e6)


def test_a_gather_inside_a_nested_function_is_sized_and_an_unknown_shape_is_none():
    """A gather in an inlined tf.function body is sized from that function's traced
    graph; a gather whose rows the trace does not know (ids of unknown length) keeps
    bytes None, and the bandwidth oracle names it."""
    table = tf.Variable(tf.ones((10, 5)), name="table")

    @tf.function
    def inner(ids):
        return tf.gather(table, ids)

    @tf.function
    def outer(ids):
        return tf.reduce_sum(inner(ids))

    g = functions.extract_concrete_function(
        outer.get_concrete_function(tf.constant([1, 2, 3]))).graph
    (recv,) = g.recvs
    assert "PartitionedCall" in recv.name and recv.bytes == 3 * 5 * 4
    unknown = functions.extract_concrete_function(outer.get_concrete_function(
        tf.TensorSpec([None], tf.int32))).graph
    (recv,) = unknown.recvs
    assert recv.bytes is None
    with pytest.raises(GraphError, match="no size.*" + re.escape(recv.name)):
        oracle.recv_times_from_bandwidth(unknown, 1e6)
