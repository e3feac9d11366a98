"""Transfer-ordering heuristics: TIC and TAC (paper section 4), plus reference orders.

Each returns a :class:`Schedule` over the graph's recvs. All are deterministic: ties are
broken by the recvs' position in the graph's topological order (TIC's ties keep one
shared priority; only their place in ``order`` follows that position).

See docs/ALGORITHMS.md, "TIC", "TAC" and "Baselines".
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from tictac_hooks.graph.dag import RECV, Graph, GraphError
from tictac_hooks.graph.oracle import generic_times
from tictac_hooks.graph.properties import DependencyClasses, JobState, OutstandingState
from tictac_hooks.graph.schedule import Schedule

ALGORITHMS = ("tic", "tac", "tac-paper", "random", "first-use", "declared")
# Old names still accepted; each says once per process what it is now called.
ALIASES = {"layer": "first-use"}
# What each baseline stands for, for tables and reports (a result file's "layer" is
# "first-use": PEER_LABELS[canonical_algorithm(name, quiet=True)]).
PEER_LABELS = {
    "declared": "declared (BytePS TF: variable-list order; ByteScheduler PyTorch/MXNet, "
                "P3: parameter index)",
    "first-use": "first-use (ByteScheduler TF: DAG order of first consumer)",
    "random": "random (a fixed random order)",
    "tic": "TIC",
    "tac": "TAC",
    "tac-paper": "TAC (the paper's per-recv rule)",
}
_log = logging.getLogger("tictac")
_aliases_said: set[str] = set()


def canonical_algorithm(name: str, quiet: bool = False) -> str:
    """``name`` with an old alias (``layer``) replaced by today's name (``first-use``);
    the first time per process an alias is used (``quiet`` False) one warning line says
    so. Other names come back unchanged."""
    new = ALIASES.get(name)
    if new is None:
        return name
    if not quiet and name not in _aliases_said:
        _aliases_said.add(name)
        _log.warning("algorithm %r is now called %r (ranks each parameter by its first "
                     "consumer in the traced step); %r still works", name, new, name)
    return new


def peer_label(name: str) -> str:
    """The label of an order or baseline in tables: what it is and whose rule it stands
    for (``layer``, an old result's name, is ``first-use``)."""
    name = canonical_algorithm(name, quiet=True)
    return PEER_LABELS.get(name, name)


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
    """TAC: Algorithm 3's greedy loop with Eq. 6 (Johnson's rule) applied to jobs, the
    outstanding recvs each op waits for, instead of to single recvs.

    Each round takes the first job by Johnson's key over (M, P) of :class:`JobState`
    (M < P first by ascending M, then the rest by descending P; ties by M, then class
    order), descends to the first job by the same key among the jobs strictly inside it
    until none is, and sends that job's first outstanding recv in graph order. Where
    every compute op waits on one recv (the two-machine flow shop) the jobs are the recvs
    and this is Johnson's optimal order, as :func:`tac_paper` is.

    Why not the paper's per-recv rule: a recv that unlocks compute only with others (a
    layer's gamma and beta; every forward recv, for the backward pass) has P = 0 there,
    so Eq. 6 sends every recv with P > 0 first, however little that compute matters.
    With tf_keras's SGD the worker reads each optimizer slot for one cheap multiply, and
    the paper's TAC sends all of them ahead of the forward pass (simulated step +19 to
    +38 % over TIC on ResNet-50, Inception-v3 and MobileNet-v2 training). Here the
    forward pass is the job with the backward's compute as its P. docs/ALGORITHMS.md,
    "TAC", gives the measurements.
    """
    classes = DependencyClasses.of(graph)
    jobs = JobState(classes)
    names: list[str] = []
    while len(names) < len(graph.recvs):
        live = np.flatnonzero(jobs.live)
        if live.size == 0:  # recvs no worker op waits for: last, in graph order
            names += [graph.recvs[i].name for i in np.flatnonzero(jobs.outstanding)]
            break
        k = _johnson_first(jobs, live)
        while (inside := jobs.within(k)).size:
            k = _johnson_first(jobs, inside)
        r = int(np.flatnonzero(classes.member[k] & jobs.outstanding)[0])
        names.append(graph.recvs[r].name)
        jobs.complete(r)
    return Schedule.from_order("tac", names)


def _johnson_first(jobs: JobState, ks: np.ndarray) -> int:
    """The first of jobs ``ks`` by Johnson's key (Eq. 6), then M, then class order."""
    m, p = jobs.load[ks], jobs.unlocked[ks]
    johnson_set = (m >= p).astype(np.int8)
    return int(ks[np.lexsort((ks, m, np.where(johnson_set == 0, m, -p), johnson_set))[0]])


def tac_paper(graph: Graph) -> Schedule:
    """The paper's TAC (Algorithm 3 with the Eq. 6 comparator) on single recvs:
    repeatedly take the minimum of R. Kept for comparison (``tac-paper``); :func:`tac`
    says where it goes wrong.

    Comparator (Johnson's two-machine rule, Eq. 6): for recvs A, B let
    a = min(P_B, M_A), b = min(P_A, M_B); A goes first iff a < b, and on a == b iff
    M+_A < M+_B. This pairwise rule need not be transitive (ties in ``a == b`` across
    Johnson's two sets), so "the minimum" is defined as the first recv by
    (losses, Johnson key, M+, graph order), where losses counts the recvs that Eq. 6
    puts strictly before it (a Copeland minimum) and Johnson's key sorts comm < compute
    recvs by ascending M, then the rest by descending P. Where Eq. 6 has a minimum
    (nobody beats it) this is exactly that minimum.

    Fast path: Eq. 6 strict preferences agree with Johnson's key, so the key-first recv
    is checked against all others in O(n); only if something beats it (rare) is the
    full O(n^2) tournament run. M+ is computed only for the recvs a decision needs.
    """
    classes = DependencyClasses.of(graph)
    state = OutstandingState(classes)
    comm = classes.recv_time                       # M of a recv is its own transfer time
    n = comm.size
    alive = np.arange(n)
    names = []
    for _ in range(n):
        p_all = state.directly_dependent_load()
        m, p = comm[alive], p_all[alive]
        johnson_set = (m >= p).astype(np.int8)      # 0: comm < compute; 1: otherwise
        johnson_value = np.where(johnson_set == 0, m, -p)
        pick = _tac_fast_pick(state, alive, m, p, johnson_set, johnson_value)
        if pick is None:
            pick = _tac_tournament_pick(state, alive, m, p, johnson_set, johnson_value)
        r = int(alive[pick])
        names.append(graph.recvs[r].name)
        state.complete(r)
        alive = np.delete(alive, pick)
    return Schedule.from_order("tac-paper", names)


def _tac_fast_pick(state: OutstandingState, alive: np.ndarray, m: np.ndarray,
                   p: np.ndarray, johnson_set: np.ndarray, johnson_value: np.ndarray
                   ) -> int | None:
    """The key-first recv if no other recv beats it under Eq. 6, else None."""
    first = np.lexsort((alive, johnson_value, johnson_set))[0]
    group = np.flatnonzero((johnson_set == johnson_set[first])
                           & (johnson_value == johnson_value[first]))
    if group.size > 1:  # equal Johnson keys: M+ then graph order (alive is sorted)
        first = group[state.argmin_impending(alive[group])[0]]
    # y beats x iff min(P_x, M_y) < min(P_y, M_x), or equal and M+_y < M+_x.
    lhs = np.minimum(p[first], m)
    rhs = np.minimum(p, m[first])
    if np.any(lhs < rhs):
        return None
    tied = np.flatnonzero(lhs == rhs)
    tied = tied[tied != first]
    if tied.size:
        m_plus_first = state.impending_comm_load(alive[[first]])[0]
        if state.any_impending_below(alive[tied], m_plus_first):
            return None
    return int(first)


def _tac_tournament_pick(state: OutstandingState, alive: np.ndarray, m: np.ndarray,
                         p: np.ndarray, johnson_set: np.ndarray, johnson_value: np.ndarray
                         ) -> int:
    """The Copeland minimum of the full Eq. 6 tournament over the outstanding recvs."""
    m_plus = state.impending_comm_load(alive)
    # a[i, j] = min(P_j, M_i): the Eq. 6 "a" with A = i, B = j; "b" is its transpose.
    a = np.minimum(p[None, :], m[:, None])
    b = a.T
    first = (a < b) | ((a == b) & (m_plus[:, None] < m_plus[None, :]))
    losses = first.sum(axis=0)
    return int(np.lexsort((alive, m_plus, johnson_value, johnson_set, losses))[0])


def random_order(graph: Graph, seed: int = 0) -> Schedule:
    """A fixed random order (one sample of what the runtime does unscheduled)."""
    rng = np.random.default_rng(seed)
    names = [graph.recvs[i].name for i in rng.permutation(len(graph.recvs))]
    return Schedule.from_order("random", names)


def first_use_order(graph: Graph) -> Schedule:
    """First-use order (``first-use``, formerly ``layer``): recvs by the graph position
    of their first consumer, the forward order of the traced step.

    ByteScheduler's TensorFlow plugin ranks by such a graph-derived order; the other
    layer-wise schedulers use the declaration order (:func:`declared_order`), with which
    it coincides when a model creates its variables in the order it uses them. Recvs
    nothing consumes go last.
    """
    first_use = {op.name: len(graph) for op in graph.recvs}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            if name in first_use and first_use[name] == len(graph):
                first_use[name] = i
    names = [op.name for op in sorted(graph.recvs, key=lambda o: (first_use[o.name], graph.index(o.name)))]
    return Schedule.from_order("first-use", names)


def declared_order(graph: Graph) -> Schedule:
    """Declaration order (``declared``): recvs by their variable's position in the
    model's variable list (``Op.declared``: ``model.trainable_variables``, then the
    other variables in creation order), ties (two reads of one variable) by graph
    order. What BytePS's TensorFlow plugin enqueues by (``declared_key``), and
    ByteScheduler's PyTorch (``model.parameters()``) and MXNet plugins and P3
    (``priority=-index``).

    Raises:
      GraphError: a recv without a declaration position, naming the recvs that lack
        it and how to get it.
    """
    missing = [op.name for op in graph.recvs if op.declared is None]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise GraphError(
            f"algorithm 'declared' needs each recv's declaration position (the 'declared' "
            f"field of the graph JSON); {len(missing)} of {len(graph.recvs)} recvs lack "
            f"it: {shown}{more}. Extract the graph again with the model: "
            f"extract_concrete_function(fn, declared=model) or extract_keras_model(model, "
            f"...) (the TicTac callback and TicTacLoop(model=...) pass it), or "
            f"with_declared(graph, ...) for a graph-mode partition graph")
    names = [op.name for op in sorted(graph.recvs,
                                      key=lambda o: (o.declared, graph.index(o.name)))]
    return Schedule.from_order("declared", names)


def compute_order(graph: Graph, algorithm: str, seed: int = 0) -> Schedule:
    """Dispatches by name: ``tic``, ``tac``, ``tac-paper``, ``random`` (with ``seed``),
    ``first-use`` (alias ``layer``, said once) or ``declared``; on the graph's
    parameters (:func:`parameter_graph`: a partitioned variable's shards are one
    parameter, each shard of it takes the parameter's place), then with every recv
    that has inputs moved after the recvs those depend on (:func:`after_inputs`)."""
    algorithm = canonical_algorithm(algorithm)
    merged, members = parameter_graph(graph)
    if algorithm == "tic":
        schedule = tic(merged)
    elif algorithm == "tac":
        schedule = tac(merged)
    elif algorithm == "tac-paper":
        schedule = tac_paper(merged)
    elif algorithm == "random":
        schedule = random_order(merged, seed)
    elif algorithm == "first-use":
        schedule = first_use_order(merged)
    elif algorithm == "declared":
        schedule = declared_order(merged)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}: choose one of "
                         f"{', '.join(ALGORITHMS)}")
    if members:
        schedule = _expanded(schedule, members)
    return after_inputs(schedule, graph)


