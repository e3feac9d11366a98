"""The gate enforces, per destination, only the transfers that destination receives."""

import asyncio

from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.graph.tf.naming import worker_of

W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"


async def _step(gate, step, arrivals):
    """arrivals: [(dest, name)] in arrival order; each waits for its turn."""
    async def one(dest, name):
        t = gate.arrive(step, dest, name)
        turn = gate.request(t)
        if turn is not None:
            await turn
        await asyncio.sleep(0.001)
        gate.handed_back(t)
    await asyncio.gather(*(one(d, n) for d, n in arrivals))
    # records name the worker task (one worker is one task); keyed here by the device
    return {d: r for r in gate.records() if r["step_id"] == step
            for d in (W0, W1) if worker_of(d) == r["worker"]}


def test_each_tower_follows_its_own_order_without_waiting_for_the_others():
    async def main():
        gate = Gate(skip_after_s=0.2, finish_after_s=0.01)
        # Profiling: worker 0 receives tower0/*, worker 1 tower1/*.
        await _step(gate, 1, [(W0, "t0/a"), (W0, "t0/b"), (W1, "t1/a"), (W1, "t1/b")])
        await asyncio.sleep(0.05)  # the step is whole: what it served counts
        merged = Schedule.merged([Schedule.from_order("tic", ["t0/b", "t0/a"]),
                                  Schedule.from_order("tic", ["t1/a", "t1/b"])])
        result = gate.install(merged)
        assert result.expected == 4
        recs = await _step(gate, 2, [(W0, "t0/a"), (W1, "t1/b"), (W0, "t0/b"), (W1, "t1/a")])
        assert recs[W0]["order"] == ["t0/b", "t0/a"] and recs[W0]["skips"] == 0
        assert recs[W1]["order"] == ["t1/a", "t1/b"] and recs[W1]["skips"] == 0
    asyncio.run(main())


def test_a_destination_not_seen_before_the_install_enforces_everything_listed():
    async def main():
        gate = Gate(skip_after_s=0.05, presume_absent_after=0)
        gate.install(Schedule.from_order("tic", ["a", "b"]))
        recs = await _step(gate, 1, [(W0, "b"), (W0, "a")])
        assert recs[W0]["order"] == ["a", "b"]
    asyncio.run(main())


def test_a_destination_served_only_unlisted_names_enforces_everything_listed():
    async def main():
        gate = Gate(skip_after_s=0.05)
        await _step(gate, 1, [(W0, "a"), (W0, "b"), (W1, "init/poll")])
        gate.install(Schedule.from_order("tic", ["a", "b"]))
        recs = await _step(gate, 2, [(W1, "b"), (W1, "a")])
        assert recs[W1]["order"] == ["a", "b"] and recs[W1]["violations"] == 0
    asyncio.run(main())
