"""`tictac whatif`: a model's step time and TicTac's gain on W workers and P PSes,
predicted from one worker's profile (graph/profile.py) before deploying.

Per order, one worker's step is simulated against the load of the W - 1 others
(graph/cluster_sim.py); asynchronous training (``fit`` under ParameterServerStrategy)
is its steady state, a fixed point of the step time T; synchronous training ends with
the last worker. Beside them the bounds no order beats: the links' (each PS's egress
and ingress carry W workers' bytes, a worker's its own), the barrier's (synchronous:
every pull then the last worker's pushes, or one worker's pulls then every push) and,
with ``cpus``, the CPU's (W steps' CPU on C cores). See docs/WHATIF.md.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Sequence

from tictac_hooks.graph.algorithms import compute_order
from tictac_hooks.graph.cluster_sim import Links, Prepared, StepTimes, worker_step
from tictac_hooks.graph.dag import RECV, Graph
from tictac_hooks.graph.profile import Placed, Profile, placed
from tictac_hooks.graph.simulate import channel_sequences

# "default": TensorFlow's own (no gate, SHARED); the others the gate serves (PACED):
# a fixed random order, the variable list, first use, TIC (paper Algorithm 2, by M+)
# and TAC (Algorithm 3, Eq. 6), from graph/algorithms.py.
ORDERS = ("default", "random", "declared", "first-use", "tic", "tac")
TIED = ("random", "tic")  # orders with ties or draws: averaged over SEEDS
LABELS = {"default": "TensorFlow's default", "random": "paced random",
          "declared": "declared", "first-use": "first-use", "tic": "TIC", "tac": "TAC"}
SEEDS = 3          # tie-break / random-order samples averaged
ITERATIONS = 40    # fixed-point steps of the steady state (it settles in 5-15)


class WhatIfError(ValueError):
    """A cluster or order that cannot be predicted; the message says why."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """W workers, P PSes, every link ``rate`` bytes/s each way; ``cpus``: the cores the
    whole cluster shares (as on one test machine), None: enough for every task."""

    workers: int
    ps: int
    rate: float
    cpus: float | None = None
    synchronous: bool = False

    def check(self) -> None:
        if self.workers < 1:
            raise WhatIfError(f"--workers must be >= 1, got {self.workers}")
        if self.ps < 1:
            raise WhatIfError(f"--ps must be >= 1, got {self.ps}")
        if not self.rate > 0 or not math.isfinite(self.rate):
            raise WhatIfError(f"the link rate must be > 0 bytes/s, got {self.rate}")
        if self.cpus is not None and not self.cpus > 0:
            raise WhatIfError(f"--cpus must be > 0, got {self.cpus}")


@dataclasses.dataclass(frozen=True)
class Bounds:
    link: float      # max over each PS's egress and ingress (W workers) and a worker's own
    barrier: float   # synchronous: W pulls then a push, or a pull then W pushes
    cpu: float       # W steps' CPU over the cores (0: not bounded)


@dataclasses.dataclass(frozen=True)
class Row:
    order: str
    step_s: float
    throughput: float   # samples (steps where the batch is unknown) per second, all workers
    gain: float         # step of TensorFlow's default / this step - 1


@dataclasses.dataclass(frozen=True)
class Prediction:
    model: str
    cluster: Cluster
    bounds: Bounds
    rows: tuple[Row, ...]

    @property
    def orders(self) -> list[str]:
        """The orders predicted (``declared`` is left out for a profile without the
        model's declaration order)."""
        return [r.order for r in self.rows]

    def row(self, order: str) -> Row:
        for r in self.rows:
            if r.order == order:
                return r
        raise WhatIfError(f"order {order!r} was not predicted; predicted: "
                          f"{', '.join(self.orders)}")

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "workers": self.cluster.workers, "ps": self.cluster.ps,
                "rate_bytes_per_s": self.cluster.rate, "cpus": self.cluster.cpus,
                "synchronous": self.cluster.synchronous,
                "bounds_s": dataclasses.asdict(self.bounds),
                "orders": {r.order: {"step_s": r.step_s, "throughput": r.throughput,
                                     "gain": r.gain} for r in self.rows}}


def bounds(where: Placed, cluster: Cluster, compute_s: float, cpu_s: float) -> Bounds:
    """The link, barrier and CPU bounds of a step (the module docstring)."""
    w, r = cluster.workers, cluster.rate
    pulls = [b / r for b in where.pull_bytes]
    pushes = [b / r for b in where.push_bytes]
    link = max([w * t for t in pulls + pushes]
               + [sum(where.pull_bytes) / r, sum(where.push_bytes) / r, compute_s])
    barrier = max(max(w * s + compute_s + g, s + compute_s + w * g)
                  for s, g in zip(pulls, pushes))
    cpu = w * cpu_s / cluster.cpus if cluster.cpus else 0.0
    return Bounds(link=link, barrier=barrier, cpu=cpu)


