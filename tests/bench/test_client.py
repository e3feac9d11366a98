"""bench/client.py: the block rotation and the calibration blocks, with stand-ins for
the cluster (no TensorFlow); the settling and the served bytes are test_orders.py's."""

from __future__ import annotations

import dataclasses

import pytest

from tictac_hooks.records import ClientStep

from .results import gate_step


def test_rotation_balances_positions():
    from tictac_hooks.bench.client import _rotation
    names = ["none", "rendezvous", "tic"]
    assert _rotation(names, 0) == ["none", "rendezvous", "tic"]
    assert _rotation(names, 1) == ["none", "tic", "rendezvous"]
    firsts = {_rotation(names, r)[0] for r in range(6)}
    assert firsts == set(names)


def test_calibration_blocks_measure_the_fast_link_and_the_compute_in_the_rounds(monkeypatch):
    from tictac_hooks.bench import client
    asked = []
    monkeypatch.setattr(client, "_ask", lambda event: asked.append(event) or "shaped")

    class Runner:  # steps of 1.1, 1.2, ... s over the link, 0.5 s with no transfer
        def __init__(self):
            self.calls = []

        def step(self, which):
            self.calls.append(("step", which))
            return ClientStep("", 1.0 + 0.1 * len(self.calls), ())

        def compute_step(self):
            self.calls.append(("compute", None))
            return ClientStep("", 0.5, ())
    cfg = {"shaped": True, "profile_rate_bits": 1e11, "settle_steps": 1, "block_steps": 3}
    r = Runner()
    fast = client._calibration_block(cfg, r, client.FAST_LINK, 2e9)
    # the link goes to the profiling rate for the block and back to the run's rate; the
    # settle step is not measured
    assert asked == [{"event": "reshape", "rate_bits": 1e11},
                     {"event": "reshape", "rate_bits": 2e9}]
    assert fast == pytest.approx([1.2, 1.3, 1.4]) and r.calls == [("step", 0)] * 4
    asked.clear()
    assert client._calibration_block(cfg, r, client.NO_TRANSFER, 2e9) == [0.5] * 3
    assert not asked  # the compute reference moves nothing: no reshape
    # a failing step still gives the link back its rate
    r.step = lambda which: 1 / 0
    with pytest.raises(ZeroDivisionError):
        client._calibration_block(cfg, r, client.FAST_LINK, 2e9)
    assert asked[-1] == {"event": "reshape", "rate_bits": 2e9}
    asked.clear()
    client._calibration_block(dict(cfg, shaped=False), Runner(), client.FAST_LINK, 2e9)
    assert not asked  # loopback: nothing to reshape
    # the medians the simulator gets, and none without both kinds of block
    got = client.in_run_compute({client.FAST_LINK: [0.3, 0.1, 0.2],
                                 client.NO_TRANSFER: [0.05, 0.07]})
    assert got.fast_link_s == pytest.approx(0.2) and got.compute_s == pytest.approx(0.06)
    assert client.in_run_compute({client.FAST_LINK: [0.3], client.NO_TRANSFER: []}) is None


def test_bytes_per_transfer_names_each_edge_of_a_tensor_sent_over_two():
    from tictac_hooks.records import TransferRecord, bytes_per_transfer
    def rec(step, *sizes):
        return dataclasses.replace(
            gate_step([], violations=0, skips=0, version=None), step_id=step,
            transfers=tuple(TransferRecord(n, "pass", -1, b, 0.0, 0.0, -1, 0.0,
                                           tensor=tensor)
                            for n, b, tensor in sizes))
    records = [
        # an older gate, no order installed: both edges of "w" under its node name
        rec(1, ("w", 400, ""), ("w", 8, ""), ("v", 100, "")),
        # an order naming the edges: the gate records each by its own name
        rec(2, ("edge_1_w", 400, ""), ("edge_2_w", 8, ""), ("v", 120, ""), ("other", 5, "")),
        rec(3, ("edge_1_w", 402, ""), ("edge_2_w", 8, ""), ("v", 110, "")),
    ]
    names = ["edge_1_w", "edge_2_w", "v", "absent"]
    assert bytes_per_transfer(records, names) == {"edge_1_w": 401.0, "edge_2_w": 8.0,
                                                  "v": 110.0}
    assert bytes_per_transfer(records[:1], ["w"]) == {}  # ambiguous in every step
    # no order installed, the gate saying which edge each copy was
    profiled = [rec(4, ("w", 398, "edge_1_w"), ("w", 8, "edge_2_w"), ("v", 100, ""))]
    assert bytes_per_transfer(profiled) == {"edge_1_w": 398.0, "edge_2_w": 8.0, "v": 100.0}
    # an errored call says nothing about its size
    failed = [dataclasses.replace(profiled[0], transfers=(
        dataclasses.replace(profiled[0].transfers[0], error="CANCELLED"),))]
    assert bytes_per_transfer(failed) == {}


def test_steps_in_one_turn_counts_the_steps_whose_workers_share_a_turn():
    from tictac_hooks.bench.client import steps_in_one_turn
    from tictac_hooks.records import GateStep

    def rec(step, worker, turn, ps="ps0"):
        return GateStep(step, f"/job:worker/replica:0/task:{worker}", 1, "tic", True, (), (),
                        0, 0.0, 0.0, (), 0, 0, 0, (), ps=ps, turn=turn)
    records = [rec(1, 0, 5), rec(1, 1, 5), rec(2, 0, 6), rec(2, 1, 7), rec(3, 0, 8),
               rec(1, 0, 2, ps="ps1"), rec(1, 1, 2, ps="ps1"), rec(4, 0, -1), rec(4, 1, -1)]
    assert steps_in_one_turn(records) == (2, 3)  # step 3: one worker; step 4: no turns


def test_a_step_that_waits_for_something_lost_ends_with_a_clear_error(monkeypatch):
    """A real TensorFlow session whose step waits forever (a dequeue from a queue no one
    fills, as a step waits for a lost transfer): the bench's step gives up after
    STEP_TIMEOUT_S with StepHung instead of hanging the run; a step that finishes is
    timed as before."""
    import time

    import tensorflow as tf

    from tictac_hooks.bench import client
    monkeypatch.setattr(client, "STEP_TIMEOUT_S", 1)
    graph = tf.Graph()
    with graph.as_default():
        queue = tf.queue.FIFOQueue(1, tf.float32)
        stamp = tf.timestamp()
        lost = [queue.dequeue(), stamp]
        done = [tf.constant(1.0), stamp]
    runner = object.__new__(client.Runner)
    runner.tf = tf

    @dataclasses.dataclass
    class Towers:
        fetches: list
        num_timestamps: int = 1
    with tf.compat.v1.Session(graph=graph) as session:
        step = runner._run(Towers(done), session)
        assert 0 <= step.step_time < 5 and len(step.finishes) == 1
        t0 = time.monotonic()
        with pytest.raises(client.StepHung, match=r"did not finish within 1 s"):
            runner._run(Towers(lost), session)
        assert time.monotonic() - t0 < 30
        # a traced step (the profile's) is bounded the same way, and still traced
        trace = tf.compat.v1.RunMetadata()
        runner._session_run(session, done, trace=trace)
        assert trace.step_stats.dev_stats and trace.partition_graphs
        with pytest.raises(client.StepHung):
            runner._session_run(session, lost, trace=tf.compat.v1.RunMetadata())
