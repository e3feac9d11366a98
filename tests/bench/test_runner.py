"""bench/runner.py: the configuration, the driver of the client (with a stand-in), the
record it returns, and one real --quick run on a shaped network (root only)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from .results import result as bench_result

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_config_validation_and_rates():
    from tictac_hooks.bench.runner import BenchConfig, parse_rates
    assert parse_rates(["auto", "auto:2", "500mbit"]) == [
        {"kind": "ratio", "value": 1.0, "spec": "auto"},
        {"kind": "ratio", "value": 2.0, "spec": "auto:2"},
        {"kind": "rate", "value": 500_000_000, "spec": "500mbit"}]
    BenchConfig(schedules=["none", "stock", "tic", "tic-fifo", "tic-aligned",
                           "tic-nopace"]).validate()
    # the baselines; "layer" (first-use's old name) is accepted, as such, and said once
    import logging
    from tictac_hooks.graph import algorithms
    algorithms._aliases_said.discard("layer")
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("tictac").addHandler(handler)
    try:
        config = BenchConfig(schedules=["none", "layer", "layer-aligned", "declared",
                                        "declared-wc"])
        config.validate()
        assert config.schedules == ["none", "first-use", "first-use-aligned", "declared",
                                    "declared-wc"]
        BenchConfig(schedules=["layer-fifo", "first-use-nopace"]).validate()
    finally:
        logging.getLogger("tictac").removeHandler(handler)
    assert [m for m in said if "'layer' is now called 'first-use'" in m] == [said[0]]
    assert len(said) == 1
    from tictac_hooks.bench.runner import default_schedules
    assert {"first-use", "declared"} <= set(default_schedules("native"))
    assert "layer" not in default_schedules("native")
    for bad in (dict(model="alexnet"), dict(workers=0), dict(schedules=["tic", "fifo"]),
                dict(schedules=["layer", "first-use"]), dict(schedules=["layered"]),
                dict(schedules=["stock", "tic"], backend="proxy"),
                dict(schedules=["none-fifo"]), dict(check_rounds=0),
                dict(check_block_steps=1), dict(check_block_steps=2),
                dict(bandwidth=["auto:x"]), dict(mode="eval")):
        with pytest.raises(ValueError):
            BenchConfig(**bad).validate()


def test_emulated_settings_are_checked_and_the_byte_scale_picked():
    from tictac_hooks.bench.runner import (EMULATED_BYTES_PER_STEP, BenchConfig,
                                           emulated_byte_scale)
    config = BenchConfig(model="resnet50", workers=32, ps=8, compute_ms=100.0)
    config.validate()  # 32 workers and 8 PS: emulated workers only
    assert config.schedules == ["stock", "tic", "tac"]
    assert config.label == "resnet50/training/W32/P8/gpu100ms"
    with pytest.raises(ValueError, match="workers must be in 1..8"):
        BenchConfig(model="resnet50", workers=32).validate()
    for bad, word in ((dict(model="inceptionv3"), "replays a profile"),
                      (dict(compute_ms=0.0), "--compute-ms"),
                      (dict(byte_scale=1.5), "--byte-scale"), (dict(max_ops=0), "--max-ops"),
                      (dict(workers=33), "--workers")):
        with pytest.raises(ValueError, match=word):
            BenchConfig(**(dict(model="resnet50", compute_ms=100.0) | bad)).validate()
    # the picked scale keeps W workers' pulls and pushes within EMULATED_BYTES_PER_STEP
    pull = 10 * 2**20
    assert emulated_byte_scale(BenchConfig(compute_ms=1.0, workers=2), pull, pull) == 1.0
    assert emulated_byte_scale(BenchConfig(compute_ms=1.0, workers=80), pull, pull) == \
        pytest.approx(EMULATED_BYTES_PER_STEP / (80 * 2 * pull))
    # one worker's own bytes bound it too: 100 MiB each way at one worker
    assert emulated_byte_scale(BenchConfig(compute_ms=1.0, workers=1), 10 * pull,
                               10 * pull) == pytest.approx(64 / 200)
    assert emulated_byte_scale(BenchConfig(compute_ms=1.0, workers=16, byte_scale=0.5),
                               pull) == 0.5


def test_the_cli_takes_emulate_gpu_with_compute_ms_only(capsys):
    from tictac_hooks.cli import main
    assert main(["bench", "--emulate-gpu", "--model", "resnet50"]) != 0
    assert "--emulate-gpu and --compute-ms go together" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.root
def test_quick_bench_on_a_shaped_network(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the benchmark builds network namespaces shaped with tc")
    from tictac_hooks.bench import runner
    from tictac_hooks.cluster import netns
    from tictac_hooks.records import BenchRun
    ok, why = netns.available()
    if not ok:
        pytest.skip(f"no shaped network here: {why}")
    out = tmp_path / "quick.json"
    # Popen, for the pid that names the run's namespaces (checked removed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tictac_hooks.cli", "bench", "--quick", "--json", str(out),
         "--schedules", "none,rendezvous,stock,tic,tac,random,layer,declared,checked",
         "--check-rounds", "1", "--check-block-steps", "3"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["network"]["shaped"] is True
    # the result says which code ran it, and how
    assert result["commit"] == runner.source_revision()[0] and len(result["commit"]) == 40
    assert result["command"].startswith("tictac bench --quick --json ")
    assert BenchRun.from_json(result).to_json() == result
    # "layer" is first-use's old name; declared: tf.compat.v1.trainable_variables()
    assert set(result["schedules"]) == {"none", "rendezvous", "stock", "tic", "tac", "random",
                                        "first-use", "declared", "checked"}
    for name, m in result["schedules"].items():
        for key in ("throughput", "step_time_median", "step_time_p95", "step_time_cv",
                    "straggler_pct", "efficiency_median", "violations", "matched"):
            assert key in m, (name, key)
        assert m["throughput"] > 0
    # the gate was bypassed for "stock" only: the orders after it were enforced again
    assert result["schedules"]["stock"]["matched"] is None
    assert result["schedules"]["tic"]["matched"] > 0.9
    # "checked" ran TicTac's order check (1 round: a TIC and a TAC block pair, 3 steps
    # each) and its blocks ran what it kept: that order enforced, or none at all
    check = result["schedules"]["checked"]["check"]
    # TIC and TAC, or one of them where their orders are the same (checked once)
    n = len(check["candidates"])
    assert set(check["candidates"]) <= {"tic", "tac"} and n >= 1, check
    assert check["steps"] == 6 * n and check["decision"] in ("tictac", "default"), check
    assert (check["kept"] in ("tic", "tac")) == (check["decision"] == "tictac"), check
    if check["kept"]:
        assert result["schedules"]["checked"]["matched"] > 0.9
    else:
        assert not result["schedules"]["checked"]["matched"]
    assert f"[bench mobilenetv2/inference/W2/P1] order check ({6 * n} steps" in stderr
    # each round held the calibration blocks, and the simulator got their medians
    from tictac_hooks.bench.predict import load_inputs
    (run,) = result["runs"]
    assert len(run["in_run"]["fast_link_steps"]) == len(run["in_run"]["compute_steps"]) == 4
    assert run["in_run"]["fast_link_s"] > 0 and run["in_run"]["compute_s"] > 0
    assert load_inputs(str(out))[0]["compute_s"] == run["in_run"]["fast_link_s"]
    assert load_inputs(str(out))[0]["reference_s"] == run["in_run"]["compute_s"]
    assert "| mobilenetv2/inference/W2/P1" in stdout
    assert not [ns for ns in netns._namespaces() if ns.startswith(f"{netns.PREFIX}-")
                and ns.split("-")[1] == str(proc.pid)]


class _OneHostCluster:
    """What the bench driver asks of a cluster, with ``spawn_in`` running a stand-in for
    the benchmark client: it saves its first bandwidth the way the client does, then
    hangs where the second would be measured."""
    ps_addresses = ["localhost:1"]
    worker_addresses = ["localhost:2"]
    tasks: list = []

    def __init__(self, saves_a_bandwidth: bool):
        self.saves = saves_a_bandwidth

    def child_env(self):
        return dict(os.environ)

    def spawn_in(self, host, argv, **kw):
        code = ("import json, sys, time\n"
                "from tictac_hooks.bench.client import save_result\n"
                "cfg = json.load(open(sys.argv[1]))\n"
                + ("save_result(cfg['out'], {'runs': [{'rate_bits': 4e8}], "
                   "'compute': {}})\n" if self.saves else "")
                + "time.sleep(60)\n")
        return subprocess.Popen([sys.executable, "-c", code, argv[-1]], cwd=ROOT, **kw)


@pytest.mark.slow
def test_a_run_cut_short_keeps_the_bandwidths_it_finished(tmp_path):
    from tictac_hooks.bench.runner import _drive
    said = []
    cfg = {"interposed_tasks": [0], "direct_tasks": [], "out": str(tmp_path / "r.json")}
    result = _drive(_OneHostCluster(True), cfg, str(tmp_path), 3.0, None, said.append)
    assert result["runs"] == [{"rate_bits": 4e8}]
    assert result["incomplete"] == "the benchmark client did not finish within 3 s (--timeout)"
    assert "keeping the 1 bandwidth(s) it finished (400 Mbit/s)" in said[-1]
    os.remove(cfg["out"])
    with pytest.raises(TimeoutError, match="before any bandwidth was measured"):
        _drive(_OneHostCluster(False), cfg, str(tmp_path), 3.0, None, said.append)
    from tictac_hooks.bench.report import text_table
    cut = dataclasses.replace(bench_result(), incomplete=result["incomplete"])
    assert "**INCOMPLETE** (resnet50/training/W2/P1: the benchmark client did not finish" \
        in text_table([cut])
    assert "INCOMPLETE" not in text_table([bench_result()])



def test_config_record_holds_every_setting_of_a_bench_config():
    from tictac_hooks.bench.runner import BenchConfig, config_record
    from tictac_hooks.records import BenchConfigRecord
    settings = {f.name for f in dataclasses.fields(BenchConfig)}
    recorded = {f.name for f in dataclasses.fields(BenchConfigRecord)}
    assert settings <= recorded, settings - recorded  # a new setting is recorded too
    record = config_record(BenchConfig(workers=3, schedules=["none", "tic"]), batch=16)
    assert record.label == "resnet50/training/W3/P1" and record.batch == 16
    assert record.schedules == ("none", "tic") and record.backend == "native"
    assert BenchConfigRecord.from_json(record.to_json()) == record


def test_source_revision_is_the_checkouts_commit_and_whether_it_has_changes(tmp_path):
    from tictac_hooks.bench.runner import source_revision
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode != 0:
        pytest.skip("this copy of the package is not a git checkout")
    commit, _ = source_revision()
    assert commit == head.stdout.strip() and len(commit) == 40
    assert source_revision(str(tmp_path)) == ("", False)  # not a checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / "f.py").write_text("a = 1\n")
    subprocess.run(git + ["add", "f.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "f"], check=True)
    commit, dirty = source_revision(str(tmp_path))
    assert len(commit) == 40 and not dirty
    (tmp_path / "new.json").write_text("{}")  # an untracked result does not count
    assert source_revision(str(tmp_path)) == (commit, False)
    (tmp_path / "f.py").write_text("a = 2\n")
    assert source_revision(str(tmp_path)) == (commit, True)


def test_command_line_names_the_program_by_its_base_name():
    from tictac_hooks.bench import runner
    assert runner.command_line(["/x/.venv/bin/tictac", "bench", "--model", "a b"]) == \
        "tictac bench --model 'a b'"
    cli = os.path.join(ROOT, "tictac_hooks", "cli.py")  # python -m tictac_hooks.cli
    assert runner.command_line([cli, "bench", "--quick"]) == "tictac bench --quick"
    assert runner.command_line(["/x/benchmarks/bench_tictac.py", "--steps", "5"]) == \
        "bench_tictac.py --steps 5"
    assert runner.command_line([]) == ""


def test_a_run_returns_a_bench_run_with_its_commit_and_command(monkeypatch):
    from tictac_hooks.bench import runner
    from tictac_hooks.cluster import launcher
    from tictac_hooks.records import BenchRun, ProfiledCompute
    from .results import rate_run
    rate = rate_run({"none": [1.0, 1.1], "tic": [0.9, 0.9]})
    client_output = {"param_bytes": 1000, "global_batch": 4,
                     "compute": ProfiledCompute(0.5, 0.2, 0.5, 0.4).to_json(),
                     "runs": [dict(rate.to_json(), sim_inputs={"version": 9})]}
    monkeypatch.setattr(launcher, "LocalCluster", lambda **kw: contextlib.nullcontext())
    monkeypatch.setattr(runner, "_drive", lambda *a: json.loads(json.dumps(client_output)))
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/tictac", "bench", "--loopback"])
    config = runner.BenchConfig(model="mobilenetv2", mode="inference", batch=2,
                                loopback=True, schedules=["none", "tic"])
    result = runner.run(config, progress=lambda m: None)
    assert isinstance(result, BenchRun)
    assert (result.commit, result.dirty) == runner.source_revision()
    assert result.command == "tictac bench --loopback"
    assert not result.shaped and result.network_reason == "--loopback given"
    assert result.runs == (rate,) and result.runs[0].sim_inputs == {"version": 9}
    assert result.config.label == "mobilenetv2/inference/W2/P1" and result.config.batch == 2
    assert result.compute.compute_s == 0.2 and result.param_bytes == 1000
    written = json.loads(json.dumps(result.to_json()))
    assert written["commit"] == result.commit and written["command"] == result.command
    assert "sim_inputs" not in written["runs"][0]  # saved beside the result, not in it
    assert BenchRun.from_json(written) == result
    assert runner.run(config, lambda m: None, command="bench_tictac.py x").command == \
        "bench_tictac.py x"


def test_every_benchmark_scripts_json_records_its_provenance():
    """The scripts under benchmarks/ that write JSON put the commit and the command in
    it, from one helper."""
    import pathlib
    from tictac_hooks.bench.runner import provenance
    got = provenance(["benchmarks/probe_default_order.py", "--x", "a b"])
    assert got["command"] == "probe_default_order.py --x 'a b'"
    assert set(got) == {"commit", "dirty", "command"} and isinstance(got["dirty"], bool)
    root = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
    # the scripts whose output is a JSON result (the others print tables)
    for name in ("bench_shaped_overhead.py", "probe_layer_vs_dag.py",
                 "probe_default_order.py", "probe_fastlink_waits.py",
                 "probe_step_timeline.py"):
        assert "**provenance()" in (root / name).read_text(), name


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.root
def test_emulated_gpu_workers_on_a_shaped_network(tmp_path):
    """--emulate-gpu end to end: two workers replay the cnn profile at 60 ms of compute
    per step (the delay op loaded into each worker process), TensorFlow's order (the
    gate bypassed), TIC and TAC on one worker set; the run says how much compute it
    measured and what CPU it took, and records both."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the benchmark builds network namespaces shaped with tc")
    from tictac_hooks.cluster import netns
    from tictac_hooks.records import BenchRun
    ok, why = netns.available()
    if not ok:
        pytest.skip(f"no shaped network here: {why}")
    out = tmp_path / "emulated.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tictac_hooks.cli", "bench", "--emulate-gpu",
         "--compute-ms", "60", "--model", "cnn", "--mode", "training", "--workers", "2",
         "--bandwidth", "200mbit", "--byte-scale", "0.5", "--steps", "4",
         "--block-steps", "2", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    label = "[bench cnn/training/W2/P1/gpu60ms]"
    assert f"{label} emulated GPU workers: 60 ms of compute per step, bytes and links x " \
           "0.5 (--byte-scale)" in proc.stderr
    assert f"{label} link 0.2 Gbit/s x 0.5 (the byte scale): shaped at 100 Mbit/s" \
        in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "emulated compute:" in ln]
    measured = float(line.split("emulated compute: ")[1].split(" ms")[0])
    assert "ms of 60 ms requested (2 workers, CPU " in line
    assert 54 <= measured <= 75, line  # the guard's load decides the rest (CPU-bound)
    result = json.loads(out.read_text())
    assert BenchRun.from_json(result).to_json() == result
    assert list(result["schedules"]) == ["stock", "tic", "tac"]
    assert result["config"]["compute_ms"] == 60 and result["config"]["byte_scale"] == 0.5
    (run,) = result["runs"]
    assert run["emulated_compute_ms"] == pytest.approx(measured, abs=0.05)
    assert set(run["cpu"]["task_cpu_s"]) >= {"ps0", "worker0", "worker1"}
    assert run["vs_default"]["tic"]["throughput_gain_pct"] is not None  # against stock
    assert result["schedules"]["tic"]["matched"] > 0.9
    assert ("CPU-bound:" in proc.stderr) == bool(
        max(run["cpu"]["core_busy"]) > 0.85 or
        max(run["cpu"]["task_cpu_s"][f"worker{w}"] for w in (0, 1)) / run["cpu"]["wall_s"]
        > 1 / 3)
