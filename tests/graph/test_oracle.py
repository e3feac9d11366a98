"""Time oracles: generic, bandwidth, step_stats records, and real profiler
measurements of real models on this CPU."""

from __future__ import annotations

import io
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

from tictac_hooks.graph import oracle
from tictac_hooks.graph.dag import COMPUTE, RECV, Graph, GraphError, Op
from tictac_hooks.graph.tf import profiler


def _small_graph():
    return Graph([Op("r1", RECV, bytes=1000), Op("r2", RECV, bytes=3000, channel="ps:1"),
                  Op("c1", COMPUTE, ("r1",)), Op("c2", COMPUTE, ("c1", "r2"))])


def test_generic_times_is_paper_eq5():
    assert oracle.generic_times(_small_graph()) == {"r1": 1.0, "r2": 1.0, "c1": 0.0, "c2": 0.0}


def test_recv_times_from_bandwidth():
    t = oracle.recv_times_from_bandwidth(_small_graph(), 1000.0, latency=0.5)
    assert t == {"r1": 1.5, "r2": 3.5}
    with pytest.raises(GraphError, match="bytes_per_second"):
        oracle.recv_times_from_bandwidth(_small_graph(), 0)
    with pytest.raises(GraphError, match="latency"):
        oracle.recv_times_from_bandwidth(_small_graph(), 1.0, latency=-1)
    with pytest.raises(GraphError, match="no size"):
        oracle.recv_times_from_bandwidth(Graph([Op("r", RECV)]), 1.0)


def test_recv_times_from_transfers_takes_the_median():
    records = [("a", 10, 1.0), ("a", 10, 100.0), ("a", 10, 2.0), ("b", None, 0.5),
               oracle.TransferRecord("b", 4, 0.7)]
    assert oracle.recv_times_from_transfers(records) == {"a": 2.0, "b": 0.6}
    assert oracle.recv_times_from_transfers(records, statistic="min")["a"] == 1.0
    with pytest.raises(GraphError, match="statistic"):
        oracle.recv_times_from_transfers(records, statistic="mode")
    with pytest.raises(GraphError, match="bad transfer record"):
        oracle.recv_times_from_transfers([("a", 1, -1.0)])


def _step_stats(entries):
    """A real StepStats proto: entries of (device, node, op_start, op_end, label)."""
    from tensorflow.core.framework import step_stats_pb2

    ss = step_stats_pb2.StepStats()
    devs = {}
    for device, node, start, end, label in entries:
        if device not in devs:
            devs[device] = ss.dev_stats.add(device=device)
        devs[device].node_stats.add(node_name=node, op_start_rel_micros=start,
                                    op_end_rel_micros=end, all_end_rel_micros=end + 1,
                                    timeline_label=label)
    return ss


def test_times_from_step_stats_median_name_map_and_device():
    pytest.importorskip("tensorflow")
    worker, ps = "/job:worker/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:0/device:CPU:0"
    label = ("[256B] [1Mb/s] edge_6_w/read from " + ps + " to " + worker)
    steps = [_step_stats([(worker, "mm", 0, d, ""), (worker, "w/read_S1", 0, 5, ""),
                          (ps, "w/read", 0, 7, ""), (worker, "RecvTensor", 0, 0, label)])
             for d in (10, 30, 1000)]
    times = profiler.times_from_step_stats(steps, {"w/read_S1": "w/read"}, device="/job:worker")
    assert times == pytest.approx({"mm": 30e-6, "w/read": 5e-6})
    assert profiler.times_from_step_stats(steps, statistic="mean")["mm"] == pytest.approx(
        (10 + 30 + 1000) / 3 * 1e-6)
    rec = profiler.transfers_from_step_stats(steps)
    assert [(r.name, r.bytes, r.source, r.destination) for r in rec] == [
        ("w/read", 256, "ps:0", "worker:0")] * 3
    assert rec[0].seconds == pytest.approx(1e-6)
    with pytest.raises(GraphError, match="StepStats"):
        profiler.times_from_step_stats(["not a proto"])
    with pytest.raises(GraphError, match="no step_stats"):
        profiler.times_from_step_stats([])


@pytest.fixture(scope="module")
def tiny_conv_step():
    import keras

    from tictac_hooks.graph.tf import keras_models

    model = keras.Sequential([keras.Input((16, 16, 3)),
                              keras.layers.Conv2D(8, 3, activation="relu", name="c1"),
                              keras.layers.Flatten(), keras.layers.Dense(2, name="d")])
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    return keras_models.extract_keras_model(model, 8, training=True)


