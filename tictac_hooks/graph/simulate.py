"""Bounds, efficiency and a discrete-event makespan simulator (paper section 3).

Resources: one compute resource for the worker; one channel per (worker, PS) pair,
carrying one transfer at a time. Recvs are ready at the start of the iteration (the PS
activates every send at once), so each channel sends its transfers back to back
(a recv with inputs, e.g. an embedding gather, is ready once they are done: its
channel waits for it, in order, as the gate does):
unlisted transfers first, in random order (they pass the rendezvous straight through),
then the scheduled ones by priority, ties in random order. A compute op starts when
its inputs are done and the compute resource is free; ready ops run first-come,
first-served (ties by graph order).

See docs/ALGORITHMS.md, "Bounds and efficiency" and "Simulator".
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Mapping

import numpy as np

from tictac_hooks.graph.dag import RECV, Graph, GraphError
from tictac_hooks.graph.schedule import Schedule


def efficiency(makespan: float, upper: float, lower: float) -> float | None:
    """E = (U - m) / (U - L) (paper Eq. 4), the one definition every E in the package
    uses (simulated, benchmarked, and per step in TensorBoard); None where it is not
    an efficiency: U = L (nothing to schedule), or m outside [L, U]. A measured step
    faster than L or slower than U means the time oracle behind U and L does not bound
    that step (compute or transfer times over- or underestimated), so no E is reported
    for it rather than a number outside [0, 1]."""
    tolerance = 1e-9 * max(abs(upper), 1.0)  # float rounding of sums, not a real miss
    if not upper - lower > 1e-12 or not lower - tolerance <= makespan <= upper + tolerance:
        return None
    return min(1.0, max(0.0, (upper - makespan) / (upper - lower)))


@dataclasses.dataclass(frozen=True)
class Bounds:
    """U, L and S of one iteration (paper section 3.2)."""

    upper: float    # U: sum of Time(op) over all ops (nothing overlaps)
    lower: float    # L: max over resources of the time on that resource
    speedup: float  # S = (U - L) / L: the most scheduling can gain
    dependency_lower: float = math.nan  # L* (see dependency_lower_bound), >= L

    def efficiency(self, makespan: float) -> float:
        """E of a makespan under these bounds (:func:`efficiency`); NaN where it has none."""
        e = efficiency(makespan, self.upper, self.lower)
        return math.nan if e is None else e

    def dependency_efficiency(self, makespan: float) -> float:
        """E* = (U - m) / (U - L*): E measured against the dependency-aware bound."""
        if not self.upper > self.dependency_lower:
            return math.nan
        return (self.upper - makespan) / (self.upper - self.dependency_lower)


def _times(graph: Graph) -> list[float]:
    missing = [op.name for op in graph.ops if op.time is None]
    if missing:
        raise GraphError(
            f"{len(missing)} ops have no time (e.g. {missing[0]!r}): the simulator needs "
            "a time oracle for every op")
    return [op.time for op in graph.ops]  # type: ignore[misc]


def dependency_lower_bound(graph: Graph) -> float:
    """L*: a lower bound on the makespan that, unlike L, respects dependencies.

    Every op whose dep set contains D can start only after the recvs of D arrived, and
    those ops share the one compute resource; so for each distinct dep set D,
    m >= max over channels of (transfer time of D's recvs on it) + (compute time of the
    ops whose dep contains D). L* is the largest such value and L. In a training graph
    the backward pass depends on every recv, so L* exposes how much of L is unreachable
    by any order (ours, not the paper's; the paper's E uses L).
    """
    from tictac_hooks.graph.properties import DependencyClasses
    times = _times(graph)
    classes = DependencyClasses.of(graph)
    channel_of = np.asarray([graph.channels.index(op.channel) for op in graph.recvs], dtype=np.int64)
    member = classes.member
    best = _resource_bounds(graph, times)[1]
    if member.shape[0] == 0:
        return best
    # comm[k, c]: transfer time of class k's recvs on channel c.
    onehot = np.zeros((channel_of.size, len(graph.channels)))
    onehot[np.arange(channel_of.size), channel_of] = classes.recv_time
    comm = member.astype(np.float64) @ onehot
    not_member = ~member
    for start in range(0, member.shape[0], 256):
        block = member[start:start + 256]
        # contains[j, k]: class j's dep set contains class k's (k in this block).
        contains = (not_member.astype(np.float32) @ block.T.astype(np.float32)) == 0
        later_compute = classes.compute_time @ contains
        best = max(best, float((comm[start:start + 256].max(axis=1) + later_compute).max()))
    return best


def bounds(graph: Graph) -> Bounds:
    """U = sum Time(op); L = max over resources d of sum Time(op on d); S = (U - L) / L."""
    upper, lower = _resource_bounds(graph, _times(graph))
    speedup = (upper - lower) / lower if lower > 0 else math.inf
    return Bounds(upper=upper, lower=lower, speedup=speedup,
                  dependency_lower=dependency_lower_bound(graph))


def _resource_bounds(graph: Graph, times: list[float]) -> tuple[float, float]:
    per_resource: dict[str, float] = {"compute": 0.0}
    for op, t in zip(graph.ops, times):
        key = "channel:" + op.channel if op.kind == RECV else "compute"  # type: ignore[operator]
        per_resource[key] = per_resource.get(key, 0.0) + t
    return sum(times), max(per_resource.values())


@dataclasses.dataclass(frozen=True)
class SimResult:
    makespan: float
    bounds: Bounds
    recv_finish: dict[str, float]  # when each transfer completed
    finish: dict[str, float] = dataclasses.field(default_factory=dict)  # every op

    @property
    def efficiency(self) -> float:
        return self.bounds.efficiency(self.makespan)

    @property
    def dependency_efficiency(self) -> float:
        return self.bounds.dependency_efficiency(self.makespan)

    def to_json(self) -> dict[str, float | str | None]:
        """Figures as JSON numbers; an undefined one (E where U = L, S where L = 0) is
        null, with a ``<name>_reason`` saying why, never Infinity or NaN."""
        out: dict[str, float | str | None] = {
            "makespan": finite_or_none(self.makespan), "upper": finite_or_none(self.bounds.upper),
            "lower": finite_or_none(self.bounds.lower),
            "efficiency": finite_or_none(self.efficiency),
            "speedup": finite_or_none(self.bounds.speedup),
            "lower_dependency": finite_or_none(self.bounds.dependency_lower),
            "efficiency_dependency": finite_or_none(self.dependency_efficiency)}
        if out["efficiency"] is None:
            out["efficiency_reason"] = ("U = L: all the time is on one resource, nothing "
                                        "can overlap, so E = (U - m) / (U - L) is undefined")
        if out["speedup"] is None:
            out["speedup_reason"] = ("L = 0: no op takes any time, so "
                                     "S = (U - L) / L is undefined")
        return out


def finite_or_none(x: float | None) -> float | None:
    """x, or None where it is not a finite number (for JSON, which has no inf/NaN)."""
    return x if x is not None and math.isfinite(x) else None


def channel_sequences(graph: Graph, schedule: Schedule | None, seed: int = 0) -> dict[str, list[int]]:
    """channel -> recv indices (into graph.ops) in the order the channel sends them."""
    rng = np.random.default_rng(seed)
    priority = schedule.priority if schedule is not None else {}
    per_channel: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        if op.kind == RECV:
            per_channel.setdefault(op.channel, []).append(i)  # type: ignore[arg-type]
    out = {}
    for channel, idx in per_channel.items():
        tiebreak = rng.permutation(len(idx))
        # Unlisted (-1) first, then by priority; random tie-break within equal keys.
        keyed = sorted(zip(idx, tiebreak),
                       key=lambda it: (priority.get(graph.ops[it[0]].name, -1), it[1]))
        out[channel] = [i for i, _ in keyed]
    return out


SERIAL, SHARED = "serial", "shared"  # models of TensorFlow's default order


def shared_finishes(times: list[float]) -> list[float]:
    """Finish times of transfers that all start at 0 and share one link equally while
    they last (processor sharing): with the times sorted t_1 <= ... <= t_n, transfer k
    ends at t_1 + ... + t_{k-1} + (n - k + 1) t_k. Returned in the input's order."""
    order = sorted(range(len(times)), key=times.__getitem__)
    out = [0.0] * len(times)
    done, n = 0.0, len(times)
    for k, i in enumerate(order):
        out[i] = done + (n - k) * times[i]
        done += times[i]
    return out


