"""The local-cluster launcher: a port taken between pick and bind is retried; start is
idempotent; nothing outlives the cluster."""

import os
import socket

import pytest

from tictac_hooks.cluster.launcher import LocalCluster

pytestmark = pytest.mark.cluster


def test_a_taken_port_makes_the_cluster_restart_on_fresh_ports():
    cluster = LocalCluster(num_ps=1, num_workers=1, rendezvous=False)
    host, port = cluster.spec["ps"][0].rsplit(":", 1)
    with socket.socket() as blocker:  # no SO_REUSEPORT: TensorFlow's bind fails
        blocker.bind((host, int(port)))
        blocker.listen()
        with cluster:
            assert cluster.spec["ps"][0] != f"{host}:{port}"
            assert all(t.alive for t in cluster.tasks) and len(cluster.tasks) == 2
            assert cluster.start() is cluster and len(cluster.tasks) == 2  # idempotent
            procs = [t.process for t in cluster.tasks]
            log_dir = cluster.log_dir
            assert os.path.isdir(log_dir)
    assert all(p.poll() is not None for p in procs)
    assert not os.path.exists(log_dir)  # its temporary log directory went with it


def test_a_cluster_never_started_makes_no_directory_and_a_given_one_is_kept(tmp_path):
    assert LocalCluster(num_ps=1, num_workers=1).log_dir is None
    cluster = LocalCluster(num_ps=1, num_workers=1, log_dir=str(tmp_path))
    cluster.close()
    assert tmp_path.is_dir()


def test_a_transient_grpc_abort_at_start_up_is_retried_on_the_same_ports(monkeypatch):
    from tictac_hooks.cluster import launcher
    cluster = LocalCluster(num_ps=1, num_workers=1, rendezvous=False)
    spec = dict(cluster.spec)
    real, attempts = LocalCluster._start_once, []

    def flaky(self):
        attempts.append(1)
        if len(attempts) == 1:  # what the task log shows when grpc's poller aborts
            self._start_task("ps", 0, ["server", "--cluster-spec", "{}", "--job", "ps",
                                       "--task-index", "0"])
            raise launcher.ClusterError("ps:0 exited with -6 while starting:\n"
                                        "ev_epoll1_linux.cc:... wakeup_fd_->ConsumeWakeup()")
        return real(self)
    monkeypatch.setattr(LocalCluster, "_start_once", flaky)
    with cluster:
        assert len(attempts) == 2 and cluster.spec == spec  # same ports
        assert all(t.alive for t in cluster.tasks) and len(cluster.tasks) == 2
    # Anything else that kills a task at start-up is not retried.
    other = LocalCluster(num_ps=1, num_workers=1, rendezvous=False)
    attempts.clear()
    monkeypatch.setattr(LocalCluster, "_start_once",
                        lambda self: attempts.append(1) or (_ for _ in ()).throw(
                            launcher.ClusterError("ps:0 exited with 1: bad flag")))
    with pytest.raises(launcher.ClusterError, match="bad flag"):
        other.start()
    assert len(attempts) == 1


def test_workers_and_ps_can_be_pinned_to_one_cpu_each():
    cpus = sorted(os.sched_getaffinity(0))
    with LocalCluster(num_ps=1, num_workers=1, rendezvous=False,
                      worker_cpus={0: cpus[-1]}) as cluster:
        (worker,) = [t for t in cluster.tasks if t.job == "worker"]
        (ps,) = [t for t in cluster.tasks if t.job == "ps"]
        assert os.sched_getaffinity(worker.process.pid) == {cpus[-1]}
        # every thread of it, the ones TensorFlow started too
        threads = os.listdir(f"/proc/{worker.process.pid}/task")
        assert len(threads) > 1
        assert all(os.sched_getaffinity(int(t)) == {cpus[-1]} for t in threads)
        assert os.sched_getaffinity(ps.process.pid) == set(cpus)
    with LocalCluster(num_ps=1, num_workers=1, rendezvous=True,
                      ps_cpus={0: cpus[0]}) as cluster:
        (worker,) = [t for t in cluster.tasks if t.job == "worker"]
        (ps,) = [t for t in cluster.tasks if t.job == "ps"]
        threads = os.listdir(f"/proc/{ps.process.pid}/task")
        assert len(threads) > 1
        assert all(os.sched_getaffinity(int(t)) == {cpus[0]} for t in threads)
        assert os.sched_getaffinity(worker.process.pid) == set(cpus)
    with pytest.raises(ValueError, match="ps_cpus"):
        LocalCluster(num_ps=1, num_workers=1, ps_cpus={1: cpus[0]})
    with pytest.raises(ValueError, match="worker_cpus"):
        LocalCluster(num_ps=1, num_workers=1, worker_cpus={0: 10_000})
    with pytest.raises(ValueError, match="worker_cpus"):
        LocalCluster(num_ps=1, num_workers=1, worker_cpus={3: cpus[0]})


def test_a_process_groups_cpu_and_memory_are_read_from_proc():
    """cluster/usage.py: a child in a group of its own that burns CPU and holds 64 MiB
    shows both; a group that does not exist reads as None."""
    import subprocess
    import sys
    import time

    from tictac_hooks.cluster.usage import group_usage
    code = ("import time\nx = bytearray(64 << 20)\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        usage = group_usage(child.pid)
        while (usage is None or usage.cpu_s < 0.3) and time.monotonic() < deadline:
            time.sleep(0.1)
            usage = group_usage(child.pid)
        assert usage is not None and usage.cpu_s >= 0.3, usage
        assert usage.rss_bytes >= 64 << 20 and usage.peak_rss_bytes >= usage.rss_bytes
    finally:
        child.kill()
        child.wait()
    assert group_usage(child.pid) is None
