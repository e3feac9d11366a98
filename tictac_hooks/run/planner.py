"""The planner of the switch: each worker DAG restricted to the transfers the PSes served
while profiling, timed for TAC, ordered; and the per-PS install plan of those orders.

A *part* is one worker DAG (restricted, timed for TAC) with its order; a switch has one
part per worker DAG, and the candidates of the order check map an algorithm to its
parts.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

from tictac_hooks.run.settings import TicTacSetupError
from tictac_hooks.graph.algorithms import compute_order
from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.profile import from_run
from tictac_hooks.graph.schedule import Schedule, ScheduleError
from tictac_hooks.graph.tf.naming import canonical_transfer_name, sending_node_name

log = logging.getLogger("tictac")

Parts = list[tuple[Graph, Schedule]]


def merged(parts: Sequence[tuple[Graph, Schedule]]) -> Schedule:
    """The one schedule of a candidate's per-worker orders."""
    return parts[0][1] if len(parts) == 1 else Schedule.merged([sched for _, sched in parts])


def channel_index(channel: str) -> int:
    job, _, task = channel.partition(":")
    if job != "ps" or not task.isdigit():
        raise ScheduleError(f"transfer channel {channel!r} is not a PS task ('ps:<index>')")
    return int(task)


def received_only(graph: Graph, served: set[str], late: set[str]) -> Graph:
    """The DAG with only the recvs the PSes served while profiling (the others are
    reads that never left their PS), each named as the PSes name it: a tensor sent
    over two edges in one step is two recvs named by their edges (edge_<n>_<node>),
    which the PSes report by its sending node; a read inside a step loop is named by
    the loop's body, which TensorFlow numbers when it lowers the loop
    (canonical_transfer_name)."""
    recv_names = {op.name for op in graph.recvs} - late
    if not served:
        return graph.with_recvs_only(recv_names)
    by_canonical: dict[str, str] = {}
    for name in sorted(served):
        by_canonical.setdefault(canonical_transfer_name(name), name)
    matched, renamed = set(), {}
    for n in recv_names:
        if n in served or sending_node_name(n) in served:
            matched.add(n)
        elif (as_served := by_canonical.get(canonical_transfer_name(n))) is not None:
            matched.add(n)
            renamed[n] = as_served
    if not matched:
        reads = sorted(recv_names) or sorted(op.name for op in graph.recvs)
        raise ScheduleError(
            f"none of the {len(served)} transfers the PSes served while profiling "
            f"(e.g. {sorted(served)[0]!r}) matches a parameter read of the step "
            f"function TicTac traced ({len(reads)} reads, e.g. "
            f"{reads[0] if reads else 'none'!r}), so TicTac cannot tell which "
            "transfer feeds which part of the step")
    return graph.with_recvs_only(matched).renamed(renamed)


def why_unlisted(graphs: Mapping[str, Graph], late: set[str]) -> "Callable[[str], str]":
    """Why a served transfer is not in the order, in words, by its name."""
    reads = {canonical_transfer_name(op.name) for g in graphs.values() for op in g.recvs}
    after_write = {canonical_transfer_name(n) for n in late}

    def why(name: str) -> str:
        key = canonical_transfer_name(name)
        if key in after_write:
            return ("a read ordered after work of the same step (e.g. after a "
                    "variable's update), so it cannot be served at the step's start")
        if key in reads:
            return "a read of the traced step that the PSes did not serve while profiling"
        return ("not a parameter read of the traced step (a control edge, a loop's "
                "bookkeeping, or a value computed on the PS)")
    return why


def timed(graph: Graph, compute_times: Mapping[str, float] | None,
          link_rate: float | None, served_bytes: Mapping[str, int],
          compute_profile_error: str | None = None) -> Graph:
    """The DAG with TAC's times: each compute op its measured time, each recv its bytes
    over ``link_rate`` (``served_bytes``: the bytes the PS served each transfer with
    while profiling, StepLog.transfer_bytes; ``compute_profile_error``: why the
    frontend's compute profile failed, for the error)."""
    if compute_times is None:
        raise TicTacSetupError(
            "TAC needs measured compute times: " +
            (f"no compute profile ({compute_profile_error})"
             if compute_profile_error else "none were profiled"))
    if not link_rate:
        raise TicTacSetupError(
            "TAC needs transfer times: no transfer was recorded while profiling and "
            "no bandwidth was given")
    # Time(recv) = bytes / rate, with the bytes the PS served it with while profiling
    # where recorded: the trace gives both edges of a tensor sent over two the
    # tensor's size, but the PS serves it over one and a few bytes over the other
    # (ResNet-50 training: 188.3 MB traced per worker, 94.4 MB served).
    served = served_bytes
    sizes = {op.name: served.get(op.name, op.bytes) for op in graph.recvs}
    missing_bytes = [n for n, b in sizes.items() if b is None]
    if missing_bytes:
        raise TicTacSetupError(f"TAC needs the size of every transfer; unknown for "
                               f"{missing_bytes[0]!r}")
    times = {op.name: compute_times.get(op.name, 0.0) for op in graph.compute_ops}
    times.update({name: b / link_rate for name, b in sizes.items()})
    return graph.with_times(times)


