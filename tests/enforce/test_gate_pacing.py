"""The native gate's pacing (gate.h, "Pacing"): with a link rate set, the next listed
transfer whose turn came is handed to gRPC only once the bytes already handed back have
drained to the window; the skip timer never skips a transfer that waits only for the
link; without a rate nothing is held for the link. Drives the C++ gate through its C API
(no TensorFlow)."""

import threading
import time

import pytest

from tictac_hooks.enforce.native.client import install_argument
from tictac_hooks.graph.schedule import Schedule

SRC = "/job:ps/replica:0/task:0/device:CPU:0"
W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"


def key(name, edge=1, dest=W0):
    return f"{SRC};1;{dest};edge_{edge}_{name};0:0"


@pytest.fixture(scope="module")
def lib_path(gate_library):
    return gate_library


class Driver:
    def __init__(self, path, skip_after_s=2.0):
        from tictac_hooks.enforce.native.cgate import CGate
        self.gate = CGate.alone(path, skip_after_s=skip_after_s)
        self.times = {}
        self.handed = []  # (destination, name) in hand-back order
        self.event = threading.Event()

    def install(self, names, pace_rate=None, window=None, align=None):
        return self.gate.control("install", install_argument(
            Schedule.from_order("test", names), pace_rate=pace_rate, window_bytes=window,
            align=align))

    def send(self, step, name, nbytes, dest=W0):
        ticket = self.gate.arrive(step, key(name, dest=dest))

        def handed():
            self.times[name] = time.monotonic()
            self.handed.append((dest, name))
            self.event.set()
        self.gate.ready(ticket, nbytes, handed)

    def wait_for(self, names, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(n in self.times for n in names):
            time.sleep(0.005)
        return all(n in self.times for n in names)


def test_the_next_transfer_waits_until_the_backlog_drains_to_the_window(lib_path):
    d = Driver(lib_path)
    rate, window, big = 1e6, 1000, 100_000  # 100 kB at 1 MB/s: 0.1 s on the wire
    summary = d.install(["a", "b", "c"], pace_rate=rate, window=window)
    assert summary["expected"] == 3
    assert d.gate.control("configure", "")["pace_rate"] == rate
    t0 = time.monotonic()
    for name in ("a", "b", "c"):
        d.send(1, name, big)
    assert d.wait_for(["a", "b", "c"])
    gap_ab, gap_bc = d.times["b"] - d.times["a"], d.times["c"] - d.times["b"]
    # b goes once a's 100 kB have drained to the 1 kB window: 99 ms at 1 MB/s.
    assert d.times["a"] - t0 < 0.05
    assert 0.08 <= gap_ab <= 0.5 and 0.08 <= gap_bc <= 0.5, (gap_ab, gap_bc)
    (rec,) = [r for r in d.gate.control("stats", "active")["steps"]]
    assert rec["order"] == ["a", "b", "c"] and rec["skips"] == 0
    d.gate.close()


def test_a_transfer_held_only_for_the_link_is_never_skipped(lib_path):
    # Skip bound 50 ms, but b waits about 0.3 s for the link: its turn came, so the
    # timer must not skip it (nor c behind it).
    d = Driver(lib_path, skip_after_s=0.05)
    d.install(["a", "b", "c"], pace_rate=1e6, window=0)
    for name, nbytes in (("a", 300_000), ("b", 10), ("c", 10)):
        d.send(2, name, nbytes)
    assert d.wait_for(["a", "b", "c"])
    assert d.times["b"] - d.times["a"] >= 0.25
    (rec,) = d.gate.control("stats", "active")["steps"]
    assert rec["skips"] == 0 and rec["order"] == ["a", "b", "c"], rec
    d.gate.close()


def test_without_a_rate_nothing_waits_for_the_link(lib_path):
    d = Driver(lib_path)
    d.install(["a", "b", "c"])
    assert d.gate.control("configure", "")["pace_rate"] == 0
    for name in ("a", "b", "c"):
        d.send(3, name, 10_000_000)
    assert d.wait_for(["a", "b", "c"])
    assert d.times["c"] - d.times["a"] < 0.05
    d.gate.close()


def test_bad_pacing_settings_are_refused_with_the_setting_named(lib_path):
    from tictac_hooks.graph.schedule import ScheduleError
    d = Driver(lib_path)
    for line, word in (("pace_rate\t-1", "pace_rate"), ("pace_rate\tnan", "pace_rate"),
                       ("window_bytes\t-5", "window_bytes")):
        with pytest.raises(ScheduleError, match=word):
            d.gate.control("configure", line + "\norder\n")
    d.gate.close()


@pytest.mark.parametrize("align", [True, False])
def test_aligned_pacing_gives_every_destination_its_kth_before_any_its_next(lib_path, align):
    # One step shared by two workers (in-graph replication), every response ready at
    # once, W0's first. Aligned: the link goes to the destination with fewer handed
    # back, so the two alternate. First come, first served: W0 takes the link each time
    # it has room, and W1 waits for all of W0's.
    d = Driver(lib_path)
    names = ["a", "b", "c", "d"]
    summary = d.install(names, pace_rate=1e6, window=0, align=align)
    assert d.gate.control("configure", "")["align"] is align
    for dest in (W0, W1):
        for name in names:
            d.send(7, name, 10_000, dest=dest)  # 10 ms each on the wire
    deadline = time.monotonic() + 5.0
    while len(d.handed) < 8 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert summary["expected"] == 4 and len(d.handed) == 8, d.handed
    dests = [0 if dest == W0 else 1 for dest, _ in d.handed]
    if align:
        assert dests == [0, 1] * 4, d.handed
    else:
        assert dests == [0] * 4 + [1] * 4, d.handed
    for w in (W0, W1):  # each destination still gets its own order
        assert [n for dest, n in d.handed if dest == w] == names
    d.gate.close()


def test_align_setting_is_checked(lib_path):
    from tictac_hooks.graph.schedule import ScheduleError
    d = Driver(lib_path)
    assert d.gate.control("configure", "")["align"] is True  # the default
    with pytest.raises(ScheduleError, match="align must be 1"):
        d.gate.control("configure", "align\tyes\norder\n")
    d.gate.close()


def _conserve(d, after_s):
    return d.gate.control("configure", f"conserve_after_s\t{after_s}\norder\n")


def test_strict_order_holds_a_ready_transfer_while_the_link_idles(lib_path):
    # Work conservation off (the default): b is ready, a (its turn) never asked for;
    # b waits for the skip timer, however idle the link.
    d = Driver(lib_path, skip_after_s=0.4)
    d.install(["a", "b"], pace_rate=1e6, window=0)
    assert d.gate.control("configure", "")["conserve_after_s"] is None
    t0 = time.monotonic()
    d.send(11, "b", 10)
    assert d.wait_for(["b"])
    assert d.times["b"] - t0 >= 0.35
    (rec,) = d.gate.control("stats", "active")["steps"]
    assert [s["name"] for s in rec["skipped"]] == ["a"], rec
    d.gate.close()


def test_work_conservation_sends_a_ready_transfer_once_the_link_idled(lib_path):
    d = Driver(lib_path, skip_after_s=2.0)
    d.install(["a", "b", "c"], pace_rate=1e6, window=0)
    assert _conserve(d, 0.05)["conserve_after_s"] == 0.05
    t0 = time.monotonic()
    d.send(12, "b", 10)  # a, whose turn it is, is not requested: b goes after 50 ms
    assert d.wait_for(["b"])
    assert 0.04 <= d.times["b"] - t0 < 0.5, d.times["b"] - t0
    d.send(12, "a", 10)
    d.send(12, "c", 10)
    assert d.wait_for(["a", "c"])
    (rec,) = d.gate.control("stats", "active")["steps"]
    assert rec["order"] == ["b", "a", "c"] and rec["skips"] == 0, rec
    assert rec["reordered"] == 1
    assert d.gate.control("configure", "")["totals"]["out_of_turn"] == 1
    d.gate.close()


def test_work_conservation_keeps_the_order_while_the_link_is_busy(lib_path):
    # a occupies the link for 0.1 s; c is ready but b (its turn before c) is asked for
    # only at 30 ms: the link never idled, so b still goes before c.
    d = Driver(lib_path, skip_after_s=2.0)
    d.install(["a", "b", "c"], pace_rate=1e6, window=0)
    _conserve(d, 0.05)
    d.send(13, "a", 100_000)
    d.send(13, "c", 10)
    time.sleep(0.03)
    d.send(13, "b", 10)
    assert d.wait_for(["a", "b", "c"])
    (rec,) = d.gate.control("stats", "active")["steps"]
    assert rec["order"] == ["a", "b", "c"], rec
    assert "out_of_turn" not in d.gate.control("configure", "")["totals"]
    d.gate.close()


def test_work_conservation_setting_is_checked_and_turns_off(lib_path):
    from tictac_hooks.graph.schedule import ScheduleError
    d = Driver(lib_path)
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ScheduleError, match="conserve_after_s must be"):
            _conserve(d, bad)
    assert _conserve(d, 0)["conserve_after_s"] == 0
    assert _conserve(d, "off")["conserve_after_s"] is None
    d.gate.close()


