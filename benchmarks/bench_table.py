"""One table row per `tictac bench` result: each schedule's throughput over TensorFlow's
order, its straggler share and the spread of its step times (p95/p50), with the gate's
totals and (--emulate-gpu) the emulated compute and the CPU guard's verdict; and one row
per `tictac bench --frontend fit` result. The tables of RESULTS.md's straggler and
GPU-speed sections are printed by it.

    python3 benchmarks/bench_table.py benchmarks/results/rejoin/*.json.gz
    python3 benchmarks/bench_table.py --cells benchmarks/results/gpu-speed/*.json.gz
"""
from __future__ import annotations

import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tictac_hooks.bench.cpu_guard import CpuUse  # noqa: E402
from tictac_hooks.records.files import load_json  # noqa: E402


def _p95_over_median(m: dict) -> float | None:
    """p95 / median of a schedule's step times (issue 53's straggler spread)."""
    p95, median = m.get("step_time_p95"), m.get("step_time_median")
    return p95 / median if p95 and median else None


def _spread(m: dict) -> str:
    ratio = _p95_over_median(m)
    return f"{ratio:.2f}" if ratio is not None else "-"


def _gain(m: dict, base: dict) -> float:
    """A schedule's throughput over the baseline's in the same run, in per cent."""
    return 100 * (m["throughput"] / base["throughput"] - 1)


