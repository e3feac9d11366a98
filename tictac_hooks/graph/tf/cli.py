"""`tictac analyze`: a Keras application model's bounds, E and TIC/TAC gains (builds and
profiles the model, so TensorFlow is imported when it runs)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tictac_hooks.checks import arg_whole_number
from tictac_hooks.graph.cli import _rate_arg, parse_rate

DEFAULT_BATCH = 8


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze", help="analyze a Keras application model: bounds, E and gains of TIC/TAC",
        description="Build a Keras application model (random weights, nothing downloaded), "
                    "extract its worker DAG, measure compute on this CPU, derive transfer "
                    "times from bytes / bandwidth, and print U, L, S and the makespan and "
                    "efficiency E of random order, TIC and TAC.")
    p.add_argument("--model", required=True,
                   help="keras.applications name, e.g. ResNet50; with --profile also a PS "
                        "workload: dlrm, transformer, cnn or PATH.py:FUNCTION")
    p.add_argument("--training", action="store_true",
                   help="analyze a training step (forward, backward, update); default inference")
    p.add_argument("--batch-size", type=arg_whole_number(1), default=None,
                   help="batch size per worker (default 8; a PS workload's own: dlrm 256, "
                        "transformer 16, cnn 32, a model file 64)")
    p.add_argument("--image-size", type=int, default=None,
                   help="input height/width (default: small, the model's minimum or 64)")
    p.add_argument("--bandwidth", default="1Gbit", type=_rate_arg,
                   help="link rate for transfer times, e.g. 1Gbit, 100Mbit, 10Gbit, 125MB "
                        "(default 1Gbit)")
    p.add_argument("--ps", type=arg_whole_number(1), default=1,
                   help="number of PS tasks; variables are spread round-robin (default 1)")
    p.add_argument("--seeds", type=arg_whole_number(1), default=10,
                   help="random orders to simulate for the baseline (default 10)")
    p.add_argument("--json", metavar="OUT.json", help="also write the figures as JSON")
    p.add_argument("--save-graph", metavar="GRAPH.json", help="write the timed DAG as graph JSON")
    p.add_argument("--profile", metavar="DIR",
                   help="instead of the analysis, write the model's profile (DAG, time "
                        "oracle, bytes, placement) to DIR for `tictac whatif --profile DIR`")
    p.set_defaults(func=_analyze)


def _analyze(args: argparse.Namespace) -> int:
    args.batch_size = args.batch_size or DEFAULT_BATCH
    if args.profile:
        from tictac_hooks.graph.tf.model_profile import application_profile
        return write_profile(application_profile(
            args.model, args.training, args.batch_size, args.image_size), args.profile)
    from tictac_hooks.graph.tf.analyze import analyze_report  # imports TensorFlow
    report = analyze_report(model=args.model, training=args.training,
                            batch_size=args.batch_size, image_size=args.image_size,
                            bandwidth=parse_rate(args.bandwidth), num_ps=args.ps,
                            seeds=args.seeds, save_graph=args.save_graph)
    print(report.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=1, allow_nan=False)
    return 0


def write_profile(profile: Any, directory: str) -> int:
    """Saves ``profile`` and says where and what it holds."""
    path = profile.save(directory)
    print(f"{profile.model}: {len(profile.graph)} ops, {len(profile.graph.recvs)} transfers, "
          f"{sum(p.bytes for p in profile.parameters) / 1e6:.1f} MB of parameters, "
          f"{profile.compute_s * 1e3:.1f} ms of compute per step on this machine: {path}")
    return 0
