"""run/steplog.py: the PSes' step records merged into each worker's steps."""

from __future__ import annotations

import pytest

from tictac_hooks.run.steplog import StepLog
from tictac_hooks.records import (CHECK, LISTED, PASS, PROFILING, SCHEDULED, GateStep,
                                  TransferRecord)

W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"
CHIEF = "/job:chief/replica:0/task:0/device:CPU:0"


def rec(step_id, start, worker=W0, ps="ps:0", seq=0, names=("a", "b"), version=None,
        priorities=None, iteration=0, dead=False, violations=0):
    priorities = priorities or list(range(len(names)))
    transfers = tuple(
        TransferRecord(n, LISTED if version is not None else PASS,
                       p if version is not None else -1, 100, start, start + 0.001,
                       i, start + 0.002 + 0.001 * i, dead=dead)
        for i, (n, p) in enumerate(zip(names, priorities)))
    return GateStep(step_id=step_id, worker=worker, schedule_version=version,
                    algorithm="tic" if version is not None else None, complete=True,
                    order=tuple(names), transfers=transfers, bytes=100 * len(names),
                    start=start, end=start + 0.01, skipped=(), skips=0,
                    violations=violations, reordered=0, unlisted=(), ps=ps,
                    iteration=iteration, worker_seq=seq)


def finalize(log, everything=False):
    return log.finalize(lambda a, b: 0.0, lambda step, t: None, everything)


def test_a_step_is_its_records_at_every_ps_and_lasts_until_the_next():
    log = StepLog()
    log.add([rec(1, 10.0, ps="ps:0", seq=1), rec(1, 10.2, ps="ps:1", seq=1),
             rec(2, 11.0, ps="ps:0", seq=2), rec(2, 11.1, ps="ps:1", seq=2),
             rec(3, 12.5, ps="ps:0", seq=3)])
    steps = finalize(log)  # the latest has no successor yet: it waits
    assert [(s.step, s.start, s.phase) for s in steps] == [(0, 10.0, PROFILING),
                                                           (1, 11.0, PROFILING)]
    assert steps[0].step_time == pytest.approx(1.0) and steps[1].step_time == pytest.approx(1.5)
    assert finalize(log) == []  # each step is handed out once
    (last,) = finalize(log, everything=True)
    assert last.step == 2 and last.step_time is None
    summary = log.summary()["workers"][W0]
    # step 0 (start-up) and the last step are not in the medians; step 1 is
    assert summary["steps"] == 3 and summary["profiling_steps"] == 1
    assert summary["excluded"] == {"first_step": 1, "last_step": 1}
    assert summary["profiling_median_step_time"] == pytest.approx(1.5)
    assert log.totals() == (3, 0, 0)


def test_lost_records_are_a_gap_never_a_step_time():
    log = StepLog()
    # Records 3 and 4 of this worker at the PS were let go before they were read.
    log.add([rec(1, 1.0, seq=1), rec(2, 2.0, seq=2), rec(5, 5.0, seq=5), rec(6, 6.0, seq=6)])
    steps = finalize(log, everything=True)
    assert [s.step for s in steps] == [0, 1, 4, 5]  # the gap keeps its numbers
    assert steps[1].step_time is None  # no interval drawn across the gap
    assert steps[2].step_time == pytest.approx(1.0)
    assert log.gaps[W0] == 2
    assert log.totals() == (4, 2, 0)
    assert log.summary()["workers"][W0]["missing"] == 2
    assert log.summary()["workers"][W0]["excluded"]["before_gap"] == 1


def test_a_loops_dead_exit_iteration_is_no_step_and_no_gap():
    log = StepLog()
    log.add([rec(1, 1.0, seq=1, iteration=0), rec(1, 1.5, seq=2, iteration=1),
             rec(1, 1.9, seq=3, iteration=2, dead=True),  # the loop's exit
             rec(2, 2.0, seq=4, iteration=0), rec(2, 2.5, seq=5, iteration=1)])
    steps = finalize(log, everything=True)
    assert [s.start for s in steps] == [1.0, 1.5, 2.0, 2.5]
    assert steps[1].step_time == pytest.approx(0.5)  # numbers 2 and 4: 3 was read
    assert log.totals() == (4, 0, 0)


def test_a_lost_workers_last_step_is_unfinished_and_other_jobs_are_not_workers():
    log = StepLog()
    log.add([rec(1, 1.0, W0, seq=1), rec(2, 2.0, W0, seq=2),
             rec(1, 1.1, W1, seq=1), rec(2, 2.1, W1, seq=2), rec(3, 3.1, W1, seq=3),
             rec(9, 1.5, CHIEF, seq=1)])
    # silent from 2.0 to the latest start (3.1): 1.1 of its own 1-s step intervals
    assert log.silent(W0) == pytest.approx((2.0, 1.1))
    log.mark_lost(W0, 4.0, "its task does not answer")
    steps = finalize(log, everything=True)
    assert {s.worker for s in steps} == {W0, W1}
    assert log.unfinished[W0] == 1
    summary = log.summary()["workers"]
    assert summary[W0]["steps"] == 1 and summary[W0]["unfinished"] == 1
    assert summary[W0]["lost"]["reason"] == "its task does not answer"
    assert log.totals() == (4, 0, 1)


