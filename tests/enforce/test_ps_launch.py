"""Launching PS tasks: `tictac ps --tf-config` (cluster and task from TF_CONFIG, the way
Kubernetes launches PS tasks) serves the TicTac gate (native, or the rendezvous in front
of the PS) on the cluster-spec address and serves real TensorFlow traffic through it; a wrong TF_CONFIG is a one-line error with exit code 2;
LocalCluster's processes die with their parent even when it is SIGKILLed (no atexit),
and live on when the thread that started them ends."""

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tictac_hooks.enforce.client import RendezvousClient, RendezvousError, connect
from tictac_hooks.cluster.launcher import repo_pythonpath
from tictac_hooks.cluster.procs import die_with_parent
from tictac_hooks.ports import free_port

TICTAC = [sys.executable, "-m", "tictac_hooks.cli"]  # the `tictac` command
START_TIMEOUT_S = 45.0


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=repo_pythonpath(), **extra)
    return env


def _tf_config(cluster: dict, job: str, index: int) -> str:
    # "environment" is what Kubernetes operators (and TF_CONFIG for Cloud) add; ignored.
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index},
                       "environment": "cloud"})


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(10)


def _log(path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


@pytest.fixture
def launch(tmp_path):
    """launch(args, tf_config) -> (process, log path): a `tictac` subcommand with TF_CONFIG
    set, in its own process group (killed at teardown)."""
    procs = []

    def start(args, tf_config):
        log = tmp_path / f"{len(procs)}-{args[0]}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen([*TICTAC, *args], stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=_env(TF_CONFIG=tf_config),
                                    preexec_fn=die_with_parent)
        procs.append(proc)
        return proc, log

    yield start
    for proc in procs:
        _kill_group(proc)


def _wait_for(what, check, proc, log, timeout_s=START_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} while starting:\n{_log(log)}")
        if check():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not answer within {timeout_s} s:\n{_log(log)}")
        time.sleep(0.2)


def _rendezvous_answers(address: str, backend: str = "auto") -> bool:
    try:
        with connect(address, timeout_s=1.0, backend=backend) as client:
            return client.ping()
    except RendezvousError:
        return False


def _grpc_answers(address: str) -> bool:
    import grpc

    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=1.0)
            return True
        except grpc.FutureTimeoutError:
            return False


# -- tictac ps --tf-config -------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "proxy"])
def test_ps_from_tf_config_serves_the_gate_and_tensorflow(launch, backend):
    tf = pytest.importorskip("tensorflow")
    # Two PS in the cluster, this one is ps:1: its index and port come from TF_CONFIG.
    # ps:0 is never started; the session's device filters keep the worker off it.
    cluster = {"ps": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"],
               "worker": [f"127.0.0.1:{free_port()}"]}
    public = cluster["ps"][1]
    ps, ps_log = launch(["ps", "--tf-config", "--backend", backend],
                        _tf_config(cluster, "ps", 1))
    worker, worker_log = launch(["server", "--tf-config"], _tf_config(cluster, "worker", 0))

    # (a) The gate answers on the address the cluster spec names for ps:1.
    _wait_for("tictac ps --tf-config", lambda: _rendezvous_answers(public, backend), ps,
              ps_log)
    if backend == "native":
        banner = re.search(r"tictac ps: ps:1 native gate \(grpc\+tictac\) on (\S+)",
                           _log(ps_log))
        assert banner and banner.group(1) == public, _log(ps_log)
        with connect(public) as client:
            before = client.stats()
            assert client.backend == "native" and client.device == "/job:ps/replica:0/task:1"
        assert before.ps == public and before.backend == "native"
    else:
        banner = re.search(r"tictac ps: ps:1 rendezvous on (\S+), TensorFlow server on (\S+)",
                           _log(ps_log))
        assert banner, _log(ps_log)
        assert banner.group(1) == public
        private = banner.group(2)
        assert private != public and private not in cluster["ps"]
        with RendezvousClient(public) as client:
            before = client.stats()
        assert before.ps == public and before.upstream == private
    assert not any(s.order for s in before.steps)  # nothing served yet
    # Its bounds are sized for at least 64 workers (one in this cluster): 64 records
    # per worker; a channel finishes after a second of quiet.
    assert (before.history_limit, before.finish_after_s) == (64 * 64, 1.0), before

    # (b) A real TensorFlow worker reads a variable placed on that PS, in graph mode.
    _wait_for("tictac server --tf-config", lambda: _grpc_answers(cluster["worker"][0]),
              worker, worker_log)
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = tf.Graph()
    with g.as_default():
        with tf.device("/job:ps/task:1"):
            v = tf.compat.v1.get_variable("tf_config_var", initializer=tf.constant(value))
        with tf.device("/job:worker/task:0"):
            doubled = tf.reduce_sum(v * 2.0)  # v read on the PS, sent to the worker
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(
        device_filters=["/job:ps/task:1", "/job:worker/task:0"],
        operation_timeout_in_ms=30000)
    with tf.compat.v1.Session("grpc://" + cluster["worker"][0], graph=g,
                              config=config) as sess:
        sess.run(init)
        assert sess.run(doubled) == pytest.approx(2 * value.sum())
        np.testing.assert_array_equal(sess.run(v), value)

    # The tensors went through the gate: it recorded and handed back transfers.
    with connect(public) as client:
        after = client.stats()
        served = client.served_names()
    steps = [s for s in after.steps if s.order]
    assert steps, after
    assert sum(s.bytes for s in steps) >= value.nbytes, steps
    assert any("ReadVariableOp" in n for n in served), served
    assert ps.poll() is None and worker.poll() is None


