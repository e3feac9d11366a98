"""`tictac whatif`: predicted step time and gain per order on W workers x P PSes, from a
saved profile or a built-in model's, with no TensorFlow (graph/whatif.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from tictac_hooks.graph import profile as profiles
from tictac_hooks.graph.cli import _rate_arg, parse_rate
from tictac_hooks.graph.whatif import LABELS, ORDERS, Cluster, Prediction, predict


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "whatif", help="predict TicTac's gain on W workers x P PSes before deploying",
        description="Predict each order's step time, throughput and gain over "
                    "TensorFlow's default on W workers and P PSes from one worker's "
                    "profile (a TicTac run's log_dir, `tictac analyze --model M --profile "
                    "DIR`, or a built-in model), with the link, barrier and CPU bounds. "
                    "Lists sweep: --workers 8,16,64 --ps 1,4,8. docs/WHATIF.md.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", metavar="DIR",
                        help="a directory holding tictac_profile.json.gz")
    source.add_argument("--model", metavar="NAME",
                        help="a built-in profile: " + ", ".join(profiles.builtin_names()))
    p.add_argument("--workers", required=True, type=_counts("--workers"), metavar="W[,W...]",
                   help="worker counts, each >= 1, e.g. 8,16,64")
    p.add_argument("--ps", required=True, type=_counts("--ps"), metavar="P[,P...]",
                   help="PS counts, each >= 1")
    p.add_argument("--bandwidth", required=True, type=_rate_arg,
                   help="every task's link rate, each way, e.g. 200mbit, 10gbit, 125MB")
    p.add_argument("--cpus", type=_positive, default=None,
                   help="cores the whole cluster shares (one test machine): a step is at "
                        "least W x the CPU a step costs / cores; default: every task has "
                        "its own")
    p.add_argument("--step-cpu-ms", type=_positive, default=None, metavar="MS",
                   help="with --cpus, the CPU milliseconds one worker step costs the "
                        "whole cluster (default: the profile's, else its compute)")
    p.add_argument("--compute-ms", type=_positive, default=None, metavar="MS",
                   help="the step's compute on one of your workers (its GPU), ms: the "
                        "profile's op times are scaled to it, keeping their relative "
                        "costs (default: the profile's own, measured where it was taken; "
                        "the built-ins were taken on this project's 2-core CPU machine)")
    p.add_argument("--synchronous", action="store_true",
                   help="synchronous training (every worker waits at a barrier, as the "
                        "graph-mode bench); default: asynchronous, as fit under "
                        "ParameterServerStrategy")
    p.add_argument("--json", metavar="OUT.json", help="also write every prediction as JSON")
    p.add_argument("--plot", metavar="OUT.png",
                   help="plot each order's gain against workers and against PS "
                        "(needs matplotlib: pip install -e .[bench])")
    p.set_defaults(func=_whatif)


def _counts(flag: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(
                f"{flag} takes whole numbers >= 1, comma-separated (e.g. 8,16,64), "
                f"got {text!r}")
        return values
    return parse


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def sweep(profile: profiles.Profile, workers: list[int], ps: list[int], rate: float,
          cpus: float | None = None, synchronous: bool = False) -> list[Prediction]:
    """Every (W, P) prediction, workers varying fastest."""
    return [predict(profile, Cluster(w, p, rate, cpus, synchronous))
            for p in ps for w in workers]


def table(predictions: list[Prediction]) -> str:
    """One line per (W, P): TensorFlow's step, each order's gain, the bounds."""
    orders = [o for o in ORDERS if o != "default"]
    per = "samples/s" if predictions and predictions[0].rows[0].throughput else "steps/s"
    head = (f"{'W':>4} {'P':>3} {'TF step ms':>10} {per:>10} "
            + " ".join(f"{LABELS[o]:>12}" for o in orders)
            + f" {'link ms':>8} {'barrier ms':>10} {'CPU ms':>7}")
    lines = [head]
    for pr in predictions:
        base = pr.row("default")
        lines.append(
            f"{pr.cluster.workers:>4} {pr.cluster.ps:>3} {base.step_s * 1e3:>10.1f} "
            f"{base.throughput:>10.1f} "
            + " ".join(_gain(pr, o) for o in orders)
            + f" {pr.bounds.link * 1e3:>8.1f} {pr.bounds.barrier * 1e3:>10.1f} "
              f"{pr.bounds.cpu * 1e3:>7.1f}")
    return "\n".join(lines)


def _gain(prediction: Prediction, order: str) -> str:
    if order not in prediction.orders:
        return f"{'n/a':>12}"
    return f"{prediction.row(order).gain * 100:>+11.1f}%"


def plot(predictions: list[Prediction], path: str, title: str) -> None:
    """Left: each order's gain against workers, at the largest P. Right: TIC's gain
    against PS, one line per worker count."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install -e .[bench]") from None
    top_p = max(pr.cluster.ps for pr in predictions)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    chosen = [pr for pr in predictions if pr.cluster.ps == top_p]
    for order in ORDERS[1:]:
        if all(order in pr.orders for pr in chosen):
            left.plot([pr.cluster.workers for pr in chosen],
                      [pr.row(order).gain * 100 for pr in chosen], marker="o",
                      label=LABELS[order])
    left.set_xlabel(f"workers ({top_p} PS)")
    left.set_ylabel("predicted gain over TensorFlow's default, %")
    left.legend(fontsize=8)
    for w in sorted({pr.cluster.workers for pr in predictions}):
        line = [pr for pr in predictions if pr.cluster.workers == w]
        right.plot([pr.cluster.ps for pr in line], [pr.row("tic").gain * 100 for pr in line],
                   marker="o", label=f"{w} workers")
    right.set_xlabel("PS (TIC)")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.axhline(0, color="grey", linewidth=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _whatif(args: argparse.Namespace) -> int:
    if args.profile:
        if not os.path.isdir(args.profile) and not args.profile.endswith(".json.gz"):
            raise profiles.ProfileError(f"--profile {args.profile}: no such directory")
        profile = profiles.load(args.profile)
    else:
        profile = profiles.builtin(args.model)
    if args.compute_ms is not None:
        profile = profiles.at_step(profile, args.compute_ms)
    if args.step_cpu_ms is not None:
        profile = dataclasses.replace(profile, cpu_s=args.step_cpu_ms / 1e3)
    rate = parse_rate(args.bandwidth)
    started = time.perf_counter()
    predictions = sweep(profile, args.workers, args.ps, rate, args.cpus, args.synchronous)
    seconds = time.perf_counter() - started
    mode = "synchronous" if args.synchronous else "asynchronous (fit under PSS)"
    print(f"{profile.model} ({'training' if profile.training else 'inference'}, batch "
          f"{profile.batch} per worker, compute {profile.compute_s * 1e3:.0f} ms per step"
          + (" as given" if args.compute_ms is not None else " as profiled")
          + f"), links {args.bandwidth}, {mode}"
          + (f", {args.cpus:g} cores shared" if args.cpus else "")
          + f": gain of each order over TensorFlow's default ({seconds:.1f} s)")
    print(table(predictions))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": profile.source, "model": profile.model,
                       "predictions": [pr.to_json() for pr in predictions],
                       "seconds": seconds}, f, indent=1, allow_nan=False)
    if args.plot:
        plot(predictions, args.plot, f"{profile.model}, links {args.bandwidth}, {mode}")
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0
