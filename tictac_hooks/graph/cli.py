"""`tictac order` and `tictac simulate` (`tictac analyze`, which needs TensorFlow, is in
graph/tf/cli.py)."""

from __future__ import annotations

import argparse
import json
import math

from tictac_hooks.graph.algorithms import ALGORITHMS, ALIASES, compute_order
from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.graph.simulate import simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "order", help="compute a transfer order for a graph JSON",
        description="Compute the recv order of a worker graph (the Graph JSON format: "
                    "docs/OFFLINE.md) and "
                    "print it as order JSON: {algorithm, order, priority}.")
    p.add_argument("graph", metavar="GRAPH.json", help="the worker's iteration DAG")
    p.add_argument("--algorithm", choices=[a for a in ALGORITHMS if a != "random"]
                   + list(ALIASES), default="tic",
                   help="tic (default; needs no times), tac (needs a time for every op); "
                        "for comparison tac-paper (the paper's per-recv TAC), first-use "
                        "(each parameter by its first consumer in the step, ByteScheduler's "
                        "TensorFlow plugin; 'layer' is its old name) and declared (the "
                        "model's variable-list order, BytePS, ByteScheduler's PyTorch "
                        "plugin, P3: needs the recvs' 'declared' field)")
    p.add_argument("--output", "-o", metavar="ORDER.json", help="write here instead of stdout")
    p.set_defaults(func=_order)

    p = sub.add_parser(
        "simulate", help="simulate one iteration under an order",
        description="Simulate one iteration (one compute resource, one channel per PS) and "
                    "print {makespan, upper, lower, efficiency, speedup} as JSON.")
    p.add_argument("graph", metavar="GRAPH.json", help="the worker's DAG, with a time for every op")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--order", metavar="ORDER.json",
                     help="an order file (JSON, or name<TAB>priority lines)")
    how.add_argument("--algorithm", choices=ALGORITHMS + tuple(ALIASES),
                     help="compute the order first; random = TensorFlow's default (no "
                          "schedule); 'layer' is first-use's old name")
    p.add_argument("--seed", type=_seed, default=0,
                   help="seed for random orders and tie-breaking, an integer >= 0 (default 0)")
    p.set_defaults(func=_simulate)


def _seed(text: str) -> int:
    """argparse type of --seed: numpy's generators take integers >= 0 only."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _order(args: argparse.Namespace) -> int:
    graph = Graph.load(args.graph)
    schedule = compute_order(graph, args.algorithm)
    text = json.dumps(schedule.to_json(), indent=1)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    graph = Graph.load(args.graph)
    if args.order:
        schedule: Schedule | None = Schedule.load(args.order)
    elif args.algorithm == "random":
        schedule = None
    else:
        schedule = compute_order(graph, args.algorithm, seed=args.seed)
    # allow_nan=False: the output stays JSON (no Infinity/NaN); to_json writes null.
    print(json.dumps(simulate(graph, schedule, seed=args.seed).to_json(), indent=1,
                     allow_nan=False))
    return 0


def parse_rate(text: str) -> float:
    """'1Gbit' -> bytes per second. Units: bit, Kbit, Mbit, Gbit (or bps forms), B, KB, MB, GB (SI)."""
    units = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
             "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9}
    s = text.strip().lower().removesuffix("/s")
    if s.endswith("bps"):  # 10Gbps, 100mbps: bits per second
        s = s[:-3] + "bit"
    for unit in sorted(units, key=len, reverse=True):
        if s.endswith(unit):
            number = s[: -len(unit)].strip()
            try:
                value = float(number) * units[unit]
            except ValueError:
                break
            if value > 0 and math.isfinite(value):
                return value
            break
    raise ValueError(f"bad rate {text!r}: expected e.g. 1Gbit, 100Mbit, 125MB")


def _rate_arg(text: str) -> str:
    """argparse type of --bandwidth: checked at parse time, kept as given."""
    try:
        parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
