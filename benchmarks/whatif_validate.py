"""`tictac whatif` against the measured scale runs: the predicted step time and gain of
each order beside the measured ones at 1-16 workers on 4 PS (benchmarks/bench_scale.py,
results/scale/), for the built-in profiles of the models measured there.

The prediction gets what the measured cluster had: 4 PS, every link at the run's rate,
every task on this machine's cores (``--cpus``, default 2), and the CPU one worker step
costs the cluster (the PSes' and the worker's CPU over the steps, set-up included),
measured apart from the validated runs in a 1-worker run of the same bench that
records every task's CPU seconds (results/whatif/calibration/)::

    .venv/bin/python benchmarks/bench_scale.py --models cnn,dlrm --workers 1 --runs 1 \\
        --out benchmarks/results/whatif/calibration
    .venv/bin/python benchmarks/bench_scale.py --models dlrm --workers 1 --runs 1 \\
        --check-block-steps 15 --out benchmarks/results/whatif/calibration/long

The step times are the median over a run's workers of each worker's median step in its
order's check blocks; the gain is the check's median paired ratio. Orders the scale
runs did not measure (paced random, declared, first-use) are predicted only.

    .venv/bin/python benchmarks/whatif_validate.py            # the table, Markdown
    .venv/bin/python benchmarks/whatif_validate.py --json benchmarks/results/whatif/validation.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tictac_hooks.records.files import json_paths, load_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ORDERS = ("default", "random", "declared", "first-use", "tic", "tac")


def cpu_per_step(path: str) -> float:
    """CPU seconds per worker step of a 1-worker fit-bench run: its PSes' and worker's
    CPU over its steps, set-up included. The coordinator's is left out: mostly set-up
    (imports, the model, tracing, the compute profile): a dlrm run with 21 % more steps
    cost it less (results/whatif/calibration/long/). The median over the runs found."""
    run = load_json(path)
    if not run.get("worker_usage"):
        raise SystemExit(f"{path}: no worker_usage recorded; rerun the calibration "
                         "(see the module docstring)")
    cpu = sum(u["cpu_s"] for u in run["ps_usage"].values())
    cpu += sum(u["cpu_s"] for k, u in run["worker_usage"].items() if k != "coordinator")
    return cpu / run["tictac"]["records"]["dispatched"]


def measured(path: str) -> dict[str, dict[str, float]]:
    """order -> {step_s, gain} of one fit-bench run."""
    orders = load_json(path)["orders"]
    out = {}
    for name in ORDERS:
        o = orders.get(name)
        if not o:
            continue
        steps = [w["median_step_time_s"] for w in o["workers"].values()]
        out[name] = {"step_s": statistics.median(steps),
                     "gain": o["ratio_median"] - 1.0 if "ratio_median" in o else 0.0}
    return out


def validate(models: list[str], cpus: float, sources: dict[str, str],
             calibration_dir: str) -> list[dict]:
    """Every measured (model, W, order) of the runs ``sources`` names (label -> a glob
    with ``{model}``) beside its prediction."""
    from tictac_hooks.graph import profile as profiles
    from tictac_hooks.graph.cli import parse_rate
    from tictac_hooks.graph.whatif import Cluster, predict
    rows = []
    for model in models:
        calibration = json_paths(os.path.join(calibration_dir, "**", f"{model}-w1-*.json"),
                                 recursive=True)
        if not calibration:
            raise SystemExit(f"{model}: no calibration run in {calibration_dir}")
        cpu_s = statistics.median(cpu_per_step(p) for p in calibration)
        profile = dataclasses.replace(profiles.builtin(model), cpu_s=cpu_s)
        for source, pattern in sources.items():
            by_point: dict[tuple[int, int, str], list[dict]] = {}
            for path in json_paths(pattern.format(model=model)):
                cfg = load_json(path)["config"]
                by_point.setdefault((cfg["workers"], cfg["ps"], cfg["rate"]),
                                    []).append(measured(path))
            for (w, ps, rate), found in sorted(by_point.items()):
                pred = predict(profile, Cluster(w, ps, parse_rate(rate), cpus))
                for order in ORDERS:
                    seen = [m[order] for m in found if order in m]
                    if not seen:
                        continue
                    steps = [x["step_s"] for x in seen]
                    row = pred.row(order)
                    rows.append({
                        "source": source, "model": model, "workers": w, "ps": ps,
                        "rate": rate, "order": order, "cpu_s": cpu_s,
                        "measured_step_s": steps, "predicted_step_s": row.step_s,
                        "error": row.step_s / statistics.median(steps) - 1.0,
                        "measured_gain": ([x["gain"] for x in seen]
                                          if order != "default" else None),
                        "predicted_gain": row.gain if order != "default" else None,
                        "bounds_s": dataclasses.asdict(pred.bounds)})
    return rows


def _step(r: dict) -> str:
    return (f"{'-'.join(f'{x * 1e3:.0f}' for x in sorted(r['measured_step_s']))}, "
            f"{r['predicted_step_s'] * 1e3:.0f} ({r['error'] * 100:+.0f} %)")


def _gain(r: dict) -> str:
    return (f"{', '.join(f'{g * 100:+.1f}' for g in r['measured_gain'])}; "
            f"{r['predicted_gain'] * 100:+.1f} %")


def markdown(rows: list[dict], source: str) -> str:
    """One line per (model, W) of ``source``. The scale runs (TIC and TAC measured):
    each order's step, measured (the runs) against predicted with the error, then each
    gain, measured against predicted. The runs of every order: TensorFlow's step, then
    each order's gain, measured against predicted, and the median step error."""
    rows = [r for r in rows if r["source"] == source]
    orders = [o for o in ORDERS if any(r["order"] == o for r in rows)]
    if orders == ["default", "tic", "tac"]:
        out = ["| model, W | TF default ms: measured, predicted (error) | TIC | TAC | "
               "gain TIC: measured; predicted | gain TAC |", "|---|---|---|---|---|---|"]
    else:
        out = ["| model, W | TF default ms: measured, predicted (error) | "
               + " | ".join(f"gain {o}: measured; predicted" for o in orders[1:])
               + " | step error, median |", "|---|" + "---|" * len(orders) + "---|"]
    for model, w in sorted({(r["model"], r["workers"]) for r in rows}):
        by = {r["order"]: r for r in rows if (r["model"], r["workers"]) == (model, w)}
        if orders == ["default", "tic", "tac"]:
            cells = [_step(by[o]) for o in orders] + [_gain(by[o]) for o in orders[1:]]
        else:
            middle = statistics.median(abs(r["error"]) for r in by.values())
            cells = ([_step(by["default"])] + [_gain(by[o]) for o in orders[1:]]
                     + [f"{middle * 100:.0f} %"])
        out.append(f"| {model}, {w} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="cnn,dlrm")
    p.add_argument("--cpus", type=float, default=2.0, help="cores the measured cluster shared")
    p.add_argument("--scale", default=os.path.join(HERE, "results", "scale"))
    p.add_argument("--orders", default=os.path.join(HERE, "results", "whatif", "orders"),
                   help="runs of every order (tictac bench --frontend fit --json)")
    p.add_argument("--calibration", default=os.path.join(HERE, "results", "whatif", "calibration"))
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)
    sources = {"scale": os.path.join(args.scale, "{model}-w*-ps*-r*.json"),
               "orders": os.path.join(args.orders, "{model}-w*-ps*.json")}
    rows = validate([m for m in args.models.split(",") if m], args.cpus, sources,
                    args.calibration)
    for source in sources:
        if any(r["source"] == source for r in rows):
            print(markdown(rows, source) + "\n")
    errors = [abs(r["error"]) for r in rows]
    print(f"|error| of the steps: median {statistics.median(errors) * 100:.0f} %, max "
          f"{max(errors) * 100:.0f} %, over 15 %: {sum(e > 0.15 for e in errors)} of "
          f"{len(errors)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "cpus": args.cpus}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
