"""How far apart are first-use order (formerly "layer") and the DAG orders, and how much
could any order gain?

Why do TIC and TAC do no better than first-use (then "layer") order? For
each model and mode this builds the worker DAG (`tictac analyze`'s path: a
keras.applications model with random weights, its traced step, compute times profiled
on this CPU), sets the link so that the step's wire time is R x its compute (R in
--ratios), and reports, in the simulator (graph/simulate.py, Eq. 1-3's model of one
iteration):

- how alike the orders are: of the transfer pairs TIC orders (its priorities differ;
  TIC leaves tie groups unordered), the share first-use order puts the same way round;
- the simulated step under TIC, TAC, the paper's per-recv TAC, first-use order and
  declared order (the model's variable list), and under the best order a local
  search found (insertion moves from the best of them, accepted when the
  simulated step shrinks): the most the model says an order could gain over first-use;
- L* (simulate.dependency_lower_bound): no order beats it.

    .venv/bin/python benchmarks/probe_layer_vs_dag.py            # about 6 minutes
    .venv/bin/python benchmarks/probe_layer_vs_dag.py --keras keras3 --models ResNet50
    .venv/bin/python benchmarks/probe_layer_vs_dag.py \\
        --models dlrm,transformer,examples/my_model.py:make

--models takes keras.applications names and, as `tictac bench --model` does, the
built-in PS workloads (`dlrm`, `transformer`, bench/models.py) and a model file as
PATH.py:FUNCTION (bench/user_model.py): FUNCTION(batch_size) returns (model, inputs,
targets), tf_keras only; the step is traced and profiled on that batch
(graph/tf/analyze.analyzed_model), each embedding lookup's recv sized by the gather's
traced output ([batch, ..., dim] x 4 bytes). Their batch is the fit bench's (dlrm 256,
transformer 16, a file's 64) unless --batch-size says otherwise; inference is their
predict step (the fit bench itself trains only).

tf_keras (the default here) is what `tictac bench` and TF's PS training use; Keras 3
traces its step differently (batch normalization precomputes its scale from two
parameters, an op TIC's Eq. 5 counts as progress).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tictac_hooks.graph.algorithms import compute_order  # noqa: E402
from tictac_hooks.graph.dag import RECV  # noqa: E402
from tictac_hooks.graph.schedule import Schedule  # noqa: E402
from tictac_hooks.graph.simulate import dependency_lower_bound, simulate  # noqa: E402
from tictac_hooks.bench.runner import provenance  # noqa: E402

# the orders simulated, in the table's column order
ALGORITHMS = ("tic", "tac", "tac-paper", "first-use", "declared")


def agreement(a: Schedule, b: Schedule) -> tuple[float, int]:
    """Of the transfer pairs ``a`` orders strictly (different priorities), the share
    ``b`` puts the same way round (ties in ``b`` count half); and a's tie groups."""
    names = list(a.order)
    pa = np.array([a.priority[n] for n in names])
    pb = np.array([b.priority[n] for n in names])
    da, db = np.sign(pa[:, None] - pa[None, :]), np.sign(pb[:, None] - pb[None, :])
    strict = da != 0
    same = ((da == db) & strict).sum() + 0.5 * ((db == 0) & strict).sum()
    return float(same / strict.sum()) if strict.any() else 1.0, len(set(pa.tolist()))


def with_ratio(graph, ratio: float):
    """The same DAG with every transfer time scaled so that wire time = ratio x compute
    (one channel: the transfers' times add up on it)."""
    compute = sum(op.time for op in graph.compute_ops)
    comm = sum(op.time for op in graph.recvs)
    k = ratio * compute / comm
    return graph.with_times({op.name: op.time * (k if op.kind == RECV else 1.0)
                             for op in graph.ops})


