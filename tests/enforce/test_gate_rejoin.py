"""The native gate's turns after a pause (gate.h, kRejoinAfterFinishes; Gate::TurnOf):
a worker that opened no step for ten finish bounds comes back level with the round its
job is in. Two ways to come back: every worker pauses together (an epoch end, a
checkpoint, an evaluation) and they return one after the other, or one worker is away
while the others go on. Either way, and in every arrival order, each worker's n-th step
afterwards has the same turn as the others', which the paced, aligned service shows:
every worker gets its k-th transfer of a round before any gets its (k+1)-th. A worker
one turn off is served whole before (or after) the others in every later round: the
straggler the W2 bench measured. Drives the C++ gate through its C API (no TensorFlow).
"""

import itertools
import random
import time

import pytest

from tests.enforce.test_gate_pacing import Driver

NAMES = ["a", "b", "c"]
FINISH_S = 0.05  # the away bound is ten of these: 0.5 s
CHIEF = "/job:chief/replica:0/task:0/device:CPU:0"


def task(t):
    return f"/job:worker/replica:0/task:{t}/device:CPU:0"


@pytest.fixture(scope="module")
def lib_path(gate_library):
    return gate_library


class Rounds:
    """One gate, paced (1 MB/s, window 0) and aligned; a round is one step of each
    worker given, all its transfers asked for at once behind a chief's read that holds
    the link for 30 ms, so the gate alone decides the service order."""

    def __init__(self, path):
        self.d = Driver(path)
        self.d.gate.control("configure", f"finish_after_s\t{FINISH_S}\n")
        self.d.install(NAMES, pace_rate=1e6, window=0, align=True)
        self.steps = itertools.count(1)

    def run(self, arrival):
        start = len(self.d.handed)
        self.d.send(next(self.steps), "a", 30_000, dest=CHIEF)
        for t in arrival:
            step = next(self.steps)
            for name in NAMES:
                self.d.send(step, name, 2_000, dest=task(t))
        want = start + 1 + len(arrival) * len(NAMES)
        deadline = time.monotonic() + 5.0
        while len(self.d.handed) < want and time.monotonic() < deadline:
            time.sleep(0.002)
        served = [dest for dest, _ in self.d.handed[start + 1:]]
        assert len(served) == len(arrival) * len(NAMES), self.d.handed[start:]
        time.sleep(0.02)
        return [int(dest.split("/task:")[1].split("/")[0]) for dest in served]

    def totals(self):
        return self.d.gate.control("configure", "")["totals"]


def interleaved(workers):
    """The aligned service of one round with every worker in the same turn."""
    return sorted(workers) * len(NAMES)


def arrival_orders(workers):
    if workers <= 3:
        return [list(p) for p in itertools.permutations(range(workers))]
    rng = random.Random(workers)
    shuffled = [rng.sample(range(workers), workers) for _ in range(2)]
    return [list(range(workers)), list(reversed(range(workers)))] + shuffled


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 8])
def test_workers_that_pause_together_come_back_in_one_turn(lib_path, workers):
    for arrival in arrival_orders(workers):
        r = Rounds(lib_path)
        everyone = list(range(workers))
        for _ in range(3):
            assert r.run(everyone) == interleaved(everyone)
        time.sleep(12 * FINISH_S)  # every worker away past the bound
        for n in range(4):  # the first round back arrives in this order
            got = r.run(arrival if n == 0 else everyone)
            assert got == interleaved(everyone), (arrival, n, got)
        assert r.totals()["returned"] == workers + 1  # (the chief's read comes back too)
        r.d.gate.close()


@pytest.mark.parametrize("arrival", list(itertools.permutations(range(3))))
def test_a_worker_away_while_the_others_go_on_comes_back_level(lib_path, arrival):
    """Task 2 runs one round, then is away while tasks 0 and 1 run eight: it comes back
    in their round whether its first step arrives before theirs or after."""
    r = Rounds(lib_path)
    assert r.run([0, 1, 2]) == interleaved([0, 1, 2])
    for _ in range(8):  # about 0.6 s: past the away bound
        assert r.run([0, 1]) == interleaved([0, 1])
        time.sleep(0.03)
    for n in range(3):
        got = r.run(list(arrival) if n == 0 else [0, 1, 2])
        assert got == interleaved([0, 1, 2]), (arrival, n, got)
    assert r.totals()["rejoined"] >= 1  # task 2 was behind by eight turns
    r.d.gate.close()


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("gap_s", [4 * FINISH_S, 0.0])
def test_a_one_off_read_of_one_worker_does_not_put_it_a_turn_apart(lib_path, workers, gap_s):
    """Worker 0 opens a channel of its own before training (the bench's master reads
    one tensor through it at set-up; a chief or an evaluation can do the same): the
    workers' steps afterwards share their turns. Right behind it (no gap) the first
    step may still be a turn apart (the one-off channel still expects its order's other
    transfers); the next one is not."""
    r = Rounds(lib_path)
    r.d.send(next(r.steps), "a", 10, dest=task(0))
    time.sleep(gap_s)
    everyone = list(range(workers))
    for n in range(4):
        got = r.run(everyone if n % 2 else everyone[::-1])
        if n or gap_s:
            assert got == interleaved(everyone), (n, got)
    r.d.gate.close()
