"""A PS listens only where it was asked to (issue #14, "Listening address").

A PS whose cluster-spec address is 127.0.0.1 runs in a network namespace that also has
an address on a bridge; a second host of that network connects to every TCP port the
PS's namespace listens on, at the PS host's bridge address: each must be refused. The
native backend binds its one port to the cluster-spec host (tf_server.cc rewrites
TensorFlow's "0.0.0.0"); the proxy's TensorFlow server behind the rendezvous cannot be
bound so, and the PS says so at start-up. Needs root and tc; skips otherwise.
"""

import json
import subprocess
import sys
import time

import pytest

from tictac_hooks.cluster import netns
from tictac_hooks.cluster.launcher import repo_pythonpath

OK, WHY = netns.available()
pytestmark = [pytest.mark.root, pytest.mark.cluster]


def listening_ports(pid: int) -> set[int]:
    """TCP ports in LISTEN state in the network namespace of ``pid``."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def start_ps(net, args):
    import os
    spec = {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2224"]}
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(), TF_CPP_MIN_LOG_LEVEL="2")
    proc = net.run("ps0", [sys.executable, "-m", "tictac_hooks.enforce.cli", "ps",
                           "--cluster-spec", json.dumps(spec), "--task-index", "0", *args],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        if net.can_connect("ps0", "127.0.0.1:2222", 1.0):
            return proc
        time.sleep(0.5)
    raise AssertionError("the PS did not start")


def stop(proc):
    proc.kill()
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        out = ""
    return out or ""


@pytest.mark.parametrize("backend", ["native", "proxy"])
def test_a_loopback_ps_refuses_connections_from_another_host(backend):
    if not OK:
        pytest.skip(f"no shaped network here: {WHY}")
    with netns.ShapedNetwork(["ps0", "client"], rate="1gbit") as net:
        proc = start_ps(net, ["--backend", backend])
        try:
            # The process under `ip netns exec`'s shell wrapper: read its namespace's table.
            ports = listening_ports(proc.pid)
            assert 2222 in ports, ports
            outside = {p: net.can_connect("client", f"{net.address('ps0')}:{p}", 1.0)
                       for p in sorted(ports)}
        finally:
            out = stop(proc)
        if backend == "native":
            assert ports == {2222}, ports            # one port, nothing else
            assert not any(outside.values()), outside
        else:
            # The rendezvous refuses; TensorFlow's own server behind it does not, and the
            # PS says so when it starts.
            assert outside[2222] is False, outside
            exposed = [p for p, ok in outside.items() if ok]
            assert exposed and all(p != 2222 for p in exposed), outside
            assert "every interface" in out and str(exposed[0]) in out, out


def test_bind_host_everywhere_warns():
    if not OK:
        pytest.skip(f"no shaped network here: {WHY}")
    with netns.ShapedNetwork(["ps0", "client"], rate="1gbit") as net:
        proc = start_ps(net, ["--backend", "proxy", "--bind-host", "0.0.0.0"])
        try:
            assert net.can_connect("client", f"{net.address('ps0')}:2222", 1.0)
        finally:
            out = stop(proc)
    assert "warning" in out and "0.0.0.0" in out, out