def test_scheduled_steps_count_whether_they_followed_the_order():
    log = StepLog()
    log.switched_at = 1.5
    log.add([rec(1, 1.0, seq=1),
             rec(2, 2.0, seq=2, version=1),                      # in order
             rec(3, 3.0, seq=3, version=1, priorities=[1, 0]),   # released out of order
             rec(4, 4.0, seq=4, version=1, violations=1),        # a late transfer
             rec(5, 5.0, seq=5),                                 # a check block's step
             rec(6, 6.0, seq=6)])
    steps = finalize(log, everything=True)
    assert [s.phase for s in steps] == [PROFILING, SCHEDULED, SCHEDULED, SCHEDULED, CHECK,
                                        CHECK]
    assert [s.order for s in steps[1:4]] == ["tic"] * 3
    order = log.summary()["order"]
    assert order["scheduled_steps"] == 3 and order["followed"] == 1
    assert order["violations"] == 1


def test_silence_counts_in_the_workers_own_steps_whatever_the_worker_count():
    """64 workers, each stepping every 1 s: one stops at 10 s. Two seconds later the
    others started 128 steps since, yet it is silent for 2 of its own steps; a slow
    worker (a step every 4 s) silent 2 s is silent half a step."""
    log = StepLog()
    workers = [f"/job:worker/replica:0/task:{w}" for w in range(64)]
    slow = "/job:worker/replica:0/task:99"
    for t in range(13):
        log.add([rec(t + 1, t + w / 1000, worker, seq=t + 1)
                 for w, worker in enumerate(workers) if worker != workers[5] or t <= 10])
        if t % 4 == 2:
            log.add([rec(100 + t, float(t), slow, seq=t + 1)])
    last, silent = log.silent(workers[5])
    assert last == pytest.approx(10.005) and silent == pytest.approx(2.058, abs=0.01)
    assert log.silent(slow)[1] == pytest.approx((12.063 - 10.0) / 4.0, abs=0.01)
    assert log.silent(workers[0])[1] < 0.1


def test_a_lost_worker_that_comes_back_is_no_longer_lost():
    """Lost at its step 3; its new steps arrive later: the mark is cleared and said
    once, its stale step counts as unfinished (never as a step, never timed across the
    downtime), and its new steps count as steps."""
    log = StepLog()
    log.add([rec(1, 1.0, W0, seq=1), rec(2, 2.0, W0, seq=2), rec(3, 3.0, W0, seq=3)])
    log.add([rec(i, float(i), W1, seq=i) for i in range(1, 10)])
    log.mark_lost(W0, 9.0, "its task at x does not answer")
    steps = [s for s in finalize(log) if s.worker == W0]
    assert W0 in log.lost and log.returned_workers() == []
    log.add([rec(11, 10.0, W0, seq=1), rec(12, 11.0, W0, seq=2), rec(13, 12.0, W0, seq=3)])
    assert W0 not in log.lost
    back = log.returned_workers()
    assert [w for w, _ in back] == [W0] and back[0][1]["reason"].startswith("its task")
    assert log.returned_workers() == []  # said once
    steps += [s for s in finalize(log, everything=True) if s.worker == W0]
    assert [s.start for s in steps] == [1.0, 2.0, 10.0, 11.0, 12.0]
    assert all(s.step_time is None or s.step_time <= 1.0 for s in steps)
    entry = log.summary()["workers"][W0]
    assert entry["unfinished"] == 1 and entry["came_back"] == 1 and "lost" not in entry
    assert entry["steps"] == 5
    recorded, missing, unfinished = log.totals()
    assert (recorded, missing, unfinished) == (14, 0, 1)


def test_step_time_memory_is_bounded_and_the_counts_stay_whole(monkeypatch):
    monkeypatch.setattr("tictac_hooks.run.steplog._KEEP_STEP_TIMES", 50)
    log = StepLog()
    log.add([rec(i, float(i), W0, seq=i) for i in range(1, 302)])
    finalize(log)
    entry = log.summary()["workers"][W0]
    assert entry["steps"] == 300 and entry["profiling_steps"] == 299  # step 0 excluded
    assert len(log.step_times[(W0, PROFILING)]) == 50


def test_records_between_two_steps_cost_their_distance_not_the_history():
    from tictac_hooks.run import steplog
    numbers = steplog._Numbers()
    for n in range(1, 10_000, 2):  # 5,000 odd numbers: the latest 4,096 are kept
        numbers.add(n)
    assert numbers.count_between(9_000, 9_010) == 5
    assert numbers.count_between(0, 3) == 0  # let go
    assert numbers.count_between(0, 1 << 40) == len(numbers) == steplog._KEEP_RECEIVED


