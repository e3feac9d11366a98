"""The makespan simulator and bounds on hand-computed cases."""

import math

import pytest

from graph_builders import random_dag
from tictac_hooks.graph import Graph, GraphError, Op, Schedule
from tictac_hooks.graph.algorithms import compute_order
from tictac_hooks.graph.simulate import bounds, channel_sequences, simulate


def test_two_channels_run_in_parallel():
    g = Graph([Op("a", "recv", channel="ps:0", time=2.0), Op("b", "recv", channel="ps:1", time=3.0),
               Op("c", "recv", channel="ps:0", time=1.0),
               Op("x", "compute", ("a", "b"), time=1.0), Op("y", "compute", ("x", "c"), time=2.0)])
    r = simulate(g, Schedule.from_order("x", ["a", "b", "c"]))
    # ps:0 sends a [0,2], c [2,3]; ps:1 sends b [0,3]; x [3,4]; y [4,6].
    assert r.recv_finish == {"a": 2.0, "b": 3.0, "c": 3.0}
    assert r.makespan == 6.0
    b = bounds(g)
    assert (b.upper, b.lower) == (9.0, 3.0)
    assert b.speedup == pytest.approx(2.0)
    assert r.efficiency == pytest.approx(0.5)


def test_compute_is_one_resource_first_come_first_served():
    g = Graph([Op("a", "recv", time=1.0), Op("b", "recv", time=1.0),
               Op("x", "compute", ("a",), time=5.0), Op("y", "compute", ("b",), time=1.0)])
    r = simulate(g, Schedule.from_order("s", ["a", "b"]))
    # x [1,6] holds the resource; y, ready at 2, runs [6,7].
    assert r.makespan == 7.0


def test_unlisted_transfers_go_first_in_random_order():
    g = Graph([Op(n, "recv", time=1.0) for n in "abcd"] + [Op("x", "compute", tuple("abcd"), time=0.0)])
    s = Schedule.from_order("s", ["c", "a"])
    seq = channel_sequences(g, s, seed=0)["ps:0"]
    names = [g.ops[i].name for i in seq]
    assert set(names[:2]) == {"b", "d"} and names[2:] == ["c", "a"]


def test_efficiency_is_between_zero_and_one_and_nan_when_nothing_to_gain():
    for seed in range(30):
        g = random_dag(seed, n_recvs=8, n_compute=20, channels=2)
        for alg in ("tic", "tac", "random", "first-use"):
            e = simulate(g, None if alg == "random" else compute_order(g, alg), seed=seed).efficiency
            assert 0.0 <= e <= 1.0 + 1e-12
    g = Graph([Op("a", "recv", time=1.0)])
    assert math.isnan(simulate(g).efficiency)
    assert simulate(g).to_json()["efficiency"] is None


def test_simulator_needs_times():
    with pytest.raises(GraphError, match="no time"):
        simulate(random_dag(0, timed=False))


def test_shared_default_splits_the_link_among_the_unfinished_transfers():
    # 1, 2 and 3 s alone: all three share the link until the first ends at 3 x 1 = 3;
    # the other two then share it, and b ends at 3 + 2 x 1 = 5, c alone at 5 + 1 = 6.
    g = Graph([Op("a", "recv", time=1.0), Op("b", "recv", time=2.0), Op("c", "recv", time=3.0),
               Op("x", "compute", ("a",), time=4.0), Op("y", "compute", ("x", "c"), time=1.0)])
    r = simulate(g, None, default="shared")
    assert r.recv_finish == {"a": 3.0, "b": 5.0, "c": 6.0}
    assert r.makespan == 8.0  # x [3, 7] after a; y [7, 8] after x and c
    # An order installed is served one at a time, whatever the default's model.
    s = Schedule.from_order("s", ["a", "b", "c"])
    assert simulate(g, s, default="shared").recv_finish == {"a": 1.0, "b": 3.0, "c": 6.0}
    # The serial default draws a random order; the shared one has no randomness.
    assert {simulate(g, None, seed=k, default="shared").makespan for k in range(5)} == {8.0}
    with pytest.raises(ValueError, match="default must be"):
        simulate(g, None, default="fifo")


def test_event_simulation_agrees_with_the_channel_one_where_recvs_have_no_inputs():
    """The event-by-event simulator (used for recvs with inputs) gives the same
    makespan as the precomputed channel sequences on graphs both can run."""
    import random

    from tictac_hooks.graph import simulate as sim
    from tictac_hooks.graph.dag import Op
    rng = random.Random(1)
    for _ in range(200):
        ops, names = [], []
        for i in range(rng.randint(1, 5)):
            ops.append(Op(f"r{i}", "recv", channel=f"ps:{rng.randint(0, 1)}", time=rng.random()))
            names.append(f"r{i}")
        for j in range(rng.randint(1, 6)):
            inputs = tuple(rng.sample(names, rng.randint(1, min(3, len(names)))))
            ops.append(Op(f"c{j}", "compute", inputs, time=rng.random()))
            names.append(f"c{j}")
        g = Graph(ops)
        order = Schedule.from_order("x", [o.name for o in g.recvs])
        fast = sim.simulate(g, order).makespan
        events = sim._simulate_events(g, [o.time for o in g.ops],
                                      sim.channel_sequences(g, order, 0), None).makespan
        assert events == pytest.approx(fast, abs=1e-12)


def test_a_recv_with_inputs_holds_its_channel_until_they_are_done():
    """A gather waits for the ids the worker computes; the gate serves in order, so
    listing it before a transfer that needs no input makes that one wait too."""
    from tictac_hooks.graph.dag import Op
    g = Graph([Op("r0", "recv", channel="ps:0", time=1.0),
               Op("ids", "compute", ("r0",), time=2.0),
               Op("gather", "recv", ("ids",), channel="ps:0", time=1.0),
               Op("r1", "recv", channel="ps:0", time=1.0),
               Op("out", "compute", ("gather", "r1"), time=0.5)])
    early = simulate(g, Schedule.from_order("x", ["r0", "gather", "r1"]))
    late = simulate(g, Schedule.from_order("x", ["r0", "r1", "gather"]))
    assert early.recv_finish["gather"] == 4.0 and early.recv_finish["r1"] == 5.0
    assert early.makespan == 5.5 and late.makespan == 4.5
