"""The ordering gate on its own: fast, no TensorFlow, no sockets."""

import asyncio

import pytest

from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.graph.tf.naming import parse_rendezvous_key

DEST = "/job:worker/replica:0/task:0/device:CPU:0"


def test_parse_rendezvous_key():
    key = ("/job:ps/replica:0/task:0/device:CPU:0;abc123;" + DEST +
           ";edge_74_sequential/d1/MatMul/ReadVariableOp;0:0")
    assert parse_rendezvous_key(key) == ("sequential/d1/MatMul/ReadVariableOp", DEST,
                                         "edge_74_sequential/d1/MatMul/ReadVariableOp")


async def _run(gate, step, arrivals, delay=0.0):
    """Each name arrives (in ``arrivals`` order), waits for its turn, is handed back."""
    async def one(name):
        t = gate.arrive(step, DEST, name)
        turn = gate.request(t)
        if turn is not None:
            await turn
        await asyncio.sleep(delay)
        gate.handed_back(t)
    await asyncio.gather(*(one(n) for n in arrivals))
    return gate.records()[-1]


def test_hand_back_follows_schedule_whatever_the_arrival_order():
    async def main():
        gate = Gate(skip_after_s=1.0)
        gate.install(Schedule.from_order("test", ["a", "b", "c", "d"]))
        rec = await _run(gate, 1, ["d", "c", "b", "a"], delay=0.001)
        assert rec["order"] == ["a", "b", "c", "d"] and rec["skips"] == 0
        assert rec["complete"]
    asyncio.run(main())


def test_unlisted_pass_straight_through_and_no_schedule_records_order():
    async def main():
        gate = Gate()
        rec = await _run(gate, 1, ["x", "y"])
        assert sorted(rec["order"]) == ["x", "y"] and rec["schedule_version"] is None
        gate.install(Schedule.from_order("test", ["x", "y"]))
        rec = await _run(gate, 2, ["y", "z", "x"], delay=0.001)
        assert [n for n in rec["order"] if n != "z"] == ["x", "y"]
        assert rec["unlisted"] == ["z"]
    asyncio.run(main())


def test_missing_transfer_is_skipped_counted_and_then_presumed_absent():
    async def main():
        gate = Gate(skip_after_s=0.05, presume_absent_after=2)
        gate.install(Schedule.from_order("test", ["a", "ghost", "b"]))
        loop = asyncio.get_running_loop()
        times = []
        for step in range(4):
            t0 = loop.time()
            rec = await _run(gate, step, ["b", "a"])
            times.append(loop.time() - t0)
            assert rec["order"] == ["a", "b"]
            assert [s["name"] for s in rec["skipped"]] == ["ghost"]
        assert times[0] >= 0.05 and times[-1] < 0.04  # learned: no more waiting
        assert gate.totals["skipped"] == 4
    asyncio.run(main())


def test_ties_go_together_and_late_arrival_after_skip_is_a_violation():
    async def main():
        gate = Gate(skip_after_s=0.05, presume_absent_after=0)
        gate.install(Schedule("t", ("a", "b", "c"), {"a": 0, "b": 0, "c": 2}))
        rec = await _run(gate, 1, ["c", "b", "a"])
        assert rec["order"][-1] == "c" and set(rec["order"][:2]) == {"a", "b"}
        # "a" comes only after the bound: c goes first, a is late.
        async def late_a():
            await asyncio.sleep(0.15)
            t = gate.arrive(2, DEST, "a")
            assert gate.request(t) is None
            gate.handed_back(t)
        await asyncio.gather(_run(gate, 2, ["c", "b"]), late_a())
        rec = next(r for r in gate.records() if r["step_id"] == 2)
        assert rec["order"] == ["b", "c", "a"] and rec["violations"] == 1
    asyncio.run(main())


def test_a_step_runs_wholly_under_the_schedule_of_its_first_transfer():
    async def main():
        gate = Gate(skip_after_s=1.0)
        gate.install(Schedule.from_order("first", ["a", "b"]))
        t = gate.arrive(7, DEST, "b")
        turn = gate.request(t)
        assert turn is not None
        gate.install(Schedule.from_order("second", ["b", "a"]))
        ta = gate.arrive(7, DEST, "a")
        assert gate.request(ta) is None
        gate.handed_back(ta)
        await turn
        gate.handed_back(t)
        rec = gate.records()[-1]
        assert rec["algorithm"] == "first" and rec["order"] == ["a", "b"]
    asyncio.run(main())


def test_memory_is_bounded_over_many_steps():
    async def main():
        gate = Gate(max_active_steps=8, history=16)
        gate.install(Schedule.from_order("t", ["a", "b"]))
        for step in range(5000):
            await _run(gate, step, ["b", "a"])
        assert len(gate._steps) <= 8 and len(gate.records(include_active=False)) <= 16
    asyncio.run(main())


def test_install_reports_names_this_ps_never_served():
    async def main():
        gate = Gate(finish_after_s=0.01)
        await _run(gate, 1, ["a", "b"])
        await asyncio.sleep(0.05)  # the step is whole: what it served counts
        r = gate.install(Schedule.from_order("t", ["a", "nope"]))
        assert r.expected == 1 and r.unmatched == ("nope",) and r.served == 2
    asyncio.run(main())


def test_half_a_step_does_not_restrict_the_install():
    """A step still running at the install (a PS restarted mid-step, a worker's first
    step) has served part of its names: the install expects every listed name, so the
    rest of the step is not unexpected for as long as the install holds."""
    async def main():
        gate = Gate(finish_after_s=0.01)
        ticket = gate.arrive(1, DEST, "a")  # "b" still to come
        assert gate.request(ticket) is None
        r = gate.install(Schedule.from_order("t", ["a", "b"]))
        assert r.expected == 2 and r.unmatched == () and r.served == 1
        rec = await _run(gate, 2, ["b", "a"])
        assert rec["order"] == ["a", "b"] and rec["violations"] == 0, rec
    asyncio.run(main())


def test_skip_bound_must_be_positive():
    with pytest.raises(ValueError, match="skip_after_s"):
        Gate(skip_after_s=0)
