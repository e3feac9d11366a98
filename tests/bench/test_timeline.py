"""benchmarks/lab/timeline.py: a worker's step read from a synthetic step_stats-like trace."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from benchmarks.lab import timeline
from tictac_hooks.records import TransferRecord

BASE_US = 1_700_000_000_000_000  # the step's first event, in epoch microseconds
WORKER = "/job:worker/replica:0/task:0/device:CPU:0"
PS = "/job:ps/replica:0/task:0/device:CPU:0"


def node(name, start_ms, end_ms, label=None, kernel_from_ms=None):
    """A compute op's NodeExecStats: all_start at ``kernel_from_ms`` (default its
    start), its kernel from ``start_ms`` to ``end_ms``."""
    t0 = start_ms if kernel_from_ms is None else kernel_from_ms
    return NS(node_name=name, timeline_label=label or f"{name} = NoOp()",
              all_start_micros=BASE_US + int(t0 * 1000), all_start_nanos=0,
              op_start_rel_micros=int((start_ms - t0) * 1000),
              op_end_rel_micros=int((end_ms - t0) * 1000),
              all_end_rel_micros=int((end_ms - t0) * 1000))


def recv(edge, src, dst, start_ms, end_ms, size):
    return NS(node_name="RecvTensor", all_start_micros=BASE_US + int(start_ms * 1000),
              all_start_nanos=0, op_start_rel_micros=0, op_end_rel_micros=0,
              all_end_rel_micros=int((end_ms - start_ms) * 1000),
              timeline_label=f"[{size}B] [1.0Gb/s] {edge} from {src} to {dst}")


def step_stats():
    pulls = [recv("edge_3_conv1/ReadVariableOp", PS, WORKER, 0, 10, 4000),
             recv("edge_5_conv2/ReadVariableOp", PS, WORKER, 0, 30, 8000),
             recv("edge_7_fc/ReadVariableOp", PS, WORKER, 0, 80, 64000)]
    worker_ops = [
        node("_SOURCE", 0, 0),
        node("x", 0, 5, "x = RandomUniform(shape)"),
        # a gradient's constant at the step's start: not where the backward pass starts
        node("gradients/grad_ys_0", 0, 0, "gradients/grad_ys_0 = Const()"),
        # conv1's data is ready at 5, its kernel arrives at 10: 5 ms waiting for it
        node("conv1", 10, 20, "conv1 = _MklNativeConv2D(x, conv1/ReadVariableOp_S1)",
             kernel_from_ms=6),
        node("conv2/Cast", 30, 30.5, "conv2/Cast = Cast(conv2/ReadVariableOp_S3)"),
        # its kernel through a Cast: data ready at 20, kernel at 30 (10 ms)
        node("conv2", 30.5, 40, "conv2 = _MklNativeConv2D(conv1, conv2/Cast)"),
        # data ready at 40, kernel at 80: 40 ms
        node("fc", 80, 90, "fc = _MklMatMul(conv2, fc/ReadVariableOp_S5)"),
        node("gradients/fc_grad/MatMul", 92, 95,
             "gradients/fc_grad/MatMul = _MklMatMul(fc, conv2)"),
        node("gradients/conv2_grad/Conv2DBackpropFilter", 95, 100,
             "gradients/conv2_grad/Conv2DBackpropFilter = Conv2DBackpropFilter(conv1)"),
        node("fc/ReadVariableOp_S5", 0, 0, "fc/ReadVariableOp_S5 = _Recv()"),
    ]
    pushes = [recv("edge_9_gradients/fc_grad/MatMul", WORKER, PS, 1, 99, 64000),
              recv("edge_11_gradients/conv2_grad/Conv2DBackpropFilter", WORKER, PS, 1, 104,
                   8000)]
    ps_ops = [node("update_fc", 105, 106, "update_fc = ResourceApplyGradientDescent(a)")]
    return NS(dev_stats=[NS(device=WORKER, node_stats=pulls),
                         NS(device=WORKER, node_stats=worker_ops),
                         NS(device=PS, node_stats=pushes),
                         NS(device=PS, node_stats=ps_ops)])


def partition():
    return timeline.Partition(
        inputs={"conv1": ("x", "conv1/ReadVariableOp_S1"),
                "conv2/Cast": ("conv2/ReadVariableOp_S3",),
                "conv2": ("conv1", "conv2/Cast"),
                "fc": ("conv2", "fc/ReadVariableOp_S5"),
                "x": ()},
        ops={"conv1": "_MklNativeConv2D", "conv2/Cast": "Cast", "conv2": "_MklNativeConv2D",
             "fc": "_MklMatMul", "x": "RandomUniform",
             "conv1/ReadVariableOp_S1": "_Recv", "conv2/ReadVariableOp_S3": "_Recv",
             "fc/ReadVariableOp_S5": "_Recv"},
        recv_tensor={"conv1/ReadVariableOp_S1": "edge_3_conv1/ReadVariableOp",
                     "conv2/ReadVariableOp_S3": "edge_5_conv2/ReadVariableOp",
                     "fc/ReadVariableOp_S5": "edge_7_fc/ReadVariableOp"})


def test_read_step_sorts_ops_pulls_pushes_and_ps_ops():
    trace = timeline.read_step(step_stats())
    assert trace.start == pytest.approx(BASE_US * 1e-6)
    # _SOURCE and the _Recv node are no compute
    assert [r.name for r in trace.compute][:2] == ["x", "gradients/grad_ys_0"]
    assert len(trace.compute) == 8
    assert {p.name for p in trace.pulls} == {"conv1/ReadVariableOp", "conv2/ReadVariableOp",
                                             "fc/ReadVariableOp"}
    assert [p.bytes for p in trace.pushes] == [64000, 8000]
    assert [r.name for r in trace.ps_ops] == ["update_fc"]
    conv1 = next(r for r in trace.compute if r.name == "conv1")
    assert conv1.op == "_MklNativeConv2D"
    assert (conv1.start - trace.start, conv1.end - trace.start) == (pytest.approx(0.010),
                                                                   pytest.approx(0.020))
    # another worker's view holds none of it
    other = timeline.read_step(step_stats(), worker="worker:1")
    assert not other.compute and not other.pulls and not other.pushes


def test_analyze_computes_waits_busy_and_idle_times():
    tl = timeline.analyze(timeline.read_step(step_stats()), partition(), wall_s=0.110)
    assert tl["wall_ms"] == pytest.approx(110.0)
    assert tl["trace_span_ms"] == pytest.approx(106.0)
    assert tl["pulls"] == {"count": 3, "bytes": 76000, "first_issued_ms": 0.0,
                           "first_arrival_ms": 10.0, "last_arrival_ms": 80.0}
    c = tl["compute"]
    assert c["first_start_ms"] == 0.0 and c["last_end_ms"] == 100.0
    # busy: 5 + 10 + 0.5 + 9.5 + 10 + 3 + 5 = 43 ms of 100; idle 57
    assert c["busy_ms"] == pytest.approx(43.0)
    assert c["kernel_sum_ms"] == pytest.approx(43.0)  # no two kernels overlap here
    assert c["idle_ms"] == pytest.approx(57.0)
    # pulls on the way over [0, 80]; busy in it 5 + 10 + 10 = 25: 55 idle waiting for
    # them (the gap 90-92 comes after the last pull: not counted)
    assert c["idle_waiting_for_pulls_ms"] == pytest.approx(55.0)
    assert c["idle_before_last_pull_ms"] == pytest.approx(55.0)
    f = tl["forward"]
    by = {op["name"]: op for op in f["ops"]}
    assert list(by) == ["conv1", "conv2", "fc"]  # no gradient op
    assert by["conv1"]["weights_arrival_ms"] == 10.0 and by["conv1"]["data_ready_ms"] == 5.0
    assert by["conv1"]["wait_for_weights_ms"] == pytest.approx(5.0)
    assert by["conv2"]["kernels"] == ["conv2/ReadVariableOp"]  # through the Cast
    assert by["conv2"]["wait_for_weights_ms"] == pytest.approx(10.0)
    assert by["fc"]["wait_for_weights_ms"] == pytest.approx(40.0)
    assert f["wait_for_weights_ms"] == pytest.approx(55.0) and f["ops_that_waited"] == 3
    assert f["conv_first_start_ms"] == 10.0 and f["conv_last_end_ms"] == 40.0
    assert f["matmul_first_start_ms"] == 80.0 and f["matmul_last_end_ms"] == 90.0
    assert tl["backward"] == {"ops": 2, "first_start_ms": 92.0, "last_end_ms": 100.0}
    p = tl["pushes"]
    # asked for at 1 ms; the fc gradient leaves when its node ends (95)
    assert [i["leaves_ms"] for i in p["items"]] == [95.0, 100.0]
    assert p["first_leaves_ms"] == 95.0 and p["last_arrived_ms"] == 104.0
    assert p["after_backward_end_ms"] == pytest.approx(4.0)
    assert p["arrived_before_backward_end"] == 1
    assert tl["ps"] == {"ops": 1, "last_end_ms": 106.0}


def test_a_weight_that_came_before_its_data_costs_no_wait():
    stats = step_stats()
    # conv2's kernel arrives at 15, before conv1 ends (20): no wait for conv2
    stats.dev_stats[0].node_stats[1] = recv("edge_5_conv2/ReadVariableOp", PS, WORKER,
                                            0, 15, 8000)
    tl = timeline.analyze(timeline.read_step(stats), partition())
    by = {op["name"]: op for op in tl["forward"]["ops"]}
    assert by["conv2"]["wait_for_weights_ms"] == 0.0
    assert tl["forward"]["wait_for_weights_ms"] == pytest.approx(45.0)
    # without the partition nothing ties an op to its weights
    bare = timeline.analyze(timeline.read_step(stats))
    assert bare["forward"]["ops_with_weights_known"] == 0
    assert bare["forward"]["wait_for_weights_ms"] == 0.0


def test_gate_records_beside_the_worker_arrivals():
    trace = timeline.read_step(step_stats())
    t0 = trace.start

    def rec(name, arrive, ready, release, handback):
        return TransferRecord(name, "listed", 0, 1000, t0 + arrive, t0 + release, 0,
                              t0 + handback, ready=t0 + ready)

    gate_step = NS(start=t0 + 0.001, scheduled=True, transfers=(
        rec("conv1/ReadVariableOp", 0.001, 0.002, 0.004, 0.008),
        rec("fc/ReadVariableOp", 0.001, 0.002, 0.050, 0.051)))
    # the step before (its first arrival 0.1 s before this one's start), and this step
    # of another worker
    stale = NS(start=t0 - 0.1, scheduled=False, transfers=gate_step.transfers)
    other = NS(start=t0 + 0.001, scheduled=False, transfers=gate_step.transfers,
               worker="/job:worker/replica:0/task:1/device:CPU:0")
    g = timeline.gate_vs_worker([stale, gate_step, other], trace, "worker:0")
    assert g["records"] == 1 and g["scheduled"]
    rows = {r["name"]: r for r in g["transfers"]}
    assert rows["conv1/ReadVariableOp"]["handback_ms"] == pytest.approx(8.0)
    assert rows["conv1/ReadVariableOp"]["held_ms"] == pytest.approx(2.0)  # ready 2, out 4
    assert rows["conv1/ReadVariableOp"]["handback_to_arrival_ms"] == pytest.approx(2.0)
    assert rows["fc/ReadVariableOp"]["handback_to_arrival_ms"] == pytest.approx(29.0)
    assert g["handback_to_arrival_max_ms"] == pytest.approx(29.0)
    assert g["first_handback_ms"] == pytest.approx(8.0)
    assert g["last_handback_ms"] == pytest.approx(51.0)
    assert timeline.gate_vs_worker([stale], trace) is None
    assert timeline.gate_vs_worker([other], trace, "worker:0") is None
    assert timeline.gate_vs_worker([other], trace)["records"] == 1


def test_label_sizes_in_tensorflows_units():
    assert timeline.label_bytes("[4B] [0.3Mb/s] edge_1_a from x to y") == 4
    assert timeline.label_bytes("[1.0MB] [27.8Gb/s] edge_9_b from x to y") == 1 << 20
    assert timeline.label_bytes("[2.5KiB] [1Gb/s] edge_9_b from x to y") == 2560
    assert timeline.label_bytes("edge_9_b from x to y") is None


def test_summaries_take_medians_over_steps():
    tls = [timeline.analyze(timeline.read_step(step_stats()), partition(), wall_s=w)
           for w in (0.100, 0.130, 0.110)]
    s = timeline.summarize(tls)
    assert s["wall_ms"] == pytest.approx(110.0)
    assert s["forward_wait_for_weights_ms"] == pytest.approx(55.0)
    assert s["pushes_after_backward_ms"] == pytest.approx(4.0)
    text = timeline.summary_text({"none": s, "tic": dict(s, compute_start_ms=None)})
    assert "none | tic" in text
    assert "idle_waiting_for_pulls_ms" in text and " 55 | 55" in text


def test_the_probe_script_words_the_evidence_order_beside_order():
    import importlib.util
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "benchmarks", "probe_step_timeline.py")
    spec = importlib.util.spec_from_file_location("probe_step_timeline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tl = timeline.analyze(timeline.read_step(step_stats()), partition(), wall_s=0.110)
    s = timeline.summarize([tl])
    orders = {"none": {"summary": s, "plain_median_ms": 100.0},
              "tic": {"summary": dict(s, compute_start_ms=3.0, last_pull_ms=None),
                      "plain_median_ms": 97.0}}
    lines = mod.sentences(orders)
    assert "compute starts at 0 ms (none) vs 3 ms (tic)" in lines
    assert any(line.startswith("first pull arrives at 10 ms (none) vs 10 ms (tic); last "
                               "pull at 80 ms (none) vs - (tic)") for line in lines)
    assert any("idle waiting for pulls 55 ms (none) vs 55 ms (tic)" in line for line in lines)
    assert any("plain: 100 ms (none) vs 97 ms (tic)" in line for line in lines)


def test_ops_on_parallel_threads_count_once_in_the_busy_time():
    stats = NS(dev_stats=[NS(device=WORKER, node_stats=[
        recv("edge_1_w/ReadVariableOp", PS, WORKER, 0, 50, 100),
        node("a", 0, 20, "a = Relu(x)"), node("b", 10, 30, "b = Relu(x)"),
        node("c", 40, 45, "c = Relu(x)"), node("d", 60, 70, "d = Relu(x)")])])
    c = timeline.analyze(timeline.read_step(stats))["compute"]
    assert c["kernel_sum_ms"] == pytest.approx(55.0)
    assert c["busy_ms"] == pytest.approx(45.0)       # [0, 30], [40, 45], [60, 70]
    assert c["idle_ms"] == pytest.approx(25.0)       # 30-40, 45-60 of [0, 70]
    assert c["idle_waiting_for_pulls_ms"] == pytest.approx(15.0)  # 30-40, 45-50


def test_the_step_waits_for_the_worker_whose_tower_ends_last_step_by_step():
    def tl(backward_end, compute_end=None):
        return {"backward": {"last_end_ms": backward_end},
                "compute": {"last_end_ms": compute_end}, "wall_ms": 10.0}
    per_worker = {"worker:0": [tl(50.0), tl(90.0), tl(None, 30.0)],
                  "worker:1": [tl(80.0), tl(60.0), tl(None, 20.0)]}
    steps = timeline.last_to_finish(per_worker)
    assert [s["worker"] for s in steps] == ["worker:1", "worker:0", "worker:0"]
    assert [s["first_tower_end_ms"] for s in steps] == [50.0, 60.0, 20.0]
    assert timeline.summarize(steps)["first_tower_end_ms"] == 50.0
    assert timeline.tower_end_ms(tl(None, 7.0)) == 7.0  # inference: the last op's end
    with pytest.raises(ValueError, match="different numbers of traced steps"):
        timeline.last_to_finish({"worker:0": [tl(1.0)], "worker:1": []})