@pytest.mark.cluster
@pytest.mark.slow
def test_ps_from_a_sparse_tf_config_serves_the_gate_at_its_index():
    # Kubeflow's enableDynamicWorker: ps:1's TF_CONFIG lists only itself, as a list of
    # one, and an empty worker job; its task index stays 1.
    public = f"127.0.0.1:{free_port()}"
    sparse = json.dumps({"cluster": {"worker": {}, "ps": [public]},
                         "task": {"type": "ps", "index": 1}})
    env = _env(TF_CONFIG=sparse)
    with subprocess.Popen([*TICTAC, "ps", "--tf-config", "--bind-host", "127.0.0.1"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, preexec_fn=die_with_parent) as ps:
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _rendezvous_answers(public, "native"):
                assert ps.poll() is None and time.monotonic() < deadline, ps.stdout.read()
                time.sleep(0.2)
            with connect(public) as client:
                assert client.stats().ps == public
                assert client.device == "/job:ps/replica:0/task:1"
        finally:
            _kill_group(ps)
        out = ps.stdout.read()
    assert f"tictac ps: ps:1 native gate (grpc+tictac) on {public} (listening on " \
           f"{public} only)" in out, out


@pytest.mark.parametrize("tf_config, args, message", [
    (None, [], "TF_CONFIG is not set"),
    ("", [], "TF_CONFIG is not set"),
    ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": ', [], "TF_CONFIG is not valid JSON"),
    ('["ps"]', [], "TF_CONFIG must look like"),
    ('{"cluster": {"ps": ["127.0.0.1:1"]}}', [], "TF_CONFIG must look like"),
    ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps"}}', [],
     "TF_CONFIG must look like"),
    ('{"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, '
     '"task": {"type": "worker", "index": 0}}', [],
     "TF_CONFIG says this task is 'worker', not 'ps'; start this task with "
     "`tictac server --tf-config --job worker`"),
    ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 3}}', [],
     "the cluster spec has no task ps:3"),
    ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 3}}',
     ["--no-rendezvous"], "the cluster spec has no task ps:3"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}', [],
     "the cluster spec has no task ps:0"),
], ids=["unset", "empty", "malformed-json", "not-an-object", "no-task", "no-index",
        "worker-task", "index-out-of-range", "index-out-of-range-plain", "no-ps-job"])
