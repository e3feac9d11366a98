"""One table row per `tictac bench` result: each schedule's throughput over TensorFlow's
order, its straggler share and the spread of its step times (p95/p50), with the gate's
totals and (--emulate-gpu) the emulated compute and the CPU guard's verdict; and one row
per `tictac bench --frontend fit` result. The tables of RESULTS.md's straggler and
GPU-speed sections are printed by it.

    python3 benchmarks/bench_table.py benchmarks/results/rejoin/*.json.gz
"""
from __future__ import annotations

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tictac_hooks.bench.cpu_guard import CpuUse  # noqa: E402
from tictac_hooks.records.files import load_json  # noqa: E402


def _spread(m: dict) -> str:
    """p95 / median of the schedule's step times (issue 53's straggler spread)."""
    p95, median = m.get("step_time_p95"), m.get("step_time_median")
    return f"{p95 / median:.2f}" if p95 and median else "-"


def rows(path: str) -> list[str]:
    result = load_json(path)
    config = result["config"]
    out = []
    for run in result["runs"]:
        s = run["schedules"]
        base_name = "none" if "none" in s else "stock"
        base = s[base_name]
        cells = [f"{base_name} {base['straggler_pct']:.1f} %, p95/p50 {_spread(base)}"]
        for name, m in s.items():
            if name == base_name:
                continue
            gain = 100 * (m["throughput"] / base["throughput"] - 1)
            cells.append(f"{name} {gain:+.1f} % ({m['straggler_pct']:.1f} %, "
                         f"p95/p50 {_spread(m)})")
        totals = run.get("gate_totals") or {}
        returned = sum(t.get("returned", 0) for t in totals.values())
        levelled = sum(t.get("rejoined", 0) for t in totals.values())
        extra = f"returned {returned}, turn moved {levelled}"
        if run.get("emulated_compute_ms") is not None:
            cpu = CpuUse.from_json(run["cpu"])
            workers = list(range(config["workers"]))
            shares = cpu.worker_shares(workers)
            why = cpu.reasons(workers)
            extra += (f"; compute {run['emulated_compute_ms']:.1f} of "
                      f"{config['compute_ms']:g} ms, bytes x {config['byte_scale']:.3g}, "
                      f"cores {max(cpu.core_busy):.0%} busy, worker CPU "
                      f"{100 * sum(shares) / len(shares):.0f} %"
                      + ("; CPU-bound" if why else ""))
        out.append(f"| {os.path.basename(path)} | {result['commit'][:7]} | "
                   f"{run['rate'] if 'rate' in run else run['rate_bits']} | "
                   f"{run['comm_comp_ratio']:.2f} | " + "; ".join(cells) + f" | {extra} |")
    return out


def fit_row(path: str) -> str:
    """A `tictac bench --frontend fit` result: TensorFlow's order's step (median over
    the workers of each one's median), each order's ratio to it (the median over the
    block pairs of every worker, with the range of the workers' medians), the order
    check's decision and (--emulate-gpu) the emulated compute and the CPU guard."""
    result = load_json(path)
    config, orders = result["config"], result["orders"]
    tf_steps = [w["median_step_time_s"] for w in orders["default"]["workers"].values()]
    cells = []
    for name, o in orders.items():
        if o.get("same_as"):
            cells.append(f"{name} the same order as {o['same_as']}")
        if name == "default" or o.get("same_as") or "ratio_median" not in o:
            continue
        per_worker = [w["ratio_median"] for w in o["workers"].values()]
        cells.append(f"{name} {100 * (o['ratio_median'] - 1):+.1f} % (workers "
                     f"{100 * (min(per_worker) - 1):+.1f} to {100 * (max(per_worker) - 1):+.1f})")
    check = result["check"]
    rounds = len(next(iter(check["values"].values()), [])) if check.get("values") else "?"
    decision = f"kept {check['kept']} after {rounds} rounds"
    held = result.get("with_check") or {}
    if held.get("kept") and held.get("ratio_median"):  # measured again in fresh blocks
        decision += f", then {100 * (held['ratio_median'] - 1):+.1f} % in fresh blocks"
    e = result.get("emulate")
    extra = ""
    if e:
        cpu = CpuUse.from_json(e["cpu"])
        extra = (f"compute {e['compute_ms_measured']:.1f} of {e['compute_ms']:g} ms, bytes x "
                 f"{e['byte_scale']:.3g}, cores {max(cpu.core_busy):.0%} busy, worker CPU "
                 f"{100 * e['worker_cpu_share']:.0f} %" + ("; CPU-bound" if e["cpu_bound"] else ""))
    median = statistics.median(tf_steps)
    return (f"| {os.path.basename(path)} | {result['commit'][:7]} | {config['workers']} x "
            f"{config['ps']}, {config['rate']} | {median * 1e3:.0f} ms | "
            + "; ".join(cells) + f" | {decision} | {extra} |")


def main(paths: list[str]) -> int:
    paths = [p for p in sorted(paths)
             if p.endswith((".json", ".json.gz")) and os.path.getsize(p)]
    fit = [p for p in paths if load_json(p).get("benchmark") == "fit"]
    graph = [p for p in paths if p not in fit]
    if graph:
        print("| run | commit | link | comm/comp | TensorFlow's straggler share; each "
              "order's throughput over it (its straggler share, p95/p50 step) | gate, "
              "compute |")
        print("|---|---|---|---|---|---|")
        for path in graph:
            print("\n".join(rows(path)))
    if fit:
        print("| fit run | commit | W x P, link | TF's step | each order's gain over it: "
              "median of block pairs (workers' medians) | the check | compute |")
        print("|---|---|---|---|---|---|---|")
        for path in fit:
            print(fit_row(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