def simulate(graph: Graph, schedule: Schedule | None = None, seed: int = 0,
             default: str = SERIAL, resources: Mapping[str, str] | None = None) -> SimResult:
    """Makespan of one iteration of ``graph`` with transfers ordered by ``schedule``.

    ``schedule=None`` models TensorFlow's default, by ``default``: SERIAL, every
    transfer of a channel back to back in random order (``seed`` picks the order), or
    SHARED, every transfer of a channel sent at once, the link shared equally among
    those unfinished (what gRPC's interleaving of concurrent HTTP/2 streams comes to).
    ``resources`` (compute op -> the processor it runs on; default: one for all) lets
    one DAG hold several workers' steps, each computing on its own.
    """
    if default not in (SERIAL, SHARED):
        raise ValueError(f"default must be {SERIAL!r} or {SHARED!r}, got {default!r}")
    times = _times(graph)
    if schedule is not None:
        schedule.check_fits(graph)
    if any(op.inputs for op in graph.recvs) and not (schedule is None and default == SHARED):
        return _simulate_events(graph, times, channel_sequences(graph, schedule, seed),
                                resources)
    ops = graph.ops
    consumers, waiting = _edges(graph)
    finish = [0.0] * len(ops)
    ready_at = [0.0] * len(ops)
    ready: list[tuple[float, int]] = []

    def done(i: int) -> None:
        for c in consumers[i]:
            ready_at[c] = max(ready_at[c], finish[i])
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (ready_at[c], c))

    for seq in channel_sequences(graph, schedule, seed).values():
        if schedule is None and default == SHARED:
            for i, end in zip(seq, shared_finishes([times[i] for i in seq])):
                finish[i] = end
            continue
        clock = 0.0
        for i in seq:
            clock += times[i]
            finish[i] = clock
    for i, op in enumerate(ops):
        if op.kind != RECV and waiting[i] == 0:
            heapq.heappush(ready, (0.0, i))
    for i, op in enumerate(ops):
        if op.kind == RECV:
            done(i)
    free: dict[str, float] = {}  # processor -> when it is next free
    while ready:  # ready times never decrease: each processor runs its ops FIFO
        at, i = heapq.heappop(ready)
        where = resources.get(ops[i].name, "") if resources else ""
        finish[i] = max(free.get(where, 0.0), at) + times[i]
        free[where] = finish[i]
        done(i)
    makespan = max(finish, default=0.0)
    return SimResult(makespan=makespan, bounds=bounds(graph),
                     recv_finish={ops[i].name: finish[i] for i in range(len(ops)) if ops[i].kind == RECV},
                     finish={op.name: finish[i] for i, op in enumerate(ops)})