def local_search(graph, start: list[str], evals: int, seed: int = 0
                 ) -> tuple[list[str], float]:
    """First-improvement insertion search over orders, the simulated makespan as the
    objective; moves a transfer 1..n/8 positions earlier or later."""
    rng = random.Random(seed)
    order = list(start)
    best = simulate(graph, Schedule.from_order("search", order)).makespan
    n, span = len(order), max(1, len(order) // 8)
    for _ in range(evals):
        i = rng.randrange(n)
        j = min(n - 1, max(0, i + rng.choice((-1, 1)) * rng.randint(1, span)))
        if i == j:
            continue
        cand = order[:]
        cand.insert(j, cand.pop(i))
        m = simulate(graph, Schedule.from_order("search", cand)).makespan
        if m < best:
            order, best = cand, m
    return order, best


APPLICATION_BATCH = 8


def batch_for(model: str, batch_size: int | None) -> int:
    """--batch-size, else 8 for a keras.applications model and the fit bench's default
    for a `tictac bench --model` workload."""
    from tictac_hooks.bench import workloads
    from tictac_hooks.bench.user_model import is_model_spec
    if batch_size is not None:
        return batch_size
    if not is_model_spec(model):
        return APPLICATION_BATCH
    return workloads.default_batch(model, "training")


def base_graph(model: str, source, training: bool, batch_size: int):
    """The timed DAG (1 GB/s link) of a keras.applications name, or of a workload
    `tictac bench --model` takes (``source``: its resolved builder, a built-in or
    PATH.py:FUNCTION; None for a keras.applications name), loaded as the bench loads it
    (bench/user_model.py: UserModelError says what is wrong)."""
    from tictac_hooks.bench.user_model import load
    from tictac_hooks.graph.tf.analyze import analyzed_graph, analyzed_model
    if source is None:
        return analyzed_graph(model, training=training, batch_size=batch_size,
                              bandwidth_bytes_per_s=1e9, progress=False)
    loaded = load(source, batch_size)
    return analyzed_model(loaded.model, (loaded.inputs, loaded.targets), training=training,
                          bandwidth_bytes_per_s=1e9, progress=False)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="ResNet50,InceptionV3,MobileNetV2")
    p.add_argument("--modes", default="inference,training")
    p.add_argument("--ratios", default="0.5,1,2")
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: 8, or the fit bench's batch for its workloads")
    p.add_argument("--search-evals", type=int, default=400)
    p.add_argument("--keras", choices=("tf_keras", "keras3"), default="tf_keras")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    models = a.models.split(",")
    from tictac_hooks.bench.user_model import UserModelError, is_model_spec, resolve
    if a.keras == "keras3" and any(is_model_spec(m) for m in models):
        p.error("--keras keras3: the PS workloads and PATH.py:FUNCTION models are tf_keras "
                "models (as `tictac bench --model` takes them)")
    try:  # a missing file or function is said before any model is traced
        sources = {m: resolve(m) if is_model_spec(m) else None for m in models}
    except UserModelError as e:
        p.error(str(e))
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if a.keras == "tf_keras" else "0"
    rows = []
    print("| model | mode | recvs | TIC tie groups | TIC's pairs first-use keeps | comm/comp "
          "| TIC | TAC | TAC (paper) | first-use | declared | best found | L* | first-use over "
          "best DAG | declared over best DAG | best found over first-use "
          "| L* over first-use |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        batch = batch_for(model, a.batch_size)
        for mode in a.modes.split(","):
            base = base_graph(model, sources[model], mode == "training", batch)
            for ratio in (float(r) for r in a.ratios.split(",")):
                g = with_ratio(base, ratio)
                orders = {alg: compute_order(g, alg) for alg in ALGORITHMS}
                sim = {alg: simulate(g, s).makespan for alg, s in orders.items()}
                t0 = time.perf_counter()
                first = min(sim, key=sim.get)
                found, found_m = local_search(g, list(orders[first].order), a.search_evals)
                lstar = dependency_lower_bound(g)
                agree, groups = agreement(orders["tic"], orders["first-use"])
                row = {"model": model, "mode": mode, "batch": batch, "recvs": len(g.recvs),
                       "ratio": ratio,
                       "tic_tie_groups": groups, "tic_pairs_first_use_keeps": agree,
                       "sim_s": sim, "best_found_s": found_m, "lower_dependency_s": lstar,
                       "search_s": time.perf_counter() - t0}
                rows.append(row)
                best_dag = min(sim["tic"], sim["tac"])
                print(f"| {model} | {mode} | {row['recvs']} | {groups} | {agree:.1%} | "
                      f"{ratio:g} | "
                      + " | ".join(f"{sim[k] * 1e3:.1f}" for k in ALGORITHMS)
                      + f" | {found_m * 1e3:.1f} | {lstar * 1e3:.1f} | "
                      f"{(sim['first-use'] / best_dag - 1) * 100:+.1f} % | "
                      f"{(sim['declared'] / best_dag - 1) * 100:+.1f} % | "
                      f"{(sim['first-use'] / found_m - 1) * 100:+.1f} % | "
                      f"{(sim['first-use'] / lstar - 1) * 100:+.1f} % |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
