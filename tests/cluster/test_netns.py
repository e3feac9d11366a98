"""The shaped test network: rate and latency as configured, nothing left behind, and a
real graph-mode cluster training through the rendezvous across it. Needs root and tc;
every test that needs them skips with the reason otherwise."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.lab import linkmeter
from tictac_hooks.cluster import netns
from tictac_hooks.cluster.launcher import LocalCluster, repo_pythonpath
from tictac_hooks.cluster.netns import NetworkError, ShapedNetwork, cluster_hosts

OK, WHY = netns.available()


def _skip_without_root():
    if not OK:
        pytest.skip(f"no shaped network here: {WHY}")


def _ours(net_id=None):
    prefix = f"{netns.PREFIX}-{net_id}-" if net_id else f"{netns.PREFIX}-{os.getpid()}-"
    return [n for n in netns._namespaces() if n.startswith(prefix)]


def _root_links():
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n")


def test_rates_and_host_names_are_checked():
    assert netns.rate_bits("1gbit") == 10**9
    assert netns.rate_bits("100mbit") == 10**8
    assert netns.rate_bits(2.5e6) == 2_500_000
    with pytest.raises(ValueError, match="1gbit"):
        netns.rate_bits("fast")
    with pytest.raises(ValueError, match="distinct names"):
        ShapedNetwork(["ps0", "ps0"])
    with pytest.raises(ValueError, match="distinct names"):
        ShapedNetwork(["Worker-0"])
    ok, why = netns.available()
    assert isinstance(ok, bool) and (ok or why), (ok, why)


def test_the_drops_line_counts_each_kind_of_host_and_direction():
    q = lambda drops, packets: {"bytes": 0, "packets": packets, "drops": drops,  # noqa: E731
                                "overlimits": 0}
    stats = {"ps0": {"out": q(3, 297), "in": q(0, 50)}, "ps1": {"out": q(1, 99), "in": q(0, 50)},
             "worker0": {"out": q(0, 100), "in": q(4, 396)}}
    assert netns.drops_line(stats) == ("shaped queues dropped 8 of 1,000 packets (0.80 %): "
                                       "ps out 1.00 %, worker in 1.00 %")
    quiet = {"ps0": {"out": q(0, 10), "in": q(0, 10)}}
    assert netns.drops_line(quiet) == "shaped queues dropped 0 of 20 packets (0.00 %)"


@pytest.mark.root
@pytest.mark.parametrize("rate,mib", [("100mbit", 12), ("1gbit", 64)])
def test_bulk_transfer_runs_at_the_configured_rate(rate, mib):
    _skip_without_root()
    with ShapedNetwork(["a", "b"], rate=rate) as net:
        want = netns.rate_bits(rate)
        for src, dst in (("a", "b"), ("b", "a")):
            r = linkmeter.bulk_transfer(net, src, dst, mib << 20, timeout_s=30)
            print(f"\n{rate} {src}->{dst}: goodput {r['goodput_bits'] / 1e6:.1f} Mbit/s, "
                  f"wire {r['wire_bits'] / 1e6:.1f} Mbit/s in {r['seconds']:.2f} s")
            assert abs(r["wire_bits"] / want - 1) <= 0.15, r
            assert abs(r["goodput_bits"] / want - 1) <= 0.15, r
        # each host's bytes left through its own bucket and arrived through its port's
        queues = net.queue_stats()
        for host, other in (("a", "b"), ("b", "a")):
            assert queues[host]["out"]["bytes"] >= mib << 20, queues
            assert queues[other]["in"]["bytes"] >= mib << 20, queues
            assert queues[host]["out"]["packets"] > 0 and queues[host]["out"]["drops"] >= 0
        print(netns.drops_line(queues))


@pytest.mark.root
def test_latency_shows_up_in_the_round_trip():
    _skip_without_root()
    ok, why = netns.available(latency=True)
    if not ok:
        pytest.skip(f"latency cannot be emulated here: {why}")
    with ShapedNetwork(["a", "b"], rate="1gbit") as net:
        base = sorted(linkmeter.tcp_rtt(net, "a", "b", 20))[10]
        net.reshape(latency_ms=5.0)
        shaped = sorted(linkmeter.tcp_rtt(net, "a", "b", 20))[10]
    print(f"\nRTT without latency {base * 1e3:.3f} ms, with 5 ms one-way {shaped * 1e3:.3f} ms")
    assert base < 0.002
    assert 0.010 <= shaped <= 0.010 + base + 0.004


@pytest.mark.root
def test_latency_without_netem_is_a_clear_error_and_leaves_nothing():
    _skip_without_root()
    ok, why = netns.available(latency=True)
    if ok:
        pytest.skip("this kernel has netem: latency works (tested above)")
    before = _ours()
    with pytest.raises(NetworkError, match="netem"):
        ShapedNetwork(["a", "b"], latency_ms=1.0).open()
    assert _ours() == before


@pytest.mark.root
def test_a_process_started_from_a_thread_outlives_that_thread():
    """PR_SET_PDEATHSIG fires when the thread that forked a child ends: a host process
    started from a short-lived thread must live until close(), not until that thread
    ends."""
    _skip_without_root()
    import threading
    import time

    with ShapedNetwork(["a", "b"], rate="100mbit") as net:
        box = []
        starter = threading.Thread(target=lambda: box.append(net.run("b", ["sleep", "30"])))
        starter.start()
        starter.join()
        sleeper = box[0]
        time.sleep(0.5)  # a SIGKILL from the ended thread would have landed by now
        assert sleeper.poll() is None, "the process died with the thread that started it"
    assert sleeper.poll() is not None, "close() left the process running"


@pytest.mark.root
def test_close_after_an_exception_leaves_no_namespace_link_or_process():
    _skip_without_root()
    links = _root_links()
    with pytest.raises(RuntimeError, match="boom"):
        with ShapedNetwork(["a", "b", "c"], rate="100mbit") as net:
            names = net.namespaces()
            assert set(names) <= set(netns._namespaces())
            sleeper = net.run("b", ["sleep", "30"])
            raise RuntimeError("boom")
    assert sleeper.poll() is not None
    assert not set(names) & set(netns._namespaces())
    assert _root_links() == links, "links were left in (or added to) the root namespace"


@pytest.mark.root
def test_a_two_ps_four_worker_bench_network_opens():
    """11 hosts (2 PS, 2 x 4 workers, client): every host reaches the first at once
    (a listen backlog of 8 once made the 10th connection fail)."""
    _skip_without_root()
    hosts = netns.cluster_hosts(2, 8)
    assert len(hosts) == 11
    with ShapedNetwork(hosts, rate="1gbit") as net:  # open() checks connectivity
        assert set(net.namespaces()) <= set(netns._namespaces())
    assert not set(net.namespaces()) & set(netns._namespaces())


_LOOKUP = textwrap.dedent("""
    import socket, sys, time
    for _ in range(200):
        try:
            print(socket.getaddrinfo(sys.argv[1], None)[0][4][0], flush=True)
            break
        except OSError:
            time.sleep(0.05)
