"""Restarts on real local clusters (issue: a PS that comes back gets the order again, a
job restarted with BackupAndRestore keeps it, a worker that comes back is served in
turn): each scenario as a user meets it, with the lines TicTac prints."""

from __future__ import annotations

import pytest

from tictac_hooks.run import planner
from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.controller import Controller
from tictac_hooks.run.settings import Settings
from tictac_hooks.cluster.launcher import LocalCluster
from tictac_hooks.enforce.client import stats_everywhere
from tictac_hooks.graph.dag import Graph, Op


def two_ps_order() -> list:
    """A worker DAG reading one variable from each of two PS, and its TIC order."""
    graph = Graph([Op("v0", "recv", channel="ps:0", bytes=1000),
                   Op("v1", "recv", channel="ps:1", bytes=1000),
                   Op("use", "compute", ("v0", "v1"))])
    return planner.parts_for("tic", {"worker": graph}, None, {"v0", "v1"}, set())


@pytest.mark.cluster
def test_a_ps_restarted_under_a_running_controller_gets_the_order_within_one_read(capsys):
    """The PS process is killed and started again at its address (a pod restarted in
    place): the next read finds its new gate, installs the order on it again and says
    so in one line; the other PS is left as it is."""
    with LocalCluster(num_ps=2, num_workers=1) as cluster:
        ps0, ps1 = cluster.ps_addresses
        controller = Controller(RunConfig.build(Settings.resolve(check_rounds=0),
                                                cluster.ps_addresses))
        controller.connect()
        parts = two_ps_order()
        controller.runner.switched("tic", {"tic": parts})
        controller._install(parts)
        controller.runner.installed = "tic"
        before = {s.ps: s for s in stats_everywhere(cluster.ps_addresses)}
        assert controller.steplog.ordered_ps == {ps0, ps1}
        cluster.restart("ps", 1)
        fresh = stats_everywhere([ps1])[0]
        assert fresh.instance != before[ps1].instance and fresh.algorithm is None
        controller.poll()  # one read
        lines = [line for line in capsys.readouterr().out.splitlines() if "restarted" in line]
        assert lines == [f"[tictac] the PS at {ps1} was restarted (a new gate): the TIC "
                         "order installed on it again"], lines
        after = {s.ps: s for s in stats_everywhere(cluster.ps_addresses)}
        assert after[ps1].algorithm == "tic" and after[ps1].expected == 1
        assert after[ps0].schedule_version == before[ps0].schedule_version  # untouched
        assert controller.cursor.restarts == {ps1: 1}
        controller.poll()
        assert "restarted" not in capsys.readouterr().out  # said once
        controller.stop_reading()
        controller.cursor.close()


class _Job:
    """The example's job (examples/keras_ps_train.py: its own local cluster, the chief
    running tf_keras fit with TicTac and BackupAndRestore) as a process, its output
    read as it comes."""

    def __init__(self, *args: str) -> None:
        import subprocess
        import sys
        import threading
        from tests.callbacks.test_keras_callback import EXAMPLE, ROOT, _env
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, EXAMPLE, *args], cwd=ROOT, env=_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self._reader = threading.Thread(
            target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),
            daemon=True)
        self._reader.start()

    def wait_for(self, text: str, timeout_s: float = 240.0) -> str:
        import time
        deadline = time.monotonic() + timeout_s
        while True:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {text!r} in the job's output:\n" + self.output[-6000:])
            time.sleep(0.2)

    def task(self, job: str, index: int) -> tuple[int, list[str], dict[str, str]]:
        """pid, command line and environment of one of the job's cluster tasks."""
        from tests.examples.test_examples_faults import children
        (pid,) = [p for p, c in children(self.proc.pid).items()
                  if "tictac_hooks.enforce.cli" in c and f" {job} " in f" {c} "
                  and f"--task-index {index}" in c and "--job ps " not in c][:1] or [None]
        assert pid is not None, children(self.proc.pid)
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]
        env = dict(e.split("=", 1) for e in open(f"/proc/{pid}/environ", "rb").read()
                   .decode(errors="replace").split("\0") if "=" in e)
        return pid, [a.decode() for a in argv], env

    def wait(self, timeout_s: float = 400.0) -> int:
        self.proc.wait(timeout=timeout_s)
        self._reader.join(10)
        return self.proc.returncode

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        import os
        import signal
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.mark.cluster
def test_a_job_restarted_after_a_ps_loss_keeps_its_order_and_a_worker_comes_back(tmp_path):
    """(1) The PS is SIGKILLed mid-fit: the job fails, as ParameterServerStrategy does.
    (2) The job is started again with the same BackupAndRestore directory: fit resumes
    from it, and TicTac installs the order it saved there at once, without profiling.
    (3) A worker is SIGKILLed and started again: it is named lost once, back once, its
    steps after it came back follow the order, and every training step counts once."""
    import json
    import os
    import signal
    import subprocess
    import time
    common = ("--network=loopback", "--model=cnn", "--batch_size=32", "--steps=600",
              "--steps_per_epoch=50", "--tictac_profile_steps=10",
              "--tictac_check_rounds=0", "--tictac_measure_compute=false",
              f"--backup_dir={tmp_path / 'backup'}", f"--log_dir={tmp_path / 'tb'}",
              f"--summary_json={tmp_path / 's.json'}")
    first = _Job(*common)
    restarted = worker = None
    try:
        first.wait_for("[tictac] installed on 1 of 1 PS")
        deadline = time.monotonic() + 120  # an epoch backed up: the restart resumes
        while not (tmp_path / "backup" / "chief" / "checkpoint").exists():
            assert time.monotonic() < deadline and first.proc.poll() is None, first.output
            time.sleep(0.2)
        pid, _, _ = first.task("ps", 0)
        os.kill(pid, signal.SIGKILL)
        assert first.wait() != 0
        assert os.path.exists(tmp_path / "backup" / "tictac_order.json")
        restarted = _Job(*common)
        line = restarted.wait_for("[tictac] order restored from")
        assert "TIC order installed at once" in line and line.rstrip().endswith("no profiling"), line
        assert "paced at" in line or "not paced" in line, line  # says which
        assert "profiling again" not in restarted.output
        time.sleep(1.0)
        pid, argv, env = restarted.task("worker", 1)
        os.kill(pid, signal.SIGKILL)
        restarted.wait_for("[tictac] worker_1 ")  # lost
        worker = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        restarted.wait_for(") is back: ")
        assert restarted.wait() == 0, restarted.output[-6000:]
    finally:
        for job in (first, restarted):
            if job is not None:
                job.kill()
        if worker is not None:
            worker.kill()
            worker.wait()
    out = restarted.output
    epochs = [line for line in out.splitlines() if line.startswith("loss per epoch:")]
    assert len(epochs) == 1 and len(epochs[0].split()) - 3 < 12, epochs  # resumed
    assert sum(" lost: " in line for line in out.splitlines()) == 1
    assert sum(") is back: " in line for line in out.splitlines()) == 1
    summary = json.loads((tmp_path / "s.json").read_text())
    print("\n".join(line for line in out.splitlines() if line.startswith("[tictac]")))
    assert summary["restored_from"] == str(tmp_path / "backup" / "tictac_order.json")
    moves = [h[0] for h in summary["phases"]["history"]]  # no profiling, no switch
    assert moves == ["profiling", "decided", "ended"] and not summary["phases"]["illegal"], \
        summary["phases"]
    records, order = summary["records"], summary["order"]
    print(records, order)
    assert records["worker_steps"] + records["missing"] == records["dispatched"], records
    w1 = next(s for w, s in summary["workers"].items() if w.endswith("/task:1"))
    assert w1.get("came_back") == 1 and "lost" not in w1, w1
    assert order["violations"] == 0 and order["followed"] >= order["scheduled_steps"] - 2
    assert order["scheduled_steps"] > 0.8 * records["worker_steps"], order


