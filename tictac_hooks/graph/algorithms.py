"""Transfer-ordering heuristics: TIC and TAC (paper section 4), plus reference orders.

Each returns a :class:`Schedule` over the graph's recvs. All are deterministic: ties are
broken by the recvs' position in the graph's topological order.
"""

from __future__ import annotations

import numpy as np

from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.oracle_generic import generic_times
from tictac_hooks.graph.properties import DependencyClasses, OutstandingState
from tictac_hooks.graph.schedule import Schedule

ALGORITHMS = ("tic", "tac", "random", "layer")


def tic(graph: Graph) -> Schedule:
    """TIC: priority = M+ under the generic oracle (Eq. 5), all recvs outstanding.

    Ties get the rank of their group's first member (ranks 0, 0, 2, 3), as the public
    code gives them; recvs with M+ = inf share the last group.
    """
    state = OutstandingState(DependencyClasses.of(graph, generic_times(graph)))
    m_plus = state.impending_comm_load()
    order = np.lexsort((np.arange(m_plus.size), m_plus))  # by M+, then graph order
    names = [graph.recvs[i].name for i in order]
    priority: dict[str, int] = {}
    for rank, i in enumerate(order):
        if rank and m_plus[i] == m_plus[order[rank - 1]]:
            priority[names[rank]] = priority[names[rank - 1]]
        else:
            priority[names[rank]] = rank
    return Schedule.from_order("tic", names, priority)


def tac(graph: Graph) -> Schedule:
    """TAC (Algorithm 3 with the Eq. 6 comparator): repeatedly take the minimum of R.

    Comparator (Johnson's two-machine rule, Eq. 6): for recvs A, B let
    a = min(P_B, M_A), b = min(P_A, M_B); A goes first iff a < b, and on a == b iff
    M+_A < M+_B. This pairwise rule need not be transitive (ties in ``a == b`` across
    Johnson's two sets), so "the minimum" is taken as the recv that the fewest others
    beat (its Copeland minimum): exactly Eq. 6's minimum whenever one exists. Remaining
    ties go to Johnson's sequence key (M < P first by ascending M, then by descending
    P), then to graph order.
    """
    classes = DependencyClasses.of(graph)
    state = OutstandingState(classes)
    comm = classes.recv_time                       # M of a recv is its own transfer time
    n = comm.size
    alive = np.arange(n)
    names = []
    for _ in range(n):
        p_all = state.directly_dependent_load()
        m_plus_all = state.impending_comm_load()
        m, p, m_plus = comm[alive], p_all[alive], m_plus_all[alive]
        # a[i, j] = min(P_j, M_i): the Eq. 6 "a" with A = i, B = j; "b" is its transpose.
        a = np.minimum(p[None, :], m[:, None])
        b = a.T
        first = (a < b) | ((a == b) & (m_plus[:, None] < m_plus[None, :]))
        losses = first.sum(axis=0)
        johnson_set = (m >= p).astype(np.int8)      # 0: comm < compute; 1: otherwise
        johnson_value = np.where(johnson_set == 0, m, -p)
        pick = np.lexsort((alive, johnson_value, johnson_set, losses))[0]
        r = int(alive[pick])
        names.append(graph.recvs[r].name)
        state.complete(r)
        alive = np.delete(alive, pick)
    return Schedule.from_order("tac", names)


def random_order(graph: Graph, seed: int = 0) -> Schedule:
    """A fixed random order (one sample of what the runtime does unscheduled)."""
    rng = np.random.default_rng(seed)
    names = [graph.recvs[i].name for i in rng.permutation(len(graph.recvs))]
    return Schedule.from_order("random", names)


def layer_order(graph: Graph) -> Schedule:
    """Layer order: recvs by the position of their first consumer (forward layer order).

    The priority ByteScheduler and P3 use (variable creation order); recvs nothing
    consumes go last.
    """
    first_use = {op.name: len(graph) for op in graph.recvs}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            if name in first_use and first_use[name] == len(graph):
                first_use[name] = i
    names = [op.name for op in sorted(graph.recvs, key=lambda o: (first_use[o.name], graph.index(o.name)))]
    return Schedule.from_order("layer", names)


def compute_order(graph: Graph, algorithm: str, seed: int = 0) -> Schedule:
    """Dispatches by name: ``tic``, ``tac``, ``random`` (with ``seed``) or ``layer``."""
    if algorithm == "tic":
        return tic(graph)
    if algorithm == "tac":
        return tac(graph)
    if algorithm == "random":
        return random_order(graph, seed)
    if algorithm == "layer":
        return layer_order(graph)
    raise ValueError(f"unknown algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}")
