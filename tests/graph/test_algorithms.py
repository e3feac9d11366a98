"""TIC and TAC: the paper's examples, Johnson optimality, brute force on small DAGs."""

import dataclasses
import itertools
import math

import numpy as np
import pytest

from graph_builders import chains, random_dag
from tictac_hooks.graph import Graph, GraphError, Op, Schedule
from tictac_hooks.graph import algorithms as algorithms_module
from tictac_hooks.graph.algorithms import (compute_order, declared_order, first_use_order,
                                           peer_label, random_order, tac, tac_paper, tic)
from tictac_hooks.graph.properties import DependencyClasses, JobState, OutstandingState
from tictac_hooks.graph.simulate import simulate


def best_makespan(graph: Graph) -> float:
    """Brute force over every order of the recvs (one channel)."""
    names = [op.name for op in graph.recvs]
    return min(simulate(graph, Schedule.from_order("perm", p)).makespan
               for p in itertools.permutations(names))


def test_tic_tie_ranks_follow_the_public_code():
    # recvA, recvB -> op1; op1, recvC -> op2; op2, recvD -> op3 (TICTAC.md).
    g = Graph([Op("A", "recv"), Op("B", "recv"), Op("C", "recv"), Op("D", "recv"),
               Op("op1", "compute", ("A", "B")), Op("op2", "compute", ("op1", "C")),
               Op("op3", "compute", ("op2", "D"))])
    s = tic(g)
    assert dict(s.priority) == {"A": 0, "B": 0, "C": 2, "D": 3}
    assert s.order == ("A", "B", "C", "D")


def test_tic_infinite_m_plus_shares_last_group():
    # E and F feed only single-recv ops: M+ = inf, both ranked after the finite group.
    g = Graph([Op("E", "recv"), Op("A", "recv"), Op("B", "recv"), Op("F", "recv"),
               Op("e", "compute", ("E",)), Op("f", "compute", ("F",)),
               Op("ab", "compute", ("A", "B"))])
    s = tic(g)
    assert dict(s.priority) == {"A": 0, "B": 0, "E": 2, "F": 2}
    assert s.order == ("A", "B", "E", "F")


def fig1a() -> Graph:
    """Paper Fig. 1a: op1 needs recv1; op2 needs op1 and recv2 (unit times)."""
    return Graph([Op("recv1", "recv", time=1.0), Op("recv2", "recv", time=1.0),
                  Op("op1", "compute", ("recv1",), time=1.0),
                  Op("op2", "compute", ("op1", "recv2"), time=1.0)])


def test_fig1a_good_and_bad_order_hand_computed():
    g = fig1a()
    good = simulate(g, Schedule.from_order("x", ["recv1", "recv2"]))
    bad = simulate(g, Schedule.from_order("x", ["recv2", "recv1"]))
    # Good: recv1 [0,1], recv2 [1,2] overlaps op1 [1,2], op2 [2,3]. Bad: op1 waits to 2.
    assert good.makespan == 3.0 and bad.makespan == 4.0
    assert good.bounds.upper == 4.0 and good.bounds.lower == 2.0
    assert good.efficiency == pytest.approx(0.5) and bad.efficiency == pytest.approx(0.0)
    for algorithm in ("tic", "tac"):
        assert compute_order(g, algorithm).order == ("recv1", "recv2")


@pytest.mark.parametrize("m_a,p_a,m_b,p_b", [
    (1.0, 4.0, 3.0, 1.0),   # Fig. 4a-like: A has short comm, long compute: A first
    (4.0, 1.0, 1.0, 3.0),   # Fig. 4b-like: B first
    (2.0, 2.0, 1.0, 5.0),
    (3.0, 0.5, 3.0, 2.0),
])
@pytest.mark.parametrize("order", [tac, tac_paper])
def test_fig4_two_chains_closed_form(m_a, p_a, m_b, p_b, order):
    """Eq. 6 derivation: A then B takes M_A + max(P_A, M_B) + P_B."""
    g = chains([m_a, m_b], [p_a, p_b])
    ab = simulate(g, Schedule.from_order("x", ["r0", "r1"])).makespan
    ba = simulate(g, Schedule.from_order("x", ["r1", "r0"])).makespan
    assert ab == pytest.approx(m_a + max(p_a, m_b) + p_b)
    assert ba == pytest.approx(m_b + max(p_b, m_a) + p_a)
    chosen = simulate(g, order(g)).makespan
    assert chosen == pytest.approx(min(ab, ba))