def _saved(algorithm_candidates, kept, link_rate):
    from tictac_hooks.run import planner, saved_order
    from tictac_hooks.graph.dag import Graph, Op
    g = Graph([Op("p0", "recv", channel="ps0", bytes=4000), Op("p1", "recv", channel="ps0",
                                                               bytes=100),
               Op("l0", "compute", ("p0", "p1"))])
    graphs = {"worker": g}
    parts = {a: planner.parts_for("tic", graphs, None, {"p0", "p1"}, set())
             for a in algorithm_candidates}
    return graphs, saved_order.SavedOrder(saved_order.fingerprint(graphs, 1, 1), 1, 1, parts,
                                          kept, link_rate=link_rate)


@pytest.mark.parametrize("algorithm,bandwidth,restored,said", [
    ("tic", 125e6, True, "the TIC order installed at once, paced at 1 Gbit/s, no profiling"),
    ("tic", None, True, "installed at once, not paced (no bandwidth given), no profiling"),
    ("tac", 125e6, False, "holds TIC; this run asks for TAC: profiling again"),
    ("tic", 250e6, False, "computed for a link of 1 Gbit/s; this run's is 2 Gbit/s: "
                          "profiling again"),
])
def test_a_restored_order_is_paced_and_only_for_its_algorithm_and_link(
        monkeypatch, algorithm, bandwidth, restored, said):
    """A saved order runs paced like a switched one (the run's bandwidth), and is not
    restored for another algorithm or link rate than it was computed for."""
    lines = []
    c = Controller(RunConfig.build(Settings.resolve(algorithm=algorithm), ["127.0.0.1:1"],
                                   install=False, bandwidth=bandwidth))
    monkeypatch.setattr(c, "say", lines.append)
    monkeypatch.setattr(c, "wait_for_profiled_records", lambda *a, **k: True)
    graphs, saved = _saved(["tic"], "tic", 125e6)
    assert c.restore(graphs, saved, "backup/tictac_order.json") is restored
    assert said in lines[-1], lines
    assert c.pace_rate == bandwidth  # the run's, as the switch's install would take it


def test_the_fingerprint_holds_the_bytes_of_every_transfer():
    from tictac_hooks.run import saved_order
    from tictac_hooks.graph.dag import Graph, Op
    def g(nbytes):
        return {"worker": Graph([Op("p0", "recv", channel="ps0", bytes=nbytes),
                                 Op("l0", "compute", ("p0",))])}
    assert saved_order.fingerprint(g(100), 1, 1) == saved_order.fingerprint(g(100), 1, 1)
    assert saved_order.fingerprint(g(100), 1, 1) != saved_order.fingerprint(g(200), 1, 1)