def _links(cluster: Cluster, paced: bool, load: Sequence[float], push_load: Sequence[float],
           wait: Sequence[float]) -> Links:
    r = cluster.rate
    return Links(pull_rate=[r if paced else r / max(1.0, n) for n in load],
                 turn_start=list(wait), push_rate=[r / max(1.0, m) for m in push_load],
                 ingress=r, egress=r)


def steady_step(dag: Prepared, sequences: Any, where: Placed, cluster: Cluster,
                floor: float) -> StepTimes:
    """Asynchronous steady state: T = max(this worker's step against the others' load
    at T, ``floor``), iterated from the worker alone. SHARED (``sequences`` None): a
    PS's W - 1 other workers pull from it a share busy_p / T of the time, so this
    worker's stream there gets rate / (1 + (W - 1) busy_p / T); PACED: the link is its
    own once its turn comes, after a mean wait of half a turn times the share of time
    the others hold p (mean residual service, the gate serving one worker at a time)."""
    w, ps = cluster.workers, cluster.ps
    turn = [b / cluster.rate for b in where.pull_bytes]
    push_turn = [b / cluster.rate for b in where.push_bytes]
    paced = sequences is not None
    load, push_load, wait = [1.0] * ps, [1.0] * ps, [0.0] * ps
    times = worker_step(dag, sequences, _links(cluster, paced, load, push_load, wait),
                        where.push_bytes)
    period = max(times.step, floor)
    for _ in range(ITERATIONS if w > 1 else 0):
        busy = times.pulls_busy if not paced else turn
        share = [min(1.0, (w - 1) * b / period) for b in busy]
        load = [1.0 + (w - 1) * min(1.0, b / period) for b in busy]
        push_load = [1.0 + (w - 1) * min(1.0, g * m / period)
                     for g, m in zip(push_turn, push_load)]
        wait = [s * t / 2 for s, t in zip(share, turn)] if paced else [0.0] * ps
        times = worker_step(dag, sequences, _links(cluster, paced, load, push_load, wait),
                            where.push_bytes)
        new = max(times.step, floor)
        if abs(new - period) <= 1e-4 * period:
            period = new
            break
        period = 0.5 * (period + new)
    return dataclasses.replace(times, step=period)


def barrier_step(dag: Prepared, sequences: Any, where: Placed, cluster: Cluster) -> StepTimes:
    """Synchronous: every worker starts at the barrier. SHARED: each PS's links are
    shared by all W at once; PACED: the last worker's turn at each PS comes after the
    W - 1 turns before it, its pushes then meet no one."""
    w, ps = cluster.workers, cluster.ps
    if sequences is None:
        links = _links(cluster, False, [float(w)] * ps, [float(w)] * ps, [0.0] * ps)
    else:
        wait = [(w - 1) * b / cluster.rate for b in where.pull_bytes]
        links = _links(cluster, True, [1.0] * ps, [1.0] * ps, wait)
    return worker_step(dag, sequences, links, where.push_bytes)


def timed(where: Placed, rate: float) -> Graph:
    """The placed DAG with each recv timed at the link rate (TAC's oracle)."""
    return where.graph.with_times({op.name: (op.bytes or 0) / rate for op in where.graph.recvs})


def predict(profile: Profile, cluster: Cluster, orders: Sequence[str] = ORDERS,
            seeds: int = SEEDS) -> Prediction:
    """Step time, throughput and gain over TensorFlow's default of each order."""
    cluster.check()
    unknown = [o for o in orders if o not in ORDERS]
    if unknown:
        raise WhatIfError(f"unknown order(s) {', '.join(unknown)}: choose from "
                          f"{', '.join(ORDERS)}")
    where = placed(profile, cluster.ps)
    graph = timed(where, cluster.rate)
    dag = Prepared.of(graph)
    cpu_s = profile.cpu_s if profile.cpu_s is not None else profile.compute_s
    b = bounds(where, cluster, profile.compute_s, cpu_s)
    floor = 0.0 if cluster.synchronous else max(b.link, b.cpu)
    steps: dict[str, float] = {}
    if not all(op.declared is not None for op in graph.recvs):
        orders = [o for o in orders if o != "declared"]  # no declaration order known
    for order in ("default",) + tuple(o for o in orders if o != "default"):
        samples = []
        for seed in range(seeds if order in TIED else 1):
            sequences = None
            if order != "default":
                schedule = compute_order(graph, order, seed=seed)
                sequences = channel_sequences(graph, schedule, seed)
            if cluster.synchronous:
                step = max(barrier_step(dag, sequences, where, cluster).step, b.cpu)
            else:
                step = steady_step(dag, sequences, where, cluster, floor).step
            samples.append(step)
        steps[order] = statistics.fmean(samples)
    batch = cluster.workers * (profile.batch or 1)  # a run's profile: per step
    rows = tuple(Row(order=o, step_s=steps[o], throughput=batch / steps[o],
                     gain=steps["default"] / steps[o] - 1.0)
                 for o in ORDERS if o in steps and (o in orders))
    return Prediction(model=profile.model, cluster=cluster, bounds=b, rows=rows)