def test_profiler_measures_real_per_op_times(tiny_conv_step):
    ext, fn, args = tiny_conv_step
    calls = []
    prof = profiler.profile_compute_times(fn, args, steps=3, warmup=1,
                                          progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (4, 4)
    assert prof.steps == 3
    assert prof.times and all(t >= 0 for t in prof.times.values())
    assert set(prof.times) <= {op.name for op in ext.graph.ops}
    # The heavy ops are measured under their graph names; the fused Conv2D+BiasAdd+Relu
    # is reported under the last node it replaces (…/Relu).
    assert any("Conv2DBackpropFilter" in n for n in prof.times)
    assert any(n.endswith("c1_1/Relu") or n.endswith("c1/Relu") for n in prof.times)
    assert 0.9 <= prof.coverage <= 1.0
    assert sum(prof.times.values()) > 0
    assert profiler.measure_compute_times(fn, args, steps=1, warmup=0).keys() <= set(
        op.name for op in ext.graph.ops)
    with pytest.raises(GraphError, match="steps"):
        profiler.profile_compute_times(fn, args, steps=0)


def test_patch_tf_profiler_upstream_contract():
    """Fails loudly when TensorFlow's xplane messages change (patches/tf_profiler.py);
    the profiler test above covers the event naming."""
    pytest.importorskip("tensorflow")
    from tictac_hooks.patches import tf_profiler

    tf_profiler.check_upstream()
    assert hasattr(tf_profiler.xplane_module(), "XSpace")


def test_analyze_unknown_model_lists_valid_names():
    from tictac_hooks.graph.tf import analyze

    with pytest.raises(GraphError, match="ResNet50.*VGG16|valid keras.applications"):
        analyze.build_application_model("ResNet51", training=True, batch_size=2)
    assert {"ResNet50", "InceptionV3", "VGG16", "MobileNetV2"} <= set(
        analyze.application_names())


def test_analyzed_graph_small_application():
    from tictac_hooks.graph.tf import analyze

    out = io.StringIO()
    g = analyze.analyzed_graph("MobileNetV2", training=False, batch_size=2,
                               bandwidth_bytes_per_s=1e9, image_size=32, steps=2,
                               warmup=1, stream=out)
    assert g.has_times()
    assert len(g.recvs) > 100
    assert sum(op.time for op in g.compute_ops) > 0
    assert all(op.time == pytest.approx(op.bytes / 1e9) for op in g.recvs)
    assert "coverage" in out.getvalue() and "measuring [" in out.getvalue()


@pytest.mark.slow
def test_analyzed_graph_resnet50_training():
    from tictac_hooks.graph.tf import analyze

    g = analyze.analyzed_graph("ResNet50", training=True, batch_size=4,
                               bandwidth_bytes_per_s=125e6, steps=3, warmup=1,
                               progress=False)
    assert g.has_times()
    assert len(g.recvs) >= 214        # every trainable variable at least once
    assert sum(op.bytes for op in g.recvs) > 90e6


def _ids_model(keras, unique: bool):
    """ids (batch,) -> Embedding(40, 8) -> Dense(3) (test_tf_extract's model)."""
    from .test_tf_extract import embedding_model
    return embedding_model(keras, rows=40, dim=8, unique=unique)


@pytest.mark.parametrize("training", [False, True])
def test_analyzed_model_sizes_the_embedding_lookup_by_the_traced_batch(training):
    """analyze.analyzed_model (a model of one's own, traced on its own batch): the
    gather's recv carries batch x dim x 4 bytes and is timed by them like every recv."""
    keras = pytest.importorskip("tf_keras")
    import numpy as np
    from tictac_hooks.graph.tf import analyze

    model = _ids_model(keras, unique=False)
    ids = np.arange(6, dtype="int64")
    g = analyze.analyzed_model(model, (ids, ids % 3), training=training,
                               bandwidth_bytes_per_s=1e6, steps=1, warmup=1,
                               progress=False)
    assert g.has_times()
    gathers = [r for r in g.recvs if r.param and "table" in r.param
               and r.bytes != 40 * 8 * 4]
    assert len(gathers) == 1 and gathers[0].bytes == 6 * 8 * 4
    assert all(r.bytes is not None and r.time == pytest.approx(r.bytes / 1e6)
               for r in g.recvs)


def test_analyzed_model_names_a_recv_whose_traced_shape_is_unknown():
    keras = pytest.importorskip("tf_keras")
    import numpy as np
    from tictac_hooks.graph.tf import analyze

    model = _ids_model(keras, unique=True)
    ids = np.array([1, 1, 2, 5], dtype="int64")
    with pytest.raises(GraphError, match=r"1 recv\(s\) have no size.*embedding_lookup "
                                         r"\(ResourceGather\).*fixed shape"):
        analyze.analyzed_model(model, (ids, ids % 3), training=False,
                               bandwidth_bytes_per_s=1e6, progress=False)
