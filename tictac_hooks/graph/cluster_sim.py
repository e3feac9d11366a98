"""One worker's step in a cluster of W symmetric workers and P PSes (docs/WHATIF.md).

The links: every task has one link of ``rate`` bytes/s each way. A worker's pulls
leave its PSes' egress links and enter its own ingress link; its gradient pushes leave
its egress link and enter the PSes' ingress links. W workers share each PS's links;
they are symmetric, so one worker is simulated and the others are the load it meets:

- TensorFlow's default (SHARED): a PS sends every transfer at once and the link is
  shared equally among the streams in flight (gRPC interleaves HTTP/2 streams), the
  other workers' streams included: this worker's channel from PS p gets
  ``rate / n_p``, n_p the mean number of workers pulling from p at once.
- The gate's service (PACED): a PS hands one worker's transfers to gRPC one after the
  other, in the order, paced to the link, then the next worker's (the earliest turn
  first, then the lowest task): this worker's channel gets the whole rate, after
  waiting for the turns served before its own.

Asynchronous training (``fit`` under ParameterServerStrategy) runs in a steady state:
the load n_p and the wait come from the step time T itself (a worker is in p's
service a share ``busy_p / T`` of the time), solved as a fixed point. Synchronous
training (the graph-mode bench) starts every worker at the barrier: under SHARED all
W share each link at once; under PACED the last worker's turn at p starts after the
W - 1 before it (the slowest worker ends the step).

Within the worker: a channel's transfers are served in its order (PACED) or shared
(SHARED); a transfer has crossed once its PS sent it and the worker's ingress, carrying
its transfers one after the other, took it in; compute ops run one at a time, the
earliest ready first (as graph/simulate.py); the pushes leave when the compute ends.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Mapping, Sequence

from tictac_hooks.graph.dag import RECV, Graph

SHARED, PACED = "shared", "paced"


@dataclasses.dataclass(frozen=True)
class Links:
    """What one worker's step meets: per PS, the rate its pulls get, when its turn
    starts, and the rate its pushes get; its own ingress and egress rates."""

    pull_rate: Sequence[float]
    turn_start: Sequence[float]
    push_rate: Sequence[float]
    ingress: float
    egress: float


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """The times of one simulated worker step, from its start."""

    compute_end: float
    pulls_end: Sequence[float]   # per PS: when its last pull crossed
    pulls_busy: Sequence[float]  # per PS: from its first pull's start to its last's end
    pushes_end: float
    step: float


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What every simulation of one DAG reuses: its ops, who consumes each, how many
    inputs each waits for, each recv's PS, the recvs with inputs."""

    graph: Graph
    consumers: tuple[tuple[int, ...], ...]
    inputs: tuple[tuple[int, ...], ...]
    ps_of: dict[int, int]

    @classmethod
    def of(cls, graph: Graph) -> "Prepared":
        index = {op.name: i for i, op in enumerate(graph.ops)}
        inputs = tuple(tuple(sorted({index[n] for n in op.inputs})) for op in graph.ops)
        consumers: list[list[int]] = [[] for _ in graph.ops]
        for i, ins in enumerate(inputs):
            for j in ins:
                consumers[j].append(i)
        ps_of = {i: int(str(op.channel).split(":")[1]) for i, op in enumerate(graph.ops)
                 if op.kind == RECV}
        return cls(graph, tuple(map(tuple, consumers)), inputs, ps_of)


def shared_with_releases(items: Sequence[tuple[float, float]], rate: float) -> list[float]:
    """Finish times of transfers (release time, bytes) sharing a link of ``rate``
    equally among those released and unfinished (processor sharing)."""
    order = sorted(range(len(items)), key=lambda i: items[i][0])
    finish = [0.0] * len(items)
    left: dict[int, float] = {}
    now, k = 0.0, 0
    while k < len(order) or left:
        if not left:
            now = max(now, items[order[k]][0])
        while k < len(order) and items[order[k]][0] <= now:
            left[order[k]] = items[order[k]][1]
            k += 1
        share = rate / len(left)
        smallest = min(left.values())
        next_release = items[order[k]][0] if k < len(order) else float("inf")
        step = min(smallest / share, next_release - now)
        now += step
        for i in list(left):
            left[i] -= step * share
            if left[i] <= 1e-9 * max(1.0, items[i][1]):
                finish[i] = now
                del left[i]
    return finish