def test_every_ps_serves_the_workers_in_one_order_whatever_their_arrival(lib_path):
    """Two PS, four workers (ParameterServerStrategy: a step id per worker step), two
    steps each. The workers' requests reach the two PSes in opposite orders, and all
    their responses are ready at once behind a busy link. Arrival order would serve
    worker 3 first at one PS and last at the other (each worker then finishes at its
    worst PS); the turns serve every worker's first step before any second step, in
    task order, at both PSes."""
    names = ["a", "b"]
    workers = [f"/job:worker/replica:0/task:{w}/device:CPU:0" for w in range(4)]
    orders = {0: [0, 1, 2, 3], 1: [3, 2, 1, 0]}  # arrival order of the workers per PS
    served = {}
    for ps, arrival in orders.items():
        d = Driver(lib_path)
        d.install(names, pace_rate=1e6, window=0, align=False)
        # the chief's read fills the link for 50 ms: the workers' queue behind it
        d.send(99, "a", 50_000, dest="/job:chief/replica:0/task:0/device:CPU:0")
        for turn in range(2):
            for w in arrival:
                step = 1000 * (turn + 1) + w
                for n in names:
                    d.send(step, n, 5_000, dest=workers[w])
        deadline = time.monotonic() + 5.0
        while len(d.handed) < 1 + 2 * 4 * len(names) and time.monotonic() < deadline:
            time.sleep(0.005)
        served[ps] = [workers.index(dest) for dest, _ in d.handed[1:]]
        d.gate.close()
    expected = [w for w in range(4) for _ in names] * 2  # turn 0 by task, then turn 1
    assert served[0] == served[1] == expected, served


