"""Suite-wide setup, and the leak check (issue #14: nothing left in the temporary
directory, in ``ip netns`` or in the process table after the suite).

The leak check
--------------
At the start of the session:

* the temporary directory (``tempfile.gettempdir()``, ``TMPDIR``) becomes a fresh
  ``tictac-tests-*`` folder of this session's own, for this process and every child
  (pytest's ``tmp_path`` stays where it was, via ``PYTEST_DEBUG_TEMPROOT``). Other
  runs on the same machine (the shared test machines run several at once) then cannot
  be mistaken for this one's leaks, and every leak is caught whatever its name.
* ``TICTAC_TEST_SESSION`` is set to a token of this session's own; every child
  inherits it, so a leaked process is recognised even when its parent is gone and it
  was re-parented to init.
* the ``ip netns list`` output is recorded (when there is an ``ip`` command).

After each test the check notes what is new (for the report's "first seen after"), and
at the end of the session it fails the run (exit status 1, with a "tictac leak check"
section listing each leak) if anything remains:

* an entry of the session's temporary directory (a ``tictac-cluster-*`` log folder, a
  bare ``tempfile.mkdtemp()``, ...);
* a process that is a descendant of pytest, or carries the session's token (zombies
  included: a child nobody waited for);
* a network namespace that was not there at the start, unless it is a
  ``ttnet-<pid>-...`` namespace of another live process (another run's network).

Leaks are reported after a grace of a few seconds (processes being killed, namespaces
being deleted). Then the leaked processes are killed and the session's temporary
directory is removed, so that a leaking run leaves nothing behind either; leaked
namespaces are only reported (``tictac net cleanup`` removes stale ones).

``TICTAC_SKIP_LEAK_CHECK=1`` turns all of this off (no private temporary directory, no
check): for a run whose temporary files should outlive it, or while hunting another
problem.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tictac_hooks.cluster.procs import pid_alive

# The lab's modules (benchmarks/lab/, not in the wheel) import as benchmarks.lab.<name>.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SKIP_ENV = "TICTAC_SKIP_LEAK_CHECK"
TOKEN_ENV = "TICTAC_TEST_SESSION"
GRACE_S = 5.0
# Entries third-party code in the pytest process removes at interpreter exit (after
# this check): not leaks.
REMOVED_AT_EXIT = ("__autograph_generated_file", "pymp-")


class LeakCheck:
    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.outer_tmp = tempfile.gettempdir()
        self.tmp = tempfile.mkdtemp(prefix="tictac-tests-", dir=self.outer_tmp)
        self.saved_env = {k: os.environ.get(k)
                          for k in ("TMPDIR", TOKEN_ENV, "PYTEST_DEBUG_TEMPROOT")}
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", self.outer_tmp)
        os.environ["TMPDIR"] = self.tmp
        os.environ[TOKEN_ENV] = self.token
        tempfile.tempdir = self.tmp
        self.netns_at_start = set(_netns())
        self.procs_at_start = set(self.processes())
        self.first_seen: dict[str, str] = {}
        self.report: list[str] = []

    # -- what there is now ------------------------------------------------------------

    def temp_entries(self) -> list[str]:
        try:
            names = os.listdir(self.tmp)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if not n.startswith(REMOVED_AT_EXIT))

    def processes(self) -> dict[int, str]:
        """This session's processes other than pytest: {pid: description}."""
        me = os.getpid()
        table = _proc_table()
        out = {}
        for pid, (ppid, state, comm) in table.items():
            if pid == me:
                continue
            ours = _descends_from(pid, me, table) or self.token.encode() in _environ(pid)
            if ours:
                zombie = " (zombie: never waited for)" if state == "Z" else ""
                out[pid] = f"pid {pid} ppid {ppid} {_cmdline(pid) or comm}{zombie}"
        return out

    def netns(self) -> list[str]:
        """Namespaces new since the start that are not another live process's."""
        new = [n for n in _netns() if n not in self.netns_at_start]
        ours = {os.getpid(), *self.processes()} if new else set()
        return sorted(n for n in new  # not another live run's network
                      if (owner := _netns_owner(n)) is None or owner in ours
                      or not pid_alive(owner))

    def leaks(self) -> dict[str, list[str]]:
        procs = {p: d for p, d in self.processes().items() if p not in self.procs_at_start}
        return {"temporary directory": [os.path.join(self.tmp, n) for n in self.temp_entries()],
                "processes": [procs[p] for p in sorted(procs)],
                "network namespaces": self.netns()}

    # -- hooks ------------------------------------------------------------------------

    def after_test(self, nodeid: str) -> None:
        for kind, items in self.leaks().items():
            for item in items:
                self.first_seen.setdefault(_key(kind, item), nodeid)

    def finish(self, session: pytest.Session) -> None:
        deadline = time.monotonic() + GRACE_S
        leaks = self.leaks()
        while any(leaks.values()) and time.monotonic() < deadline:
            time.sleep(0.25)
            leaks = self.leaks()
        if not any(leaks.values()):
            return
        for kind, items in leaks.items():
            if items:
                self.report.append(f"{kind}: {len(items)} left")
                for item in items:
                    seen = self.first_seen.get(_key(kind, item))
                    self.report.append(f"  {item}" + (f"  (first seen after {seen})"
                                                      if seen else ""))
        self.report.append(f"(set {SKIP_ENV}=1 to run without this check)")
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        tempfile.tempdir = None
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _key(kind: str, item: str) -> str:
    # A process's description may change (its cmdline appears after exec): key by pid.
    return f"{kind}:{item.split()[1]}" if kind == "processes" else f"{kind}:{item}"


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """{pid: (ppid, state, comm)} from /proc/*/stat."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        head, _, rest = stat.rpartition(")")
        fields = rest.split()
        if len(fields) >= 2:
            table[int(entry)] = (int(fields[1]), fields[0], head.partition("(")[2])
    return table


def _descends_from(pid: int, ancestor: int, table: dict[int, tuple[int, str, str]]) -> bool:
    seen = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        pid = table[pid][0]
        if pid == ancestor:
            return True
    return False


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= 300 else text[:300] + "..."


def _netns() -> list[str]:
    if shutil.which("ip") is None:
        return []
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_owner(name: str) -> int | None:
    """The pid in a shaped network's namespace name (``ttnet-<pid>-<hex>-<host>``)."""
    parts = name.split("-")
    if len(parts) >= 3 and parts[0] == "ttnet" and parts[1].isdigit():
        return int(parts[1])
    return None


_check: LeakCheck | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _check
    if os.environ.get(SKIP_ENV, "") not in ("", "0") or _check is not None:
        return
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller checks
        return
    _check = LeakCheck()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    if _check is not None:
        _check.after_test(nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _check is not None:
        _check.finish(session)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _check is not None and _check.report:
        terminalreporter.section("tictac leak check", sep="=", red=True, bold=True)
        for line in _check.report:
            terminalreporter.line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _check
    if _check is not None:
        _check.close()
        _check = None
