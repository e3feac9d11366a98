"""Reading the PSes' records (run/reading.py) against a gate in this process: the
reading thread's wake-ups, failures and stop; lost workers told from slow ones; the
summary of what was read; waiting for profiled steps; the logs written at the end."""

import itertools
import json
import logging
import threading
import time

import pytest

from tictac_hooks.run import reading
from tictac_hooks.run.steplog import StepLog
from tictac_hooks.enforce import inprocess
from tictac_hooks.enforce.api import GateError
from tictac_hooks.enforce.cursor import RecordCursor
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.ports import free_port

PS = "127.0.0.1:61401"
W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"
T1 = "/job:worker/replica:0/task:1"  # what the gates name it: one worker is one task
IDS = itertools.count(1)


def step(gate: Gate, worker: str = W0, names=("a", "b"), gap_s: float = 0.002) -> None:
    """One step of ``worker`` at the gate (no schedule: every transfer passes), then
    ``gap_s`` before the next."""
    step_id = next(IDS)
    with inprocess.gate_lock(PS):
        for name in names:
            ticket = gate.arrive(step_id, worker, name)
            assert gate.request(ticket) is None
            ticket.nbytes = 100
            gate.completed(ticket)
            gate.handed_back(ticket)
    time.sleep(gap_s)  # steps start one after the other


@pytest.fixture
def gate():
    g = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, g):
        yield g


@pytest.fixture
def cursor(gate):
    c = RecordCursor([PS])
    c.start()
    yield c
    c.close()


def read_into(cursor: RecordCursor, steplog: StepLog, everything: bool = False) -> None:
    steplog.add(cursor.read(include_active=True).steps)
    steplog.finalize(lambda a, b: 0.0, lambda s, t: None, everything)


def test_the_thread_reads_every_n_dispatched_steps_and_stops(monkeypatch):
    monkeypatch.setattr(reading, "READ_EVERY_S", 3600.0)  # only the steps wake it
    reads = []
    done = threading.Event()

    def read():
        reads.append(1)
        done.set()
    thread = reading.ReadingThread(read, every_steps=4)
    thread.start()
    thread.dispatched(3)
    time.sleep(0.2)
    assert reads == []  # 3 of 4 steps: not yet
    thread.dispatched(1)
    assert done.wait(5.0) and len(reads) == 1
    done.clear()
    thread.wake()  # asked for (e.g. an epoch's end)
    assert done.wait(5.0) and len(reads) == 2
    thread.stop(timeout_s=5.0)
    assert not thread._thread.is_alive()


def test_a_failing_read_is_logged_once_and_tried_again(monkeypatch, caplog):
    monkeypatch.setattr(reading, "READ_EVERY_S", 0.01)
    calls = []
    recovered = threading.Event()

    def read():
        calls.append(1)
        if len(calls) <= 3:
            raise OSError("PS away")
        recovered.set()
    with caplog.at_level(logging.WARNING, logger="tictac"):
        thread = reading.ReadingThread(read, every_steps=None)
        thread.start()
        assert recovered.wait(5.0)
        thread.stop(timeout_s=5.0)
    warnings = [r.getMessage() for r in caplog.records if "reading the PSes'" in r.getMessage()]
    assert warnings == ["TicTac: reading the PSes' step records failed (OSError: PS away); "
                        "trying again"]


def test_reads_adapt_to_the_records_a_step_makes(gate, cursor):
    """Two records per step and PS (two workers): a quarter of a gate's history holds
    what finishes between reads when it reads every GATE_HISTORY / 4 / 2 steps."""
    thread = reading.ReadingThread(lambda: None, every_steps=None, cursor=cursor)
    assert thread.every_steps == reading.READ_EVERY_STEPS
    for _ in range(10):
        step(gate, W0)
        step(gate, W1)
    cursor.read(include_active=True)
    thread._dispatched = 10
    thread._adapt()
    assert thread.every_steps == min(reading.READ_EVERY_STEPS,
                                     int(reading.GATE_HISTORY / 4 / 2))
    fixed = reading.ReadingThread(lambda: None, every_steps=7, cursor=cursor)
    fixed._dispatched = 10
    fixed._adapt()
    assert fixed.every_steps == 7


