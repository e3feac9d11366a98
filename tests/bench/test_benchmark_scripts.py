"""The scripts in benchmarks/: their pure parts (no cluster, no network)."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(name: str):
    """benchmarks/<name>.py, imported."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_relaunch_overhead_rounds_rotate_and_ratio_each_round_to_its_plain_launch():
    mod = _script("bench_shaped_overhead")
    orders = list(mod.rotations(4))
    # every round launches each kind once; each kind takes each position once in 3 rounds
    assert all(sorted(o) == sorted(mod.KINDS) for o in orders)
    assert {o[0] for o in orders[:3]} == set(mod.KINDS)
    assert orders[3] == orders[0]
    steps = {"plain": [[1.0, 1.2, 1.0], [2.0, 2.0, 9.0]],  # launch medians 1.0 and 2.0
             "gate": [[1.01, 1.01, 5.0], [2.04, 2.04, 2.0]],
             "plain again": [[0.99, 0.99, 0.99], [2.0, 2.0, 2.0]]}
    ratios = mod.relaunch_ratios(steps)
    assert ratios["gate"] == pytest.approx([1.01, 1.02])
    assert ratios["plain again"] == pytest.approx([0.99, 1.0])
    assert "plain" not in ratios
    # the CPU bound: PS CPU per step of each kind over all its blocks, the gate's extra
    # as a share of the plain median step (1.6 s here: the median of the six steps)
    cpu = {"plain": [0.3, 0.3], "gate": [0.33, 0.33], "plain again": [0.3, 0.24]}
    b = mod.cpu_bound(steps, cpu)
    assert b["cpu_per_step"]["gate"] == pytest.approx(0.11)
    assert b["gate_extra"] == pytest.approx(0.01) and b["aa_extra"] == pytest.approx(-0.01)
    assert b["plain_step"] == pytest.approx(1.6) and b["bound"] == pytest.approx(0.01 / 1.6)
    # this process's CPU seconds, as /proc reports them: positive, and they grow
    t0 = mod.process_cpu_s(os.getpid())
    sum(i * i for i in range(3_000_000))
    assert mod.process_cpu_s(os.getpid()) > t0 > 0


def test_bench_table_gives_each_order_its_gain_straggler_share_and_step_spread():
    mod = _script("bench_table")
    from tictac_hooks.records.files import load_json
    result = os.path.join(ROOT, "benchmarks", "results", "gpu-speed",
                          "vgg16-training-w8-p2-222ms-10gbit-run1.json.gz")
    run = load_json(result)["runs"][0]
    s = run["schedules"]
    (row,) = mod.rows(result)
    for name in ("stock", "tic", "tac"):
        spread = s[name]["step_time_p95"] / s[name]["step_time_median"]
        assert f"p95/p50 {spread:.2f}" in row
    gain = 100 * (s["tic"]["throughput"] / s["stock"]["throughput"] - 1)
    assert f"tic {gain:+.1f} % ({s['tic']['straggler_pct']:.1f} %, p95/p50" in row
    assert "CPU-bound" not in row
    assert f"compute {run['emulated_compute_ms']:.1f} of 222 ms" in row
    assert mod._spread({"step_time_p95": None, "step_time_median": 1.0}) == "-"


def test_bench_table_gives_a_fit_run_its_gain_check_and_compute():
    import statistics
    mod = _script("bench_table")
    from tictac_hooks.records.files import load_json
    result = os.path.join(ROOT, "benchmarks", "results", "gpu-speed",
                          "resnet50-fit-w4-p2-164ms-10gbit-run1.json.gz")
    r = load_json(result)
    row = mod.fit_row(result)
    tf_step = statistics.median(w["median_step_time_s"]
                                for w in r["orders"]["default"]["workers"].values())
    assert f"| 4 x 2, 10gbit | {tf_step * 1e3:.0f} ms |" in row
    assert f"tic {100 * (r['orders']['tic']['ratio_median'] - 1):+.1f} % (workers " in row
    assert "tac the same order as tic" in row
    rounds = len(r["check"]["values"]["tic"])
    assert f"kept {r['check']['kept']} after {rounds} rounds" in row
    e = r["emulate"]
    assert f"compute {e['compute_ms_measured']:.1f} of 164 ms" in row
    assert ("CPU-bound" in row) == bool(e["cpu_bound"])


def test_the_gpu_speed_table_in_results_is_what_bench_table_prints_from_its_files():
    """RESULTS.md's GPU-speed table is `bench_table.py --cells` over results/gpu-speed/:
    every row (each run's figures, whatif's prediction and its error) and the median
    error the text states."""
    import glob
    mod = _script("bench_table")
    paths = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "gpu-speed",
                                          "*.json.gz")))
    *rows, summary, spread = mod.cells(paths)
    assert len(rows) >= 14 and summary.startswith("whatif's TensorFlow step: median error")
    text = open(os.path.join(ROOT, "benchmarks", "RESULTS.md")).read()
    section = text.split("## GPU-speed workers")[1].split("\n## ")[0]
    table = [line for line in section.splitlines()
             if line.startswith("| ") and " x " in line.split("|")[1] and "fit" not in line
             and line.count("|") == 10 and not line.startswith("| model,")]
    assert table == rows
    median = summary.split("median error ")[1].split(" %")[0]
    runs = summary.split(" over ")[1].split(" runs")[0]
    assert f"within {median} % (median of these {runs} runs" in section, summary
    close, cells = spread.split(": ")[1].split(";")[0].split(" of ")
    assert f"{close} of {cells.split()[0]} cells" in section, spread


@pytest.mark.slow
def test_the_comm_heavy_model_holds_its_bytes_on_the_ps():
    from tictac_hooks.bench.workloads import comm_heavy
    g, init, train = comm_heavy(1, num_vars=3, var_mib=1, ps=0)
    variables = g.get_collection("variables")
    assert len(variables) == 3 and init.graph is g and train.graph is g
    assert all(v.device.endswith("/job:ps/task:0") for v in variables)
    assert sum(v.shape.num_elements() * 4 for v in variables) == 3 * (1 << 20)
