"""The orders the benchmark installs and compares, and what it knows of them.

The schedule names (TensorFlow's default, the gate with no order, TicTac's orders and
the peers', their pacing variants, the calibration blocks); the controllers that
install each order (the TicTacHook code path) and TicTac's own order check; what the
profiling phase measures for them (the settled step time, the bytes each PS served,
the traced compute and pushes); and the simulator's prediction of each order's step
(bench/predict.py). :mod:`~tictac_hooks.bench.client` runs them in rotating blocks.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tictac_hooks.records import CheckSummary

DIRECT = "none"          # TensorFlow's default: direct worker set, no rendezvous
PASSTHROUGH = "rendezvous"  # through the rendezvous, no schedule installed
# "first-use" was "layer" (BenchConfig takes the old name, and a result file may hold
# it: graph/algorithms.py ALIASES); "declared" is the model's variable-list order.
ALGORITHMS = ("tic", "tac", "random", "first-use", "declared")
SCHEDULES = (DIRECT, PASSTHROUGH) + ALGORITHMS
# On request, to compare the native gate's policies (gate.h) in one run. A plain name
# ("tic") paces as TicTac does by default (align "auto": the workers of a step one after
# the other in training, aligned in inference); "tic-aligned" aligns them, "tic-fifo"
# serves them one after the other, whatever the mode; "tic-nopace" does not pace (each
# transfer handed to gRPC when its turn comes, however many are on the wire).
ALIGNED, FIFO, NOPACE = "-aligned", "-fifo", "-nopace"
# "tic-wc": paced as "tic", with the native gate's work conservation on (gate.h): a
# ready transfer goes out of turn once the link has idled conserve_after_s.
WC = "-wc"
# "stock": the interposed set with every native gate bypassed (the `bypass 1` control
# verb): TensorFlow's own RecvTensor code in the same PS processes, workers and links,
# so a difference between "none" and "rendezvous" can be put on the gate's code or on
# the other path (the twin PS and the other worker tasks).
STOCK = "stock"
# "checked": what TicTac does by default after its switch (run/order_check.py):
# TIC and TAC each tried against TensorFlow's order in interleaved block pairs, the
# faster kept, or the schedule cleared when neither is faster. The check runs once,
# before the rotation; the blocks then measure what it decided.
CHECKED = "checked"
OPTIONAL = tuple(a + v for v in (ALIGNED, FIFO, NOPACE, WC) for a in ALGORITHMS) + (STOCK,
                                                                                  CHECKED)
# Calibration blocks, in every round's rotation beside the schedules (not schedules: no
# result row): the gate with no order over the fast profiling link, and the compute
# reference (no transfer). The simulator's compute is what they measure in the same
# rounds as the steps it predicts, so the machine's drift between the profiling phase
# and the blocks is not counted as model error (ResNet-50 inference: 270 ms profiled
# over the fast link, 310-330 ms for every schedule at comm/comp 0.25 in the same run).
FAST_LINK, NO_TRANSFER = "@fast-link", "@no-transfer"
CALIBRATION = (FAST_LINK, NO_TRANSFER)


def _algorithm(name: str) -> str:
    if name == CHECKED:
        return "tic"  # the product's default algorithm; the check also tries TAC
    return name.removesuffix(ALIGNED).removesuffix(FIFO).removesuffix(NOPACE).removesuffix(WC)


def progress(cfg: dict, message: str) -> None:
    """One line of progress on stderr (the client's stdout talks to the runner)."""
    print(f"[bench {cfg['label']}] {message}", file=sys.stderr, flush=True)


def settled_makespans(step: Any, count: int, steps: int = 15) -> list[float]:
    """Of ``steps`` steps (at least ``2 * count``), the ``count`` consecutive ones with
    the lowest median. The first steps after start-up pay for allocation and kernel
    selection (counting them made the compute time, and so comm/comp and E, about 30 %
    too high on ResNet-50 training), and the step time may stay on a plateau on the way
    down: stopping at the first window that no longer fell measured ResNet-50 training
    at 684 ms over the fast link, then 544 ms steps over a shaped one."""
    times = [step() for _ in range(max(steps, 2 * count))]
    start = min(range(len(times) - count + 1),  # the lowest window, the latest of equals
                key=lambda i: (median(times[i:i + count]), -i))
    return times[start:start + count]


def served_bytes_per_ps(records: Any, ps_addresses: list[str]) -> list[float] | None:
    """Per PS (in task order), the median over (step, worker) of the bytes it served
    that worker in that step; None when some PS recorded no step."""
    import statistics
    per_ps: dict[str, list[int]] = {}
    for rec in records:
        if rec.bytes > 0:
            per_ps.setdefault(rec.ps, []).append(rec.bytes)
    if any(a not in per_ps for a in ps_addresses):
        return None
    return [float(statistics.median(per_ps[a])) for a in ps_addresses]


def traced_oracle(graphs: dict, compute: dict, late: set, num_ps: int
                  ) -> tuple[float, list[float]]:
    """Per-worker compute seconds (median over workers) and parameter bytes per PS per
    worker (max over workers), from the profiled DAGs."""
    import statistics
    comps, per_ps = [], [0.0] * num_ps
    for graph in graphs.values():
        comps.append(sum(compute.get(op.name, 0.0) for op in graph.compute_ops))
        mine = [0.0] * num_ps
        for op in graph.recvs:
            index = int((op.channel or "ps:0").split(":")[1])
            if index < num_ps:
                mine[index] += op.bytes or 0
        per_ps = [max(a, b) for a, b in zip(per_ps, mine)]
    return statistics.median(comps), per_ps


def make_controllers(cfg: dict, names: list[str], graphs: dict, compute: dict, late: set,
                     rate_bits: float, profiled_since: float | None = None) -> dict:
    """One Controller per algorithm (the TicTacHook code path), schedule computed,
    then lifted again until its block; each reads the PSes' records of the steps run
    since ``profiled_since`` (the profiled steps, run before the controllers exist)."""
    from tictac_hooks.run.config import RunConfig
    from tictac_hooks.run.controller import Controller
    from tictac_hooks.run.settings import Settings
    out = {}
    for name in names:
        # The bench compares the orders itself; only "checked" runs TicTac's own check.
        rounds = cfg["check_rounds"] if name == CHECKED else 0
        settings = Settings(algorithm=_algorithm(name), profile_steps=1, log_dir=None,
                            skip_timeout=cfg["skip_timeout"], stats_every=1,
                            window_bytes=cfg["window_bytes"], check_rounds=rounds,
                            check_block_steps=cfg["check_block_steps"],
                            recheck_every=0)
        # The variants' service: aligned or one worker after the other, or not paced.
        controller = Controller(RunConfig.build(
            settings, cfg["ps_addresses"], bandwidth=rate_bits / 8.0,
            training=cfg["mode"] == "training", pace=not name.endswith(NOPACE),
            align=name.endswith(ALIGNED) if name.endswith((ALIGNED, FIFO)) else None))
        controller.connect(records_since=profiled_since)
        controller.switch(graphs, compute_times=compute, late=late)
        controller.suspend()
        out[name] = controller
    return out


def run_order_check(cfg: dict, r: Any, controller: Any) -> CheckSummary:
    """Runs the "checked" controller's order check (its T and D blocks, step by step
    as a frontend dispatches them) and returns what it decided, for the result."""
    controller.resume()
    t0, before = time.time(), len(controller.check_results)
    ran = 0  # the check's steps (it stops at its decision, at most total_steps)
    for _ in range(controller.check.total_steps + 1):  # the step after the last decides
        r.step(0)
        controller.step_dispatched()
        if len(controller.check_results) > before:
            break
        ran += 1
    controller.suspend()
    result = controller.check_result if len(controller.check_results) > before else None
    if result is None:
        raise RuntimeError("the order check of schedule 'checked' reached no decision")
    info = CheckSummary(decision=result.decision, kept=controller.kept_order,
                        seconds=time.time() - t0, steps=ran,
                        candidates={c: spread.median
                                    for c, spread in result.candidates.items()})
    ratios = ", ".join(f"{c.upper()} {(v - 1) * 100:+.1f} %" for c, v in
                       info.candidates.items() if v is not None)
    progress(cfg, f"order check ({info.steps} steps, {info.seconds:.0f} s): {ratios} "
                  f"vs TensorFlow's order; kept {info.kept or 'TensorFlow order'}")
    return info


def traced_pushes(cfg: dict, r: Any, graphs: dict, traced: list
            ) -> list[dict[str, tuple[str, int]]]:
    """Per interposed worker its pushes to the PSes in the traced steps (training: the
    gradients), for the simulator; says how many leave a node of the worker's DAG."""
    from tictac_hooks.graph.tf.traced import gradient_pushes
    out = []
    for worker in graphs:
        pushes, unsized = {}, 0
        for name, (ps, size) in gradient_pushes(traced, worker).items():
            size = size if size is not None else r.output_bytes(name)
            if size is None:
                unsized += 1
            else:
                pushes[name] = (ps, size)
        out.append(pushes)
        if unsized:
            progress(cfg, f"{worker}: {unsized} pushes of unknown size left out")
    if any(out):
        placed = sum(len({op.name for op in g.ops} & set(p))
                     for g, p in zip(graphs.values(), out))
        progress(cfg, f"pushes to the PSes: {sum(map(len, out))} tensors, "
                      f"{sum(b for p in out for _, b in p.values()) / 2**20:.1f} MiB over "
                      f"the workers; {placed} leave a node of their worker's DAG, the rest "
                      f"at the end of its compute")
    return out


def predict_orders(cfg: dict, names: list[str], controllers: dict, compute: dict,
                   comp: float, rate_bits: float, served: dict[str, float],
                   pushes: list[dict[str, tuple[str, int]]] | None = None,
                   reference_s: float | None = None,
                   transfer_bytes: dict[str, float] | None = None
                   ) -> tuple[dict[str, dict[str, float]], dict | None]:
    """The simulator's step seconds per model of the untraced compute (bench/predict.py)
    and schedule, and its inputs (saved beside the result, for a re-prediction);
    TensorFlow's order (with and without the rendezvous) is the same DAGs with no order
    installed."""
    from tictac_hooks.bench.predict import CPU, MODELS, inputs_to_json, predictions
    if not controllers:
        return {}, None
    orders = {n: c.orders() for n, c in controllers.items()
              if c.schedule is not None and n != CHECKED}
    dags = next(iter(orders.values()), None) or controllers[CHECKED].orders()
    if CHECKED in controllers:  # the order its check kept, or TensorFlow's
        kept = controllers[CHECKED].kept_order
        orders[CHECKED] = controllers[CHECKED].orders(kept) if kept else \
            [(g, None) for g, _ in dags]
    for name in names:
        if name in (DIRECT, PASSTHROUGH, STOCK):
            orders[name] = [(g, None) for g, _ in dags]
    # the pacing each order runs with (TicTac's default: staggered in training)
    align = {n: n.endswith(ALIGNED) or (not n.endswith(FIFO) and cfg["mode"] != "training")
             for n in orders}
    t0 = time.perf_counter()
    out = {model: predictions(orders, compute, comp, rate_bits, len(cfg["interposed_tasks"]),
                              cfg["ps"], model=model, served=served,
                              transfer_bytes=transfer_bytes,
                              pushes=pushes if pushes and any(pushes) else None,
                              align=align, reference_s=reference_s)
           for model in MODELS if reference_s or not model.startswith(CPU)}
    for model, steps in out.items():
        progress(cfg, f"simulated step ms ({model} compute): "
                 + ", ".join(f"{n} {s * 1e3:.0f}" for n, s in steps.items()))
    progress(cfg, f"simulated in {time.perf_counter() - t0:.1f} s")
    inputs = inputs_to_json(orders, compute, comp, rate_bits, len(cfg["interposed_tasks"]),
                            cfg["ps"], served, pushes if pushes and any(pushes) else None,
                            align, reference_s, transfer_bytes)
    return out, inputs


def median(xs: list[float]) -> float:
    import statistics
    return statistics.median(xs) if xs else float("nan")