def test_the_summary_counts_each_dispatched_step_once(gate, cursor):
    steplog = StepLog()
    for _ in range(6):
        step(gate)
    read_into(cursor, steplog, everything=True)
    summary = reading.records_summary(6, steplog, cursor, [PS])
    assert summary["dispatched"] == 6 and summary["worker_steps"] == 6
    assert summary["missing"] == 0 and summary["unfinished"] == 0
    assert summary["dropped"] == 0 and summary["read"] >= 6
    per_ps = summary["per_ps"][PS]
    assert set(summary["per_ps"]) == {PS}
    assert (per_ps["read"], per_ps["dropped"]) == (cursor.read_records[PS], 0)
    times = per_ps["read_time"]  # each read of the PS, timed
    assert times["reads"] >= 1 and 0 < times["mean_ms"] <= times["max_ms"], times
    assert reading.records_summary(3, steplog, None, [PS]) == {"dispatched": 3}
    # No step ran a schedule: the order's counts say 0, none is left out.
    order = steplog.summary()["order"]
    assert order == {"scheduled_steps": 0, "followed": 0, "partly_ordered": 0, "skips": 0,
                     "violations": 0, "early_released": 0}, order


def test_a_silent_worker_whose_task_does_not_answer_is_lost_once(gate, cursor):
    """Silence counts in the worker's own step intervals (here the typical one of the
    workers, as worker 1 made one step only). The steps are 20 ms apart and each check
    stands 4 step times off SUSPECT_AFTER_STEPS: a busy machine's jitter (a CI run saw
    9 intervals where 7 were made at 2 ms) cannot carry it across."""
    steplog, lines, probed = StepLog(), [], {}
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    step(gate, W1, gap_s=0.02)
    for _ in range(reading.SUSPECT_AFTER_STEPS - 4):
        step(gate, W0, gap_s=0.02)
    read_into(cursor, steplog)
    reading.find_lost_workers(steplog, {"worker:1": dead}, probed, lines.append)
    assert lines == [] and T1 not in steplog.lost  # not silent long enough
    assert steplog.silent(T1)[1] < reading.SUSPECT_AFTER_STEPS
    for _ in range(8):
        step(gate, W0, gap_s=0.02)
    read_into(cursor, steplog)
    reading.find_lost_workers(steplog, {"worker:1": dead}, probed, lines.append)
    assert T1 in steplog.lost and len(lines) == 1
    assert lines[0].startswith("worker_1 (" + T1 + ") lost: its last step started at ")
    assert "and the other workers went on for " in lines[0]
    assert f"of its step times since (its task at {dead} does not answer)" in lines[0]
    reading.find_lost_workers(steplog, {"worker:1": dead}, probed, lines.append)
    assert len(lines) == 1  # said once
    step(gate, W1)  # it comes back: said once, no longer lost
    read_into(cursor, steplog)
    reading.find_lost_workers(steplog, {"worker:1": dead}, probed, lines.append)
    assert T1 not in steplog.lost and len(lines) == 2
    assert lines[1].startswith("worker_1 (" + T1 + ") is back: ")
    reading.find_lost_workers(steplog, {"worker:1": dead}, probed, lines.append)
    assert len(lines) == 2


def test_a_worker_of_unknown_address_is_lost_only_after_many_steps(gate, cursor):
    steplog, lines = StepLog(), []
    step(gate, W1)
    for _ in range(reading.SUSPECT_AFTER_STEPS + 1):
        step(gate, W0)
    read_into(cursor, steplog)
    reading.find_lost_workers(steplog, {}, {}, lines.append)
    assert lines == []  # silent, but maybe slow: no address to ask
    for _ in range(reading.LOST_AFTER_STEPS - reading.SUSPECT_AFTER_STEPS + 4):
        step(gate, W0)  # 4 steps of margin for the intervals' jitter
    read_into(cursor, steplog)
    reading.find_lost_workers(steplog, {}, {}, lines.append)
    assert T1 in steplog.lost and "(no step of it since)" in lines[0]


def test_waiting_for_profiled_steps(gate, cursor):
    steplog = StepLog()
    polls = []

    def poll():
        polls.append(1)
        steplog.add(cursor.read(include_active=True).steps)
    assert reading.wait_for_profiled_records(poll, steplog, timeout_s=0.2) is False
    step(gate)
    step(gate)
    assert reading.wait_for_profiled_records(poll, steplog, timeout_s=5.0) is True


def test_the_timeline_is_written_as_records_are_read_and_the_logs_hold_the_summary(
        gate, cursor, tmp_path):
    timeline = reading.TransferTimeline(str(tmp_path / "logs"))
    step(gate)
    timeline.add(cursor.read(include_active=True).steps)  # finished ones only
    step(gate, names=("c",))
    timeline.add(cursor.read(include_active=True).steps, final=True)  # and the active
    timeline.close()
    timeline.close()  # once is enough
    trace = json.loads((tmp_path / "logs" / reading.TIMELINE_FILE).read_text())
    transfers = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "pass"]
    # Each transfer once, though the first read saw an active record too.
    assert sorted(transfers) == ["a", "b", "c"]
    reading.write_logs(str(tmp_path / "logs"), {"records": {"dispatched": 1}})
    summary = json.loads((tmp_path / "logs" / "tictac_summary.json").read_text())
    assert summary == {"records": {"dispatched": 1}}


