"""The planner (run/planner.py): a worker DAG restricted to the transfers the PSes
served, named as they serve them; TAC's times and their errors; the per-worker parts
of a candidate; and the per-PS install plan, installed on in-process gates."""

import pytest

from tictac_hooks.run import planner
from tictac_hooks.run.settings import TicTacSetupError
from tictac_hooks.enforce import inprocess
from tictac_hooks.enforce.client import InstallError
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.graph.schedule import Schedule, ScheduleError

PS0, PS1 = "127.0.0.1:61201", "127.0.0.1:61202"
LOOP_READ = "while/body/while/dense/MatMul/ReadVariableOp"     # as traced
LOOP_SERVED = "while/body/_1/while/dense/MatMul/ReadVariableOp"  # as the PS serves it


def two_ps_graph() -> Graph:
    """Reads on ps:0 (w0, w1, a tensor sent over an edge, a loop body's read) and ps:1
    (v0, v1); ``late`` is read after the step's update; ``local`` never leaves its PS."""
    recvs = [Op("w0", "recv", channel="ps:0", bytes=100),
             Op("w1", "recv", channel="ps:0", bytes=200),
             Op("edge_7_emb", "recv", channel="ps:0", bytes=300),
             Op(LOOP_READ, "recv", channel="ps:0", bytes=50),
             Op("v0", "recv", channel="ps:1", bytes=400),
             Op("v1", "recv", channel="ps:1", bytes=10),
             Op("late", "recv", channel="ps:1", bytes=5),
             Op("local", "recv", channel="ps:1", bytes=7)]
    compute = [Op("l0", "compute", ("w0", "v0", "edge_7_emb")),
               Op("l1", "compute", ("l0", "w1", "v1", LOOP_READ)),
               Op("upd", "compute", ("l1", "late", "local"))]
    return Graph(recvs + compute)


SERVED = {"w0", "w1", "emb", LOOP_SERVED, "v0", "v1", "late"}


def test_the_dag_keeps_only_served_recvs_named_as_the_ps_serves_them():
    g = planner.received_only(two_ps_graph(), SERVED, late={"late"})
    assert {op.name for op in g.recvs} == {"w0", "w1", "edge_7_emb", LOOP_SERVED, "v0",
                                           "v1"}
    # Unserved and late reads stay in the DAG as free compute ops (no transfer).
    assert g["local"].kind == "compute" and g["late"].kind == "compute"
    assert g["local"].time == 0.0
    # The loop body's read is renamed to the PS's name, its consumer follows it.
    assert LOOP_SERVED in g["l1"].inputs and LOOP_READ not in g
    # Nothing served yet (nothing profiled): every read but the late ones.
    g = planner.received_only(two_ps_graph(), set(), late={"late"})
    assert len(g.recvs) == 7 and g["late"].kind == "compute"


def test_a_dag_sharing_no_name_with_what_was_served_is_an_error_naming_both():
    with pytest.raises(ScheduleError, match=r"none of the 2 transfers the PSes served "
                                            r"while profiling \(e\.g\. 'other/a'\).*8 reads"):
        planner.received_only(two_ps_graph(), {"other/a", "other/b"}, set())


def test_why_a_served_transfer_is_not_in_the_order():
    why = planner.why_unlisted({"worker": two_ps_graph()}, {"late"})
    assert "after work of the same step" in why("late")
    assert "did not serve while profiling" in why("local")
    assert "did not serve while profiling" in why(LOOP_SERVED)  # canonical: the loop read
    assert "not a parameter read of the traced step" in why("global_step")


def test_tac_times_recvs_by_served_bytes_and_link_rate_and_compute_by_profile():
    g = planner.received_only(two_ps_graph(), SERVED, {"late"})
    timed = planner.timed(g, {"l0": 1.0, "l1": 2.0}, link_rate=100.0,
                          served_bytes={"w0": 50})
    assert timed["w0"].time == pytest.approx(0.5)    # served bytes win over traced
    assert timed["v0"].time == pytest.approx(4.0)    # traced bytes where none served
    assert (timed["l0"].time, timed["l1"].time, timed["upd"].time) == (1.0, 2.0, 0.0)


def test_tac_without_what_it_needs_is_a_setup_error_saying_what_is_missing():
    g = planner.received_only(two_ps_graph(), SERVED, {"late"})
    with pytest.raises(TicTacSetupError, match=r"no compute profile \(it timed out\)"):
        planner.timed(g, None, 100.0, {}, compute_profile_error="it timed out")
    with pytest.raises(TicTacSetupError, match="none were profiled"):
        planner.timed(g, None, 100.0, {})
    with pytest.raises(TicTacSetupError, match="no bandwidth was given"):
        planner.timed(g, {}, None, {})
    sizeless = Graph([Op("a", "recv", channel="ps:0"), Op("c", "compute", ("a",))])
    with pytest.raises(TicTacSetupError, match="size of every transfer; unknown for 'a'"):
        planner.timed(sizeless, {}, 100.0, {})