def test_a_wrong_tf_config_is_a_clear_error(tf_config, args, message):
    env = _env() if tf_config is None else _env(TF_CONFIG=tf_config)
    out = subprocess.run([*TICTAC, "ps", "--tf-config", *args], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "tictac ps: error: " + message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "rendezvous on" not in out.stdout and "native gate" not in out.stdout  # nothing started


def test_tf_config_given_inline_and_a_ps_task_given_to_tictac_server():
    bad = '{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}'
    out = subprocess.run([*TICTAC, "server", "--tf-config", bad], capture_output=True,
                         text=True, timeout=60, env=_env())
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert ("tictac server: error: TF_CONFIG says this task is 'ps', not 'worker'; start PS "
            "tasks with `tictac ps --tf-config`") in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


# -- parent death ----------------------------------------------------------------------

PARENT = textwrap.dedent("""
    import json, sys, threading, time
    from tictac_hooks.cluster.launcher import LocalCluster

    def start():
        # log_dir: the SIGKILLed parent can never remove a temporary one of its own.
        cluster = LocalCluster(num_ps=1, num_workers=1, rendezvous=True,
                               start_timeout_s=float(sys.argv[1]), log_dir=sys.argv[3]).start()
        client = cluster.spawn([sys.executable, "-c", "import time; time.sleep(300)"])
        return cluster, client

    if sys.argv[2] == "thread":  # started from a thread that is gone before the check
        box = []
        starter = threading.Thread(target=lambda: box.append(start()))
        starter.start()
        starter.join()
        time.sleep(1.0)
        cluster, client = box[0]
    else:
        cluster, client = start()
    pids = [t.process.pid for t in cluster.tasks] + [client.pid]
    print(json.dumps({"pids": pids, "rendezvous": cluster.rendezvous_addresses}), flush=True)
    time.sleep(300)
""")


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None when it is gone or a
    zombie (dead, only not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _readline(stream, timeout_s: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return stream.readline() if ready else ""


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
@pytest.mark.parametrize("started_in", ["main", "thread"])
def test_cluster_processes_die_when_their_parent_is_sigkilled(tmp_path, started_in):
    """SIGKILL: no atexit, no __exit__; PR_SET_PDEATHSIG must do it. Started from a
    thread that has ended, the processes must still be alive before the kill
    (PR_SET_PDEATHSIG follows the forking thread, not the process)."""
    err = open(tmp_path / "parent.err", "wb")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(START_TIMEOUT_S), started_in,
                               str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                              env=_env(), text=True, start_new_session=True)
    err.close()
    children: dict[int, str] = {}  # pid -> start time (so a reused pid is never killed)
    try:
        line = _readline(parent.stdout, START_TIMEOUT_S + 15)
        assert line, (f"the parent printed nothing (exit {parent.poll()}):\n"
                      f"{_log(tmp_path / 'parent.err')}")
        started = json.loads(line)
        for pid in started["pids"]:
            children[pid] = _start_time(pid)
        # Non-vacuous: the PS, the worker and the client are running, children of it.
        assert len(children) == 3 and all(children.values()), \
            (children, _log(tmp_path / "parent.err"))
        for pid in children:
            with open(f"/proc/{pid}/stat") as f:
                assert int(f.read().rsplit(")", 1)[1].split()[1]) == parent.pid
        assert "tictac_hooks.enforce.cli ps" in _cmdline(started["pids"][0])
        assert "tictac_hooks.enforce.cli server" in _cmdline(started["pids"][1])
        assert _rendezvous_answers(started["rendezvous"][0])

        parent.kill()  # SIGKILL: no atexit, no __exit__, no finally in the parent
        assert parent.wait(10) == -signal.SIGKILL

        deadline = time.monotonic() + 10
        alive = list(children)
        while alive and time.monotonic() < deadline:
            alive = [p for p in children if _start_time(p) == children[p]]
            time.sleep(0.1)
        assert not alive, {p: _cmdline(p) for p in alive}
    finally:
        _kill_group(parent)
        parent.stdout.close()
        for pid, start in children.items():
            if start is not None and _start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # each child leads its own group


@pytest.mark.cluster
@pytest.mark.slow
def test_native_ps_warns_about_proxy_only_options_and_an_every_interface_bind(launch,
                                                                             tmp_path):
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    ps, ps_log = launch(["ps", "--tf-config", "--bind-host", "0.0.0.0", "--window-bytes",
                         "0"], _tf_config(cluster, "ps", 0))
    _wait_for("tictac ps --bind-host", lambda: "native gate" in _log(ps_log), ps, ps_log)
    assert "apply to --backend proxy only" in _log(ps_log)
    assert "--bind-host 0.0.0.0: this PS accepts connections on every interface" in _log(ps_log)
    assert "listening on 0.0.0.0:" in _log(ps_log)


@pytest.mark.cluster
@pytest.mark.slow
def test_native_ps_says_where_it_listens(launch, tmp_path):
    port = free_port()
    cluster = {"ps": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{free_port()}"]}
    ps, ps_log = launch(["ps", "--tf-config"], _tf_config(cluster, "ps", 0))
    _wait_for("tictac ps", lambda: "native gate" in _log(ps_log), ps, ps_log)
    assert f"listening on 127.0.0.1:{port} only" in _log(ps_log)


# -- ports (issue #14.5) -----------------------------------------------------------------

@pytest.fixture
def taken_port():
    """A port something listens on (a plain socket, as another program's would)."""
    import socket
    s = socket.create_server(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("backend", ["native", "plain"])
def test_a_ps_address_whose_port_is_taken_is_a_one_line_error(taken_port, backend):
    cluster = {"ps": [f"127.0.0.1:{taken_port}"], "worker": [f"127.0.0.1:{free_port()}"]}
    extra = ["--no-rendezvous"] if backend == "plain" else []
    out = subprocess.run([*TICTAC, "ps", "--cluster-spec", json.dumps(cluster), *extra],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert (f"tictac ps: error: ps:0's address 127.0.0.1:{taken_port} in the cluster spec: "
            f"port {taken_port} is already in use") in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "Could not start gRPC server" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_taken_private_port_is_a_one_line_error(taken_port):
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    out = subprocess.run([*TICTAC, "ps", "--backend", "proxy", "--cluster-spec",
                          json.dumps(cluster), "--private-port", str(taken_port)],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert (f"tictac ps: error: --private-port {taken_port}: port {taken_port} is already "
            "in use") in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "Could not start gRPC server" not in out.stderr


def test_a_worker_server_whose_port_is_taken_is_a_one_line_error(taken_port):
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{taken_port}"]}
    out = subprocess.run([*TICTAC, "server", "--cluster-spec", json.dumps(cluster)],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"worker:0's address 127.0.0.1:{taken_port} in the cluster spec: port " \
           f"{taken_port} is already in use" in out.stderr, out.stderr


@pytest.mark.parametrize("kwargs,message", [
    (dict(private_port=70000), "private_port must be a port number in 0..65535 (0: pick a "
                               "free one), got 70000"),
    (dict(private_port=-1), "private_port must be a port number in 0..65535"),
    (dict(skip_after_s=float("nan")), "skip_after_s must be a finite number of seconds > 0"),
    (dict(skip_after_s=0), "skip_after_s must be a finite number of seconds > 0"),
])
def test_tictac_server_checks_its_arguments_first(kwargs, message):
    from tictac_hooks.enforce import TicTacServer
    with pytest.raises(ValueError, match=re.escape(message)):
        TicTacServer({"ps": ["127.0.0.1:2222"]}, backend="proxy", **kwargs)


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", ":2222"])
def test_tictac_server_checks_every_cluster_spec_address(address):
    from tictac_hooks.enforce import TicTacServer
    with pytest.raises(ValueError, match=re.escape(
            f"the cluster spec's address of worker:0 must be HOST:PORT with a port in "
            f"1..65535, got {address!r}")):
        TicTacServer({"ps": ["127.0.0.1:2222"], "worker": [address]}, backend="proxy")


@pytest.mark.slow
def test_tictac_server_with_a_taken_private_port_names_it(taken_port):
    from tictac_hooks.checks import PortInUseError
    from tictac_hooks.enforce import TicTacServer
    with pytest.raises(PortInUseError, match=f"ps:0's private port \\(private_port\\): port "
                                             f"{taken_port} is already in use"):
        TicTacServer({"ps": [f"127.0.0.1:{free_port()}"]}, backend="proxy",
                     private_port=taken_port, start=False)


@pytest.mark.slow
def test_a_native_ps_uses_the_one_default_skip_bound(launch):
    """The C++ gate has a built-in default of its own; `tictac ps` always configures the
    shared one (issue #12.7)."""
    from tictac_hooks.enforce.api import DEFAULT_SKIP_AFTER_S
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    ps, ps_log = launch(["ps", "--tf-config"], _tf_config(cluster, "ps", 0))
    address = cluster["ps"][0]
    _wait_for("tictac ps", lambda: _rendezvous_answers(address, "native"), ps, ps_log)
    with connect(address, backend="native") as client:
        assert client.stats().skip_after_s == DEFAULT_SKIP_AFTER_S == 2.0


def test_the_gates_bounds_are_sized_for_the_clusters_workers():
    from tictac_hooks.cli import build_parser
    from tictac_hooks.enforce.server import sized_workers

    assert sized_workers({"ps": ["a:1"], "worker": ["b:1"] * 2}) == 64  # at least 64
    assert sized_workers({"worker": ["b:1"] * 100, "chief": ["c:1"]}) == 101
    assert sized_workers({"worker": ["b:1"] * 100}, workers=8) == 8
    with pytest.raises(ValueError, match="workers"):
        sized_workers({}, workers=0)
    args = build_parser().parse_args(["ps", "--cluster-spec", "{}", "--workers", "256"])
    assert args.workers == 256