@pytest.mark.parametrize("align,switch", [(False, False), (True, False), (False, True)])
def test_many_workers_behind_a_busy_link_are_served_by_the_rule(lib_path, align, switch):
    """48 workers (a step id each: one turn), 3 transfers each. The first 4 workers' first
    transfers go at once; then the rest are all ready behind a busy link, in a shuffled
    worker order and each worker's in reverse (most wait for their predecessor, then
    become eligible as it goes). The paced service's indexes hand them back exactly by
    the rule: one after the other (align off), worker by worker in task order; aligned,
    the fewest handed back first (every worker's k-th before any worker's (k+1)-th),
    then task order. With ``switch`` the gate is told to align while they wait, and
    re-ranks them (the 4 workers one ahead go last)."""
    import random
    names, n, ahead = ["a", "b", "c"], 48, 4
    workers = [f"/job:worker/replica:0/task:{w}/device:CPU:0" for w in range(n)]
    d = Driver(lib_path)
    d.install(names, pace_rate=1e6, window=0, align=align)
    for w in range(ahead):
        d.send(1000 + w, "a", 200, dest=workers[w])
    deadline = time.monotonic() + 5.0
    while len(d.handed) < ahead and time.monotonic() < deadline:
        time.sleep(0.005)
    # the chief's read fills the link for 150 ms: the rest queue behind it
    started = time.monotonic()
    d.send(99, "a", 150_000, dest="/job:chief/replica:0/task:0/device:CPU:0")
    for w in random.Random(7).sample(range(n), n):
        for name in reversed(names[1:] if w < ahead else names):
            d.send(1000 + w, name, 200, dest=workers[w])
    if switch:
        d.gate.control("configure", "align\t1\n")
    assert time.monotonic() - started < 0.12, "queued after the link freed: no test"
    deadline = time.monotonic() + 10.0
    while len(d.handed) < 1 + n * len(names) and time.monotonic() < deadline:
        time.sleep(0.005)
    served = [(workers.index(dest), name) for dest, name in d.handed[ahead + 1:]]
    if align or switch:
        expected = [(w, names[0]) for w in range(ahead, n)] + [
            (w, name) for name in names[1:] for w in range(n)]
    else:
        expected = [(w, name) for w in range(n) for name in names
                    if w >= ahead or name != names[0]]
    assert served == expected, served[:12]
    d.gate.close()


def test_a_worker_that_comes_back_is_served_in_its_turn_not_first(lib_path):
    """Task 2 runs one step and is away (killed, restarted) while tasks 0 and 1 run six
    each. Its turns would make it the earliest for five steps (served before everyone
    while the link is busy); it comes back level with the others instead, and within
    one turn the lowest task goes first (align off): 0, 1, then 2."""
    d = Driver(lib_path)
    d.gate.control("configure", "finish_after_s\t0.05\n")  # away: 10 x 0.05 s
    d.install(["a"], pace_rate=1e6, window=0, align=False)
    tasks = [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(3)]
    steps = iter(range(1, 1000))

    def handed(n):
        deadline = time.monotonic() + 5.0
        while len(d.handed) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(d.handed)

    d.send(next(steps), "a", 10, dest=tasks[2])
    for _ in range(6):  # 0.6 s: task 2 is away for more than 10 finish bounds
        for t in (0, 1):
            d.send(next(steps), "a", 10, dest=tasks[t])
        time.sleep(0.1)
    assert handed(13) == 13
    # the chief's read fills the link for 50 ms: the three queue behind it
    d.send(next(steps), "a", 50_000, dest="/job:chief/replica:0/task:0/device:CPU:0")
    for t in (2, 1, 0):
        d.send(next(steps), "a", 5_000, dest=tasks[t])
    assert handed(17) == 17
    assert [tasks.index(dest) for dest, _ in d.handed[-3:]] == [0, 1, 2], d.handed
    assert d.gate.control("configure", "")["totals"]["rejoined"] == 1
    d.gate.close()


def test_the_pacing_benchmark_drives_every_worker_through_the_paced_service(lib_path):
    """benchmarks/bench_gate_pacing.py's measurement at 16 workers: every b waits for
    its a (it raises otherwise), then all 32 go back through the paced service, and
    the time per hand-back is measured."""
    import importlib.util
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(
        "bench_gate_pacing", os.path.join(root, "benchmarks", "bench_gate_pacing.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert 0 < mod.one_gate(lib_path, 16) < 0.01