def _cpu_figures(cpu_json: dict, workers: int) -> tuple[float, float, list]:
    """(busiest core's share, the workers' mean CPU share, why the run is CPU-bound:
    empty if not) of a run's recorded CPU use."""
    cpu = CpuUse.from_json(cpu_json)
    tasks = list(range(workers))
    shares = cpu.worker_shares(tasks)
    return max(cpu.core_busy), sum(shares) / len(shares), cpu.reasons(tasks)


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
            cells.append(f"{name} {_gain(m, base):+.1f} % ({m['straggler_pct']:.1f} %, "
                         f"p95/p50 {_spread(m)})")
        totals = run.get("gate_totals") or {}
        returned = sum(t.get("returned", 0) for t in totals.values())
        levelled = sum(t.get("rejoined", 0) for t in totals.values())
        extra = f"returned {returned}, turn moved {levelled}"
        if run.get("emulated_compute_ms") is not None:
            busy, share, why = _cpu_figures(run["cpu"], config["workers"])
            extra += (f"; compute {run['emulated_compute_ms']:.1f} of "
                      f"{config['compute_ms']:g} ms, bytes x {config['byte_scale']:.3g}, "
                      f"cores {busy:.0%} busy, worker CPU {100 * share:.0f} %"
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


NAMES = {"resnet50": "ResNet-50", "vgg16": "VGG-16", "transformer": "transformer"}


def _range(values: list[float], fmt: str, unit: str = "") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return (lo if lo == hi else f"{lo}-{hi}") + unit


def cells(paths: list[str]) -> list[str]:
    """RESULTS.md's GPU-speed table (--cells): one row per model, W x P and link of the
    synchronous --emulate-gpu runs named ``-run<N>`` (a quick, checked or CPU-bound run
    left out), each
    run's figures in file order, and whatif's prediction for the same cell with its
    error against each run's TensorFlow step. A run stretched xK (``-<ms>msx<K>-`` in
    its name: compute x K, link / K) shows its steps / K. The last lines: whatif's median
    step error over these runs, and in how many cells TIC's step spread stays within
    0.05 of TensorFlow's (each cell's largest difference over its runs)."""
    from tictac_hooks.graph import profile as profiles
    from tictac_hooks.graph.cli import parse_rate
    from tictac_hooks.graph.whatif import Cluster, predict
    groups: dict[tuple, list[tuple[str, dict]]] = {}
    for path in paths:
        name = os.path.basename(path)
        if "quick" in name or "checked" in name or not re.search(r"-run\d", name):
            continue
        result = load_json(path)
        if not result.get("runs"):
            continue  # a fit run (its own table), or one cut short before a rate
        config, run = result["config"], result["runs"][0]
        if run.get("emulated_compute_ms") is None:
            continue
        if _cpu_figures(run["cpu"], config["workers"])[2]:
            continue  # CPU-bound: measures this machine, not the network
        m = re.search(r"-\d+msx(\d+)-(\w+)-run", name)
        given = config["bandwidth"][0]  # the cluster's link; the run's is x the byte scale
        stretch, link = (int(m.group(1)), m.group(2)) if m else (1, given)
        key = (config["model"], config["workers"], config["ps"], link, stretch,
               config["compute_ms"], given)
        groups.setdefault(key, []).append((path, result))
    order = {m: i for i, m in enumerate(NAMES)}
    out, errors, above = [], [], []
    for key in sorted(groups, key=lambda k: (order.get(k[0], 9), k[3] != "10gbit", k[1])):
        model, w, ps, link, stretch, compute_ms, rate = key
        runs = [r["runs"][0] for _, r in groups[key]]
        config = groups[key][0][1]["config"]
        s = [run["schedules"] for run in runs]
        base = "none" if "none" in s[0] else "stock"
        gain = lambda o: ", ".join(f"{_gain(x[o], x[base]):+.1f}" for x in s) + " %"  # noqa: E731
        spread = lambda o: _range([_p95_over_median(x[o]) for x in s], "{:.2f}")  # noqa: E731
        tf = [x[base]["step_time_median"] / stretch for x in s]
        above.append(max(_p95_over_median(x["tic"]) - _p95_over_median(x[base]) for x in s))
        figures = [_cpu_figures(run["cpu"], w) for run in runs]
        cores = [100 * busy for busy, _, _ in figures]
        workers_cpu = [100 * share for _, share, _ in figures]
        profile = profiles.at_step(profiles.builtin(model), compute_ms)
        pr = predict(profile, Cluster(w, ps, parse_rate(rate), synchronous=True))
        step = pr.row("default").step_s / stretch
        err = [100 * (step / t - 1) for t in tf]
        errors += [abs(e) for e in err]
        lo, hi = (f"{round(e):+d}" for e in sorted((min(err), max(err)), key=abs))
        fmt_ms = "{:.1f}" if max(tf) < 0.1 else "{:.0f}"
        out.append(
            f"| {NAMES.get(model, model)}, {w} x {ps}"
            + ("" if link == "10gbit" else f", {link[:-4]} Gbit/s") + " | "
            + (f"{config['byte_scale']:.3f} | " if config["byte_scale"] < 1 else "1 | ")
            + _range([r["emulated_compute_ms"] for r in runs], "{:.1f}")
            + f" of {compute_ms:g} ms | " + _range(cores, "{:.0f}", " %") + ", "
            + _range(workers_cpu, "{:.0f}", " %") + " | "
            + _range([t * 1e3 for t in tf], fmt_ms, " ms") + f" | {gain('tic')} | "
            f"{gain('tac')} | {spread(base)}; {spread('tic')} | "
            f"{fmt_ms.format(step * 1e3)} ms ({lo if lo == hi else f'{lo} to {hi}'} %), "
            f"{100 * pr.row('tic').gain:+.1f} % |")
    if errors:
        out.append(f"whatif's TensorFlow step: median error {statistics.median(errors):.0f} % "
                   f"over {len(errors)} runs, at most {max(errors):.0f} %")
        close = [a for a in above if a <= 0.05]
        far = sorted(a for a in above if a > 0.05)
        out.append(f"TIC's step p95/p50 at most 0.05 above TensorFlow's in the same run: "
                   f"{len(close)} of {len(above)} cells"
                   + (f"; {far[0]:.2f}-{far[-1]:.2f} above in {len(far)}" if far else ""))
    return out


def main(paths: list[str]) -> int:
    if paths and paths[0] == "--cells":
        print("| model, W x P, link | bytes x | emulated compute | busiest core, worker CPU "
              "| TF step | TIC | TAC | step p95/p50: TF; TIC | whatif |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(cells(sorted(p for p in paths[1:] if os.path.getsize(p)))))
        return 0
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