def test_record_numbers_cost_their_gaps_not_their_count():
    """Each (PS, worker) holds runs of consecutive numbers: 6,000 records with a gap every
    1,000 cost a few runs, under 2 KiB, so 256 workers x 16 PS stay under 8 MiB (the
    set of the latest 4,096 numbers each took 0.66 MiB, 2.8 GiB in all); and every
    count between two numbers is what a set of them would give."""
    import random
    import tracemalloc
    from tictac_hooks.run import steplog
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    logs = [steplog._Numbers() for _ in range(32)]
    for numbers in logs:
        for n in range(1, 6_000):
            if n % 1000:
                numbers.add(n)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert used / len(logs) < 2048, f"{used / len(logs):.0f} bytes per (PS, worker)"
    assert len(logs[0]._starts) <= 5 and len(logs[0]) == steplog._KEEP_RECEIVED
    # against a plain set, in any order of arrival, with duplicates and the bound
    rng = random.Random(5)
    numbers, kept = steplog._Numbers(), []
    arrivals = [n for n in range(1, 6000) if rng.random() < 0.9]
    rng.shuffle(arrivals)
    for n in arrivals + arrivals[:100]:
        numbers.add(n)
    truth = sorted(set(arrivals))
    assert len(numbers) == min(len(truth), steplog._KEEP_RECEIVED)
    for _ in range(300):
        lo = rng.randrange(0, 6000)
        hi = lo + rng.randrange(1, 400)
        # the bound lets the lowest numbers go: count only above the lowest kept
        floor = numbers._starts[0]
        assert numbers.count_between(lo, hi) == sum(1 for n in truth
                                                     if max(lo, floor - 1) < n < hi)


def test_a_step_counts_as_scheduled_only_where_every_ps_that_carries_the_order_ran_it():
    """Two PS carry the order; ps:1 was restarted and runs TensorFlow's order until it
    is given the order again: its steps meanwhile are partly ordered, neither scheduled
    nor in the medians. A PS the order has no transfer on does not count."""
    log = StepLog()
    log.switched_at = 0.5
    log.ordered_ps = {"ps:0", "ps:1"}
    for i, v1 in enumerate([1, None, None, 1, 1]):
        t = 1.0 + i
        log.add([rec(i + 1, t, ps="ps:0", seq=i + 1, version=1),
                 rec(i + 1, t, ps="ps:1", seq=i + 1, version=v1),
                 rec(i + 1, t, ps="ps:2", seq=i + 1)])  # no transfer of the order there
    finalize(log, everything=True)
    order, w0 = log.summary()["order"], log.summary()["workers"][W0]
    assert order["partly_ordered"] == 2 and order["scheduled_steps"] == 3, order
    assert w0["excluded"]["partly_ordered"] == 2 and w0["scheduled_steps"] == 1, w0
    log.restarted("ps:1")  # its records are numbered from 1 again
    assert not [k for k in log._received if k[0] == "ps:1"]


def test_the_profiled_steps_are_read_under_the_log_lock_while_the_reader_adds():
    """The switch (fit's background thread) reads the profiled records and served
    names while the reading thread adds records: neither may see a map or set change
    under it (RuntimeError: ... changed size during iteration)."""
    import threading
    from tictac_hooks.run.steplog import StepLog
    from tictac_hooks.records import GateStep, TransferRecord
    log = StepLog()
    w = "/job:worker/replica:0/task:0/device:CPU:0"

    def rec(step, k):
        names = [f"t{step}_{i}" for i in range(k)]
        return GateStep(step_id=step, worker=w, schedule_version=None, algorithm=None,
                        complete=True, order=tuple(names),
                        transfers=tuple(TransferRecord(n, "pass", -1, 8, 0.0, 0.0, -1, 0.0)
                                        for n in names),
                        bytes=8 * k, start=float(step), end=step + 0.5, skipped=(), skips=0,
                        violations=0, reordered=0, unlisted=(), ps=f"ps{step % 3}")
    stop, errors = threading.Event(), []

    def add():
        for step in range(1500):
            if stop.is_set():
                return
            log.add([rec(step, 40)])
    t = threading.Thread(target=add)
    t.start()
    try:
        while t.is_alive():
            try:
                log.transfer_bytes()
                set().union(*log.served_copy().values())
                log.profiled_records()
            except RuntimeError as e:
                errors.append(str(e))
                break
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_pauses_cover_what_overlaps_a_step_and_stay_bounded():
    """Pauses.within: seconds of TicTac's pauses inside an interval, overlapping and
    out-of-order pauses included, as the sum over every pause gives; the latest
    _KEEP_PAUSES are kept."""
    import random
    from tictac_hooks.run import steplog
    rng = random.Random(2)
    pauses, spans = steplog.Pauses(), []
    for _ in range(300):
        start = rng.uniform(0, 1000)
        span = (start, start + rng.choice([0.01, 0.5, 3.0]))
        spans.append(span)
        pauses.add(*span)
    for _ in range(500):
        a = rng.uniform(-5, 1005)
        b = a + rng.uniform(0, 20)
        want = sum(max(0.0, min(b, p1) - max(a, p0)) for p0, p1 in spans)
        assert pauses.within(a, b) == pytest.approx(want)
    for i in range(steplog._KEEP_PAUSES + 10):
        pauses.add(2000.0 + i, 2000.5 + i)
    assert len(pauses) == steplog._KEEP_PAUSES
