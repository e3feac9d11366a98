"""The simulator's prediction of a benchmark step, per order, beside the measured one.

The simulator (graph/simulate.py) gets the benchmark's own inputs: each worker's traced
DAG as the controller restricted it (the recvs the PSes served), the traced compute time
of each op, and each recv's bytes over its share of the shaped link. A PS's egress link
carries the pulls of all W workers at once and a worker's ingress carries its pulls from
all P PSes, so a (worker, PS) channel gets rate / max(W, P) (the fair share while every
channel is busy, which is when the order matters).

Compute is what the trace sees per op, scaled so that the ops sum to the step's
measured compute (the step time with the fast profiling link, which also holds the
session's overhead and fused or renamed ops the trace misses): the simulator then puts
that time where the trace says the work is. In training each gradient push (worker to
PS, the tensors the PS pulled from the worker in the trace, with their sizes) leaves when
the node sending it finishes, and the step ends when the last push of every channel has
crossed (:func:`pushed_makespan`); the PS's update is not in the model.

A benchmark step runs all W towers and ends with the slowest, so its prediction is the
mean over ``seeds`` tie-breaks of the largest makespan over the workers. An installed
order is served one transfer after the other. TensorFlow's own order has two models,
and the report keeps the one that fits: SHARED, every transfer sent at once and the
link shared among the unfinished ones (gRPC interleaving concurrent HTTP/2 streams
frame by frame), and SERIAL, the transfers back to back in a random order, a new one
per seed (each response written out whole once its turn comes). Under SHARED the small
tensors finish first whatever the order, which on VGG-16 (small convolutions first,
the large dense layers last) is nearly TicTac's order; the measured default was 37 %
slower than TicTac there.

The "-joint" models simulate the W workers of a step together instead (:func:`joint`):
each on its own processor, sharing each PS's link in both directions, an installed
order served as the pacing gate serves it. Only they see why serving the workers one
after the other pays in training (the first pushes while the next still pulls). For tens
to hundreds of workers, `tictac whatif` (graph/whatif.py) simulates one worker against
the others' load instead of W copies.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import statistics
from typing import Mapping, Sequence

from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.graph.simulate import SERIAL, SHARED, SimResult, simulate

# worker -> PS transfers of one worker's step: sending node -> (PS channel, seconds)
Pushes = Mapping[str, tuple[str, float]]

SEEDS = 8


def timed(graph: Graph, compute: Mapping[str, float], compute_scale: float,
          channel_bytes_per_s: float, served: Mapping[str, float] | None = None,
          transfer_bytes: Mapping[str, float] | None = None) -> Graph:
    """``graph`` with the benchmark's time oracle: traced op times x ``compute_scale``,
    recv bytes / ``channel_bytes_per_s`` (a recv of unknown size: no time).
    ``transfer_bytes`` (recv name -> bytes the PS served it with) times each recv it
    names by those bytes: the trace gives both edges of a tensor sent over two edges its
    full size, but the PS serves the tensor over one and 21 bytes over the other (the
    copy that only feeds the gradient's ShapeN; ResNet-50 training: 188.3 MB traced per
    worker, 94.4 MB served). ``served`` (channel -> bytes the PS really served a worker per step)
    rescales the traced sizes of the other recvs of a channel to what is left of it."""
    if channel_bytes_per_s <= 0:
        raise ValueError(f"channel rate must be > 0 bytes/s, got {channel_bytes_per_s}")
    known = transfer_bytes or {}
    traced: dict[str, float] = {}
    measured: dict[str, float] = {}
    for op in graph.recvs:
        if op.name in known:
            measured[op.channel] = measured.get(op.channel, 0.0) + known[op.name]
        else:
            traced[op.channel] = traced.get(op.channel, 0.0) + (op.bytes or 0)
    scale = {c: max(0.0, served[c] - measured.get(c, 0.0)) / t
             if served and c in served and t > 0 else 1.0 for c, t in traced.items()}
    times = {op.name: compute.get(op.name, 0.0) * compute_scale for op in graph.compute_ops}
    times.update({op.name: (known[op.name] if op.name in known
                            else (op.bytes or 0) * scale[op.channel]) / channel_bytes_per_s
                  for op in graph.recvs})
    return graph.with_times(times)


def pushed_makespan(result: SimResult, pushes: Pushes) -> float:
    """The step's end with its pushes: each leaves when its sending node finishes (the
    end of the compute for a node the DAG does not hold), one channel carries them one
    after the other, and the step ends when the last has crossed. Any work-conserving
    sharing of a channel ends its last push at that same time, so TensorFlow's order of
    the pushes needs no model."""
    per_channel: dict[str, list[tuple[float, float]]] = {}
    for name, (channel, seconds) in pushes.items():
        per_channel.setdefault(channel, []).append(
            (result.finish.get(name, result.makespan), seconds))
    end = result.makespan
    for items in per_channel.values():
        clock = 0.0
        for ready, seconds in sorted(items):
            clock = max(clock, ready) + seconds
        end = max(end, clock)
    return end


def predicted_step(parts: Sequence[tuple[Graph, Schedule | None]], seeds: int = SEEDS,
                   default: str = SHARED, pushes: Sequence[Pushes] | None = None) -> float:
    """Mean over tie-break seeds of the slowest worker's simulated step; ``parts``: per
    worker its timed DAG and the order its PSes enforce (None: TensorFlow's, as
    ``default`` models it); ``pushes``: per worker, its pushes (see
    :func:`pushed_makespan`), or None for a step with none."""
    if not parts:
        raise ValueError("no worker DAG to simulate")
    if pushes is not None and len(pushes) != len(parts):
        raise ValueError(f"pushes for {len(pushes)} workers, DAGs for {len(parts)}")
    return statistics.fmean(
        max(pushed_makespan(simulate(graph, schedule, seed=seed, default=default),
                            pushes[k] if pushes is not None else {})
            for k, (graph, schedule) in enumerate(parts))
        for seed in range(seeds))


def assign_pushes(graphs: Sequence[Graph], per_worker: Sequence[Mapping[str, tuple[str, int]]]
                  ) -> list[Mapping[str, tuple[str, int]]]:
    """Per DAG, the pushes (sending node -> (PS channel, bytes)) of its worker: the
    worker whose pushes leave most of their nodes in that DAG (in order where none do)."""
    if len(per_worker) != len(graphs):
        raise ValueError(f"pushes of {len(per_worker)} workers for {len(graphs)} DAGs")
    out = []
    for k, g in enumerate(graphs):
        names = {op.name for op in g.ops}
        overlap = [len(names & set(p)) for p in per_worker]
        best = max(range(len(per_worker)), key=lambda i: (overlap[i], i == k))
        out.append(per_worker[best] if overlap[best] else per_worker[k])
    return out


def joint(parts: Sequence[tuple[Graph, Schedule | None]], align: bool
          ) -> tuple[Graph, Schedule | None, dict[str, str]]:
    """The W workers of one step as one DAG: worker k's ops renamed ``w<k>/<name>``,
    each worker computing on its own processor, every worker's recvs from one PS on
    that PS's one channel. An installed order is served as the pacing gate serves it:
    ``align`` each worker's k-th transfer before any worker's (k+1)-th, else worker 0's
    whole order, then worker 1's (the staggered service of training). With no order
    (TensorFlow's), every worker's transfers share the channel's random order."""
    ops, resources = [], {}
    priority: dict[str, int] = {}
    width = max(len(g.ops) for g, _ in parts)
    for k, (g, schedule) in enumerate(parts):
        def name(n: str, k: int = k) -> str:
            return f"w{k}/{n}"
        for op in g.ops:
            ops.append(dataclasses.replace(op, name=name(op.name),
                                           inputs=tuple(map(name, op.inputs))))
            if not op.is_recv:
                resources[name(op.name)] = f"w{k}"
        if schedule is not None:
            for n, p in schedule.priority.items():
                priority[name(n)] = p * len(parts) + k if align else k * width + p
    order = sorted(priority, key=priority.__getitem__)
    combined = Schedule.from_order("joint", order) if order else None
    return Graph(ops), combined, resources


def joint_step(parts: Sequence[tuple[Graph, Schedule | None]], pushes: Sequence[Pushes] | None,
               align: bool, seeds: int = SEEDS, default: str = SERIAL) -> float:
    """Mean over seeds of the step of all workers simulated together (:func:`joint`),
    their pushes sharing each PS's ingress; ``parts`` timed at the full link rate."""
    graph, schedule, resources = joint(parts, align)
    merged = {f"w{k}/{n}": v for k, p in enumerate(pushes or ()) for n, v in p.items()}
    return statistics.fmean(
        pushed_makespan(simulate(graph, schedule, seed=seed, default=default,
                                 resources=resources), merged)
        for seed in range(seeds))


def with_transfer_cpu(graph: Graph, pushes: Pushes | None, rate: float,
                      seconds_per_byte: float) -> tuple[Graph, Pushes | None]:
    """The CPU model's DAG: each recv r is followed by a compute op ``r/cpu`` of
    ``seconds_per_byte`` x its bytes (r's time x ``rate``) that r's consumers wait for,
    and each push leaves after a compute op ``<node>/send_cpu`` of its bytes. On the
    worker's processor these run FIFO with the rest, as the data arrives or leaves: at a
    fast link they add up with the compute, at a slow one they fill its idle time."""
    pushes = dict(pushes) if pushes is not None else None
    cpu = {op.name: f"{op.name}/cpu" for op in graph.recvs}
    ops = []
    for op in graph.ops:
        ops.append(dataclasses.replace(op, inputs=tuple(cpu.get(n, n) for n in op.inputs)))
        if op.is_recv:
            ops.append(Op(cpu[op.name], "compute", (op.name,),
                          time=seconds_per_byte * (op.time or 0.0) * rate))
    if pushes:
        present = {op.name for op in graph.ops}
        for node, (channel, seconds) in list(pushes.items()):
            if node in present:
                sender = f"{node}/send_cpu"
                ops.append(Op(sender, "compute", (node,),
                              time=seconds_per_byte * seconds * rate))
                del pushes[node]
                pushes[sender] = (channel, seconds)
    return Graph(ops), pushes


SCALED, OVERHEAD = "scaled", "overhead"  # where the step's untraced compute goes
# CPU: the ops scaled to the compute reference (no transfer), and the rest of the step
# over the fast link (the transfers' CPU: serialization, copies, gRPC) spread over the
# bytes each worker pulls and pushes (with_transfer_cpu).
CPU = "cpu"
# A model: where the untraced compute goes, and "-serial" where TensorFlow's order is
# modelled SERIAL (no suffix: SHARED).
# "-joint": all workers of a step simulated together on the full PS links (joint_step),
# TensorFlow's order SERIAL.
JOINT = "joint"
MODELS = (SCALED, OVERHEAD, SCALED + "-" + SERIAL, OVERHEAD + "-" + SERIAL,
          SCALED + "-" + JOINT, OVERHEAD + "-" + JOINT, CPU, CPU + "-" + JOINT)


def predictions(orders: Mapping[str, Sequence[tuple[Graph, Schedule | None]]],
                compute: Mapping[str, float], compute_s: float, rate_bits: float,
                workers: int, ps: int, seeds: int = SEEDS,
                model: str = SCALED,
                served: Mapping[str, float] | None = None,
                transfer_bytes: Mapping[str, float] | None = None,
                pushes: Sequence[Mapping[str, tuple[str, int]]] | None = None,
                align: bool | Mapping[str, bool] = True,
                reference_s: float | None = None) -> dict[str, float]:
    """Predicted step seconds per order name. ``orders``: name -> per worker (DAG as
    scheduled, order; None for TensorFlow's); ``compute_s``: the measured compute of a
    worker step. The part of it the trace's op times do not hold goes, by ``model``:
    SCALED, into the ops (each traced time x compute_s / traced sum: it overlaps the
    transfers where the ops do); OVERHEAD, after the step (it overlaps nothing). A
    "-serial" suffix models TensorFlow's order as SERIAL instead of SHARED. ``pushes``:
    per worker its pushes, sending node -> (PS channel, bytes); each DAG gets its
    worker's (:func:`assign_pushes`), on the same fair share of the link as its pulls.
    A "-joint" model simulates the workers together (:func:`joint_step`), serving an
    installed order ``align``-ed or one worker after the other (see :func:`joint`);
    ``align`` is one flag for every order, or one per order name (default True).
    CPU: the ops scaled to ``reference_s`` (a worker's step with no transfer) and
    ``compute_s - reference_s`` as CPU work per byte pulled and pushed
    (:func:`with_transfer_cpu`)."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    if model.startswith(CPU) and not (reference_s is not None and reference_s > 0):
        raise ValueError(f"the {model} model needs reference_s > 0 (the step with no "
                         f"transfer), got {reference_s!r}")
    default = SERIAL if model.endswith(("-" + SERIAL, "-" + JOINT)) else SHARED
    together = model.endswith("-" + JOINT)
    model = model.split("-")[0]
    share = rate_bits / 8.0 / max(1, workers, ps)
    out = {}
    for name, parts in orders.items():
        traced = statistics.median(sum(compute.get(op.name, 0.0) for op in g.compute_ops)
                                   for g, _ in parts)
        target = reference_s if model == CPU else compute_s
        scale = target / traced if traced > 0 and model in (SCALED, CPU) else 1.0
        extra = max(0.0, compute_s - traced) if model == OVERHEAD else 0.0
        rate = rate_bits / 8.0 if together else share  # the joint model shares itself
        timed_parts = [(timed(g, compute, scale, rate, served, transfer_bytes), s)
                       for g, s in parts]
        worker_pushes = ([{n: (c, b / rate) for n, (c, b) in p.items()}
                          for p in assign_pushes([g for g, _ in parts], pushes)]
                         if pushes else None)
        if model == CPU:
            cpu_parts, cpu_pushes = [], []
            for k, (g, s) in enumerate(timed_parts):
                own = worker_pushes[k] if worker_pushes else None
                moved = rate * (sum(op.time for op in g.recvs)
                                + sum(t for _, t in (own or {}).values()))
                per_byte = max(0.0, compute_s - reference_s) / moved if moved > 0 else 0.0
                g, own = with_transfer_cpu(g, own, rate, per_byte)
                cpu_parts.append((g, s))
                cpu_pushes.append(own)
            timed_parts = cpu_parts
            worker_pushes = cpu_pushes if worker_pushes else None
        out[name] = extra + (
            joint_step(timed_parts, worker_pushes,
                       align if isinstance(align, bool) else align.get(name, True), seeds,
                       default)
            if together
            else predicted_step(timed_parts, seeds, default, worker_pushes))
    return out


# The simulator's inputs of one benchmark point, saved beside its result
# (``<result>.sim.json.gz``) so that a new model re-predicts a run without re-running it.
# Version 2 adds ``transfer_bytes``; version 1 (without it) is still read.
INPUTS_VERSION = 2
READABLE_VERSIONS = (1, 2)


def inputs_to_json(orders: Mapping[str, Sequence[tuple[Graph, Schedule | None]]],
                   compute: Mapping[str, float], compute_s: float, rate_bits: float,
                   workers: int, ps: int, served: Mapping[str, float] | None,
                   pushes: Sequence[Mapping[str, tuple[str, int]]] | None,
                   align: Mapping[str, bool], reference_s: float | None,
                   transfer_bytes: Mapping[str, float] | None = None) -> dict:
    """The arguments of :func:`predictions` as JSON; DAGs shared by several orders are
    stored once, and ``compute`` only for the ops some DAG holds."""
    graphs: list[dict] = []
    index: dict[int, int] = {}
    names: set[str] = set()
    out_orders: dict[str, list] = {}
    for name, parts in orders.items():
        rows = []
        for graph, schedule in parts:
            if id(graph) not in index:
                index[id(graph)] = len(graphs)
                graphs.append(graph.to_json())
                names.update(op.name for op in graph.compute_ops)
            rows.append([index[id(graph)], schedule.to_json() if schedule else None])
        out_orders[name] = rows
    return {"version": INPUTS_VERSION, "graphs": graphs, "orders": out_orders,
            "compute": {n: t for n, t in compute.items() if n in names},
            "compute_s": compute_s, "rate_bits": rate_bits, "workers": workers, "ps": ps,
            "served": dict(served) if served else None,
            "pushes": [{n: list(v) for n, v in p.items()} for p in pushes] if pushes else None,
            "align": dict(align), "reference_s": reference_s,
            "transfer_bytes": dict(transfer_bytes) if transfer_bytes else None}


def repredict(data: Mapping, models: Sequence[str] = MODELS, seeds: int = SEEDS
              ) -> dict[str, dict[str, float]]:
    """Step seconds per model and order from saved inputs (:func:`inputs_to_json`); a
    CPU model is left out where the run measured no compute reference."""
    if data.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"simulator inputs of version {data.get('version')!r}; this "
                         f"code reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    graphs = [Graph.from_json(g, f"graph {i}") for i, g in enumerate(data["graphs"])]
    orders = {name: [(graphs[i], Schedule.from_json(s) if s else None) for i, s in rows]
              for name, rows in data["orders"].items()}
    pushes = ([{n: (c, int(b)) for n, (c, b) in p.items()} for p in data["pushes"]]
              if data.get("pushes") else None)
    reference_s = data.get("reference_s")
    return {model: predictions(orders, data["compute"], data["compute_s"],
                               data["rate_bits"], data["workers"], data["ps"], seeds=seeds,
                               model=model, served=data.get("served"),
                               transfer_bytes=data.get("transfer_bytes"), pushes=pushes,
                               align=data["align"], reference_s=reference_s)
            for model in models if reference_s or not model.startswith(CPU)}


def inputs_path(result_path: str) -> str:
    """Where the simulator inputs of ``result_path`` (a result JSON) are saved."""
    base = result_path[:-5] if result_path.endswith(".json") else result_path
    return base + ".sim.json.gz"


def save_inputs(result_path: str, per_run: Sequence[dict | None]) -> str:
    """Writes each run's simulator inputs (None: that run simulated nothing)."""
    path = inputs_path(result_path)
    with gzip.open(path, "wt") as f:
        json.dump(list(per_run), f, separators=(",", ":"))
    return path


def load_inputs(result_path: str) -> list[dict | None] | None:
    """The saved simulator inputs of ``result_path`` per run, or None if none were saved."""
    path = inputs_path(result_path)
    if not os.path.exists(path):
        return None
    with gzip.open(path, "rt") as f:
        return json.load(f)