@pytest.mark.parametrize("order", [tac, tac_paper])
@pytest.mark.parametrize("seed", range(25))
def test_tac_is_johnson_optimal_on_independent_chains(seed, order):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    comm = [float(x) for x in rng.integers(1, 10, size=n)]  # integers: ties happen
    comp = [float(x) for x in rng.integers(0, 10, size=n)]
    g = chains(comm, comp)
    assert simulate(g, order(g)).makespan == pytest.approx(best_makespan(g))


def slot_reads(eps: float = 0.1) -> Graph:
    """Two forward layers, each waiting on a weight w and a gamma g; a backward pass on
    all of them; then per layer an optimizer slot m, read for one cheap multiply that
    the layer's update joins with its gradient (tf_keras SGD's momentum read)."""
    ops, prev = [Op("x", "compute", time=0.0)], "x"
    for i in range(2):
        ops += [Op(f"w{i}", "recv", time=1.0), Op(f"g{i}", "recv", time=0.2),
                Op(f"f{i}", "compute", (prev, f"w{i}", f"g{i}"), time=1.0)]
        prev = f"f{i}"
    for i in (1, 0):
        ops.append(Op(f"b{i}", "compute", (prev,), time=2.0))
        prev = f"b{i}"
    for i in range(2):
        ops += [Op(f"m{i}", "recv", time=1.0), Op(f"mul{i}", "compute", (f"m{i}",), time=eps),
                Op(f"add{i}", "compute", (f"mul{i}", f"b{i}"), time=eps)]
    return Graph(ops)


def test_tac_sends_the_forward_pass_before_the_optimizer_slots():
    """The paper's per-recv Eq. 6 gives w and g P = 0 (their layer needs both) and the
    slots P = eps, so it sends the slots first; TAC's jobs see the forward pass."""
    g = slot_reads()
    opt = best_makespan(g)
    assert tac(g).order == ("w0", "g0", "w1", "g1", "m0", "m1")
    assert simulate(g, tac(g)).makespan == pytest.approx(opt)
    assert tac_paper(g).order[:2] == ("m0", "m1")
    assert simulate(g, tac_paper(g)).makespan > 1.2 * opt


def test_dependency_lower_bound_is_a_valid_and_tighter_bound():
    from tictac_hooks.graph.simulate import bounds
    tighter = 0
    for seed in range(40):
        g = random_dag(seed, n_recvs=5, n_compute=8)
        b = bounds(g)
        assert b.lower <= b.dependency_lower <= best_makespan(g) + 1e-9
        tighter += b.dependency_lower > b.lower + 1e-9
    assert tighter > 10  # it does tighten L on most graphs


def test_tac_beats_random_and_tic_on_small_random_dags_against_brute_force():
    ratios = {"tac": [], "tac-paper": [], "tic": [], "random": []}
    for seed in range(40):
        g = random_dag(seed, n_recvs=5, n_compute=8)
        opt = best_makespan(g)
        for alg in ("tac", "tac-paper", "tic"):
            m = simulate(g, compute_order(g, alg)).makespan
            assert m >= opt - 1e-9
            ratios[alg].append(m / opt)
        ratios["random"].append(np.mean([simulate(g, None, seed=s).makespan for s in range(10)]) / opt)
    mean = {k: float(np.mean(v)) for k, v in ratios.items()}
    # Heuristics, not optimal; but near the optimum and better than no schedule.
    for alg in ("tac", "tac-paper"):
        assert mean[alg] < 1.05, mean
        assert np.mean(np.isclose(ratios[alg], 1.0)) > 0.6, mean
    assert mean["tac"] <= mean["random"] and mean["tic"] <= mean["random"], mean
    # Jobs instead of single recvs: no worse than the paper's rule on these graphs.
    assert mean["tac"] <= mean["tac-paper"], mean


