"""How long TIC and TAC take as the graph grows.

    .venv/bin/python benchmarks/bench_scheduling.py [--repeat 3]

Prints one row per size: recvs, ops, dependency classes, TIC, TAC and the paper's
per-recv TAC ("TACp") seconds (best of --repeat) and the simulated efficiency of each order: E against the paper's L, E*
against the dependency-aware bound L*. Targets: ResNet-152 training size
(~360 recvs, ~9,000 ops): TAC < 1 s, TIC < 0.2 s. The paper's analyzer took ~10 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from synthetic import resnet_like_training  # noqa: E402
from tictac_hooks.graph.algorithms import tac, tac_paper, tic  # noqa: E402
from tictac_hooks.graph.properties import DependencyClasses  # noqa: E402
from tictac_hooks.graph.simulate import simulate  # noqa: E402


def best_of(repeat, fn, *args):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", default="45,90,180,360,720",
                        help="synthetic ResNet-shaped training graphs, one recv per layer")
    parser.add_argument("--models", default="",
                        help="also real keras.applications training graphs, e.g. ResNet152 "
                             "(compute measured on this CPU, transfers at 1 Gbit/s)")
    args = parser.parse_args()
    graphs = [(f"synthetic-{n}", lambda n=n: resnet_like_training(n))
              for n in (int(x) for x in args.layers.split(",") if x)]
    for name in (m for m in args.models.split(",") if m):
        def real(name=name):
            from tictac_hooks.graph.tf.analyze import analyzed_graph
            return analyzed_graph(name, training=True, batch_size=4,
                                  bandwidth_bytes_per_s=125e6, progress=False)
        graphs.append((name, real))
    print(f"{'graph':<15} {'recvs':>6} {'ops':>7} {'classes':>8} {'TIC s':>8} {'TAC s':>8} "
          f"{'TACp s':>8} {'E tic':>6} {'E tac':>6} {'E tacp':>6} {'E rand':>6} {'E* tic':>6} "
          f"{'E* tac':>6} {'E* tacp':>7}")
    for label, build in graphs:
        g = build()
        k = DependencyClasses.of(g).member.shape[0]
        t_tic, s_tic = best_of(args.repeat, tic, g)
        t_tac, s_tac = best_of(args.repeat, tac, g)
        t_tacp, s_tacp = best_of(args.repeat, tac_paper, g)
        runs = [simulate(g, s) for s in (s_tic, s_tac, s_tacp)]
        e_rand = sum(simulate(g, None, seed=i).efficiency for i in range(5)) / 5
        print(f"{label:<15} {len(g.recvs):>6} {len(g):>7} {k:>8} {t_tic:>8.3f} {t_tac:>8.3f} "
              f"{t_tacp:>8.3f} {runs[0].efficiency:>6.3f} {runs[1].efficiency:>6.3f} "
              f"{runs[2].efficiency:>6.3f} {e_rand:>6.3f} "
              f"{runs[0].dependency_efficiency:>6.3f} {runs[1].dependency_efficiency:>6.3f} "
              f"{runs[2].dependency_efficiency:>7.3f}",
              flush=True)


if __name__ == "__main__":
    main()
