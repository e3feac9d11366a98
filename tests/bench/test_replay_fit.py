"""`tictac bench --frontend fit --emulate-gpu` (bench/replay_fit.py, bench/fit_mode.py):
the replay's shards created so ParameterServerStrategy's round-robin puts each on its
PS, and a real fit run on a loopback cluster with the TicTac callback, whose workers
deliver the requested compute and whose CPU guard says what it measured."""

import json
import os
import subprocess
import sys

import pytest

from tictac_hooks.bench import fit_mode
from tictac_hooks.bench.replay_fit import placement_order

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("ps_of, num_ps", [
    ([0, 1, 0, 1], 2), ([0, 0, 0, 1], 2), ([1, 1], 2), ([2, 0, 2, 2, 1], 3), ([0], 1),
    ([3, 3, 3], 4)])
def test_round_robin_puts_every_shard_on_its_ps_from_any_start(ps_of, num_ps):
    for first in range(num_ps + 2):
        order = placement_order(ps_of, num_ps, first)
        landed = {i: (first + k) % num_ps for k, i in enumerate(order) if i is not None}
        assert landed == dict(enumerate(ps_of)), (first, order)
        # each PS's shards keep their order; fillers only where a PS has none left
        for p in range(num_ps):
            mine = [i for i in order if i is not None and ps_of[i] == p]
            assert mine == sorted(mine)
        assert order[-1] is not None  # no filler after the last shard
        fillers = order.count(None)
        # at most the slots the busiest PS's shards leave to the other PSes
        most = max(ps_of.count(p) for p in range(num_ps))
        assert fillers <= num_ps * most - len(ps_of) + num_ps - 1


def test_a_shard_on_a_ps_the_strategy_has_not_is_refused():
    with pytest.raises(ValueError, match="shard 1 is on PS 2, the strategy has 2"):
        placement_order([0, 2], 2)


@pytest.mark.parametrize("argv, message", [
    (["--min-shard-bytes", "1000"], "replays the profile's own shards"),
    (["--byte-scale", "2"], "--byte-scale must be in"),
    (["--max-ops", "0"], "--max-ops must be in"),
])
def test_fit_emulation_refuses_bad_settings_before_a_cluster(argv, message, capsys):
    from tictac_hooks.cli import main
    code = main(["bench", "--frontend", "fit", "--emulate-gpu", "--compute-ms", "50",
                 "--model", "dlrm", *argv])
    assert code == 2 and message in capsys.readouterr().err


def test_fit_emulation_picks_the_byte_scale_as_the_graph_bench_does():
    config = fit_mode.FitConfig(model="resnet50", workers=8, ps=2, compute_ms=164.0,
                                min_shard_bytes=0)
    e = fit_mode.emulation(config)
    # ResNet-50 moves about 195 MiB a worker step: 8 workers within 16 MiB a step
    assert 0.0095 < e["byte_scale"] < 0.011 and e["picked"]
    assert "16 delay ops" in e["describe"] and "summing to 164.0 ms" in e["describe"]
    given = fit_mode.emulation(fit_mode.FitConfig(model="resnet50", workers=8, ps=2,
                                                  compute_ms=164.0, byte_scale=0.01,
                                                  min_shard_bytes=0))
    assert given["byte_scale"] == 0.01 and not given["picked"]


@pytest.mark.slow
@pytest.mark.cluster
def test_fit_trains_the_replay_at_the_requested_compute_on_loopback(tmp_path):
    """fit under ParameterServerStrategy, 2 workers and 2 PS on loopback, trains the
    DLRM profile's replay with the TicTac callback: every shard on its planned PS, the
    order check decided, the compute profile measured in its child (the delay ops
    loaded there), and the workers' compute reference within 10 % of the request."""
    out = tmp_path / "fit.json"
    argv = [sys.executable, "-m", "tictac_hooks.cli", "bench", "--frontend", "fit",
            "--emulate-gpu", "--compute-ms", "40", "--model", "dlrm", "--max-ops", "4",
            "--loopback", "--quick", "--schedules", "tic", "--workers", "2", "--ps", "2",
            "--json", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    result = json.loads(out.read_text())
    e = result["emulate"]
    assert e["model"] == "dlrm" and e["compute_ms"] == 40 and e["byte_scale"] == 1.0
    assert 40 <= e["compute_ms_measured"] <= 44, e["compute_ms_measured"]
    assert f"emulated compute: {e['compute_ms_measured']:.1f} ms of 40 ms requested " \
           f"(2 workers, CPU " in proc.stdout
    assert ("CPU-bound" in proc.stdout) == bool(e["cpu_bound"])
    assert set(e["cpu"]["task_cpu_s"]) == {"ps0", "ps1", "worker0", "worker1"}
    # every shard where the replay placed it, none sharded again by the strategy
    plan = fit_mode._replay("dlrm", 2, 40.0, 4, 1.0)
    placed = {v["name"]: v for v in result["model"]["variables"]}
    assert {s.name: [s.ps] for s in plan.shards} == {
        name: v["ps"] for name, v in placed.items()}
    assert all(v["shards"] == 1 for v in placed.values())
    # the order check ran TIC against TensorFlow's order on both workers
    assert set(result["orders"]["tic"]["workers"]) == {"worker:0", "worker:1"}
    assert result["tictac"]["coverage"], result["tictac"]
    assert "compute profile:" in proc.stderr + proc.stdout
    assert result["config"]["model_label"] == "dlrm (emulated)"


def test_the_emulated_line_says_the_guard_only_where_it_tripped(capsys):
    from tictac_hooks.bench.cpu_guard import CpuUse
    calm = CpuUse(10.0, (0.5, 0.6), {"worker0": 1.0, "worker1": 2.0, "ps0": 5.0})
    r = fit_mode.emulated_line({"compute_ms": 100}, 2, [0.101, 0.103, 0.102], calm)
    out = capsys.readouterr().out
    assert out == ("emulated compute: 102.0 ms of 100 ms requested (2 workers, CPU 15 % "
                   "of a core per worker)\n")
    assert r["cpu_bound"] == [] and abs(r["compute_ms_measured"] - 102.0) < 1e-9
    busy = CpuUse(10.0, (0.9, 0.6), {"worker0": 4.0, "worker1": 2.0})
    r = fit_mode.emulated_line({"compute_ms": 100}, 2, [0.1], busy)
    out = capsys.readouterr().out
    assert "CPU-bound: a core was 90% busy (guard 85%); a worker used 40% of a core" in out
    assert len(r["cpu_bound"]) == 2