@pytest.mark.parametrize("alg", ["tic", "tac", "tac-paper", "first-use"])
def test_orders_are_deterministic_permutations_of_the_recvs(alg):
    for seed in range(10):
        g = random_dag(seed, n_recvs=12, n_compute=40, channels=2)
        a, b = compute_order(g, alg), compute_order(g, alg)
        assert a == b
        assert sorted(a.order) == sorted(op.name for op in g.recvs)


def test_random_order_depends_on_seed_only():
    g = random_dag(1, n_recvs=20, n_compute=30)
    assert random_order(g, 3) == random_order(g, 3)
    assert random_order(g, 3).order != random_order(g, 4).order


def test_first_use_order_follows_first_use():
    g = Graph([Op("w2", "recv"), Op("w1", "recv"), Op("x", "compute"),
               Op("l1", "compute", ("x", "w1")), Op("l2", "compute", ("l1", "w2"))])
    assert first_use_order(g).order == ("w1", "w2")
    assert compute_order(g, "first-use").algorithm == "first-use"


def test_layer_is_first_use_and_says_so_once_per_process(caplog, monkeypatch):
    g = Graph([Op("w2", "recv"), Op("w1", "recv"), Op("x", "compute"),
               Op("l1", "compute", ("x", "w1")), Op("l2", "compute", ("l1", "w2"))])
    monkeypatch.setattr(algorithms_module, "_aliases_said", set())
    with caplog.at_level("WARNING", logger="tictac"):
        first = compute_order(g, "layer")
        again = compute_order(g, "layer")
    assert first == again == compute_order(g, "first-use")
    assert first.algorithm == "first-use" and first.order == ("w1", "w2")
    said = [r.getMessage() for r in caplog.records if "now called" in r.getMessage()]
    assert said == ["algorithm 'layer' is now called 'first-use' (ranks each parameter by "
                    "its first consumer in the traced step); 'layer' still works"]
    # An old result's schedule "layer" gets first-use's label.
    assert peer_label("layer") == peer_label("first-use") != "first-use"
    assert "ByteScheduler" in peer_label("first-use") and "BytePS" in peer_label("declared")


def _declared_reverse_of_use() -> Graph:
    """w1 is used first and declared last (a subclassed model whose __init__ creates
    its layers in reverse of the call order)."""
    return Graph([Op("w1", "recv", declared=2), Op("w2", "recv", declared=1),
                  Op("w3", "recv", declared=0), Op("x", "compute"),
                  Op("l1", "compute", ("x", "w1")), Op("l2", "compute", ("l1", "w2")),
                  Op("l3", "compute", ("l2", "w3"))])


def test_declared_order_follows_the_variable_list_not_the_graph():
    g = _declared_reverse_of_use()
    assert first_use_order(g).order == ("w1", "w2", "w3")
    s = compute_order(g, "declared")
    assert s.algorithm == "declared" and s.order == ("w3", "w2", "w1")
    assert dict(s.priority) == {"w3": 0, "w2": 1, "w1": 2}
    # two reads of one variable share its position: graph order between them
    g = Graph([Op("b", "recv", declared=0), Op("a", "recv", declared=1),
               Op("b_again", "recv", declared=0), Op("y", "compute", ("a", "b", "b_again"))])
    assert declared_order(g).order == ("b", "b_again", "a")


def test_declared_order_keeps_a_sharded_variable_together():
    """The shards of one variable share its position (one parameter)."""
    g = _sharded_mlp()
    declared = {3: 0, 2: 1, 1: 2}  # fc3 declared first
    g = Graph(dataclasses.replace(op, declared=2 * declared[int(op.name[2])]
                                  + (1 if "/bias/" in op.name else 0))
              if op.is_recv else op for op in g.ops)
    order = compute_order(g, "declared").order
    assert [n.split("/")[0] for n in order] == ["fc3"] * 3 + ["fc2"] * 3 + ["fc1"] * 3, order
    for k in range(1, 4):  # kernel shards adjacent, ahead of the bias
        at = [i for i, n in enumerate(order) if n.startswith(f"fc{k}/")]
        assert order[at[-1]] == f"fc{k}/bias/read", order


