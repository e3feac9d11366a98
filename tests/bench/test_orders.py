"""bench/orders.py: what the profiling phase measures for the orders (the settled step
time, the bytes each PS served a worker), with stand-ins for the cluster (no TensorFlow)."""

from __future__ import annotations

import dataclasses
import statistics

from .results import gate_step


def test_compute_is_measured_once_the_step_time_has_settled():
    from tictac_hooks.bench.orders import settled_makespans
    # Start-up steps (allocation, kernel selection) are slow; the median of three
    # settles at 1.0 and is what counts.
    times = iter([3.0, 2.0, 1.6, 1.2, 1.0, 1.0, 1.0, 1.01, 0.99, 1.0, 1.0])
    assert settled_makespans(lambda: next(times), 3, steps=11) == [0.99, 1.0, 1.0]
    # A plateau on the way down does not end it: the lower level counts.
    plateau = iter([3.0, 1.3, 1.3, 1.3, 1.3, 1.3, 1.0, 1.0, 1.0, 1.0])
    assert settled_makespans(lambda: next(plateau), 2, steps=10) == [1.0, 1.0]
    # A slow spike after settling does not count; one fast step alone does not either.
    spiky = iter([1.0, 1.0, 1.0, 1.6, 1.7, 0.2, 1.9, 1.8])
    assert statistics.median(settled_makespans(lambda: next(spiky), 3, steps=8)) == 1.0
    # The number of steps: as asked, and at least two windows.
    calls = []
    assert settled_makespans(lambda: calls.append(1) or 1.0, 5, steps=4) == [1.0] * 5
    assert len(calls) == 10


def test_comm_bytes_are_what_each_ps_served_a_worker_per_step():
    from tictac_hooks.bench.orders import served_bytes_per_ps
    base = gate_step(["a"], violations=0, skips=0, version=None)
    recs = [dataclasses.replace(base, ps=ps, step_id=s, bytes=b)
            for ps, s, b in (("p0", 1, 100), ("p0", 2, 120), ("p0", 3, 90), ("p1", 1, 40),
                             ("p1", 2, 0))]  # a step with nothing served does not count
    assert served_bytes_per_ps(recs, ["p0", "p1"]) == [100.0, 40.0]
    assert served_bytes_per_ps(recs, ["p0", "p1", "p2"]) is None  # p2 recorded nothing
