"""The gate's look-ahead window: small scheduled transfers go to the PS back to back,
in schedule order, instead of one PS round trip each; large ones still go alone."""

import asyncio

import pytest

from tictac_hooks.checks import check_window
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.schedule import Schedule

DEST = "/job:worker/replica:0/task:0/device:CPU:0"
SIZES = {"a": 10, "b": 10, "c": 10, "big": 1000, "d": 10}
ORDER = ["a", "b", "c", "big", "d"]


def _learn_sizes(gate, step=1):
    """One strict step in which every response completes with its size."""
    for name in ORDER:
        t = gate.arrive(step, DEST, name)
        assert gate.request(t) is None
        gate.handed_back(t)
        t.nbytes = SIZES[name]
        gate.completed(t)


def _arrive_all(gate, step, names):
    tickets, futures = {}, {}
    for name in names:
        tickets[name] = t = gate.arrive(step, DEST, name)
        futures[name] = gate.request(t)
    return tickets, futures


def _released(futures):
    return {n for n, f in futures.items() if f is None or f.done()}


def test_small_transfers_go_together_in_order_large_ones_alone():
    async def main():
        gate = Gate(skip_after_s=5.0, window_bytes=100)
        gate.install(Schedule.from_order("test", ORDER))
        _learn_sizes(gate)
        tickets, futures = _arrive_all(gate, 2, list(reversed(ORDER)))
        await asyncio.sleep(0)
        # a, b and c (30 bytes) are all with the PS before any of them is answered;
        # big (1000 > window) waits for its turn, and d waits behind big.
        assert _released(futures) == {"a", "b", "c"}
        for name in ("c", "b", "a"):  # the PS answers them in reverse
            gate.handed_back(tickets[name])
        await asyncio.sleep(0)
        assert _released(futures) == {"a", "b", "c", "big"}
        gate.handed_back(tickets["big"])  # d (10) fits, but not beside big in flight
        await asyncio.sleep(0)
        assert _released(futures) == set(ORDER)
        gate.handed_back(tickets["d"])
        rec = gate.records()[-1]
        assert rec["order"] == ["c", "b", "a", "big", "d"]
        assert rec["reordered"] == 2 and rec["violations"] == 0 and rec["skips"] == 0
        released = sorted(rec["transfers"], key=lambda t: t["release_seq"])
        assert [t["name"] for t in released] == ORDER  # sent to the PS in schedule order
        assert rec["complete"]
    asyncio.run(main())


def test_window_never_skips_ahead_of_a_transfer_that_has_not_arrived():
    async def main():
        gate = Gate(skip_after_s=5.0, window_bytes=100)
        gate.install(Schedule.from_order("test", ORDER))
        _learn_sizes(gate)
        tickets, futures = _arrive_all(gate, 2, ["b", "c"])  # a not requested yet
        await asyncio.sleep(0)
        assert _released(futures) == set()
        more, more_futures = _arrive_all(gate, 2, ["a"])
        futures.update(more_futures)
        await asyncio.sleep(0)
        assert _released(futures) == {"a", "b", "c"}
    asyncio.run(main())


def test_zero_window_and_unknown_sizes_are_strict():
    async def main():
        for window, learn in ((0, True), (100, False)):
            gate = Gate(skip_after_s=5.0, window_bytes=window)
            gate.install(Schedule.from_order("test", ORDER))
            if learn:
                _learn_sizes(gate)
            tickets, futures = _arrive_all(gate, 2, list(reversed(ORDER)))
            await asyncio.sleep(0)
            assert _released(futures) == {"a"}, (window, learn)
            for i, name in enumerate(ORDER):
                gate.handed_back(tickets[name])
                await asyncio.sleep(0)
                assert _released(futures) == set(ORDER[:i + 2]), (window, learn)
            rec = gate.records()[-1]
            assert rec["order"] == ORDER and rec["reordered"] == 0
    asyncio.run(main())


