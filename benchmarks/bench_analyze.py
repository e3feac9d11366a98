"""`tictac analyze` over the Keras application models: E and simulated gain of TIC and TAC.

    .venv/bin/python benchmarks/bench_analyze.py [--bandwidth 1Gbit] [--batch-size 8]

Builds each Keras application model (random weights), extracts its DAG, measures
compute on this CPU, times transfers at the given link rate, and prints one Markdown
row per (model, mode): U, L, L*, S, then E / E* / gain over the mean random order for
TIC and TAC, and TAC's run time.
"""

from __future__ import annotations

import argparse
import math

from tictac_hooks.graph.cli import parse_rate
from tictac_hooks.graph.tf.analyze import analyze_report

MODELS = ("ResNet50", "InceptionV3", "VGG16", "MobileNetV2")


def fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bandwidth", default="1Gbit")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    print("| model | mode | ops | recvs | MiB | U ms | L ms | L* ms | S | random E | "
          "TIC E | TIC E* | TIC gain | TAC E | TAC E* | TAC gain | TAC s |")
    print("|" + "---|" * 17)
    for model in args.models.split(","):
        for training in (False, True):
            r = analyze_report(model, training, args.batch_size, None,
                               parse_rate(args.bandwidth), seeds=args.seeds, progress=False)
            rows = {row.name: row for row in r.rows}
            rand, tic, tac = rows["random (mean)"], rows["TIC"], rows["TAC"]
            b, s = r.bounds, r.summary
            print(f"| {model} | {'training' if training else 'inference'} | {s['ops']} | "
                  f"{s['recvs']} | {(s['param_bytes'] or 0) / 2**20:.1f} | "
                  f"{b.upper * 1e3:.0f} | {b.lower * 1e3:.0f} | {b.dependency_lower * 1e3:.0f} | "
                  f"{b.speedup:.3f} | {fmt(rand.efficiency)} | "
                  f"{fmt(tic.efficiency)} | {fmt(tic.dependency_efficiency)} | "
                  f"{r.gain(tic) * 100:+.1f}% | {fmt(tac.efficiency)} | "
                  f"{fmt(tac.dependency_efficiency)} | {r.gain(tac) * 100:+.1f}% | "
                  f"{tac.seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
