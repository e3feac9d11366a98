"""TicTac at 1-16 workers on 4 PS: tf_keras ``fit`` under ParameterServerStrategy with the
``TicTac()`` callback, every task in its own network namespace, each PS's link shaped
to one rate (the PS links are the bottleneck as workers are added), per model and
worker count, repeated.

Each run is one `tictac bench --frontend fit` run (bench/fit_mode.py) with TicTac's own
candidates (TIC and TAC): its order check decides, and the kept order is measured again
against TensorFlow's default in fresh interleaved blocks of the same run (the gain).
Where the check keeps TensorFlow's order the gain is 1 by construction. Per run it also
records what the issue asks to hold at scale: the share of bytes the order lists,
transfers let go out of their order (early releases), the step records read (every
dispatched step recorded, none dropped), whether the check decided, each PS's read time,
and each PS process's CPU seconds and resident memory (the whole TensorFlow PS with its
gate: the gate's own share is not separated).

    sudo .venv/bin/python benchmarks/bench_scale.py --models cnn,dlrm \\
        --workers 1,2,4,8,16 --ps 4 --rate 200mbit --runs 2

Needs root and tc (iproute2); without them it says so and exits (status 2). Writes one
JSON per run and the table (``--out``, default results/scale/).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HERE = os.path.dirname(os.path.abspath(__file__))


def row_of(result: dict) -> dict:
    """The figures of one fit-bench run that the scale table shows."""
    cfg, tictac = result["config"], result.get("tictac", {})
    records, order = tictac.get("records", {}), tictac.get("order", {})
    w = result.get("with_check", {})
    kept = w.get("kept")
    gain = w.get("ratio_median") if kept else 1.0
    steps = max(1, records.get("dispatched", 0))
    usage = result.get("ps_usage", {})
    reads = [ps.get("read_time", {}) for ps in records.get("per_ps", {}).values()]
    return {
        "model": cfg["model"], "workers": cfg["workers"], "ps": cfg["ps"],
        "kept": kept or "default", "gain": gain,
        "gain_min": w.get("ratio_min") if kept else 1.0,
        "gain_max": w.get("ratio_max") if kept else 1.0,
        "held_out_pairs": w.get("pairs", 0),
        "check_decided": result.get("check", {}).get("decision") is not None,
        "bytes_share": tictac.get("coverage", {}).get("bytes_share"),
        "early_released": order.get("early_released"),
        "followed": order.get("followed"), "scheduled_steps": order.get("scheduled_steps"),
        "dispatched": records.get("dispatched"), "worker_steps": records.get("worker_steps"),
        "dropped": records.get("dropped"), "missing": records.get("missing"),
        "read_ms_mean": max((r.get("mean_ms", 0.0) for r in reads), default=None),
        "read_ms_max": max((r.get("max_ms", 0.0) for r in reads), default=None),
        "ps_cpu_ms_per_step": (1e3 * statistics.mean(u["cpu_s"] for u in usage.values())
                               / steps) if usage else None,
        "ps_rss_mb": max((u["rss_mb"] for u in usage.values()), default=None),
        "wall_s": result.get("wall_s"),
    }


def table(rows: list[dict]) -> str:
    """One line per (model, workers): the gain's median and range over runs, and the
    scale checks over the runs (worst case)."""
    out = ["model  W   gain (kept order / TF default, held out)  kept     bytes  early "
           "records   decided  read ms (max)  PS CPU ms/step  PS RSS MB"]
    keys = sorted({(r["model"], r["workers"]) for r in rows})
    for model, workers in keys:
        rs = [r for r in rows if (r["model"], r["workers"]) == (model, workers)]
        gains = [r["gain"] for r in rs if r["gain"] is not None]
        gain = (f"{(statistics.median(gains) - 1) * 100:+6.1f} % "
                f"(runs {', '.join(f'{(g - 1) * 100:+.1f}' for g in gains)})"
                if gains else "n/a")
        recorded = sum(r["worker_steps"] or 0 for r in rs)
        dispatched = sum(r["dispatched"] or 0 for r in rs)
        out.append(
            f"{model:6} {workers:<3} {gain:42} {'/'.join(r['kept'] for r in rs):8} "
            f"{min(r['bytes_share'] or 0 for r in rs) * 100:5.1f} "
            f"{sum(r['early_released'] or 0 for r in rs):5} "
            f"{recorded}/{dispatched} ({sum(r['dropped'] or 0 for r in rs)} dropped) "
            f"{sum(r['check_decided'] for r in rs)}/{len(rs)}  "
            f"{max(r['read_ms_max'] or 0 for r in rs):8.0f}  "
            f"{statistics.median(r['ps_cpu_ms_per_step'] or 0 for r in rs):10.2f}  "
            f"{max(r['ps_rss_mb'] or 0 for r in rs):9.0f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="cnn,dlrm")
    p.add_argument("--workers", default="1,2,4,8,16")
    p.add_argument("--ps", type=int, default=4)
    p.add_argument("--rate", default="200mbit", help="each link's rate (tc)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--check-rounds", type=int, default=2)
    p.add_argument("--verify-rounds", type=int, default=2)
    p.add_argument("--check-block-steps", type=int, default=5, help="steps per worker")
    p.add_argument("--out", default=os.path.join(HERE, "results", "scale"))
    args = p.parse_args(argv)
    from tictac_hooks.bench import fit_mode
    from tictac_hooks.cluster import netns
    shaped, why = netns.available()
    if not shaped:
        print(f"bench_scale: needs shaped links ({why})", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    workers = [int(w) for w in args.workers.split(",") if w]
    rows = []
    for run in range(1, args.runs + 1):  # each run sweeps everything: runs apart in time
        for model in models:
            for w in workers:
                config = fit_mode.FitConfig(
                    model=model, workers=w, ps=args.ps, rate=args.rate, orders=("tic", "tac"),
                    rounds=args.check_rounds, verify_rounds=args.verify_rounds,
                    block_steps=args.check_block_steps)
                started = time.time()
                print(f"[scale] run {run}: {model}, {w} workers x {args.ps} PS at "
                      f"{args.rate}", file=sys.stderr, flush=True)
                try:
                    result = fit_mode.run(config, argv=sys.argv, progress=lambda m: None)
                except RuntimeError as e:
                    print(f"[scale] failed: {e}", file=sys.stderr, flush=True)
                    rows.append({"model": model, "workers": w, "ps": args.ps,
                                 "run": run, "error": str(e)})
                    continue
                path = os.path.join(args.out, f"{model}-w{w}-ps{args.ps}-r{run}.json")
                with open(path, "w") as f:
                    json.dump(result, f, indent=1)
                row = dict(row_of(result), run=run)
                rows.append(row)
                print(f"[scale] {model} W={w} run {run}: gain {row['gain']}, kept "
                      f"{row['kept']}, {time.time() - started:.0f} s", file=sys.stderr,
                      flush=True)
    ok = [r for r in rows if "error" not in r]
    text = table(ok)
    print(text)
    with open(os.path.join(args.out, "scale.json"), "w") as f:
        json.dump({"rate": args.rate, "ps": args.ps, "rows": rows, "table": text}, f, indent=1)
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
