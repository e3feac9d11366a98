"""One table row per `tictac bench` result: each schedule's throughput over TensorFlow's
order, its straggler share and the spread of its step times (p95/p50), with the gate's
totals and (--emulate-gpu) the emulated compute and the CPU guard's verdict. The tables of RESULTS.md's straggler and GPU-speed
sections are printed by it.

    python3 benchmarks/bench_table.py benchmarks/results/rejoin/*.json.gz
"""
from __future__ import annotations

import os
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


def main(paths: list[str]) -> int:
    print("| run | commit | link | comm/comp | TensorFlow's straggler share; each order's "
          "throughput over it (its straggler share, p95/p50 step) | gate, compute |")
    print("|---|---|---|---|---|---|")
    for path in sorted(paths):
        if path.endswith((".json", ".json.gz")) and os.path.getsize(path):
            print("\n".join(rows(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
