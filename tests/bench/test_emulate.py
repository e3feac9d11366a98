"""The compute-emulating ops (bench/emulate.py, enforce/native/delay_op.cc): a delay
costs wall time and no core, one stream runs its ops one after the other, the gradient
passes back through a delay of its own, a cancelled step leaves nothing pending, and a
payload has its shape. Real TensorFlow sessions on the library built here."""

import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def emulate():
    """Skips only where no C++ compiler is installed; a library that does not build
    or load fails the tests."""
    from tictac_hooks.bench import emulate
    from tictac_hooks.enforce.native.build import NativeBuildError, compiler
    try:
        compiler()
    except NativeBuildError as e:
        pytest.skip(f"no C++ toolchain for the native library: {e}")
    emulate.ops()
    return emulate


def _session(graph):
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4,
                                      intra_op_parallelism_threads=1)
    return tf.compat.v1.Session(graph=graph, config=config)


def test_32_concurrent_delays_take_one_delay_and_no_core(emulate):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [])
        outs = [emulate.delay([x], 100.0, stream=f"worker{i}")[0] for i in range(32)]
        total = tf.add_n(outs)
    with _session(graph) as sess:
        assert sess.run(total, {x: 1.0}) == 32.0  # warm
        walls, cpus = [], []
        for _ in range(3):
            c0, t0 = time.process_time(), time.monotonic()
            assert sess.run(total, {x: 2.0}) == 64.0
            walls.append(time.monotonic() - t0)
            cpus.append(time.process_time() - c0)
    wall, cpu = sorted(walls)[1], sorted(cpus)[1]
    assert 0.098 <= wall < 0.15, walls
    assert cpu < 0.03, cpus  # 32 waits of 100 ms each: no thread spins or sleeps per op


def test_one_stream_runs_its_ops_one_after_the_other(emulate):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [])
        same = tf.add_n([emulate.delay([x], 50.0, stream="gpu")[0] for _ in range(3)])
        apart = tf.add_n([emulate.delay([x], 50.0, stream=f"gpu{i}")[0] for i in range(3)])
    with _session(graph) as sess:
        sess.run([same, apart], {x: 0.0})
        t0 = time.monotonic()
        sess.run(same, {x: 1.0})
        serial = time.monotonic() - t0
        t0 = time.monotonic()
        sess.run(apart, {x: 1.0})
        parallel = time.monotonic() - t0
    assert 0.148 <= serial < 0.25, serial
    assert 0.048 <= parallel < 0.1, parallel


def test_the_gradient_passes_back_through_a_delay_of_its_own(emulate):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [3])
        w = tf.compat.v1.placeholder(tf.float32, [3])
        y, w_out = emulate.delay([x, w], 20.0, grad_ms=60.0, stream="gpu")
        loss = tf.reduce_sum(3.0 * y)  # w's pass-through is not used: zero gradient
        gx, gw = tf.gradients(loss, [x, w])
        delays = [op for op in graph.get_operations() if op.type == "TictacDelay"]
    assert sorted(op.get_attr("delay_ms") for op in delays) == [20.0, 60.0]
    with _session(graph) as sess:
        feed = {x: np.ones(3, np.float32), w: np.ones(3, np.float32)}
        sess.run(gx, feed)
        t0 = time.monotonic()
        got_x, got_w = sess.run([gx, gw], feed)
        np.testing.assert_array_equal(got_x, [3.0, 3.0, 3.0])
        np.testing.assert_array_equal(got_w, [0.0, 0.0, 0.0])
        assert 0.078 <= time.monotonic() - t0 < 0.2  # forward 20 ms, then backward 60 ms


def test_a_cancelled_step_leaves_no_pending_delay(emulate):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [])
        slow = emulate.delay([x], 5000.0, stream="cancelled")[0]
    before = emulate.timer_counts()
    with _session(graph) as sess:
        t0 = time.monotonic()
        with pytest.raises(tf.errors.DeadlineExceededError):
            sess.run(slow, {x: 1.0}, options=tf.compat.v1.RunOptions(timeout_in_ms=100))
        assert time.monotonic() - t0 < 2.0
    deadline = time.monotonic() + 2.0
    while emulate.timer_counts()["pending"] and time.monotonic() < deadline:
        time.sleep(0.01)
    after = emulate.timer_counts()
    assert after["pending"] == 0, after
    assert after["cancelled"] == before["cancelled"] + 1, (before, after)


def test_a_payload_has_its_shape_and_is_made_once(emulate):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [])
        p = emulate.payload([x], [4, 5])
    assert p.shape.as_list() == [4, 5]
    with _session(graph) as sess:
        a = sess.run(p, {x: 1.0})
        b = sess.run(p, {x: 2.0})
    assert a.shape == (4, 5) and not a.any() and not b.any()


def test_bad_delays_are_refused(emulate):
    with pytest.raises(ValueError, match=">= 0 ms"):
        emulate.delay([tf.constant(1.0)], -1.0)
