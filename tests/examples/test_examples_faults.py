"""No example hangs on a dead PS (issue #14, "No hang"): each example trains on a real
local cluster; its PS is killed with SIGKILL mid-run; the example must exit non-zero
within 30 s, with one line naming the task and no hang in TensorFlow's session."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.cluster
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXAMPLES = [
    ("keras_ps_train.py", ["--network=loopback", "--steps=100000", "--steps_per_epoch=10"]),
    ("inference.py", ["--network=loopback", "--steps=100000"]),
    ("keras3_custom_loop.py", ["--network=loopback", "--steps=100000"]),
    ("graph_mode_train.py", ["--steps=100000"]),
    ("graph_mode_train.py", ["--steps=100000", "--replication=between"]),
]


def children(pid: int) -> dict[int, str]:
    """pid -> command line of every descendant of ``pid``."""
    parent_of, cmd = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent_of[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        cmd[int(entry)] = cmdline
    out = {}
    for p in cmd:
        q = p
        while q in parent_of and q > 1:
            q = parent_of[q]
            if q == pid:
                out[p] = cmd[p]
                break
    return out


def ps_processes(pid: int) -> list[int]:
    return [p for p, c in children(pid).items()
            if "tictac_hooks.enforce.cli ps " in c and "--task-index 0" in c]


@pytest.mark.parametrize("example,args", EXAMPLES,
                         ids=[f"{e}{'-between' if '--replication=between' in a else ''}"
                              for e, a in EXAMPLES])
def test_killing_the_ps_mid_training_ends_the_example_within_30_s(example, args, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "examples", example), *args,
                             f"--log_dir={tmp_path / 'tb'}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        # Training runs once TicTac has connected and profiles ("[tictac] profiling"):
        # kill the PS a few steps into it.
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                                  daemon=True)
        reader.start()
        deadline = time.monotonic() + 150
        while not any("[tictac] profiling" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, \
                ("".join(lines), proc.stderr.read())
            time.sleep(0.2)
        time.sleep(3)
        assert proc.poll() is None and ps_processes(proc.pid), "".join(lines)
        for pid in ps_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            proc.wait(timeout=30)
            err = proc.stderr.read()
            out = "".join(lines)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{example} still running 30 s after its PS was killed")
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, (out[-2000:], err[-2000:])
    assert took < 30
    assert "ps:0" in err, err[-3000:]
    print(f"\n{example}: exit {proc.returncode} {took:.1f} s after the PS was killed; "
          f"last line: {err.strip().splitlines()[-1]}")