def _edges(graph: Graph) -> tuple[list[list[int]], list[int]]:
    """Per op index: the indices of its consumers, and how many inputs it waits for."""
    index = {op.name: i for i, op in enumerate(graph.ops)}
    consumers: list[list[int]] = [[] for _ in graph.ops]
    waiting = [0] * len(graph.ops)
    for i, op in enumerate(graph.ops):
        for name in set(op.inputs):
            consumers[index[name]].append(i)
            waiting[i] += 1
    return consumers, waiting


def _simulate_events(graph: Graph, times: list[float], sequences: Mapping[str, list[int]],
                     resources: Mapping[str, str] | None) -> SimResult:
    """:func:`simulate` for graphs with recvs that have inputs, event by event: a
    channel sends its sequence in order, each transfer once the channel is free and its
    inputs are done (the gate holds the ones behind a transfer that is not ready); a
    processor runs the ready compute op that became ready first."""
    ops = graph.ops
    consumers, waiting = _edges(graph)
    finish = [0.0] * len(ops)
    ready_at = [0.0] * len(ops)
    events: list[tuple[float, int, int]] = []  # (finish time, tie-break, op)
    tick = iter(range(1 << 62))
    queued: dict[str, list[tuple[float, int]]] = {}  # processor -> ready compute ops
    busy: set[str] = set()
    position = {ch: 0 for ch in sequences}
    sending: set[str] = set()

    def where(i: int) -> str:
        return resources.get(ops[i].name, "") if resources else ""

    def start_channels(now: float) -> None:
        for ch, seq in sequences.items():
            if ch in sending or position[ch] >= len(seq):
                continue
            r = seq[position[ch]]
            if waiting[r]:
                continue  # its inputs are not done: the channel waits for it
            position[ch] += 1
            sending.add(ch)
            finish[r] = max(now, ready_at[r]) + times[r]
            heapq.heappush(events, (finish[r], next(tick), r))

    def start_compute(now: float) -> None:
        for proc, heap in queued.items():
            if proc in busy or not heap:
                continue
            _, i = heapq.heappop(heap)
            busy.add(proc)
            finish[i] = now + times[i]
            heapq.heappush(events, (finish[i], next(tick), i))

    for i, op in enumerate(ops):
        if op.kind != RECV and waiting[i] == 0:
            heapq.heappush(queued.setdefault(where(i), []), (0.0, i))
    now = 0.0
    start_channels(now)
    start_compute(now)
    while events:
        now, _, i = heapq.heappop(events)
        if ops[i].kind == RECV:
            sending.discard(ops[i].channel)  # type: ignore[arg-type]
        else:
            busy.discard(where(i))
        for c in consumers[i]:
            ready_at[c] = max(ready_at[c], now)
            waiting[c] -= 1
            if waiting[c] == 0 and ops[c].kind != RECV:
                heapq.heappush(queued.setdefault(where(c), []), (ready_at[c], c))
        start_channels(now)
        start_compute(now)
    makespan = max(finish, default=0.0)
    return SimResult(makespan=makespan, bounds=bounds(graph),
                     recv_finish={ops[i].name: finish[i] for i in range(len(ops))
                                  if ops[i].kind == RECV},
                     finish={op.name: finish[i] for i, op in enumerate(ops)})