def _pulls(dag: Prepared, sequences: Mapping[str, Sequence[int]] | None, links: Links,
           release: Mapping[int, float]) -> dict[int, tuple[float, float]]:
    """recv index -> (start at its PS, crossed), for the given release times."""
    ops = dag.graph.ops
    sent: dict[int, tuple[float, float]] = {}
    by_ps: dict[int, list[int]] = {}
    for i, p in dag.ps_of.items():
        by_ps.setdefault(p, []).append(i)
    for p, idx in by_ps.items():
        rate, start = links.pull_rate[p], links.turn_start[p]
        if sequences is None:  # SHARED: every transfer in flight at once
            items = [(max(start, release.get(i, 0.0)), float(ops[i].bytes or 0)) for i in idx]
            for i, (at, _), end in zip(idx, items, shared_with_releases(items, rate)):
                sent[i] = (at, end)
            continue
        clock = start
        for i in sequences[f"ps:{p}"]:  # PACED: one after the other, in order
            begin = max(clock, release.get(i, 0.0))
            clock = begin + (ops[i].bytes or 0) / rate
            sent[i] = (begin, clock)
    crossed: dict[int, tuple[float, float]] = {}
    clock = 0.0  # the worker's ingress takes them in one after the other
    for i in sorted(sent, key=lambda i: (sent[i][1], sent[i][0])):
        begin, end = sent[i]
        clock = max(end, clock + (ops[i].bytes or 0) / links.ingress)
        crossed[i] = (begin, clock)
    return crossed


def _compute(dag: Prepared, arrived: Mapping[int, float], times: Sequence[float]) -> list[float]:
    """Finish time of every op: recvs when they crossed, compute ops on one processor,
    earliest ready first, ties by graph order."""
    is_recv = [i in dag.ps_of for i in range(len(times))]
    finish = [0.0] * len(times)
    ready_at = [0.0] * len(times)
    waiting = [len(ins) for ins in dag.inputs]
    heap = [(0.0, i) for i in range(len(times)) if not is_recv[i] and waiting[i] == 0]
    events = [(arrived.get(i, 0.0), i) for i in dag.ps_of]
    heapq.heapify(heap)
    heapq.heapify(events)
    free = 0.0

    def done(i: int) -> None:
        for c in dag.consumers[i]:
            ready_at[c] = max(ready_at[c], finish[i])
            waiting[c] -= 1
            if waiting[c] == 0 and not is_recv[c]:
                heapq.heappush(heap, (ready_at[c], c))
    while heap or events:
        if events and (not heap or events[0][0] <= max(free, heap[0][0])):
            at, i = heapq.heappop(events)
            finish[i] = at
            done(i)
            continue
        at, i = heapq.heappop(heap)
        finish[i] = max(free, at) + times[i]
        free = finish[i]
        done(i)
    return finish


def worker_step(dag: Prepared, sequences: Mapping[str, Sequence[int]] | None, links: Links,
                push_bytes: Sequence[int], compute_scale: float = 1.0) -> StepTimes:
    """One worker's step on ``links`` (the module docstring); ``sequences``: per channel
    the recv indices in the order the gate serves them, None for SHARED. A recv with
    inputs (an embedding lookup) is released when they are done: solved by repeating
    the pulls with the release times of the previous pass until they settle."""
    ops = dag.graph.ops
    times = [(op.time or 0.0) * compute_scale if op.kind != RECV else 0.0 for op in ops]
    gated = [i for i in dag.ps_of if dag.inputs[i]]
    release: dict[int, float] = {}
    for _ in range(8):
        crossed = _pulls(dag, sequences, links, release)
        finish = _compute(dag, {i: end for i, (_, end) in crossed.items()}, times)
        new = {i: max(finish[j] for j in dag.inputs[i]) for i in gated}
        if new == release:
            break
        release = new
    compute_end = max((finish[i] for i in range(len(ops)) if i not in dag.ps_of),
                      default=0.0)
    ps = len(links.pull_rate)
    first = [float("inf")] * ps
    last = [0.0] * ps
    for i, (begin, end) in crossed.items():
        p = dag.ps_of[i]
        first[p], last[p] = min(first[p], begin), max(last[p], end)
    busy = [last[p] - first[p] if last[p] > 0 else 0.0 for p in range(ps)]
    total_push = sum(push_bytes)
    pushes_end = compute_end + max([total_push / links.egress if total_push else 0.0]
                                   + [b / links.push_rate[p] for p, b in enumerate(push_bytes)])
    return StepTimes(compute_end=compute_end, pulls_end=last, pulls_busy=busy,
                     pushes_end=pushes_end,
                     step=max(compute_end, pushes_end, max(last, default=0.0)))