def test_declared_order_on_a_graph_without_positions_names_the_recvs_and_the_fix():
    g = Graph([Op("a", "recv", declared=0), Op("b", "recv"), Op("c", "recv"),
               Op("y", "compute", ("a", "b", "c"))])
    with pytest.raises(GraphError) as e:
        compute_order(g, "declared")
    message = str(e.value)
    assert "2 of 3 recvs lack it: 'b', 'c'" in message
    assert "'declared' field" in message and "Extract the graph again with the model" in message


def recv_deps(g: Graph) -> dict[str, set[str]]:
    """op name -> the recvs it depends on, directly or transitively (Algorithm 1's dep)."""
    deps: dict[str, set[str]] = {}
    for op in g.ops:
        d = {op.name} if op.kind == "recv" else set()
        for i in op.inputs:
            d |= deps[i]
        deps[op.name] = d
    return deps


def test_properties_match_the_definitions_on_random_dags():
    """Vectorised P / M+ equal a direct transcription of Algorithm 1."""
    for seed in range(15):
        g = random_dag(seed, n_recvs=6, n_compute=15)
        names = [op.name for op in g.recvs]
        deps = recv_deps(g)
        state = OutstandingState(DependencyClasses.of(g))
        outstanding = set(names)
        for r in list(np.random.default_rng(seed).permutation(len(names))):
            p_ref = {n: 0.0 for n in names}
            mp_ref = {n: math.inf for n in names}
            for op in g.compute_ops:
                live = deps[op.name] & outstanding
                if len(live) == 1:
                    p_ref[next(iter(live))] += op.time
                elif len(live) > 1:
                    m = sum(g[x].time for x in live)
                    for x in live:
                        mp_ref[x] = min(mp_ref[x], m)
            p, mp = state.directly_dependent_load(), state.impending_comm_load()
            for i, n in enumerate(names):
                if n in outstanding:
                    assert p[i] == pytest.approx(p_ref[n])
                    assert mp[i] == pytest.approx(mp_ref[n])
            state.complete(int(r))
            outstanding.discard(names[r])


def test_jobs_match_the_definitions_on_random_dags():
    """JobState's incremental M and P equal a direct transcription of their definition."""
    for seed in range(15):
        g = random_dag(seed, n_recvs=6, n_compute=15)
        names = [op.name for op in g.recvs]
        deps = recv_deps(g)
        classes = DependencyClasses.of(g)
        jobs = JobState(classes)
        outstanding = set(names)
        for r in list(np.random.default_rng(seed).permutation(len(names))):
            live = {op.name: frozenset(deps[op.name] & outstanding) for op in g.compute_ops
                    if deps[op.name]}
            expected = {}
            for s in set(live.values()) - {frozenset()}:
                expected[s] = (sum(g[x].time for x in s),
                               sum(g[o].time for o, t in live.items() if t and t <= s))
            got = {}
            for k in np.flatnonzero(jobs.live):
                s = frozenset(n for i, n in enumerate(names)
                              if classes.member[k, i] and n in outstanding)
                got[s] = (jobs.load[k], jobs.unlocked[k])
                inside = {frozenset(n for i, n in enumerate(names)
                                    if classes.member[j, i] and n in outstanding)
                          for j in jobs.within(int(k))}
                assert inside == {t for t in expected if t < s}
            assert got.keys() == expected.keys()
            for s, (m, p) in expected.items():
                assert got[s] == pytest.approx((m, p))
            jobs.complete(int(r))
            outstanding.discard(names[r])


