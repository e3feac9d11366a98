"""Local clusters on localhost for tests, examples and benchmarks.

:class:`LocalCluster` starts PS tasks (with the TicTac gate, native or behind the
proxy, or plain) and worker tasks as separate processes, waits until each answers gRPC,
and tears every process down on exit, also when the caller fails: each child runs in its
own process group that is killed as a whole; a child dies with its parent
(``PR_SET_PDEATHSIG`` on Linux); at interpreter exit and on SIGINT/SIGTERM the registry
of :mod:`tictac_hooks.cluster.cleanup` kills whatever is left.

With ``network=`` a :class:`~tictac_hooks.cluster.netns.ShapedNetwork`, every task runs
in its own network namespace behind a shaped link instead, at ``<host address>:2222``
(a proxied PS's TensorFlow server behind the rendezvous at ``:2223``); clients run there too,
through :meth:`LocalCluster.spawn_in`.

Example:
  with LocalCluster(num_ps=1, num_workers=1, rendezvous=True) as cluster:
      print(cluster.spec, cluster.ps_addresses)

  hosts = cluster_hosts(num_ps=1, num_workers=1)        # ps0, worker0, client
  with ShapedNetwork(hosts, rate="1gbit") as net, \
          LocalCluster(num_ps=1, num_workers=1, network=net) as cluster:
      cluster.spawn_in("client", [sys.executable, "train.py"]).wait(600)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tictac_hooks.enforce.api import BACKENDS
from tictac_hooks.cluster import cleanup
from tictac_hooks.cluster.procs import die_with_parent, on_lasting_thread
from tictac_hooks.ports import free_port

if TYPE_CHECKING:
    from tictac_hooks.cluster.netns import ShapedNetwork

TASK_PORT = 2222  # every task's address in a shaped network: <its host>:TASK_PORT
PRIVATE_PORT = 2223  # a proxied PS's TensorFlow server behind the rendezvous, there

def _kill_groups(procs: Sequence[subprocess.Popen]) -> None:
    """SIGKILLs each process's whole group and reaps it."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(10)


def _bind_failure(message: str) -> bool:
    # TensorFlow's own words, or `tictac ps`'s one-line error for a taken port.
    return "Could not start gRPC server" in message or "already in use" in message


def _transient_abort(message: str) -> bool:
    """A task that died starting up on a gRPC-internal check, not on anything the
    cluster asked of it: grpc's epoll poller aborts now and then when the machine is
    loaded (``ev_epoll1_linux.cc ... ConsumeWakeup``); the same task starts on a retry."""
    return "ConsumeWakeup" in message


def _pinned(cpu: int) -> Callable[[], None]:
    """preexec_fn: :func:`die_with_parent`, and only ``cpu`` for the child and every
    thread it starts."""
    def preexec() -> None:
        die_with_parent()
        os.sched_setaffinity(0, {cpu})
    return preexec


