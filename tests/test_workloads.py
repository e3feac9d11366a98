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