@pytest.mark.parametrize("order", [tac, tac_paper])
def test_tac_needs_times(order):
    g = random_dag(0, timed=False)
    with pytest.raises(GraphError, match="has no time.*TIC"):
        order(g)
    tic(g)  # TIC needs none


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="unknown algorithm 'fastest'.*tic, tac"):
        compute_order(random_dag(0), "fastest")


@pytest.mark.parametrize("seed", range(30))
def test_tac_fast_path_equals_the_full_tournament(seed, monkeypatch):
    """The O(n) fast path picks exactly what the full Eq. 6 tournament picks."""
    import tictac_hooks.graph.algorithms as algorithms
    rng = np.random.default_rng(seed)
    g = random_dag(seed, n_recvs=int(rng.integers(3, 15)), n_compute=int(rng.integers(5, 40)),
                   channels=int(rng.integers(1, 3)))
    # Integer times make Eq. 6 ties (and its non-transitive cases) common.
    g = g.with_times({op.name: float(rng.integers(0, 4)) for op in g.ops})
    fast = tac_paper(g)
    monkeypatch.setattr(algorithms, "_tac_fast_pick", lambda *a: None)
    assert tac_paper(g) == fast


def _sharded_mlp(shards: int = 2, layers: int = 3) -> Graph:
    """fc1..fcN, each kernel read as ``shards`` shards (one per PS) joined by a concat
    that depends on them alone, as a ShardedVariable is read; the bias unsharded."""
    ops, prev = [Op("x", "compute", time=0.0)], "x"
    for layer in range(1, layers + 1):
        kernel = [f"fc{layer}/kernel/part_{k}/read" for k in range(shards)]
        for k, name in enumerate(kernel):
            ops.append(Op(name, "recv", channel=f"ps:{k}", bytes=1 << 19, time=0.01,
                          param=f"fc{layer}/kernel"))
        ops.append(Op(f"fc{layer}/bias/read", "recv", channel="ps:0", bytes=2048, time=0.001))
        ops.append(Op(f"fc{layer}/concat", "compute", tuple(kernel), time=0.001))
        ops.append(Op(f"fc{layer}/matmul", "compute",
                      (prev, f"fc{layer}/concat", f"fc{layer}/bias/read"), time=0.01))
        prev = f"fc{layer}/matmul"
    return Graph(ops)


@pytest.mark.parametrize("algorithm", ["tic", "tac", "first-use"])
def test_a_sharded_variable_is_one_parameter_layer_by_layer(algorithm):
    """The concat of a variable's shards depends on them alone: counted per shard, TIC
    gave every kernel shard priority 0 (fc1's bias after the fc2/fc3 shards). As one
    parameter, the order is the unsharded model's: layer by layer, each kernel's shards
    next to each other."""
    g = _sharded_mlp()
    order = compute_order(g, algorithm).order
    layer_of = [int(name.split("/")[0][2:]) for name in order]
    assert layer_of == sorted(layer_of), order
    for k in range(1, 4):  # the shards of one kernel are adjacent
        at = [i for i, n in enumerate(order) if n.startswith(f"fc{k}/kernel/")]
        assert at == list(range(at[0], at[0] + 2)), order


@pytest.mark.parametrize("algorithm", ["tic", "tac", "tac-paper", "first-use", "random"])
def test_a_recv_with_inputs_comes_after_the_recvs_they_depend_on(algorithm):
    """An embedding gather whose ids the worker computes from another transfer is
    listed after that transfer, whatever the algorithm put first."""
    g = Graph([Op("table_ids_source", "recv", channel="ps:0", bytes=400, time=0.01),
               Op("ids", "compute", ("table_ids_source",), time=0.01),
               Op("gather", "recv", ("ids",), channel="ps:1", bytes=40000, time=0.05),
               Op("w", "recv", channel="ps:1", bytes=4000, time=0.02),
               Op("out", "compute", ("gather", "w"), time=0.02)])
    for seed in range(5):
        s = compute_order(g, algorithm, seed=seed)
        assert s.order.index("gather") > s.order.index("table_ids_source"), s.order
        # never listed ahead of it (a tie lets the gate hand back either first)
        assert s.priority["gather"] >= s.priority["table_ids_source"]
