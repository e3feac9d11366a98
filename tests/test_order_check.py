"""The order check (callbacks/order_check.py): blocks, pairing and the decision rule,
on step records as the PS labels them; no cluster."""

import pytest

from tictac_hooks.callbacks import order_check
from tictac_hooks.callbacks.order_check import CheckPlan, decide, paired_ratios, run_medians
from tictac_hooks.records import CHECK, PROFILING, SCHEDULED, WorkerStep

W0, W1 = "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"


def steps(worker, pattern, t0=0.0):
    """pattern: [(phase, [step times])]; consecutive records of one worker."""
    out, t, i = [], t0, 0
    for phase, times in pattern:
        for x in times:
            out.append(WorkerStep(worker=worker, step=i, start=t, step_time=x,
                                  transfer_span=0.0, phase=phase))
            t += x
            i += 1
    return out


def test_plan_alternates_tictac_and_default_blocks_and_checks_its_arguments():
    plan = CheckPlan(rounds=2, block_steps=3)
    assert plan.total_steps == 12
    assert [plan.scheduled_block(n) for n in range(12)] == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3
    for bad in (dict(rounds=-1, block_steps=3), dict(rounds=1, block_steps=1),
                dict(rounds=1.5, block_steps=3), dict(rounds=True, block_steps=3)):
        with pytest.raises(ValueError, match="check"):
            CheckPlan(**bad)
    assert CheckPlan(rounds=0, block_steps=0).total_steps == 0


def test_a_block_needs_three_steps_because_its_first_and_last_are_not_measured():
    """A block's first step straddles the order change; its last holds the next block's
    install, a pause, so the step log gives it no step time. Two-step blocks would
    measure nothing (the check could only ever be inconclusive), so they are refused
    by the plan and by every frontend's settings, with the reason."""
    with pytest.raises(ValueError, match=r"block_steps must be >= 3 .*straddles"):
        CheckPlan(rounds=1, block_steps=2)
    from tictac_hooks.callbacks.settings import Settings
    with pytest.raises(ValueError, match="check_block_steps"):
        Settings.resolve(check_block_steps=2)
    # What the PS and the step log make of 3-step blocks: per block one measured step.
    def block(phase, x, order=None):
        return [(phase, x, 0.0, order), (phase, x, 0.0, order), (phase, None, 0.01, order)]
    pattern = (block(SCHEDULED, 1.0, "tic") + block(CHECK, 2.0)) * 2
    recs, t = [], 0.0
    for i, (phase, x, paused, order) in enumerate(pattern):
        recs.append(WorkerStep(W0, i, t, x, 0.0, phase, paused_s=paused, order=order))
        t += x or 1.0
    r = decide(recs, CheckPlan(2, 3), "tic")
    assert r.decision == order_check.TICTAC and r.spread.pairs == 2
    # The same records cut to two-step blocks (the straddling step and the paused one)
    # leave no measured step, hence no pair.
    two = [rec for rec in recs if rec.step % 3 != 1]
    assert decide(two, CheckPlan(2, 3), "tic").decision is None


def test_each_run_drops_its_straddling_first_step_and_pairs_default_with_the_tictac_before():
    recs = steps(W0, [(PROFILING, [9.0, 9.0]),            # before the switch: ignored
                      (SCHEDULED, [5.0, 1.0, 1.0, 1.2]),  # 5.0 straddles the switch
                      (CHECK, [7.0, 2.0, 2.0, 2.2]),
                      (SCHEDULED, [3.0, 1.1, 1.1]),
                      (CHECK, [0.1, 2.2, 2.2])])
    medians = run_medians(recs)[W0]
    assert [(p, round(m, 3)) for p, m, _ in medians] == [
        (SCHEDULED, 1.0), (CHECK, 2.0), (SCHEDULED, 1.1), (CHECK, 2.2)]
    assert paired_ratios({W0: medians})[W0] == pytest.approx([2.0, 2.0])


def test_decision_keeps_tictac_when_the_median_pair_is_not_slower_and_clears_otherwise():
    plan = CheckPlan(rounds=2, block_steps=4)
    faster = steps(W0, [(SCHEDULED, [1, 1, 1, 1]), (CHECK, [2, 2, 2, 2])] * 2) + \
        steps(W1, [(SCHEDULED, [1, 1, 1, 1]), (CHECK, [1.5, 1.5, 1.5, 1.5])] * 2)
    r = decide(faster, plan, "tic")
    assert r.decision == order_check.TICTAC and r.spread.pairs == 4
    assert r.spread.low == pytest.approx(1.5) and r.spread.high == pytest.approx(2.0)
    assert r.workers[W0].tictac_median_step_time == pytest.approx(1.0)
    assert r.workers[W0].default_median_step_time == pytest.approx(2.0)
    slower = steps(W0, [(SCHEDULED, [2, 2, 2, 2]), (CHECK, [1, 1, 1, 1])] * 2)
    assert decide(slower, plan, "tac").decision == order_check.DEFAULT
    # Paused steps and steps without a time are not in any median.
    odd = [WorkerStep(W0, 0, 0.0, None, 0.0, SCHEDULED)] + steps(W0, [(SCHEDULED, [3])], 1)
    assert run_medians(odd)[W0] == [] or all(m > 0 for _, m, _ in run_medians(odd)[W0])