def compute_seconds(graph: Graph, compute_times: Mapping[str, float]) -> float:
    """Per-step compute time of a (restricted) worker DAG: its compute ops' times."""
    return sum(compute_times.get(op.name, 0.0) for op in graph.compute_ops)


def parts_for(algorithm: str, graphs: Mapping[str, Graph],
              compute_times: Mapping[str, float] | None, served: set[str],
              late: set[str], link_rate: float | None = None,
              served_bytes: Mapping[str, int] | None = None,
              compute_profile_error: str | None = None) -> Parts:
    """Each worker DAG, restricted to what the PSes served, with its order (for TAC,
    timed: see :func:`timed` for the other arguments)."""
    parts = []
    for graph in graphs.values():
        graph = received_only(graph, served, late)
        if algorithm == "tac":
            graph = timed(graph, compute_times, link_rate, served_bytes or {},
                          compute_profile_error)
        parts.append((graph, compute_order(graph, algorithm)))
    return parts


def save_profile(log_dir: str, graph: Graph, compute_times: Mapping[str, float] | None,
                 steplog: Any) -> str | None:
    """Writes the run's profile to ``log_dir`` for `tictac whatif --profile LOG_DIR`
    (graph/profile.py, :func:`~tictac_hooks.graph.profile.from_run`), with the bytes
    each transfer was served with while profiling (``steplog.transfer_bytes()``). A
    profile that cannot be written is said in one warning; training goes on."""
    try:
        return from_run(graph, dict(compute_times) if compute_times else None,
                        dict(steplog.transfer_bytes())).save(log_dir)
    except (OSError, ValueError) as e:
        log.warning("TicTac: no profile written to %s (%s)", log_dir, e)
        return None


def orders(candidates: Mapping[str, Parts], name: str) -> Parts:
    """The parts of the candidate ``name``; KeyError naming those computed."""
    if name not in candidates:
        raise KeyError(f"no {name!r} order was computed (computed: "
                       f"{sorted(candidates) or 'none yet'})")
    return list(candidates[name])


def per_ps(parts: Sequence[tuple[Graph, Schedule]],
           ps_addresses: Sequence[str]) -> dict[str, Schedule]:
    """The install plan: each PS (by address) gets, per worker, that worker's order
    restricted to its transfers (merged over the workers); PSes the order has no
    transfer on are not in it."""
    per_channel: dict[str, list[Schedule]] = {}
    for graph, schedule in parts:
        for channel, sub in schedule.per_channel(graph).items():
            per_channel.setdefault(channel, []).append(sub)
    plan: dict[str, Schedule] = {}
    for channel, subs in sorted(per_channel.items()):
        index = channel_index(channel)
        if index >= len(ps_addresses):
            raise ScheduleError(f"graph names channel {channel!r} but the cluster has "
                                f"{len(ps_addresses)} PS tasks")
        plan[ps_addresses[index]] = subs[0] if len(subs) == 1 else \
            Schedule.merged(subs)
    return plan


def install(parts: Sequence[tuple[Graph, Schedule]], ps_addresses: Sequence[str],
            skip_after_s: float | None, window_bytes: int | None,
            pace_rate: float | None = None, align: bool | None = None,
            only: "Sequence[str] | None" = None, clients: Any = None) -> list[str]:
    """Installs the plan of ``parts`` (:func:`per_ps`), all or nothing: checked on every
    PS first, rolled back on a failure half-way; on the PSes of ``only`` alone when
    given (e.g. one restarted); through the run's ``clients`` (GateClients) when
    given. Logs the scheduled transfers a PS did not serve; returns the PSes that got
    an order."""
    from tictac_hooks.enforce.client import install_plan
    plan = per_ps(parts, ps_addresses)
    if only is not None:
        plan = {a: s for a, s in plan.items() if a in only}
    results = install_plan(plan, skip_after_s=skip_after_s, window_bytes=window_bytes,
                           pace_rate=pace_rate, align=align, clients=clients)
    for address, result in results.items():
        if result.unmatched:
            log.warning("TicTac: %d scheduled transfers were not served by %s (e.g. %r); "
                        "that PS enforces the other %d", len(result.unmatched), address,
                        result.unmatched[0], result.expected)
    return sorted(plan)
