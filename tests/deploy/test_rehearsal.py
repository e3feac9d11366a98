"""deploy/tfjob.yaml rehearsed on this machine (tictac_hooks.cluster.tfjob): each pod a
network namespace with the pod DNS names in its own /etc/hosts, published only once the
pod is Ready; TF_CONFIG per replica as the operator writes it (a custom cluster domain
here); the manifest's own commands and environment. The job trains with TicTac across
those names, the gate's records show the order followed, and the PSes come up before
any name resolves. A PS bound to its own name instead waits for it, saying so, and comes
up once it resolves. Needs root (network namespaces); skips with the reason otherwise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tictac_hooks.cluster import netns
from tictac_hooks.cluster.launcher import repo_pythonpath

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency (setup.cfg [test])")

OK, WHY = netns.available()
pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORDER_LINE = re.compile(r"TicTac order followed: (\d+) of (\d+) scheduled steps \(skips "
                        r"(\d+), violations (\d+)\)")


def test_the_manifest_trains_with_tictac_across_pod_names(tmp_path):
    if not OK:
        pytest.skip(f"no network namespaces here: {WHY}")
    from tictac_hooks.cluster.tfjob import TFJobRehearsal

    with open(os.path.join(ROOT, "deploy", "tfjob.yaml")) as f:
        manifest = yaml.safe_load(f)
    # The image's ENV lines (deploy/Dockerfile), and this checkout as its package.
    env = dict(PYTHONPATH=repo_pythonpath(), PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    start = time.monotonic()
    with TFJobRehearsal(manifest, namespace="team", cluster_domain="cluster.local",
                        paths={"/app": os.path.join(ROOT, "deploy"),
                               "/ckpt": str(tmp_path / "ckpt")},
                        env=env) as job:
        ps = [p for p in job.pods if p.rtype == "PS"]
        assert len(ps) == 2 and ps[0].service == "tictac-demo-ps-0.team.svc.cluster.local"
        before = job.run_in(job.chief, ["getent", "ahosts", ps[0].service], timeout_s=30)
        assert before.returncode != 0, before.stdout  # nothing resolves before Ready
        job.start()
        code = job.wait(timeout_s=300)
        chief_log = job.log(job.chief)
        ps_logs = [job.log(p) for p in ps]
        # The gate's own records, read as a user would from the chief's pod.
        stats = job.run_in(job.chief, ["tictac", "schedule", "stats",
                                       *[a for p in ps for a in ("--ps",
                                                                 f"{p.service}:2222")]])
        after = job.run_in(job.chief, ["getent", "ahosts", ps[0].service], timeout_s=30)
        ready = {p.name: p.ready for p in job.pods}
        namespaces = job.network.namespaces()
    wall = time.monotonic() - start
    # Nothing left: the namespaces and their /etc files are gone with the job.
    assert not [n for n in namespaces if os.path.exists(f"/run/netns/{n}")
                or os.path.exists(os.path.join(netns.ETC_NETNS, n))]
    print(f"\n--- chief log (tail) ---\n{chief_log[-1500:]}\n--- getent in the chief's pod "
          f"after: {after.stdout.splitlines()[:1]}\n--- rehearsal: {wall:.0f} s")
    assert code == 0, chief_log
    assert after.returncode == 0 and after.stdout.split()[0] == ps[0].address, after.stdout

    # Each PS bound its pod IP and came up before any name resolved (no waiting line):
    # it was Ready, so its own name was published only after it listened.
    for p, log in zip(ps, ps_logs):
        assert (f"tictac ps: ps:{p.index} native gate (grpc+tictac) on {p.service}:2222 "
                f"(listening on {p.address}:2222 only)") in log, log
        assert "waiting for" not in log, log
    assert all(ready.values()), ready

    # TicTac trained across the pod names and the order was followed.
    m = ORDER_LINE.search(chief_log)
    assert m, chief_log
    followed, scheduled, skips, violations = map(int, m.groups())
    assert scheduled > 0 and followed > 0 and violations == 0, m.group(0)
    assert stats.returncode == 0, stats.stderr[-3000:]
    steps = json.loads(stats.stdout)["steps"]
    ordered = [s for s in steps if s["order"]]
    assert ordered and sum(s["violations"] for s in ordered) == 0, steps[-3:]
    assert {s["ps"] for s in ordered} == {f"{p.service}:2222" for p in ps}
    print(f"tictac schedule stats: {len(ordered)} step records in TicTac's order on "
          f"{len(ps)} PS, violations 0")


def test_a_ps_bound_to_its_own_name_waits_for_it_then_comes_up():
    """Without --bind-host the native PS binds the host of its TF_CONFIG entry: on
    Kubernetes a name that resolves only once the pod is Ready. It says it waits, and
    comes up when the name appears (here: written into its /etc/hosts)."""
    if not OK:
        pytest.skip(f"no network namespaces here: {WHY}")
    name = "demo-ps-0.team.svc"
    config = json.dumps({"cluster": {"ps": [f"{name}:2222"],
                                     "worker": ["demo-worker-0.team.svc:2222"]},
                         "task": {"type": "ps", "index": 0}, "environment": "cloud"})
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=repo_pythonpath(), PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
               TF_CONFIG=config)
    with netns.ShapedNetwork(["ps0", "node"]) as net:
        net.write_etc("ps0", "hosts", "127.0.0.1 localhost\n")
        net.write_etc("ps0", "resolv.conf", "nameserver 127.0.0.1\n")
        ps = net.run("ps0", [sys.executable, "-m", "tictac_hooks.cli", "ps", "--tf-config"],
                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = ps.stdout.readline()
        assert first.startswith(f"tictac ps: waiting for ps:0's host {name} to resolve"), first
        net.write_etc("ps0", "hosts", f"127.0.0.1 localhost\n{net.address('ps0')} {name}\n")
        deadline = time.monotonic() + 90
        while not net.can_connect("node", f"{net.address('ps0')}:2222", 1.0):
            assert ps.poll() is None and time.monotonic() < deadline, ps.stdout.read()
            time.sleep(0.3)
        ps.kill()
        out = first + ps.communicate(timeout=20)[0]
    print(out)
    assert f"tictac ps: {name} resolves now, after" in out, out
    assert (f"native gate (grpc+tictac) on {name}:2222 (listening on {name}:2222 "
            "only)") in out, out
