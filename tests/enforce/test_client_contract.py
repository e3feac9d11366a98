"""The contract of enforce/api.py's GateClient, held by every backend's client through
the same scenario: the in-process client over the Python gate, and `tictac ps` in a
process of its own with the native gate (grpc+tictac, its control ops run through a
TensorFlow session) and with the proxy (the HTTP/2 interposer's control service). The
gates themselves are test_gate_conformance.py's; this is what the run (planner, record
cursor, order check) relies on from a client: ping, install and what it returns, the
settings a backend honours or refuses (never ignores), clear, a cursor's read, a bad
schedule refused before anything changes, and a gate that goes away answering
GateError."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tictac_hooks.cluster.launcher import repo_pythonpath
from tictac_hooks.cluster.procs import die_with_parent
from tictac_hooks.enforce import api, inprocess
from tictac_hooks.enforce.api import INSTALL_SETTINGS, GateError, UnhonouredSetting
from tictac_hooks.enforce.client import connect
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.schedule import Schedule, ScheduleError
from tictac_hooks.ports import free_port

START_TIMEOUT_S = 60.0
# A value for each install setting (enforce/api.py INSTALL_SETTINGS).
SETTINGS = {"skip_after_s": 2.0, "window_bytes": 1 << 16, "pace_rate": 125e6, "align": True}


def schedule(names=("w", "b", "bias"), algorithm="tic") -> Schedule:
    return Schedule(algorithm, tuple(names), {n: i for i, n in enumerate(names)})


class Served:
    """A gate at an address, of one backend, and how to take it away."""

    def __init__(self, backend: str, tmp_path) -> None:
        self.backend = backend
        self.address = f"127.0.0.1:{free_port()}"
        self.proc = None
        self._ctx = None
        if backend == "inprocess":
            self._ctx = inprocess.serve_in_process(self.address, Gate(window_bytes=0))
            self._ctx.__enter__()
            return
        self.log = tmp_path / f"{backend}.log"
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=repo_pythonpath(),
                   TF_CONFIG=json.dumps({"cluster": {"ps": [self.address]},
                                         "task": {"type": "ps", "index": 0}}))
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tictac_hooks.cli", "ps", "--tf-config",
                 "--backend", backend], stdout=f, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, preexec_fn=die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"tictac ps --backend {backend} did not answer:\n"
                            f"{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)

    def _answers(self) -> bool:
        try:
            with connect(self.address, timeout_s=1.0, backend=self.backend) as client:  # noqa
                return client.ping()
        except GateError:
            return False

    def stop(self) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(10)


@pytest.fixture(params=[
    "inprocess",
    pytest.param("native", marks=[pytest.mark.cluster, pytest.mark.slow]),
    pytest.param("proxy", marks=[pytest.mark.cluster, pytest.mark.slow])])
def served(request, tmp_path):
    s = Served(request.param, tmp_path)
    yield s
    s.stop()


def test_every_client_keeps_the_gate_contract(served, monkeypatch):
    with connect(served.address, timeout_s=10.0) as client:
        # connect picks the backend that answers; ping and a fresh gate's stats
        assert client.backend == served.backend and client.ping() is True
        fresh = client.stats()
        assert fresh.backend == served.backend and fresh.schedule_version is None
        assert fresh.algorithm is None and not fresh.steps and fresh.served_names == 0
        assert client.served_names() == []

        # install: steps starting after it run under it; before any traffic every
        # scheduled transfer is expected and none is unmatched
        got = client.install(schedule())
        assert got.version >= 1 and got.transfers == 3 and got.expected == 3, got
        assert not got.unmatched
        after = client.stats()
        assert (after.schedule_version, after.algorithm, after.expected) == \
            (got.version, "tic", 3)

        # every install setting is honoured or refused by name, never ignored
        for name, value in SETTINGS.items():
            if name in client.unhonoured:
                with pytest.raises(UnhonouredSetting, match=f"{name}="):
                    client.install(schedule(), **{name: value})
            else:
                again = client.install(schedule(algorithm="tac"), **{name: value})
                assert again.version > got.version
                got = again
        assert set(SETTINGS) == set(INSTALL_SETTINGS)
        if served.backend == "native":   # the native gate reports what it took
            client.install(schedule(), pace_rate=125e6, align=True)
            native = client.stats()
            assert native.pace_rate == pytest.approx(125e6) and native.align is True

        # a schedule over the install limit is refused before it is sent: nothing changes
        version = client.stats().schedule_version
        monkeypatch.setattr(api, "MAX_INSTALL_BYTES", 4096)
        big = Schedule.from_order("tic", [f"model/dense/kernel/read/{i:040d}"
                                          for i in range(200)])
        with pytest.raises(ScheduleError, match="too large to install: 200 transfers"):
            client.install(big)
        monkeypatch.undo()
        assert client.stats().schedule_version == version

        # a cursor's read: nothing finished yet, nothing dropped
        read = client.stats(since=0)
        assert (read.since, read.last_seq, read.dropped) == (0, 0, 0) and not read.steps

        # clear: TensorFlow's own order again
        client.clear()
        cleared = client.stats()
        assert cleared.schedule_version is None and cleared.algorithm is None

    # a gate that goes away: GateError (what the run catches), not another error
    served.stop()
    with pytest.raises(GateError):
        backend = "auto" if served.backend == "inprocess" else served.backend
        with connect(served.address, timeout_s=2.0, backend=backend) as client:
            client.stats()