def repo_pythonpath() -> str:
    """PYTHONPATH that lets children import tictac_hooks and patches from this tree."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    old = os.environ.get("PYTHONPATH", "")
    return root + (os.pathsep + old if old else "")


@dataclasses.dataclass
class Task:
    """One process of a local cluster."""

    job: str
    index: int
    address: str
    process: subprocess.Popen
    log_path: str
    private_address: str | None = None
    host: str | None = None
    args: tuple[str, ...] = ()  # the `tictac` command line it runs (restart)

    def log(self, tail: int = 4000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-tail:]
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def _died(task: "Task") -> str:
    return (f"task {task.job}:{task.index} ({task.address}) died (exit "
            f"{task.process.returncode})")


class ClusterError(RuntimeError):
    """A local cluster task failed to start or died."""


class LocalCluster:
    """PS and worker processes on localhost.

    Args:
      num_ps: PS tasks (default 1).
      num_workers: worker tasks (default 1).
      rendezvous: give every PS the TicTac gate (default True); a sequence of bools
        chooses per PS (False: a plain TensorFlow PS).
      backend: where the gate runs: "native" (default; in the PS process, protocol
        grpc+tictac) or "proxy" (the HTTP/2 rendezvous in front of the PS).
      chief: add a "chief" job with one address (for ParameterServerStrategy
        coordinators, which run in the caller's process or a client process).
      skip_after_s: the gate's skip bound (default: the gate default).
      window_bytes: the proxy's look-ahead window (default: the Gate default).
      start_timeout_s: how long to wait for every task to answer (default 120).
      env: extra environment for the children.
      log_dir: where each task's stdout/stderr goes (default: a temporary directory,
        removed by :meth:`close`).
      direct_workers: indices of workers whose TensorFlow server gets
        :meth:`direct_spec`, to compare both paths in one cluster: they reach every PS
        without the gate (proxy: the TensorFlow server behind the rendezvous; native:
        a plain TensorFlow PS twin of each gated PS, job ``ps-direct`` here, on the same
        host, holding its own copy of the variables, so run the initializer through
        a direct worker too).
      workers_load_native: every worker task loads the native library (its ops: the
        emulated compute of ``tictac bench --emulate-gpu``) before it serves.
      network: an open :class:`~tictac_hooks.cluster.netns.ShapedNetwork` with hosts
        ``ps<i>``, ``worker<i>`` (and ``chief`` when ``chief``), see
        :func:`~tictac_hooks.cluster.netns.cluster_hosts`; each task runs in its
        host's namespace (default None: every task on 127.0.0.1). The caller opens and
        closes the network around the cluster. The caller's own namespace cannot reach
        the tasks then: run clients with :meth:`spawn_in`.

    The cluster spec names each PS's public address: the rendezvous's, when it has one.
    ``ps_private_addresses[i]`` is the TensorFlow server behind it (the direct path; for
    a native or plain PS, its public address).
    """

    def __init__(self, num_ps: int = 1, num_workers: int = 1,
                 rendezvous: bool | Sequence[bool] = True, chief: bool = False,
                 backend: str = "native",
                 skip_after_s: float | None = None, window_bytes: int | None = None,
                 start_timeout_s: float = 120.0,
                 env: Mapping[str, str] | None = None, log_dir: str | None = None,
                 direct_workers: Sequence[int] = (),
                 network: "ShapedNetwork | None" = None,
                 worker_cpus: Mapping[int, int] | None = None,
                 ps_cpus: Mapping[int, int] | None = None,
                 workers_load_native: bool = False,
                 gate_workers: int | None = None) -> None:
        if isinstance(rendezvous, bool):
            rendezvous = [rendezvous] * num_ps
        if len(rendezvous) != num_ps:
            raise ValueError(f"rendezvous has {len(rendezvous)} entries for {num_ps} PS")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        self.enforcing = list(rendezvous)
        # PS tasks with a private (direct) address beside the public one: the TensorFlow
        # server behind a proxy, or a native PS's plain twin for direct workers.
        self.rendezvous = [rv and (backend == "proxy" or bool(direct_workers))
                           for rv in rendezvous]
        self.network = network
        jobs = {"ps": num_ps, "worker": num_workers, **({"chief": 1} if chief else {})}
        if network is None:
            self.spec: dict[str, list[str]] = {job: [""] * n for job, n in jobs.items()}
            self._pick_loopback_ports()
        else:
            missing = [self.host(job, i) for job, n in jobs.items() for i in range(n)
                       if self.host(job, i) not in network.hosts]
            if missing:
                raise ValueError(f"the network has no host(s) {missing} for this cluster; "
                                 f"build it with cluster_hosts({num_ps}, {num_workers}, "
                                 f"chief={chief}); it has {network.hosts}")
            self.spec = {job: [f"{network.address(self.host(job, i))}:{TASK_PORT}"
                               for i in range(n)] for job, n in jobs.items()}
            self.ps_private_addresses = [
                f"{network.address(self.host('ps', i))}:{PRIVATE_PORT}" if rv else addr
                for i, (rv, addr) in enumerate(zip(self.rendezvous, self.spec["ps"]))]
        self.direct_workers = set(direct_workers)
        # task index -> the one CPU it may run on (e.g. to emulate one machine per
        # worker on a shared host, or to keep a benchmark's PS and worker off each
        # other's core); the others run anywhere.
        self.task_cpus = {"worker": dict(worker_cpus or {}), "ps": dict(ps_cpus or {})}
        available = os.sched_getaffinity(0)
        for job, n in (("worker", num_workers), ("ps", num_ps)):
            bad = {i: c for i, c in self.task_cpus[job].items()
                   if c not in available or not 0 <= i < n}
            if bad:
                raise ValueError(f"{job}_cpus {bad}: each must map a {job} index below "
                                 f"{n} to a CPU this process may use "
                                 f"({sorted(available)})")
        self.skip_after_s = skip_after_s
        self.window_bytes = window_bytes
        self.workers_load_native = workers_load_native
        # the workers each gate is sized for (its record history and live steps;
        # `tictac ps --workers`); None: the PS's default (the cluster's, at least 64)
        self.gate_workers = gate_workers
        self.start_timeout_s = start_timeout_s
        self.env = dict(env or {})
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir  # a temporary directory from start() to close() if None
        self.tasks: list[Task] = []
        self._extra: list[subprocess.Popen] = []

    # -- addresses -------------------------------------------------------------------

    @property
    def ps_addresses(self) -> list[str]:
        return list(self.spec["ps"])

    @property
    def worker_addresses(self) -> list[str]:
        return list(self.spec["worker"])

    @property
    def gate_addresses(self) -> list[str]:
        """The PS addresses that have a TicTac gate (either backend)."""
        return [a for a, on in zip(self.spec["ps"], self.enforcing) if on]

    rendezvous_addresses = gate_addresses  # the name from before the native backend

    @staticmethod
    def host(job: str, index: int) -> str:
        """The network host a task runs on: ``chief``, or ``<job><index>``."""
        return "chief" if job == "chief" else f"{job}{index}"

    def direct_spec(self) -> dict[str, list[str]]:
        """The cluster spec with every PS at its TensorFlow server's own address
        (bypassing the rendezvous)."""
        return {**self.spec, "ps": list(self.ps_private_addresses)}

    def tf_config(self, job: str, index: int, direct: bool = False) -> str:
        return json.dumps({"cluster": self.direct_spec() if direct else self.spec,
                           "task": {"type": job, "index": index}})

    def child_env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONPATH"] = repo_pythonpath()
        env.update(extra)
        return env

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> "LocalCluster":
        """Starts every task and waits until each answers. On loopback, a task that
        could not bind its port (another process took it between the port pick and the
        bind) makes the whole cluster restart on fresh ports, up to 3 times; read
        ``spec`` after ``start()``. A task that dies starting up on a transient gRPC-
        internal abort (:func:`_transient_abort`) makes it restart the same way."""
        if self.tasks:
            return self  # already started (``with LocalCluster(...)`` starts it)
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="tictac-cluster-")
        if (self.backend == "native" and any(self.enforcing)) or self.workers_load_native:
            from tictac_hooks.enforce.native.build import build
            build()  # once, here, rather than in every PS at once (cached afterwards)
        cleanup.register(self)
        for attempt in range(3):
            try:
                return self._start_once()
            except ClusterError as e:
                transient = _transient_abort(str(e))
                if attempt == 2 or not (transient or (self.network is None
                                                      and _bind_failure(str(e)))):
                    self.close()
                    raise
                self._stop_tasks()
                if not transient:
                    self._pick_loopback_ports()
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _start_once(self) -> "LocalCluster":
        for i, (on, rv) in enumerate(zip(self.enforcing, self.rendezvous)):
            args = ["ps", "--cluster-spec", json.dumps(self.spec), "--task-index", str(i)]
            if on:
                args += ["--backend", self.backend]
                if self.skip_after_s is not None:
                    args += ["--skip-timeout", str(self.skip_after_s)]
                if self.gate_workers is not None:
                    args += ["--workers", str(self.gate_workers)]
            if rv and self.backend == "proxy":
                args += ["--private-port", self.ps_private_addresses[i].rsplit(":", 1)[1]]
                if self.network is not None:
                    args += ["--bind-host", self.network.address(self.host("ps", i))]
                if self.window_bytes is not None:
                    args += ["--window-bytes", str(self.window_bytes)]
            elif not on:
                args += ["--no-rendezvous"]
            self._start_task("ps", i, args)
            if rv and self.backend == "native":  # the plain twin direct workers reach
                self._start_task("ps-direct", i, [
                    "server", "--cluster-spec", json.dumps(self.direct_spec()), "--job", "ps",
                    "--task-index", str(i)], host=self.host("ps", i),
                    address=self.ps_private_addresses[i])
        for i in range(len(self.spec["worker"])):
            spec = self.direct_spec() if i in self.direct_workers else self.spec
            self._start_task("worker", i, [
                "server", "--cluster-spec", json.dumps(spec), "--job", "worker",
                "--task-index", str(i)] + (["--load-native"] if self.workers_load_native
                                           else []))
        self.wait_ready()
        return self

    def _stop_tasks(self) -> None:
        _kill_groups([t.process for t in self.tasks])
        self.tasks = []

    def _pick_loopback_ports(self) -> None:
        self.spec = {job: [f"127.0.0.1:{free_port()}" for _ in addrs]
                     for job, addrs in self.spec.items()}
        self.ps_private_addresses = [
            f"127.0.0.1:{free_port()}" if rv else addr
            for rv, addr in zip(self.rendezvous, self.spec["ps"])]

    def _start_task(self, job: str, index: int, args: list[str], host: str | None = None,
                    address: str | None = None) -> Task:
        log_path = os.path.join(self.log_dir, f"{job}{index}.log")
        log = open(log_path, "wb")
        argv = [sys.executable, "-m", "tictac_hooks.enforce.cli", *args]
        cpu = self.task_cpus.get(job, {}).get(index)
        popen = dict(stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                     env=self.child_env(),
                     preexec_fn=die_with_parent if cpu is None else _pinned(cpu))
        if self.network is None:
            host = None
        elif host is None:
            host = self.host(job, index)
        proc = (self.network.run(host, argv, **popen) if host is not None
                else on_lasting_thread(lambda: subprocess.Popen(argv, **popen)))
        log.close()
        private = (self.ps_private_addresses[index]
                   if job == "ps" and self.backend == "proxy" else None)
        task = Task(job, index, address or self.spec[job][index], proc, log_path, private,
                    host, tuple(args))
        self.tasks.append(task)
        return task

    def spawn(self, argv: Sequence[str], name: str = "client", **popen: Any) -> subprocess.Popen:
        """Starts another process (a client) that is torn down with the cluster."""
        popen.setdefault("env", self.child_env())
        popen.setdefault("preexec_fn", die_with_parent)
        proc = on_lasting_thread(lambda: subprocess.Popen(list(argv), **popen))
        self._extra.append(proc)
        return proc

    def spawn_in(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Starts a process (a client, a PSS coordinator on ``chief``) in a host of the
        shaped network, where it reaches every task; torn down with the cluster. Without
        a network it is :meth:`spawn`."""
        if self.network is None:
            return self.spawn(argv, **popen)
        popen.setdefault("env", self.child_env())
        popen.setdefault("preexec_fn", die_with_parent)
        proc = self.network.run(host, list(argv), **popen)
        self._extra.append(proc)
        return proc

    def run_clients(self, argvs: Sequence[Sequence[str]], host: str | None = None,
                    dead_task_grace_s: float = 20.0, timeout_s: float | None = None,
                    workers_may_die: bool = False) -> list[int]:
        """Runs client processes (a PSS coordinator, graph-mode clients) until each has
        exited and returns their exit codes. Never waits on a dead cluster: if a task
        dies meanwhile, the clients get ``dead_task_grace_s`` to fail by themselves
        (TensorFlow's own error), then are killed, and :class:`ClusterError` names the
        task. With ``workers_may_die`` (ParameterServerStrategy goes on without a dead
        worker), dead workers count only once every worker is dead. ``host``: the
        shaped network's host to run them in (see :meth:`spawn_in`).
        """
        procs = [self.spawn_in(host, argv) if host else self.spawn(argv) for argv in argvs]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        dead_since = None
        def fatal() -> list["Task"]:
            dead = [t for t in self.tasks if not t.alive]
            if workers_may_die and any(t.alive for t in self.tasks if t.job == "worker"):
                dead = [t for t in dead if t.job != "worker"]
            return dead

        while any(p.poll() is None for p in procs):
            time.sleep(0.25)
            dead = fatal()
            if dead and dead_since is None:
                dead_since = time.monotonic()
            late = dead_since is not None and time.monotonic() - dead_since > dead_task_grace_s
            if late or (deadline is not None and time.monotonic() > deadline):
                _kill_groups(procs)
                if late:
                    raise ClusterError(f"{_died(dead[0])}; its clients were stopped after "
                                       f"{dead_task_grace_s:.0f} s")
                raise ClusterError(f"the clients did not finish within {timeout_s:.0f} s")
        dead = fatal()
        if dead and any(p.returncode for p in procs):
            raise ClusterError(f"{_died(dead[0])} while its clients ran")
        return [p.returncode for p in procs]

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Waits until every task answers: gRPC channel readiness on localhost (the
        rendezvous listens after its TensorFlow server started); in a shaped network, a
        TCP connection from another host, through the bridge."""
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        for task in self.tasks:
            while True:
                if not task.alive:
                    raise ClusterError(f"{task.job}:{task.index} exited with "
                                       f"{task.process.returncode} while starting:\n{task.log()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(f"{task.job}:{task.index} at {task.address} did not "
                                       f"answer within the start timeout:\n{task.log()}")
                addresses = [task.address]
                if task.private_address and task.private_address != task.address:
                    addresses.append(task.private_address)
                if all(self._answers(task, a, min(1.0, left)) for a in addresses):
                    break
                if self.network is not None:
                    time.sleep(0.1)

    def _answers(self, task: Task, address: str, timeout_s: float) -> bool:
        if self.network is not None:
            others = [h for h in self.network.hosts if h != task.host]
            return self.network.can_connect(others[0] if others else task.host, address,
                                            timeout_s)
        import grpc

        with grpc.insecure_channel(address) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout_s)
                return True
            except grpc.FutureTimeoutError:
                return False

    def task(self, job: str, index: int = 0) -> Task:
        return next(t for t in self.tasks if t.job == job and t.index == index)

    def kill(self, job: str, index: int = 0, sig: int = signal.SIGKILL) -> None:
        """Kills one task's whole process group (e.g. a PS mid-step)."""
        task = self.task(job, index)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(task.process.pid, sig)
        task.process.wait(10)

    def restart(self, job: str, index: int = 0) -> Task:
        """Kills one task and starts it again the same way, at the same address (a pod
        restarted in place, e.g. a PS: a new process, a new gate); returns once every
        task answers."""
        old = self.task(job, index)
        self.kill(job, index)
        self.tasks.remove(old)
        task = self._start_task(job, index, list(old.args), host=old.host,
                                address=old.address)
        self.wait_ready()
        return task

    def close(self) -> None:
        """Kills every process this cluster started and removes its temporary log
        directory, if it made one (idempotent; error messages quote the logs before)."""
        _kill_groups([t.process for t in self.tasks] + self._extra)
        cleanup.unregister(self)
        if self._own_log_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