def parameter_graph(graph: Graph) -> tuple[Graph, dict[str, list[str]]]:
    """The graph with the shards of each partitioned variable (recvs sharing a
    ``param``) as ONE recv: a ShardedVariable is read as its shards joined by a concat
    that depends on them alone, so the concat is no progress, and per shard every
    kernel of every layer gets M+ of its own concat (TIC's priority 0 for all). The
    merged recv is named after the parameter; its time and bytes are the shards' sum,
    its inputs theirs. Returns (graph, merged name -> shard names in graph order);
    the graph itself, and {}, when no recvs share a parameter."""
    by_param: dict[str, list] = {}
    for op in graph.recvs:
        if op.param is not None:
            by_param.setdefault(op.param, []).append(op)
    groups = {param: ops for param, ops in by_param.items() if len(ops) > 1}
    if not groups:
        return graph, {}
    taken = {op.name for op in graph.ops}
    rename: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for param, ops in groups.items():
        name = param if param not in taken else f"{param}/(shards)"
        members[name] = [op.name for op in ops]
        rename.update((op.name, name) for op in ops)
    out = []
    done: set[str] = set()
    for op in graph.ops:
        name = rename.get(op.name)
        if name is None:
            inputs = tuple(dict.fromkeys(rename.get(i, i) for i in op.inputs))
            out.append(dataclasses.replace(op, inputs=inputs))
            continue
        if name in done:
            continue
        done.add(name)
        shards = [graph[n] for n in members[name]]
        inputs = tuple(dict.fromkeys(rename.get(i, i) for s in shards for i in s.inputs
                                     if rename.get(i, i) != name))
        times = [s.time for s in shards]
        nbytes = [s.bytes for s in shards]
        out.append(dataclasses.replace(
            op, name=name, inputs=inputs,
            time=None if None in times else float(sum(times)),  # type: ignore[arg-type]
            bytes=None if None in nbytes else int(sum(nbytes))))  # type: ignore[arg-type]
    return Graph(out), members