""")


@pytest.mark.root
def test_each_host_has_its_own_etc_hosts_rewritten_in_place():
    """What the TFJob rehearsal's pod DNS rests on: `ip netns exec` bind-mounts the
    host's /etc/hosts, a running process sees it rewritten, other hosts do not."""
    _skip_without_root()
    with ShapedNetwork(["a", "b"]) as net:
        for host in ("a", "b"):
            net.write_etc(host, "hosts", "127.0.0.1 localhost\n")
            net.write_etc(host, "resolv.conf", "nameserver 127.0.0.1\n")
        folder = os.path.join(netns.ETC_NETNS, net.namespace("a"))
        reader = net.run("a", [sys.executable, "-c", _LOOKUP, "pod-b.team.svc"],
                         stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # it looks up (and fails) before the name is there
        net.write_etc("a", "hosts", f"127.0.0.1 localhost\n{net.address('b')} pod-b.team.svc\n")
        assert reader.communicate(timeout=20)[0].strip() == net.address("b")
        other = subprocess.run(net.command("b", ["getent", "hosts", "pod-b.team.svc"]),
                               capture_output=True, text=True, timeout=20)
        assert other.returncode != 0, other.stdout
        with pytest.raises(ValueError, match="lowercase letters and dots"):
            net.write_etc("a", "../passwd", "")
    assert not os.path.exists(folder)


_CRASH = textwrap.dedent("""
    import os, signal, sys, time
    from tictac_hooks.cluster.netns import ShapedNetwork
    net = ShapedNetwork(["a", "b"]).open()
    net.write_etc("a", "hosts", "127.0.0.1 localhost\\n")
    net.run("a", ["sleep", "30"])
    print(net.id, flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup at all
    time.sleep(30)  # waits for SIGTERM
""")


@pytest.mark.root
@pytest.mark.parametrize("how", ["kill", "term"])
def test_a_crashed_or_terminated_owner_leaves_nothing_after_cleanup_stale(how):
    _skip_without_root()
    proc = subprocess.Popen([sys.executable, "-c", _CRASH, how], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": repo_pythonpath()})
    try:
        net_id = proc.stdout.readline().strip()
        assert net_id, "the child did not build its network"
        assert len(_ours(net_id)) == 3
        if how == "term":
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == (-signal.SIGKILL if how == "kill" else -signal.SIGTERM)
        left = _ours(net_id)
        if how == "term":  # the handler cleaned up before dying of SIGTERM
            assert left == []
        removed = netns.cleanup_stale()
        assert set(left) <= set(removed)
        assert _ours(net_id) == []
        assert not [n for n in os.listdir(netns.ETC_NETNS) if net_id in n]  # /etc files
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


_CLIENT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    from tests.enforce.test_cluster_graph import build
    from tictac_hooks.enforce.client import connect
    worker, ps = sys.argv[1], sys.argv[2]
    g, init, train, loss, _, _ = build(0)
    with tf.compat.v1.Session("grpc://" + worker, graph=g) as s:
        s.run(init)
        losses = [float(s.run([train, loss])[1]) for _ in range(3)]
    steps = [st.to_json() for st in connect(ps).stats().steps if st.order]
    print(json.dumps({"losses": losses, "steps": len(steps),
                      "reads": sorted(steps[-1]["order"]) if steps else []}))
""")


@pytest.mark.root
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "proxy"])
def test_a_cluster_in_namespaces_trains_through_the_gate(backend):
    _skip_without_root()
    with ShapedNetwork(cluster_hosts(1, 1), rate="1gbit") as net, \
            LocalCluster(num_ps=1, num_workers=1, rendezvous=True, network=net,
                         backend=backend) as c:
        assert c.ps_addresses == [f"{net.address('ps0')}:2222"]
        port = 2222 if backend == "native" else 2223  # the proxy's TF server is behind it
        assert c.ps_private_addresses == [f"{net.address('ps0')}:{port}"]
        assert c.worker_addresses == [f"{net.address('worker0')}:2222"]
        before = linkmeter.egress_bytes(net, "ps0")
        client = c.spawn_in("client", [sys.executable, "-c", _CLIENT, c.worker_addresses[0],
                                       c.ps_addresses[0]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = client.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            client.kill()
            pytest.fail(f"the client did not finish in 120 s:\n{c.task('ps', 0).log()}")
        assert client.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        sent = linkmeter.egress_bytes(net, "ps0") - before
    assert len(result["losses"]) == 3 and result["losses"][-1] < result["losses"][0], result
    assert result["steps"] >= 3, result
    assert len(result["reads"]) >= 4, result  # the gate served the variable reads
    assert sent > 4 * 16 * 16 * 4, sent  # through ps0's shaped link
    assert not _ours(net.id)


_COORDINATOR = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    from tictac_hooks.enforce.client import connect
    spec, ps = json.loads(sys.argv[1]), sys.argv[2]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        v = tf.Variable(tf.ones([1 << 16]))

    @tf.function
    def step():
        return strategy.run(lambda: tf.reduce_sum(v.assign_add(tf.ones_like(v))))

    results = [coordinator.schedule(step) for _ in range(4)]
    coordinator.join()
    print(json.dumps({"v0": float(v.numpy()[0]), "last": float(results[-1].fetch()),
                      "rendezvous_steps": len(connect(ps).stats().steps)}))
""")


@pytest.mark.root
@pytest.mark.cluster
@pytest.mark.slow
def test_a_pss_coordinator_on_the_chief_host_trains_through_the_native_gate():
    _skip_without_root()
    with ShapedNetwork(cluster_hosts(1, 1, chief=True, clients=()), rate="1gbit") as net, \
            LocalCluster(num_ps=1, num_workers=1, chief=True, network=net) as c:
        assert c.spec["chief"] == [f"{net.address('chief')}:2222"]
        coordinator = c.spawn_in("chief", [sys.executable, "-c", _COORDINATOR,
                                           json.dumps(c.spec), c.ps_addresses[0]],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = coordinator.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            coordinator.kill()
            pytest.fail(f"the coordinator did not finish in 120 s:\n{c.task('ps', 0).log()}")
        assert coordinator.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
    assert result["v0"] == 5.0 and result["last"] == 5.0 * (1 << 16), result
    assert result["rendezvous_steps"] >= 4, result
