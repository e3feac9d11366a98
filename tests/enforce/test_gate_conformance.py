"""One set of scenarios for both gates: the Python gate (enforce/gate.py, strict window)
and the C++ gate (enforce/native/gate.cc, built alone, without TensorFlow, and driven
through its C API). Each scenario runs on both; the step records must be the same, and
each scenario also states what it expects."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest

from tictac_hooks.enforce.gate import (DEFAULT_WORKERS, LIVE_STEPS_PER_WORKER,
                                       RECORDS_PER_WORKER, Gate)
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.graph.tf.naming import (parse_rendezvous_key, rendezvous_key_frame,
                                         worker_of)
from tictac_hooks.records import GateStep, TransferRecord

SKIP_S = 0.25
# the gates' default bounds (sized for DEFAULT_WORKERS workers)
LIVE_STEPS = LIVE_STEPS_PER_WORKER * DEFAULT_WORKERS
HISTORY = RECORDS_PER_WORKER * DEFAULT_WORKERS
SRC = "/job:ps/replica:0/task:0/device:CPU:0"
W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"
W2 = "/job:worker/replica:0/task:2/device:CPU:0"


def key(name: str, dest: str = W0, edge: int = 1, frame_iter: str = "0:0") -> str:
    return f"{SRC};1;{dest};edge_{edge}_{name};{frame_iter}"


LOOP = 4242424242424242424  # a loop's frame id, as TensorFlow writes it (a uint64)


class PythonDriver:
    """The Python gate, as the rendezvous drives it: a request is forwarded when the
    gate releases it; its response is handed back once it is also ready."""

    name = "python"

    def __init__(self, max_active_steps: int = LIVE_STEPS, history: int = HISTORY,
                 finish_after_s: float = 1.0, stale_after_s: float = 60.0,
                 skip_after_s: float = SKIP_S) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gate = self._on_loop(lambda: Gate(skip_after_s=skip_after_s, window_bytes=0,
                                               max_active_steps=max_active_steps,
                                               history=history,
                                               finish_after_s=finish_after_s,
                                               stale_after_s=stale_after_s))
        self.tickets: dict[str, object] = {}
        self.released: set[str] = set()
        self.ready_: dict[str, tuple[int, str]] = {}
        self.handed: list[str] = []

    def _on_loop(self, fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def _settle(self) -> None:
        time.sleep(0.02)  # let released futures' callbacks run

    def install(self, order: list[str], algorithm: str = "test") -> dict:
        s = Schedule.from_order(algorithm, order)
        return self._on_loop(lambda: self.gate.install(s).to_json())

    def clear(self) -> None:
        self._on_loop(self.gate.clear)

    def _hand_back(self, tid: str) -> None:
        t = self.tickets[tid]
        nbytes, error = self.ready_.pop(tid)
        t.nbytes = nbytes
        self.gate.completed(t)
        self.gate.handed_back(t, error)
        self.handed.append(tid)

    def _on_release(self, tid: str) -> None:
        self.released.add(tid)
        if tid in self.ready_:
            self._hand_back(tid)

    def arrive(self, tid: str, step: int, k: str, settle: bool = True) -> None:
        def go():
            name, dest, tensor = parse_rendezvous_key(k)
            t = self.gate.arrive(step, dest, name, tensor, *rendezvous_key_frame(k))
            self.tickets[tid] = t
            fut = self.gate.request(t)
            if fut is None:
                self._on_release(tid)
            else:
                fut.add_done_callback(lambda _f: self._on_release(tid))
        self._on_loop(go)
        if settle:
            self._settle()

    def ready(self, tid: str, nbytes: int = 100, error: str = "", dead: bool = False,
              settle: bool = True) -> None:
        def go():
            self.tickets[tid].dead = dead  # the rendezvous reads it off the response
            self.ready_[tid] = (nbytes, error)
            if tid in self.released:
                self._hand_back(tid)
        self._on_loop(go)
        if settle:
            self._settle()

    def records(self) -> list[dict]:
        return self._on_loop(self.gate.records)

    def totals(self) -> dict:
        return self._on_loop(lambda: dict(self.gate.totals))

    def read(self, since: int, active: bool) -> dict:
        return self._on_loop(lambda: self.gate.read(since, active))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class NativeDriver:
    """The C++ gate through its C API: arrive, then ready with a hand-back callback."""

    name = "native"

    def __init__(self, path: str, max_active_steps: int = LIVE_STEPS, history: int = HISTORY,
                 finish_after_s: float = 1.0, stale_after_s: float = 60.0,
                 skip_after_s: float = SKIP_S) -> None:
        from tictac_hooks.enforce.native.cgate import CGate

        self.gate = CGate.alone(path, skip_after_s=skip_after_s,
                                max_active_steps=max_active_steps,
                                history=history)
        self.gate.control("configure", f"finish_after_s\t{finish_after_s!r}\n"
                                       f"stale_after_s\t{stale_after_s!r}\n")
        self.ids: dict[str, int] = {}
        self.handed: list[str] = []
        self._lock = threading.Lock()

    def install(self, order: list[str], algorithm: str = "test") -> dict:
        from tictac_hooks.enforce.native.client import install_argument
        return self.gate.control("install",
                                 install_argument(Schedule.from_order(algorithm, order)))

    def clear(self) -> None:
        self.gate.control("clear")

    def arrive(self, tid: str, step: int, k: str, settle: bool = True) -> None:
        self.ids[tid] = self.gate.arrive(step, k)

    def ready(self, tid: str, nbytes: int = 100, error: str = "", dead: bool = False,
              settle: bool = True) -> None:
        def handed():
            with self._lock:
                self.handed.append(tid)
        self.gate.ready(self.ids[tid], nbytes, handed, error, dead)
        if settle:
            time.sleep(0.02)

    def records(self) -> list[dict]:
        return self.gate.control("stats", "active")["steps"]

    def totals(self) -> dict:
        return self.gate.control("stats", "finished")["totals"]

    def read(self, since: int, active: bool) -> dict:
        reply = self.gate.control("stats", f"{'active' if active else 'finished'} "
                                           f"since={since}")
        return {k: reply[k] for k in ("since", "last_seq", "dropped", "steps")}

    def close(self) -> None:
        self.gate.close()


def normalized(records: list[dict]) -> list[dict]:
    return sorted(({
        "step_id": r["step_id"], "worker": r["worker"],
        "schedule_version": r["schedule_version"], "algorithm": r["algorithm"],
        "complete": r["complete"], "order": r["order"],
        "states": [(t["name"], t["state"], t["priority"], t["bytes"]) for t in r["transfers"]],
        "errors": [t.get("error", "") for t in r["transfers"]],
        "tensors": [t.get("tensor", "") for t in r["transfers"]],
        "skipped": [(k["name"], k["reason"]) for k in r["skipped"]],
        "skips": r["skips"], "violations": r["violations"], "reordered": r["reordered"],
        "unlisted": r["unlisted"], "bytes": r["bytes"],
        "frame": r.get("frame", 0), "iteration": r.get("iteration", 0),
        "dead": [t.get("dead", False) for t in r["transfers"]]} for r in records),
        key=lambda r: (r["step_id"], r["worker"], r["frame"], r["iteration"]))


# -- scenarios: each drives a gate and returns a check of its records -------------------

def reversed_order(d):
    d.install(["c", "b", "a"])
    for n in "abc":
        d.arrive(n, 1, key(n))
        d.ready(n)
    return lambda recs: recs[0]["order"] == ["c", "b", "a"] and recs[0]["complete"]


def unlisted_pass_straight_through(d):
    d.install(["b", "a"])
    d.arrive("x", 1, key("x"))
    d.ready("x")
    d.arrive("a", 1, key("a"))
    d.ready("a")
    d.arrive("b", 1, key("b"))
    d.ready("b")
    return lambda recs: recs[0]["order"] == ["x", "b", "a"] and recs[0]["unlisted"] == ["x"]


def ready_before_its_turn_waits(d):
    # "a" is listed first but its response comes last: "b" and "c" wait for it.
    d.install(["a", "b", "c"])
    d.arrive("a", 1, key("a"))
    for n in "bc":
        d.arrive(n, 1, key(n))
        d.ready(n)
    d.ready("a")
    return lambda recs: recs[0]["order"] == ["a", "b", "c"] and recs[0]["skips"] == 0


def a_transfer_that_never_comes_is_skipped(d):
    d.install(["ghost", "a"])
    d.arrive("a", 1, key("a"))
    d.ready("a")
    time.sleep(SKIP_S * 2.5)
    return lambda recs: (recs[0]["order"] == ["a"]
                         and recs[0]["skipped"] == [("ghost", "timeout")])


def a_slow_transfer_is_skipped_then_late(d):
    d.install(["a", "b"])
    d.arrive("a", 1, key("a"))   # requested, response not ready yet
    d.arrive("b", 1, key("b"))
    d.ready("b")
    time.sleep(SKIP_S * 2.5)
    d.ready("a")
    return lambda recs: (recs[0]["order"] == ["b", "a"] and recs[0]["violations"] == 1
                         and recs[0]["skipped"] == [("a", "slow")])


def absent_after_two_steps_is_skipped_at_once(d):
    d.install(["ghost", "a"])
    for step in (1, 2):
        d.arrive(f"a{step}", step, key("a"))
        d.ready(f"a{step}")
        time.sleep(SKIP_S * 2.5)
    t0 = time.monotonic()
    d.arrive("a3", 3, key("a"))
    d.ready("a3")
    fast = time.monotonic() - t0 < SKIP_S
    return lambda recs: fast and [r["skipped"] for r in recs] == [
        [("ghost", "timeout")], [("ghost", "timeout")], [("ghost", "absent")]]


def duplicate_and_late_names(d):
    d.install(["a", "b"])
    for tid in ("a", "a2"):
        d.arrive(tid, 1, key("a"))
        d.ready(tid)
    d.arrive("b", 1, key("b"))
    d.ready("b")
    return lambda recs: [s[1] for s in recs[0]["states"]] == ["listed", "duplicate", "listed"]


def per_destination_view(d):
    # Before the install, worker 0 was served a and b, worker 1 only b: worker 1 must
    # not wait for a.
    for n, dest in (("a", W0), ("b", W0), ("b1", W1)):
        d.arrive(n, 1, key(n[0], dest))
        d.ready(n)
    time.sleep(1.6)  # the steps are whole (finished by the timer): what they served counts
    d.install(["a", "b"])
    d.arrive("w1b", 2, key("b", W1))
    d.ready("w1b")
    d.arrive("w0b", 2, key("b", W0))
    d.ready("w0b")
    d.arrive("w0a", 2, key("a", W0))
    d.ready("w0a")
    return lambda recs: ([(r["worker"], r["order"]) for r in recs if r["step_id"] == 2]
                         == [(worker_of(W0), ["a", "b"]), (worker_of(W1), ["b"])]
                         and all(r["skips"] == 0 for r in recs))


def a_step_binds_to_the_schedule_at_its_first_transfer(d):
    d.arrive("a", 1, key("a"))
    d.arrive("b", 1, key("b"))
    d.install(["b", "a"])  # step 1 started before: it stays unordered
    d.ready("a")
    d.ready("b")
    d.arrive("a2", 2, key("a"))
    d.arrive("b2", 2, key("b"))
    d.ready("a2")
    d.ready("b2")
    d.clear()
    d.arrive("a3", 3, key("a"))
    d.ready("a3")
    return lambda recs: ([(r["step_id"], r["schedule_version"], r["order"]) for r in recs]
                         == [(1, None, ["a", "b"]), (2, 1, ["b", "a"]), (3, None, ["a"])])


def an_error_response_goes_at_once_and_advances(d):
    d.install(["a", "b"])
    d.arrive("b", 1, key("b"))
    d.ready("b")
    d.arrive("a", 1, key("a"))
    d.ready("a", 0, "aborted")
    return lambda recs: recs[0]["order"] == ["a", "b"] and recs[0]["errors"] == ["aborted", ""]


def a_tensor_sent_twice_is_ordered_by_its_full_name(d):
    # One node's tensor over two edges in one step: both full names count as served,
    # and a schedule listing the full names orders each copy by it.
    d.arrive("x3", 1, key("x", edge=3))
    d.ready("x3")
    d.arrive("x5", 1, key("x", edge=5))
    d.ready("x5")
    d.install(["edge_5_x", "edge_3_x"])
    d.arrive("y3", 2, key("x", edge=3))
    d.arrive("y5", 2, key("x", edge=5))
    d.ready("y3")
    d.ready("y5")
    return lambda recs: recs[-1]["order"] == ["edge_5_x", "edge_3_x"]


def each_copy_of_a_tensor_sent_twice_says_its_edge(d):
    # No order: both copies come under the node's name, and each record says which edge
    # it was (the bytes the PS serves each edge: a few over the copy feeding only the
    # gradient's ShapeN). A name that comes once records no edge.
    d.arrive("x3", 1, key("x", edge=3))
    d.ready("x3", nbytes=4000)
    d.arrive("x5", 1, key("x", edge=5))
    d.ready("x5", nbytes=21)
    d.arrive("v", 1, key("v", edge=7))
    d.ready("v", nbytes=50)
    return lambda recs: (recs[0]["order"] == ["x", "x", "v"]
                         and recs[0]["tensors"] == ["edge_3_x", "edge_5_x", ""])


def each_loop_iteration_follows_the_order_as_its_own_step(d):
    # steps_per_execution > 1: one step id, the training steps are the iterations of a
    # loop (the key's frame:iter). Iteration 1's requests come while iteration 0's are
    # still held: each iteration has its own counter and record.
    d.install(["c", "b", "a"])
    it = lambda i: f"{LOOP}:{i}"  # noqa: E731
    d.arrive("a0", 1, key("a", frame_iter=it(0)))
    d.ready("a0")
    d.arrive("a1", 1, key("a", frame_iter=it(1)))
    d.ready("a1")
    for n in "bc":
        d.arrive(f"{n}1", 1, key(n, frame_iter=it(1)))
        d.ready(f"{n}1")
    for n in "bc":
        d.arrive(f"{n}0", 1, key(n, frame_iter=it(0)))
        d.ready(f"{n}0")
    d.arrive("x", 1, key("x"))  # outside the loop (0:0): a record of its own, unlisted
    d.ready("x")
    return lambda recs: ([(r["step_id"], r["frame"], r["iteration"], r["order"]) for r in recs]
                         == [(1, 0, 0, ["x"]), (1, LOOP, 0, ["c", "b", "a"]),
                             (1, LOOP, 1, ["c", "b", "a"])]
                         and all(r["skips"] == 0 and r["violations"] == 0 for r in recs))


def a_loops_dead_exit_iteration_is_marked_dead(d):
    # The loop's exit iteration sends every body transfer once more, as a dead tensor.
    d.install(["b", "a"])
    it = lambda i: f"{LOOP}:{i}"  # noqa: E731
    for n in "ab":
        d.arrive(f"{n}0", 1, key(n, frame_iter=it(0)))
    d.ready("a0")
    d.ready("b0")
    for n in "ba":
        d.arrive(f"{n}1", 1, key(n, frame_iter=it(1)))
        d.ready(f"{n}1", nbytes=23, dead=True)
    return lambda recs: ([(r["iteration"], r["order"], r["dead"]) for r in recs]
                         == [(0, ["b", "a"], [False, False]), (1, ["b", "a"], [True, True])])


SCENARIOS = [reversed_order, unlisted_pass_straight_through, ready_before_its_turn_waits,
             a_transfer_that_never_comes_is_skipped, a_slow_transfer_is_skipped_then_late,
             absent_after_two_steps_is_skipped_at_once, duplicate_and_late_names,
             per_destination_view, a_step_binds_to_the_schedule_at_its_first_transfer,
             an_error_response_goes_at_once_and_advances,
             a_tensor_sent_twice_is_ordered_by_its_full_name,
             each_copy_of_a_tensor_sent_twice_says_its_edge,
             each_loop_iteration_follows_the_order_as_its_own_step,
             a_loops_dead_exit_iteration_is_marked_dead]


def _fields_and_times_mean_one_thing(backend: str, raw: list[dict]) -> None:
    """Each backend writes only the fields of records/gate.py, and each time field means
    the same on both: arrive <= release, ready <= handback (release: the gate let it go;
    ready: the PS had the response; the native gate releases at the hand-back, the
    Python gate releases the request before the PS produces the response)."""
    step_keys = {f.name for f in dataclasses.fields(GateStep)}
    transfer_keys = {f.name for f in dataclasses.fields(TransferRecord)}
    for r in raw:
        assert set(r) <= step_keys, (backend, set(r) - step_keys)
        step = GateStep.from_json(r)
        for t, d in zip(step.transfers, r["transfers"]):
            assert set(d) <= transfer_keys, (backend, set(d) - transfer_keys)
            if not t.handback:
                continue
            assert t.arrive <= t.release <= t.handback, (backend, d)
            assert t.arrive <= t.ready <= t.handback, (backend, d)
            if backend == "native":
                assert t.release == t.handback  # it holds the response
            else:
                assert t.ready == t.handback  # its HEADERS come back: handed back
            assert t.held_s >= 0 and t.ps_s >= 0
            assert t.held_s + t.ps_s <= t.handback - t.arrive + 1e-9, (backend, d)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_both_gates_give_the_same_records(scenario, gate_library):
    results = {}
    for driver in (PythonDriver(), NativeDriver(gate_library)):
        try:
            check = scenario(driver)
            time.sleep(0.05)
            raw = driver.records()
            records = normalized(raw)
        finally:
            driver.close()
        assert records, f"{driver.name}: no records"
        assert check(records), f"{driver.name}: {records}"
        _fields_and_times_mean_one_thing(driver.name, raw)
        results[driver.name] = (records, driver.handed)
    assert results["native"][0] == results["python"][0]
    assert results["native"][1] == results["python"][1]  # the same hand-back order


def test_evicting_an_old_step_hands_back_what_it_held(gate_library):
    # Only past the memory bound on live steps (sized with the workers; 2 here).
    for driver in (PythonDriver(max_active_steps=2), NativeDriver(gate_library, 2)):
        try:
            driver.install(["ghost", "a"])
            driver.arrive("a1", 1, key("a"))
            driver.ready("a1")
            assert driver.handed == []  # held behind "ghost"
            # (other workers' steps: one worker's next step would supersede step 1)
            driver.arrive("a2", 2, key("a", W1))
            driver.arrive("a3", 3, key("a", W2))  # a third step: step 1 is evicted
            time.sleep(0.05)
            assert driver.handed[:1] == ["a1"], driver.name
            (rec,) = [r for r in driver.records() if r["step_id"] == 1]
            # the record says it went out of its order, and why; it is not complete
            assert [t.get("early", "") for t in rec["transfers"]] == ["evicted"], rec
            assert not rec["complete"] and rec["seq"] == 1
            totals = driver.totals()
            assert totals["early_evicted"] == 1 and totals["evicted_steps"] == 1, totals
        finally:
            driver.close()


FINISH_S = 0.15  # a short finish bound, so that the tests below wait little


def test_a_step_lives_until_it_is_quiet_however_many_steps_arrive(gate_library):
    """200 steps of 8 workers beside a step still waiting: none is finished by the
    others' arrivals (the old bound was 64 step keys); each finishes once quiet, with
    its record complete and nothing let go early."""
    # (a skip bound longer than the test: step 1 waits for "a" throughout)
    for driver in (PythonDriver(finish_after_s=FINISH_S, skip_after_s=30.0),
                   NativeDriver(gate_library, finish_after_s=FINISH_S, skip_after_s=30.0)):
        try:
            driver.install(["a", "b"])
            driver.arrive("held-b", 1, key("b"))
            driver.ready("held-b")  # waits for "a"
            for step in range(2, 202):
                dest = f"/job:worker/replica:0/task:{step % 8}/device:CPU:0"
                for n in "ab":
                    driver.arrive(f"{n}{step}", step, key(n, dest), settle=False)
                for n in "ab":
                    driver.ready(f"{n}{step}", nbytes=10, settle=False)
            time.sleep(0.05)
            assert "held-b" not in driver.handed, driver.name  # step 1 is still live
            driver.arrive("held-a", 1, key("a"))
            driver.ready("held-a")
            time.sleep(FINISH_S * 3)
            recs = driver.read(0, active=False)["steps"]
            assert len(recs) == 201 and all(r["complete"] for r in recs), driver.name
            assert all(not t.get("early") for r in recs for t in r["transfers"])
            (first,) = [r for r in recs if r["step_id"] == 1]
            assert first["order"] == ["a", "b"] and first["skips"] == 0, first
            totals = driver.totals()
            assert not any(k.startswith("early_") or k == "evicted_steps" for k in totals)
        finally:
            driver.close()


def test_a_request_after_its_channel_finished_passes_straight_through(gate_library):
    """A request for a (step, worker) already finished goes at once, counted, and makes
    no second record (its counter does not start again at 0 and wait on "a")."""
    for driver in (PythonDriver(finish_after_s=FINISH_S),
                   NativeDriver(gate_library, finish_after_s=FINISH_S)):
        try:
            driver.install(["a", "b"])
            for n in "ab":
                driver.arrive(n, 1, key(n))
                driver.ready(n)
            time.sleep(FINISH_S * 3)
            started = time.monotonic()
            driver.arrive("b-again", 1, key("b"))
            driver.ready("b-again")
            assert "b-again" in driver.handed and time.monotonic() - started < SKIP_S
            recs = driver.read(0, active=True)["steps"]
            assert [(r["step_id"], r["order"]) for r in recs] == [(1, ["a", "b"])], recs
            assert driver.totals()["after_finish"] == 1
        finally:
            driver.close()


def test_a_stale_channel_lets_go_what_it_holds_marked_stale(gate_library):
    for driver in (PythonDriver(finish_after_s=FINISH_S, stale_after_s=0.3),
                   NativeDriver(gate_library, finish_after_s=FINISH_S, stale_after_s=0.3)):
        try:
            driver.install(["a", "b"])
            driver.arrive("a", 1, key("a"))  # its response never comes
            driver.arrive("b", 1, key("b"))
            time.sleep(0.6)
            (rec,) = driver.read(0, active=True)["steps"]
            assert rec["seq"] == 1 and not rec["complete"], rec
            assert sorted(t.get("early") for t in rec["transfers"]) == ["stale", "stale"]
            assert driver.totals()["early_stale"] == 2
        finally:
            driver.close()


def test_a_name_absent_for_one_worker_is_not_presumed_absent_for_another(gate_library):
    """The absent streak is per destination: worker 0 never reads "ghost", worker 1
    does, and worker 1 still waits for it."""
    w1 = W1
    for driver in (PythonDriver(), NativeDriver(gate_library)):
        try:
            driver.install(["ghost", "a"])
            for step in (1, 2):  # ghost times out twice for worker 0: absent there
                driver.arrive(f"a{step}", step, key("a"))
                driver.ready(f"a{step}")
                time.sleep(SKIP_S * 1.6)
            driver.arrive("w0a", 3, key("a"))
            driver.ready("w0a")
            assert "w0a" in driver.handed  # at once: presumed absent for worker 0
            driver.arrive("w1a", 4, key("a", w1))
            driver.ready("w1a")
            driver.arrive("w1ghost", 4, key("ghost", w1))
            driver.ready("w1ghost")
            (rec,) = [r for r in driver.records() if r["step_id"] == 4]
            assert rec["order"] == ["ghost", "a"] and rec["skips"] == 0, (driver.name, rec)
        finally:
            driver.close()


@pytest.mark.parametrize("devices", [("CPU:0",), ("CPU:0", "GPU:0"),
                                     tuple(f"GPU:{i}" for i in range(8))],
                         ids=["cpu", "cpu+gpu0", "gpu0-7"])
def test_one_worker_is_one_task_whatever_devices_its_reads_land_on(gate_library, devices):
    """Reads of one task on its CPU and its GPUs are one channel and one record, named
    by the task; the order holds over them."""
    task = "/job:worker/replica:0/task:2"
    names = [f"v{i}" for i in range(max(2, len(devices)))]
    for driver in (PythonDriver(), NativeDriver(gate_library)):
        try:
            driver.install(names)
            for i, n in enumerate(names):
                driver.arrive(n, 1, key(n, f"{task}/device:{devices[i % len(devices)]}"),
                              settle=False)
            for n in reversed(names):  # each waits for the ones before it
                driver.ready(n)
            (rec,) = driver.records()
            assert rec["worker"] == task and rec["order"] == names, (driver.name, rec)
            assert rec["complete"] and rec["skips"] == 0
        finally:
            driver.close()


def test_native_gate_hands_a_dead_transfer_back_at_once(gate_library):
    # A dead tensor carries nothing: the native gate (which holds responses) does not
    # hold it for its turn; it counts as handed back, and the real ones keep the order.
    driver = NativeDriver(gate_library)
    try:
        driver.install(["b", "a"])
        it = f"{LOOP}:3"
        driver.arrive("a", 1, key("a", frame_iter=it))
        driver.ready("a", nbytes=23, dead=True)
        assert driver.handed == ["a"]
        driver.arrive("b", 1, key("b", frame_iter=it))
        driver.ready("b", nbytes=23, dead=True)
        (rec,) = driver.records()
        assert rec["iteration"] == 3 and rec["complete"] and rec["skips"] == 0, rec
        assert [t.get("dead") for t in rec["transfers"]] == [True, True]
    finally:
        driver.close()


def test_native_gate_rejects_malformed_schedules(gate_library):
    from tictac_hooks.enforce.native.cgate import CGate
    from tictac_hooks.graph.schedule import ScheduleError

    g = CGate.alone(gate_library)
    try:
        for arg, message in (("order\na\t0\na\t1\n", "more than once"),
                             ("order\na\t5\n", "in \\[0, 1\\)"),
                             ("order\na\tx\n", "not a whole number"),
                             ("order\nb\t1\na\t0\n", "not sorted"),
                             ("bogus\t1\norder\n", "unknown control setting"),
                             ("skip_after_s\t-1\norder\n", "> 0")):
            with pytest.raises(ScheduleError, match=message):
                g.control("install", arg)
        with pytest.raises(ScheduleError, match="unknown control verb"):
            g.control("nope")
        assert g.control("install", "order\na\t0\n")["version"] == 1
    finally:
        g.close()


def test_a_cursor_reads_each_record_once_and_counts_what_the_history_dropped(gate_library):
    """Records are numbered as they finish (seq gate-wide, worker_seq per destination);
    a read after record ``since`` gets the later ones and the number the history bound
    let go, the same on both gates."""
    def steps(d, first, last):
        for step in range(first, last + 1):  # workers 0 and 1 by turns, one transfer
            d.arrive(f"t{step}", step, key("a", W0 if step % 2 else W1))
            d.ready(f"t{step}")

    def seqs(read):
        return [(r["step_id"], r.get("seq", 0), r.get("worker_seq", 0)) for r in read["steps"]]

    results = {}
    for driver in (PythonDriver(max_active_steps=1, history=4),
                   NativeDriver(gate_library, 1, history=4)):
        try:
            # One active step at a time: each step finishes the one before it.
            steps(driver, 1, 10)
            first = driver.read(0, active=False)  # steps 1-9 finished; 4 held
            assert (first["last_seq"], first["dropped"]) == (9, 5), (driver.name, first)
            # W0 ran steps 1, 3, 5, 7, 9 (worker_seq 1-5), W1 steps 2, 4, 6, 8 (1-4).
            assert seqs(first) == [(6, 6, 3), (7, 7, 4), (8, 8, 4), (9, 9, 5)], driver.name
            steps(driver, 11, 12)
            second = driver.read(first["last_seq"], active=True)
            assert (second["last_seq"], second["dropped"]) == (11, 0), (driver.name, second)
            # Finished 10 and 11; step 12 is active: no seq yet, the worker_seq it will
            # finish with.
            assert seqs(second) == [(10, 10, 5), (11, 11, 6), (12, 0, 6)], driver.name
            late = driver.read(2, active=False)  # a reader that fell behind
            assert late["dropped"] == 5 and [r["seq"] for r in late["steps"]] == [8, 9, 10, 11]
            assert driver.read(11, active=False)["steps"] == []
            results[driver.name] = (first, second, late)
        finally:
            driver.close()
    same = {name: [(r["last_seq"], r["dropped"], seqs(r)) for r in reads]
            for name, reads in results.items()}
    assert same["native"] == same["python"]


def test_native_stats_refuses_a_bad_cursor(gate_library):
    from tictac_hooks.enforce.native.cgate import CGate
    from tictac_hooks.graph.schedule import ScheduleError

    g = CGate.alone(gate_library)
    try:
        for arg in ("finished since=-1", "finished since=x", "finished after=3", "all"):
            with pytest.raises(ScheduleError, match="stats takes 'active' or 'finished'"):
                g.control("stats", arg)
        assert g.control("stats", "finished since=0")["dropped"] == 0
    finally:
        g.close()


def test_a_step_its_worker_left_goes_when_the_worker_begins_another(gate_library):
    """A worker killed mid-step and started again: its old step holds "b" for "a",
    which never comes. Its first new step lets that go at once, marked superseded (not
    first in turn, not after the skip bound), and runs in the order itself. A next
    step that follows within the finish bound supersedes nothing (see the pacing
    tests, whose workers queue steps back to back)."""
    for driver in (PythonDriver(finish_after_s=FINISH_S, skip_after_s=30.0),
                   NativeDriver(gate_library, finish_after_s=FINISH_S, skip_after_s=30.0)):
        try:
            driver.install(["a", "b"])
            driver.arrive("old-b", 1, key("b"))
            driver.ready("old-b")
            time.sleep(FINISH_S * 2)
            assert driver.handed == [], driver.name  # held: its worker may still want it
            driver.arrive("new-a", 2, key("a"))
            driver.ready("new-a")
            driver.arrive("new-b", 2, key("b"))
            driver.ready("new-b")
            time.sleep(0.05)
            assert driver.handed == ["old-b", "new-a", "new-b"], driver.name
            time.sleep(FINISH_S * 3)
            old, new = sorted(driver.read(0, active=False)["steps"],
                              key=lambda r: r["step_id"])
            assert [t.get("early") for t in old["transfers"]] == ["superseded"], old
            assert not old["complete"] and new["complete"] and new["order"] == ["a", "b"]
            totals = driver.totals()
            assert totals["superseded_steps"] == totals["early_superseded"] == 1, totals
        finally:
            driver.close()
