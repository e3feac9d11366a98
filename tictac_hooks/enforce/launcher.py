"""Local clusters on localhost for tests, examples and benchmarks.

:class:`LocalCluster` starts PS tasks (behind the TicTac rendezvous or not) and worker
tasks as separate processes, waits until each answers gRPC, and tears every process
down on exit, also when the caller fails: each child runs in its own process group that
is killed as a whole; a child dies with its parent (``PR_SET_PDEATHSIG`` on Linux); an
``atexit`` hook kills whatever is left.

Example:
  with LocalCluster(num_ps=1, num_workers=1, rendezvous=True) as cluster:
      print(cluster.spec, cluster.ps_addresses)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Any, Mapping, Sequence

from tictac_hooks.enforce.server import free_port

_PR_SET_PDEATHSIG = 1
_LIVE: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()


def _die_with_parent() -> None:
    """preexec_fn: own process group, and SIGKILL when the parent dies (Linux)."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _kill_all_live() -> None:
    for cluster in list(_LIVE):
        cluster.close()


atexit.register(_kill_all_live)


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

    def log(self, tail: int = 4000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-tail:]
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class ClusterError(RuntimeError):
    """A local cluster task failed to start or died."""


class LocalCluster:
    """PS and worker processes on localhost.

    Args:
      num_ps: PS tasks (default 1).
      num_workers: worker tasks (default 1).
      rendezvous: put the TicTac rendezvous in front of every PS (default True); a
        sequence of bools chooses per PS.
      chief: add a "chief" job with one address (for ParameterServerStrategy
        coordinators, which run in the caller's process or a client process).
      skip_after_s: the rendezvous's skip bound (default: the Gate default).
      start_timeout_s: how long to wait for every task to answer (default 120).
      env: extra environment for the children.
      log_dir: where each task's stdout/stderr goes (default: a temporary directory).
      direct_workers: indices of workers whose TensorFlow server gets
        :meth:`direct_spec` (they reach every PS without the rendezvous), to compare
        both paths in one cluster.

    The cluster spec names each PS's public address: the rendezvous's, when it has one.
    ``ps_private_addresses[i]`` is the TensorFlow server behind it (the direct path).
    """

    def __init__(self, num_ps: int = 1, num_workers: int = 1,
                 rendezvous: bool | Sequence[bool] = True, chief: bool = False,
                 skip_after_s: float | None = None, start_timeout_s: float = 120.0,
                 env: Mapping[str, str] | None = None, log_dir: str | None = None,
                 direct_workers: Sequence[int] = ()) -> None:
        if isinstance(rendezvous, bool):
            rendezvous = [rendezvous] * num_ps
        if len(rendezvous) != num_ps:
            raise ValueError(f"rendezvous has {len(rendezvous)} entries for {num_ps} PS")
        self.rendezvous = list(rendezvous)
        self.spec: dict[str, list[str]] = {
            "ps": [f"127.0.0.1:{free_port()}" for _ in range(num_ps)],
            "worker": [f"127.0.0.1:{free_port()}" for _ in range(num_workers)]}
        if chief:
            self.spec["chief"] = [f"127.0.0.1:{free_port()}"]
        self.ps_private_addresses = [
            f"127.0.0.1:{free_port()}" if rv else addr
            for rv, addr in zip(self.rendezvous, self.spec["ps"])]
        self.direct_workers = set(direct_workers)
        self.skip_after_s = skip_after_s
        self.start_timeout_s = start_timeout_s
        self.env = dict(env or {})
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="tictac-cluster-")
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
    def rendezvous_addresses(self) -> list[str]:
        """The PS addresses that have a rendezvous (control service) behind them."""
        return [a for a, rv in zip(self.spec["ps"], self.rendezvous) if rv]

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
        _LIVE.add(self)
        try:
            for i, rv in enumerate(self.rendezvous):
                args = ["ps", "--cluster-spec", json.dumps(self.spec), "--task-index", str(i)]
                if rv:
                    args += ["--private-port", self.ps_private_addresses[i].rsplit(":", 1)[1]]
                    if self.skip_after_s is not None:
                        args += ["--skip-after", str(self.skip_after_s)]
                else:
                    args += ["--no-rendezvous"]
                self._start_task("ps", i, args)
            for i in range(len(self.spec["worker"])):
                spec = self.direct_spec() if i in self.direct_workers else self.spec
                self._start_task("worker", i, [
                    "server", "--cluster-spec", json.dumps(spec), "--job", "worker",
                    "--task-index", str(i)])
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _start_task(self, job: str, index: int, args: list[str]) -> Task:
        log_path = os.path.join(self.log_dir, f"{job}{index}.log")
        log = open(log_path, "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tictac_hooks.enforce.cli", *args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.child_env(), preexec_fn=_die_with_parent)
        log.close()
        private = self.ps_private_addresses[index] if job == "ps" else None
        task = Task(job, index, self.spec[job][index], proc, log_path, private)
        self.tasks.append(task)
        return task

    def spawn(self, argv: Sequence[str], name: str = "client", **popen: Any) -> subprocess.Popen:
        """Starts another process (a client) that is torn down with the cluster."""
        popen.setdefault("env", self.child_env())
        popen.setdefault("preexec_fn", _die_with_parent)
        proc = subprocess.Popen(list(argv), **popen)
        self._extra.append(proc)
        return proc

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Waits until every task answers gRPC (a Ping to the rendezvous, which runs
        after its TensorFlow server started; channel readiness for the others)."""
        import grpc

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
                with grpc.insecure_channel(task.address) as channel:
                    try:
                        grpc.channel_ready_future(channel).result(timeout=min(1.0, left))
                    except grpc.FutureTimeoutError:
                        continue
                if task.private_address and task.private_address != task.address:
                    with grpc.insecure_channel(task.private_address) as channel:
                        try:
                            grpc.channel_ready_future(channel).result(timeout=min(1.0, left))
                        except grpc.FutureTimeoutError:
                            continue
                break

    def task(self, job: str, index: int = 0) -> Task:
        return next(t for t in self.tasks if t.job == job and t.index == index)

    def kill(self, job: str, index: int = 0, sig: int = signal.SIGKILL) -> None:
        """Kills one task's whole process group (e.g. a PS mid-step)."""
        task = self.task(job, index)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(task.process.pid, sig)
        task.process.wait(10)

    def close(self) -> None:
        """Kills every process this cluster started (idempotent)."""
        procs = [t.process for t in self.tasks] + self._extra
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.wait(10)
        _LIVE.discard(self)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
