"""The native gate at 256 workers x 4 PS of synthetic arrivals (the C++ gate alone,
through its C API, as the conformance tests drive it): every step stays live until it
is quiet, whatever the number of workers, follows the order, and the gate's state
stays within its bounds."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tictac_hooks.enforce.native.cgate import CGate
from tictac_hooks.enforce.native.client import install_argument
from tictac_hooks.graph.schedule import Schedule

WORKERS, PS, TRANSFERS, ROUNDS = 256, 4, 8, 24
FINISH_S = 0.3


def _key(ps: int, worker: int, name: str) -> str:
    return (f"/job:ps/replica:0/task:{ps};1;/job:worker/replica:0/task:{worker}"
            f"/device:CPU:0;edge_1_{name};0:0")


@pytest.mark.slow
def test_256_workers_on_4_ps_no_live_step_evicted_order_followed_state_bounded(
        gate_library):
    rng = random.Random(42)
    gates = [CGate.alone(gate_library, skip_after_s=30.0) for _ in range(PS)]
    handed: dict[tuple[int, int], list[str]] = {}
    lock = threading.Lock()
    names = {p: [f"ps{p}/v{i}" for i in range(TRANSFERS)] for p in range(PS)}
    try:
        for p, g in enumerate(gates):
            g.control("configure", f"workers\t{WORKERS}\nfinish_after_s\t{FINISH_S}\n")
            g.control("install", install_argument(Schedule.from_order("tic", names[p])))
        live = []  # the most live steps at a PS after each round
        started = time.monotonic()
        for r in range(ROUNDS):
            # Every worker starts its next step at every PS: its requests in a random
            # order, then the responses, also in a random order; 256 x 4 steps live.
            for w in range(WORKERS):
                step = r * WORKERS + w + 1
                for p, g in enumerate(gates):
                    order = rng.sample(names[p], TRANSFERS)
                    tickets = {n: g.arrive(step, _key(p, w, n)) for n in order}
                    for n in rng.sample(order, TRANSFERS):
                        def back(p=p, step=step, n=n):
                            with lock:
                                handed.setdefault((p, step), []).append(n)
                        g.ready(tickets[n], 1000, back)
            live.append(max(g.control("stats", f"finished since={1 << 53}")["active_steps"]
                            for g in gates))
        elapsed = time.monotonic() - started
        time.sleep(FINISH_S * 3)
        steps = ROUNDS * WORKERS
        for p, g in enumerate(gates):
            stats = g.control("stats", "active since=0")
            totals = stats["totals"]
            # no live step was evicted, nothing went out of its order, nothing came late
            assert not {k for k in totals if k.startswith("early_")
                        or k in ("evicted_steps", "after_finish", "skipped")}, totals
            assert totals["listed"] == steps * TRANSFERS
            # every step finished by itself (quiet), complete, in the history
            assert stats["active_steps"] == 0 and stats["dropped"] == 0
            assert stats["history"] == steps <= stats["history_limit"] == 64 * WORKERS
            recs = stats["steps"]
            assert len(recs) == steps and all(rec["complete"] for rec in recs)
            assert {rec["worker"] for rec in recs} == {
                f"/job:worker/replica:0/task:{w}" for w in range(WORKERS)}
            assert all(rec["order"] == names[p] and rec["skips"] == 0 for rec in recs)
        # the hand-backs themselves, as gRPC would see them, in priority order
        assert len(handed) == steps * PS
        assert all(handed[(p, s)] == names[p] for (p, s) in handed)
        # The live state is bounded in time, not in steps: it holds the steps of the
        # last finish bound or so, and stops growing once the first ones are quiet
        # (a gate that kept every step would hold all 6,144 at the end).
        half = ROUNDS // 2
        assert max(live[half:]) <= 1.25 * max(live[:half]) < steps / 3, live
        print(f"{steps * PS * TRANSFERS} transfers of {WORKERS} workers x {PS} PS in "
              f"{elapsed:.1f} s; live steps per PS after each round: {live}")
    finally:
        for g in gates:
            g.close()