def test_a_restarted_ps_is_found_by_its_gate_id_and_read_from_its_first_record():
    """A PS restarted at the same address answers with another gate id: the read says
    so (CursorRead.restarted) and reads the new gate's records from its first, even
    when it has numbered as many records as the old one had (no number went back)."""
    address = f"127.0.0.1:{free_port()}"
    cursor = RecordCursor([address])
    old = Gate(skip_after_s=5.0, window_bytes=0, finish_after_s=0.01)
    with inprocess.serve_in_process(address, old):
        cursor.start()
        for _ in range(2):
            one_step(old, address)
        read = cursor.read()
        assert len(read.steps) == 2 and read.restarted == ()
    new = Gate(skip_after_s=5.0, window_bytes=0, finish_after_s=0.01)
    with inprocess.serve_in_process(address, new):
        for _ in range(3):
            one_step(new, address)
        read = cursor.read()
        assert read.restarted == (address,) and cursor.restarts[address] == 1
        assert [s.seq for s in read.steps] == [1, 2, 3]  # its own, from the first
        assert cursor.read().restarted == ()
    cursor.close()


def test_a_restart_found_in_a_read_another_ps_failed_is_reported_by_the_next_read():
    """Issue #54: the PSes are read in parallel; when one fails the read, what the
    others answered is not kept, so a restart one of them showed is not lost (it used
    to be taken as seen, and the restarted PS never got its order again)."""
    a, b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    cursor = RecordCursor([a, b], timeout_s=2.0)
    gate_a, old_b, new_b = (Gate(skip_after_s=5.0, window_bytes=0, finish_after_s=0.01)
                            for _ in range(3))
    with inprocess.serve_in_process(a, gate_a), inprocess.serve_in_process(b, old_b):
        cursor.start()
        assert cursor.read().restarted == ()
    with inprocess.serve_in_process(b, new_b):  # b restarted while a does not answer
        one_step(new_b, b)
        one_step(new_b, b)
        with pytest.raises(GateError):
            cursor.read()  # a fails the read: b's restart is not taken as seen
        with inprocess.serve_in_process(a, gate_a):
            read = cursor.read()
    assert read.restarted == (b,) and cursor.restarts[b] == 1, (read, cursor.restarts)
    assert [s.seq for s in read.steps] == [1, 2]  # b's, from its first (a ran none)
    cursor.close()


def one_step(gate: Gate, address: str) -> None:
    with inprocess.gate_lock(address):
        ticket = gate.arrive(next(IDS), W0, "a")
        assert gate.request(ticket) is None
        ticket.nbytes = 100
        gate.completed(ticket)
        gate.handed_back(ticket)
    time.sleep(0.03)  # quiet: its record is finished


def test_a_clear_keeps_the_pses_that_carried_the_order(gate):
    """Issue #54: a check's D block clears every PS; steps of the T block before it,
    read after the clear, are still judged against every PS that carried the order
    (an emptied list counted a step that ran in order at one PS of two as followed)."""
    from tictac_hooks.run.config import RunConfig
    from tictac_hooks.run.controller import Controller
    from tictac_hooks.run.settings import Settings
    c = Controller(RunConfig.build(Settings.resolve(check_rounds=0), [PS]), verbose=False)
    c.steplog.set_ordered_ps({PS, "127.0.0.1:1"})
    c._clear()
    assert c.steplog.ordered_ps == {PS, "127.0.0.1:1"}
    c.gates.close()


def test_a_cursor_made_after_its_runs_steps_reads_them_from_the_runs_start():
    """The bench makes its controllers after the profiled steps: a cursor started later
    than a finish bound after them saw none of them (the switch then found no served
    transfer, or only stray ones, and refused). Started with the run's start time, it
    reads the steps begun since, not those of an earlier run."""
    g = Gate(skip_after_s=5.0, window_bytes=0, finish_after_s=0.05)
    with inprocess.serve_in_process(PS, g):
        step(g, names=("earlier",))            # an earlier run's step
        time.sleep(0.01)
        began = time.time()
        for _ in range(3):
            step(g, names=("a", "b"))
        time.sleep(0.2)                          # past the finish bound: all finished
        g.stats(since=0)                         # (reading finishes quiet channels)
        late = RecordCursor([PS])
        late.start()
        assert late.read().steps == []           # what the bench's controllers saw
        since = RecordCursor([PS])
        since.start(after=began)
        got = since.read().steps
        assert len(got) == 3 and {n for s in got for n in s.order} == {"a", "b"}, got
        late.close()
        since.close()
