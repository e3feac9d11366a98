"""The benchmark's workloads: the compute reference holds no transfer (graph checks)."""

import pytest

pytest.importorskip("tensorflow")


def _ancestors(fetches):
    seen, todo = set(), [t.op if hasattr(t, "op") else t for t in fetches]
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        todo += [t.op for t in op.inputs] + list(op.control_inputs)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_compute_reference_runs_the_towers_on_worker_local_parameters(mode):
    from tictac_hooks.bench import workloads
    work = workloads.build("mobilenetv2", mode, [[0, 1]], num_ps=1, batch=2,
                           compute_workers=[0, 1])
    g = work.graph
    ref = _ancestors(work.compute.fetches)
    main = _ancestors(work.sets[0].fetches)
    devices = {g.get_operation_by_name(n).device for n in ref}
    # every op of the reference runs on a worker, none on the PS: no transfer at all
    assert devices and all("/job:worker/" in d for d in devices if d), devices
    assert any("/job:ps/" in g.get_operation_by_name(n).device for n in main)
    assert work.compute.num_timestamps == 2 and work.compute.workers == [0, 1]
    for w in (0, 1):  # each worker computes its own tower
        assert any(f"/task:{w}" in d for d in devices)
    types = {g.get_operation_by_name(n).type for n in ref}
    assert "Conv2D" in types or "DepthwiseConv2dNative" in types
    if mode == "training":  # the backward pass is in it (what a training step computes)
        assert "Conv2DBackpropFilter" in types
    # the PS's variables and their byte count are the model's alone
    assert all("/job:ps/" in v.device for v in work.variables)


@pytest.mark.slow
def test_declared_is_the_variable_list_and_places_every_ps_read():
    """The "declared" baseline of the compat.v1 workloads: the order
    tf.compat.v1.trainable_variables() returns (the model's, in creation order), then
    the other global variables; a PS read of a variable is placed at its index."""
    import tensorflow as tf
    from tictac_hooks.bench import workloads
    from tictac_hooks.graph.tf.declared import graph_mode_positions
    work = workloads.build("mobilenetv2", "inference", [[0]], num_ps=2, batch=2)
    with work.graph.as_default():
        trainable = tf.compat.v1.trainable_variables()
    assert work.declared[:len(trainable)] == trainable
    assert work.declared[:len(work.variables)] == work.variables
    rest = work.declared[len(trainable):]
    assert rest and not any(v.trainable for v in rest)  # batch-norm moving statistics
    assert {id(v) for v in work.all_variables} <= {id(v) for v in work.declared}
    position = graph_mode_positions(work.graph, work.declared)
    index = {v.op.name: k for k, v in enumerate(work.declared)}
    reads = [op for op in work.graph.get_operations() if op.type == "ReadVariableOp"
             and "/job:ps/" in op.inputs[0].op.device]
    assert len({r.inputs[0].op.name for r in reads}) == len(work.all_variables)
    for read in reads:
        assert position(read.name) == index[read.inputs[0].op.name], read.name
        assert position("edge_12_" + read.name) == index[read.inputs[0].op.name]
    assert position("tower0/no_such_node") is None


def test_a_ps_workload_of_ones_own_runs_in_graph_mode_too():
    """`tictac bench --model PATH.py:FUNCTION` (or dlrm, transformer) in the compat.v1
    bench: the model's variables on the PSes, one tower per worker on the batch the
    function returned, the compiled loss; declared is model.trainable_variables (the
    reverse-declared model lists its head first though it uses it last); an embedding's
    rows are updated as rows (the pushes stay rows, as under ParameterServerStrategy)."""
    import os
    from tictac_hooks.bench import user_model, workloads
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = os.path.join(root, "examples", "my_model.py") + ":make"
    assert workloads.model_key(spec) == "my_model-make"
    assert workloads.default_batch(spec, "training") == user_model.DEFAULT_BATCH
    assert workloads.default_batch("dlrm", "inference") == 256
    work = workloads.build(spec, "training", [[0, 1]], num_ps=2, batch=8,
                           compute_workers=[0])
    assert all("/job:ps/" in v.device for v in work.variables)
    assert {v.device for v in work.variables} >= {"/job:ps/task:0", "/job:ps/task:1"}
    assert work.declared[:len(work.variables)] == work.variables
    names = [v.name for v in work.variables]
    assert names.index(next(n for n in names if "head" in n)) < names.index(
        next(n for n in names if "tokens" in n))  # declared head first
    g = work.graph
    types = {op.type for op in g.get_operations()}
    assert "ResourceScatterSub" in types and "ResourceGather" in types
    ref = _ancestors(work.compute.fetches)
    assert all("/job:worker/" in g.get_operation_by_name(n).device
               for n in ref if g.get_operation_by_name(n).device)
    assert work.sets[0].num_timestamps == 2
    inference = workloads.build("dlrm", "inference", [[0]], num_ps=1, batch=4)
    assert inference.param_bytes > 0 and len(inference.sets[0].fetches) == 2