def _expanded(schedule: Schedule, members: dict[str, list[str]]) -> Schedule:
    """Each merged parameter's place in ``schedule`` taken by its shards, next to each
    other (on each PS, one shard of a parameter follows the previous parameter's);
    ties kept, priorities re-ranked (Schedule.restricted)."""
    order = [shard for name in schedule.order for shard in members.get(name, [name])]
    merged_of = {shard: name for name, shards in members.items() for shard in shards}
    keyed = Schedule.from_order(schedule.algorithm, order,
                                {n: schedule.priority[merged_of.get(n, n)] for n in order})
    return keyed.restricted(order)


def after_inputs(schedule: Schedule, graph: Graph) -> Schedule:
    """``schedule`` with every recv that has inputs (a read the PS serves only once the
    worker sent it data, e.g. an embedding gather's ids) placed after every listed recv
    those inputs depend on: the gate hands transfers back in order, so a recv listed
    before one it waits for would hold it, and all behind it, until the skip bound.
    Other recvs keep their places; unchanged when nothing must move."""
    from tictac_hooks.graph.properties import dependency_bitsets
    listed = set(schedule.order)
    recv_names = [op.name for op in graph.recvs]
    ancestors: dict[str, set[str]] = {}
    for op, d in zip(graph.ops, dependency_bitsets(graph)):
        if op.kind == RECV and op.inputs and op.name in listed:
            found = {recv_names[i] for i in range(len(recv_names)) if d >> i & 1}
            found = (found & listed) - {op.name}
            if found:
                ancestors[op.name] = found
    if not ancestors:
        return schedule
    order: list[str] = []
    placed: set[str] = set()
    waiting: list[str] = []
    for name in schedule.order:
        waiting.append(name)
        progress = True
        while progress:  # place every waiting recv whose ancestors are all placed
            progress = False
            for w in list(waiting):
                if ancestors.get(w, set()) <= placed:
                    order.append(w)
                    placed.add(w)
                    waiting.remove(w)
                    progress = True
    order += waiting  # only for a cyclic graph, which Graph refuses
    position = {n: i for i, n in enumerate(schedule.order)}
    priority: dict[str, int] = {}
    for i, name in enumerate(order):  # ties only where the schedule had them, unmoved
        prev = order[i - 1] if i else None
        tie = (prev is not None and position[name] == position[prev] + 1
               and schedule.priority[name] == schedule.priority[prev])
        priority[name] = priority[prev] if tie else i  # type: ignore[index]
    return Schedule.from_order(schedule.algorithm, order, priority)