def test_no_pair_means_no_decision_and_says_why():
    r = decide(steps(W0, [(SCHEDULED, [1, 1, 1])]), CheckPlan(1, 3), "tic")
    assert r.decision is None and "no (TicTac, TensorFlow) block pair" in r.reason
    assert r.spread.pairs == 0


def test_with_two_candidates_the_faster_is_kept_and_the_blocks_rotate():
    plan = CheckPlan(rounds=2, block_steps=3, candidates=("tic", "tac"))
    assert plan.total_steps == 24
    assert [plan.block(n) for n in range(24)] == (["tic"] * 3 + [None] * 3 + ["tac"] * 3
                                                 + [None] * 3) * 2

    def labelled(worker, pattern):
        out, t = [], 0.0
        for i, (phase, order, x) in enumerate(pattern):
            out.append(WorkerStep(worker, i, t, x, 0.0, phase, order=order))
            t += x
        return out
    block = lambda phase, order, x: [(phase, order, x)] * 4  # noqa: E731
    # TIC 1.5 s, TAC 1.0 s, TensorFlow's 2.0 s per step: TAC gains most.
    recs = labelled(W0, (block(SCHEDULED, "tic", 1.5) + block(CHECK, None, 2.0)
                         + block(SCHEDULED, "tac", 1.0) + block(CHECK, None, 2.0)) * 2)
    r = decide(recs, plan, "tic")
    assert r.decision == order_check.TICTAC and r.chosen == "tac"
    assert r.candidates["tic"].median == pytest.approx(2.0 / 1.5)
    assert r.candidates["tac"].median == pytest.approx(2.0)
    assert r.algorithm == "tac" and r.spread.pairs == 2
    # Both slower than TensorFlow's order: cleared.
    slow = labelled(W0, (block(SCHEDULED, "tic", 3.0) + block(CHECK, None, 2.0)
                         + block(SCHEDULED, "tac", 2.5) + block(CHECK, None, 2.0)) * 2)
    r = decide(slow, plan, "tic")
    assert r.decision == order_check.DEFAULT and r.chosen is None


def test_align_auto_staggers_training_and_aligns_inference_and_can_be_forced():
    from tictac_hooks.callbacks.controller import Controller
    from tictac_hooks.callbacks.settings import Settings
    def align(training, **kw):
        return Controller(["127.0.0.1:1"], Settings.resolve(**kw), training=training).align
    assert align(True) is False and align(False) is True  # auto
    assert align(True, align="on") is True and align(False, align="off") is False
    with pytest.raises(ValueError, match="align must be one of auto, on, off"):
        Settings.resolve(align="yes")
    from tictac_hooks import TicTac, TicTacHook
    with pytest.raises(ValueError, match="align must be one of"):
        TicTac(align="sideways")
    with pytest.raises(ValueError, match="training must be True or False"):
        TicTacHook(training="yes")


def test_tac_times_each_recv_by_the_bytes_the_ps_served_it_while_profiling():
    """The trace gives both edges of a tensor sent over two edges the tensor's size; the
    PS serves it over one and a few bytes over the other (the copy feeding only the
    gradient's ShapeN). The profiling records say which edge each copy was, and TAC's
    oracle takes those bytes (a recv no record holds keeps its traced size)."""
    from tictac_hooks.callbacks import planner
    from tictac_hooks.callbacks.controller import Controller
    from tictac_hooks.callbacks.settings import Settings
    from tictac_hooks.graph import Graph, Op
    from tictac_hooks.records import GateStep, TransferRecord

    def rec(step, *sizes):
        return GateStep(step_id=step, worker=W0, schedule_version=None, algorithm=None,
                        complete=True, order=tuple(n for n, _, _ in sizes),
                        transfers=tuple(TransferRecord(n, "pass", -1, b, 0.0, 0.0, -1, 0.0,
                                                       tensor=t) for n, b, t in sizes),
                        bytes=sum(b for _, b, _ in sizes), start=0.0, end=1.0, skipped=(),
                        skips=0, violations=0, reordered=0, unlisted=(), ps="ps0")
    g = Graph([Op("edge_1_w", "recv", channel="ps0", bytes=400),
               Op("edge_2_w", "recv", channel="ps0", bytes=400),
               Op("v", "recv", channel="ps0", bytes=100),
               Op("u", "recv", channel="ps0", bytes=50),
               Op("x", "compute", ("edge_1_w", "v", "u")), Op("z", "compute", ("x", "edge_2_w"))])
    c = Controller(["127.0.0.1:1"], Settings.resolve(algorithm="tac"), install=False)
    c.steplog.add([rec(s, ("w", 400, "edge_1_w"), ("w", 8, "edge_2_w"), ("v", 90 + s, ""))
                   for s in (1, 2, 3)])
    timed = planner.timed(g, {"x": 1.0, "z": 2.0}, 100.0, c.steplog.transfer_bytes())
    assert [timed[n].time for n in ("edge_1_w", "edge_2_w", "v", "u")] == \
        pytest.approx([4.0, 0.08, 0.92, 0.5])
    assert (timed["x"].time, timed["z"].time) == (1.0, 2.0)