def test_parts_are_one_restricted_ordered_dag_per_worker():
    graphs = {"worker:0": two_ps_graph(), "worker:1": two_ps_graph()}
    parts = planner.parts_for("tic", graphs, None, SERVED, {"late"})
    assert len(parts) == 2
    for graph, schedule in parts:
        assert schedule.algorithm == "tic"
        assert set(schedule.order) == {op.name for op in graph.recvs}
        assert "local" not in schedule.order and "late" not in schedule.order
    assert planner.merged(parts[:1]) is parts[0][1]
    assert set(planner.merged(parts).order) == set(parts[0][1].order)
    tac = planner.parts_for("tac", graphs, {"l0": 1.0}, SERVED, {"late"}, 100.0, {})
    assert tac[0][1].algorithm == "tac" and tac[0][0].has_times
    with pytest.raises(TicTacSetupError):
        planner.parts_for("tac", graphs, None, SERVED, {"late"}, 100.0, {})
    assert planner.compute_seconds(tac[0][0], {"l0": 1.0, "l1": 0.5, "x": 9.0}) == 1.5


def test_orders_of_a_candidate_and_the_error_naming_those_computed():
    parts = planner.parts_for("tic", {"w": two_ps_graph()}, None, SERVED, {"late"})
    assert planner.orders({"tic": parts}, "tic") == parts
    with pytest.raises(KeyError, match=r"no 'tac' order was computed \(computed: \['tic'\]"):
        planner.orders({"tic": parts}, "tac")
    with pytest.raises(KeyError, match="none yet"):
        planner.orders({}, "tic")


def test_each_ps_gets_its_own_transfers_in_the_order_re_ranked():
    parts = planner.parts_for("tic", {"w": two_ps_graph()}, None, SERVED, {"late"})
    plan = planner.per_ps(parts, [PS0, PS1])
    assert set(plan) == {PS0, PS1}
    assert set(plan[PS0].order) == {"w0", "w1", "edge_7_emb", LOOP_SERVED}
    assert set(plan[PS1].order) == {"v0", "v1"}
    order = parts[0][1].order
    for schedule in plan.values():  # each PS: the worker's order, restricted
        assert list(schedule.order) == [n for n in order if n in schedule.order]
        assert min(schedule.priority.values()) == 0
    # A PS the order has no transfer on gets nothing; a channel past the cluster or
    # not a PS task is an error.
    only_ps1 = planner.parts_for("tic", {"w": two_ps_graph()}, None, {"v0", "v1"}, {"late"})
    assert set(planner.per_ps(only_ps1, [PS0, PS1])) == {PS1}
    with pytest.raises(ScheduleError, match="names channel 'ps:1' but the cluster has 1 PS"):
        planner.per_ps(parts, [PS0])
    bad = Graph([Op("a", "recv", channel="worker:0", bytes=1)])
    with pytest.raises(ScheduleError, match="'worker:0' is not a PS task"):
        planner.per_ps([(bad, Schedule("tic", ("a",), {"a": 0}))], [PS0])


def test_install_puts_each_ps_plan_on_its_gate_all_or_nothing():
    gates = {PS0: Gate(skip_after_s=5.0, window_bytes=0),
             PS1: Gate(skip_after_s=5.0, window_bytes=0)}
    parts = planner.parts_for("tic", {"w": two_ps_graph()}, None, SERVED, {"late"})
    with inprocess.serve_in_process(PS0, gates[PS0]), \
            inprocess.serve_in_process(PS1, gates[PS1]):
        assert planner.install(parts, [PS0, PS1], skip_after_s=3.0, window_bytes=0) == [PS0, PS1]
        plan = planner.per_ps(parts, [PS0, PS1])
        for address, gate in gates.items():
            assert gate.summary()["algorithm"] == "tic"
            assert gate.skip_after_s == 3.0
            assert set(gate._installed.schedule.order) == set(plan[address].order)
        # A setting the in-process backend cannot honour: refused before any PS changed.
        versions = {a: g.schedule_version for a, g in gates.items()}
        with pytest.raises(InstallError, match="cannot honour pace_rate"):
            planner.install(parts, [PS0, PS1], 3.0, 0, pace_rate=1e6)
        assert {a: g.schedule_version for a, g in gates.items()} == versions


def test_a_fresh_ps_beside_others_is_not_given_the_names_they_serve():
    """`tictac schedule install` on a PS that has served nothing yet (restarted) beside
    PSes that have: it would wait the skip bound on each of their names, every step
    until presumed absent. It gets the others' names left out."""
    from tictac_hooks.enforce.client import install_everywhere
    import time
    gates = {PS0: Gate(skip_after_s=5.0, window_bytes=0, finish_after_s=0.01),
             PS1: Gate(skip_after_s=5.0, window_bytes=0)}
    with inprocess.serve_in_process(PS0, gates[PS0]), \
            inprocess.serve_in_process(PS1, gates[PS1]):
        with inprocess.gate_lock(PS0):
            ticket = gates[PS0].arrive(1, "/job:worker/replica:0/task:0", "v0")
            gates[PS0].request(ticket)
            ticket.nbytes = 8
            gates[PS0].completed(ticket)
            gates[PS0].handed_back(ticket)
        time.sleep(0.05)  # PS0's step is whole
        results = install_everywhere([PS0, PS1], Schedule.from_order("tic", ["v0", "v1"]))
    assert gates[PS1]._installed.schedule.order == ("v1",)
    assert results[PS1].expected == 1 and results[PS0].expected == 1
