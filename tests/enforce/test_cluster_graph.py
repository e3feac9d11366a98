"""The gate on a real PS cluster (graph mode, tf.compat.v1), on both backends: order
enforced, training unchanged, skips counted, clear errors, no hangs. One cluster per
backend: ps0 has the TicTac gate, ps1 is a plain TensorFlow PS (the direct path)."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tictac_hooks.enforce.client import (RendezvousClient, RendezvousError, connect,
                                         install_everywhere)
from tictac_hooks.cluster.launcher import LocalCluster
from tictac_hooks.graph.schedule import Schedule, ScheduleError

tf = pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LAYERS = ("w1", "w2", "w3", "w4")


def build(worker: int, ps: int = 0):
    """A tiny 4-layer regression on the variables of PS task ``ps``; returns (graph,
    train, loss, eval, vars)."""
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(1)
        with tf.device(f"/job:ps/task:{ps}"):
            ws = [tf.compat.v1.get_variable(n, shape=[16, 16] if n != "w4" else [16, 1],
                                            initializer=tf.compat.v1.glorot_uniform_initializer(seed=i))
                  for i, n in enumerate(LAYERS)]
        with tf.device(f"/job:worker/task:{worker}"):
            x = tf.constant(np.random.RandomState(0).randn(64, 16).astype("float32"))
            y = tf.reduce_sum(x, axis=1, keepdims=True)
            h = x
            for w in ws[:-1]:
                h = tf.tanh(h @ w)
            loss = tf.reduce_mean((h @ ws[-1] - y) ** 2)
            train = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss)
            partial = tf.add_n([tf.reduce_sum(w) for w in ws[:2]])  # reads w1, w2 only
        init = tf.compat.v1.global_variables_initializer()
    return g, init, train, loss, partial, ws


def session(cluster, worker, g):
    return tf.compat.v1.Session("grpc://" + cluster.worker_addresses[worker], graph=g)


def train(cluster, direct, steps):
    """Through the gate (variables on ps0) or not (the same variables on the plain ps1)."""
    g, init, train_op, loss, _, ws = build(0, ps=1 if direct else 0)
    with session(cluster, 0, g) as sess:
        sess.run(init)
        losses = [sess.run([train_op, loss])[1] for _ in range(steps)]
        return losses, sess.run(ws)


@pytest.fixture(scope="module", params=["native", "proxy"])
def cluster(request):
    with LocalCluster(num_ps=2, num_workers=1, rendezvous=[True, False], skip_after_s=0.3,
                      backend=request.param) as c:
        yield c


def _steps(cluster):
    return [s.to_json() for s in connect(cluster.ps_addresses[0]).stats().steps if s.order]


def test_training_is_identical_with_and_without_the_gate(cluster):
    direct_losses, direct_w = train(cluster, True, 5)
    rv_losses, rv_w = train(cluster, False, 5)
    assert direct_losses == rv_losses
    for a, b in zip(direct_w, rv_w):
        np.testing.assert_array_equal(a, b)


def test_order_without_and_with_a_schedule(cluster):
    connect(cluster.ps_addresses[0]).clear()
    train(cluster, False, 12)
    steps = _steps(cluster)[-10:]
    orders = [tuple(s["order"]) for s in steps]
    changes = sum(a != b for a, b in zip(orders, orders[1:]))
    print(f"\nwithout a schedule TensorFlow's order changed in {changes} of "
          f"{len(orders) - 1} consecutive step pairs; orders seen: {len(set(orders))}")
    reads = sorted(steps[-2]["order"])  # a training step's reads (the last read ws)
    assert len(reads) >= len(LAYERS), reads
    wanted = list(reversed(reads))  # an order TensorFlow would not pick by itself
    # Strict (no look-ahead window): handed back exactly in schedule order.
    strict = install_everywhere(cluster.gate_addresses, Schedule.from_order("test", wanted),
                                window_bytes=0)
    train(cluster, False, 8)
    # Steps that read the variables (the initializer's step reads none of them).
    enforced = [s for s in _steps(cluster) if s["schedule_version"] is not None
                and set(s["order"]) & set(wanted)]
    assert len(enforced) >= 8
    for s in enforced:
        listed = [n for n in s["order"] if n in wanted]
        skipped = {k["name"] for k in s["skipped"]}
        assert listed == [n for n in wanted if n not in skipped], s
        assert s["skips"] == 0 and s["violations"] == 0 and s["reordered"] == 0
    if cluster.backend == "native":
        # In-process the counter advances at the hand-back itself: no window, so the
        # default settings are the strict order checked above.
        assert connect(
            cluster.ps_addresses[0]).stats().window_bytes == 0
        return
    # The default window (these 1 KiB weights all fit in it): sent to the PS in
    # schedule order, the PS may answer those in flight together in any order.
    install_everywhere(cluster.gate_addresses, Schedule.from_order("test", wanted))
    train(cluster, False, 8)
    windowed = [s for s in _steps(cluster)
                if s["schedule_version"] not in (None, strict[cluster.ps_addresses[0]].version)
                and set(s["order"]) & set(wanted)]
    assert len(windowed) >= 8
    for s in windowed:
        sent = sorted((t for t in s["transfers"] if t["name"] in wanted),
                      key=lambda t: t["release_seq"])
        assert [t["name"] for t in sent] == wanted, s
        assert s["skips"] == 0 and s["violations"] == 0
    print(f"default window: {sum(s['reordered'] for s in windowed)} of "
          f"{len(windowed) * len(wanted)} transfers answered out of schedule order")


def test_a_bypassed_native_gate_serves_as_a_plain_ps_and_records_nothing(cluster):
    if cluster.backend != "native":
        pytest.skip("bypass is the native gate's measurement setting")
    from tictac_hooks.enforce.native.client import NativeGateError
    gate = connect(cluster.ps_addresses[0])
    train(cluster, False, 2)
    reads = sorted(_steps(cluster)[-2]["order"])
    install_everywhere(cluster.gate_addresses, Schedule.from_order("test", reads))
    direct_losses, _ = train(cluster, True, 3)
    try:
        assert gate.call("bypass", "1") == {"bypassed": True}
        assert gate.call("ping")["enforcing"] is False  # it says so
        with pytest.raises(NativeGateError, match="bypassed"):
            gate.ping()
        with pytest.raises(ScheduleError, match="bypass 0"):
            gate.install(Schedule.from_order("test", reads))
        before = len(gate.stats().steps)
        losses, _ = train(cluster, False, 3)
        assert losses == direct_losses  # served, and the same training
        assert len(gate.stats().steps) == before  # through no gate
        assert gate.stats().schedule_version is None  # bypass cleared the order
    finally:
        assert gate.call("bypass", "0") == {"bypassed": False}
    train(cluster, False, 3)
    assert len(gate.stats().steps) > before and gate.ping()
    with pytest.raises(ScheduleError, match="bypass takes 1"):
        gate.call("bypass", "yes")


def test_a_transfer_that_does_not_come_is_skipped_and_training_goes_on(cluster, tmp_path):
    train(cluster, False, 2)
    reads = sorted(_steps(cluster)[-2]["order"])
    # A transfer this PS has served (reading the weights for the final fetch) but that
    # no training step makes; scheduled first, everything else would wait for it.
    ghost = next(n for n in connect(cluster.ps_addresses[0]).served_names()
                 if n.endswith("/Read/ReadVariableOp"))
    order = tmp_path / "order.json"
    Schedule.from_order("test", [ghost] + reads).save(order)
    out = _cli("schedule", "install", "--ps", cluster.ps_addresses[0], str(order))
    assert out.returncode == 0, out.stderr
    losses, _ = train(cluster, False, 4)
    assert all(np.isfinite(losses))
    stats = json.loads(_cli("schedule", "stats", "--ps", cluster.ps_addresses[0]).stdout)
    trained = [s for s in stats["steps"] if set(s["order"]) & set(reads)][-4:]
    assert len(trained) == 4
    for s in trained:
        assert [k["name"] for k in s["skipped"]] == [ghost], s
    assert all("step_id" in s and "worker" in s and "order" in s for s in stats["steps"])
    assert _cli("schedule", "clear", "--ps", cluster.ps_addresses[0]).returncode == 0


def test_clear_errors(cluster, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"order": ["a", "a"]}')
    out = _cli("schedule", "install", "--ps", cluster.ps_addresses[0], str(bad))
    assert out.returncode == 2 and "more than once" in out.stderr
    nothing = tmp_path / "nothing.json"
    Schedule.from_order("test", ["no/such/transfer"]).save(nothing)
    out = _cli("schedule", "install", "--ps", cluster.ps_addresses[0], str(nothing))
    assert out.returncode == 2 and "another model" in out.stderr, out.stderr
    out = _cli("schedule", "stats", "--ps", "127.0.0.1:1", "--timeout", "2")
    assert out.returncode == 2 and "cannot reach" in out.stderr, out.stderr
    with pytest.raises(RendezvousError, match="no TicTac rendezvous"):
        RendezvousClient(cluster.worker_addresses[0], timeout_s=5).ping()
    # A plain TensorFlow PS: the auto-detected client says it cannot enforce.
    with pytest.raises(RendezvousError, match="has no TicTac gate"):
        connect(cluster.ps_addresses[1], timeout_s=5).ping()
    assert connect(cluster.ps_addresses[0]).backend == cluster.backend


# -- installs are all or nothing (issue #14.3) ---------------------------------------------

def _version(cluster):
    with connect(cluster.ps_addresses[0]) as c:
        return c.stats(include_active=False).schedule_version


def test_an_unreachable_ps_refuses_the_install_before_any_ps_changes(cluster):
    from tictac_hooks.enforce.client import InstallError
    from tictac_hooks.ports import free_port
    connect(cluster.ps_addresses[0]).clear()
    before = _version(cluster)
    with pytest.raises(InstallError, match="nothing was installed on any PS"):
        install_everywhere([cluster.ps_addresses[0], f"127.0.0.1:{free_port()}"],
                           Schedule.from_order("test", ["w1/read", "w2/read"]), timeout_s=3)
    assert _version(cluster) == before is None


def test_names_that_match_nothing_served_are_refused_before_install(cluster):
    from tictac_hooks.enforce.client import InstallError
    train(cluster, False, 2)  # the PS has served transfers now
    connect(cluster.ps_addresses[0]).clear()
    before = _version(cluster)
    with pytest.raises(InstallError, match="another model.*Nothing was installed"):
        install_everywhere([cluster.ps_addresses[0]],
                           Schedule.from_order("test", ["no/such/read", "nor/this"]))
    assert _version(cluster) == before is None


def test_a_failure_half_way_rolls_back_and_says_which_ps_holds_what(cluster, monkeypatch):
    from tictac_hooks.enforce import client as client_mod
    from tictac_hooks.enforce.client import InstallError, install_plan
    train(cluster, False, 2)
    good = cluster.ps_addresses[0]
    alias = "localhost:" + good.rsplit(":", 1)[1]  # the same PS under a second name
    real_connect = client_mod.connect

    class FailingInstall:
        """The real client of the PS, whose install fails (a PS that dies half-way)."""
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def install(self, *a, **k):
            raise client_mod.GateError(f"cannot reach {alias}: connection reset")

    def connect_(address, *a, **k):
        c = real_connect(address, *a, **k)
        return FailingInstall(c) if address == alias else c
    monkeypatch.setattr(client_mod, "connect", connect_)
    served = set(real_connect(good).served_names())
    wanted = sorted(n for n in served if any(x in n for x in LAYERS))[:3]
    schedule = Schedule.from_order("test", wanted)
    with pytest.raises(InstallError) as e:
        install_plan({good: schedule, alias: schedule})
    message = str(e.value)
    assert f"install on {alias} failed" in message
    assert f"rolled back: {good} cleared again" in message
    assert _version(cluster) is None  # the first PS is back on TensorFlow's order


def test_ps_killed_mid_step_gives_the_worker_an_error_and_nothing_hangs(cluster):
    """The PS process dies mid-step: the client gets TensorFlow's error (after its gRPC
    retries, about 30 s here), it does not hang."""
    if cluster.backend == "proxy":
        pytest.skip("the proxy's rendezvous runs in the PS process (TicTacServer), so "
                    "killing it is the native run's process death: run once, native")
    g, init, train_op, loss, _, _ = build(0)
    errors = []

    def run():
        try:
            with session(cluster, 0, g) as sess:
                sess.run(init)
                while True:
                    sess.run(train_op)
        except Exception as e:  # noqa: BLE001 - what we want to see
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(2.0)
    cluster.kill("ps", 0)
    t.join(60)
    assert not t.is_alive(), "the client hangs after the PS died"
    assert errors and isinstance(errors[0], tf.errors.OpError), errors


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tictac_hooks.enforce.cli", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})