def test_the_controller_orders_by_declaration_or_first_use_as_the_bench_asks():
    """The bench's controllers take any algorithm of compute_order: "declared" orders
    the DAG the extraction gave positions (late recvs are no transfers to order);
    "layer" is first-use."""
    import dataclasses
    from tictac_hooks.callbacks.controller import Controller, Settings
    from tictac_hooks.graph import Graph, Op
    g = Graph([Op("w1", "recv", channel="ps0", bytes=4, declared=2),
               Op("w2", "recv", channel="ps0", bytes=4, declared=0),
               Op("w3", "recv", channel="ps0", bytes=4, declared=1),
               Op("metric", "recv", channel="ps0", bytes=4, declared=3),
               Op("x", "compute", ("w1",)), Op("y", "compute", ("x", "w2")),
               Op("z", "compute", ("y", "w3", "metric"))])
    for algorithm, order in (("declared", ("w2", "w3", "w1")),
                             ("first-use", ("w1", "w2", "w3")),
                             ("layer", ("w1", "w2", "w3"))):
        settings = dataclasses.replace(Settings.resolve(), algorithm=algorithm)
        c = Controller(["127.0.0.1:1"], settings, install=False)
        ((graph, schedule),) = c._parts_for(algorithm, {"worker:0": g}, None, set(),
                                            {"metric"})
        assert schedule.order == order, algorithm
        assert graph["metric"].declared is None and graph["w1"].declared == 2


def _dispatched_over(plan, workers, tictac_s=1.0, default_s=1.2):
    """What the PSes record when the loop dispatches ``plan``'s steps and the
    coordinator hands them to ``workers`` workers in turn: per worker, its steps in
    the order they ran, each block's last step holding the next install (no time)."""
    by_worker = {w: [] for w in range(workers)}
    for n in range(plan.total_steps):
        by_worker[n % workers].append(plan.block(n))
    recs = []
    for w, blocks in by_worker.items():
        worker, t = f"/job:worker/replica:0/task:{w}", 0.0
        for i, order in enumerate(blocks):
            x = tictac_s if order else default_s
            last_of_block = i + 1 == len(blocks) or blocks[i + 1] != order
            recs.append(WorkerStep(worker, i, t, None if last_of_block else x, 0.0,
                                   SCHEDULED if order else CHECK,
                                   paused_s=0.01 if last_of_block else 0.0, order=order))
            t += x
    return recs


def test_blocks_count_steps_per_worker_so_the_check_decides_at_64_workers():
    """Blocks of 10 steps per worker: 640 dispatched steps a block at 64 workers, and
    every worker gives its pairs. The same 10 steps counted over all workers (the old
    blocks) give each worker at most one step a block: no pair, no decision."""
    plan = CheckPlan(rounds=3, block_steps=10, candidates=("tic",), workers=64)
    assert plan.block_dispatched == 640 and plan.total_steps == 3 * 2 * 640
    r = decide(_dispatched_over(plan, 64), plan, "tic")
    assert r.decision == order_check.TICTAC and r.chosen == "tic"
    assert len(r.workers) == 64 and all(c.spread.pairs == 3 for c in r.workers.values())
    assert r.spread.median == pytest.approx(1.2)
    old = CheckPlan(rounds=3, block_steps=10, candidates=("tic",))
    stuck = decide(_dispatched_over(old, 64), old, "tic")
    assert stuck.decision is None and stuck.spread.pairs == 0
    with pytest.raises(ValueError, match="workers must be >= 1"):
        CheckPlan(rounds=1, block_steps=3, workers=0)