def test_window_shrinks_as_answers_come_back():
    async def main():
        gate = Gate(skip_after_s=5.0, window_bytes=25)  # two small ones at a time
        gate.install(Schedule.from_order("test", ORDER))
        _learn_sizes(gate)
        tickets, futures = _arrive_all(gate, 2, ORDER)
        await asyncio.sleep(0)
        assert _released(futures) == {"a", "b"}
        gate.handed_back(tickets["a"])
        await asyncio.sleep(0)
        assert _released(futures) == {"a", "b", "c"}
        assert gate.summary()["window_bytes"] == 25
    asyncio.run(main())


@pytest.mark.parametrize("bad", [-1, 1.5, "1", True, None])
def test_bad_window_is_rejected(bad):
    with pytest.raises(ValueError, match="window_bytes"):
        check_window(bad)
    with pytest.raises(ValueError, match="window_bytes"):
        Gate(window_bytes=bad)


def test_flag_default_is_the_gate_default():
    from tictac_hooks import flags
    from tictac_hooks.enforce.gate import DEFAULT_WINDOW_BYTES
    assert flags.DEFAULTS["window_bytes"] == DEFAULT_WINDOW_BYTES == Gate().window_bytes


def test_a_tensor_sent_twice_is_ordered_by_its_full_names():
    """Two copies of one sending node in a step (two partition edges): once both were
    seen their full names are served, and a schedule naming them orders each copy."""
    async def main():
        gate = Gate(skip_after_s=5.0, window_bytes=0)
        for name, tensor in (("k", "edge_9_k"), ("k", "edge_3_k"), ("b", "edge_4_b")):
            t = gate.arrive(1, DEST, name, tensor)
            assert gate.request(t) is None
            gate.handed_back(t)
        assert {"edge_3_k", "edge_9_k", "k", "b"} <= set(gate.served_names())
        assert "edge_4_b" not in gate.served_names()  # sent once: its node name is enough
        gate.install(Schedule.from_order("test", ["edge_3_k", "b", "edge_9_k"]))
        tickets, futures = {}, {}
        for name, tensor in (("k", "edge_9_k"), ("b", "edge_4_b"), ("k", "edge_3_k")):
            t = gate.arrive(2, DEST, name, tensor)
            tickets[t.name], futures[t.name] = t, gate.request(t)
        assert set(tickets) == {"edge_9_k", "b", "edge_3_k"}
        await asyncio.sleep(0)
        assert _released(futures) == {"edge_3_k"}
        for name in ("edge_3_k", "b", "edge_9_k"):
            gate.handed_back(tickets[name])
            await asyncio.sleep(0)
        rec = gate.records()[-1]
        assert rec["order"] == ["edge_3_k", "b", "edge_9_k"] and rec["violations"] == 0
    asyncio.run(main())


def test_steplog_judges_the_order_transfers_were_sent_in():
    from tictac_hooks.run.steplog import _Pending

    from tictac_hooks.records import GateStep

    def rec(transfers, **kw):
        full = [dict(t, bytes=8, arrive=1.0, release=1.0, handback=2.0) for t in transfers]
        step = {"step_id": 1, "worker": DEST, "schedule_version": 1, "algorithm": "tic",
                "complete": True, "order": [t["name"] for t in transfers],
                "transfers": full, "bytes": 8 * len(full), "start": 1.0, "end": 2.0,
                "skipped": [], "skips": 0, "violations": 0, "reordered": 0, "unlisted": [],
                **kw}
        return _Pending({"ps:0": GateStep.from_json(step)})
    sent_in_order = [  # answered b, a (window), sent a, b
        {"name": "b", "state": "listed", "priority": 1, "release_seq": 8},
        {"name": "a", "state": "listed", "priority": 0, "release_seq": 7},
        {"name": "x", "state": "pass", "priority": -1, "release_seq": 1}]
    assert rec(sent_in_order).followed_order()
    sent_out_of_order = [dict(t, release_seq=s) for t, s in zip(sent_in_order, (7, 8, 1))]
    assert not rec(sent_out_of_order).followed_order()
    assert not rec(sent_in_order, skips=1).followed_order()
