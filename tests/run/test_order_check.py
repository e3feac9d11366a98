"""The order check (run/order_check.py): ABBA rounds, clean blocks (windows and
the PS's labels), per-round values and the sequential rule's decision, on step records
as the PS labels them; no cluster. The rule's own statistics: tests/run/."""

import math

import pytest

from tictac_hooks.run import order_check
from tictac_hooks.run.order_check import CheckPlan, Window, decide, round_values
from tictac_hooks.records import CHECK, PROFILING, SCHEDULED, WorkerStep

W0, W1 = "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"


def run_blocks(plan, times, workers=(W0,), steps=4, rounds=None, jitter=0.0, seed=0):
    """Records and windows of ``rounds`` rounds of ``plan`` (default: all): each block
    one window of ``steps`` steps per worker, back to back, labelled as the PS labels
    them; ``times``: candidate (None: TensorFlow's order) -> step time, each block's
    scaled by a factor drawn from 1 +- ``jitter`` (the machine's state per block)."""
    import random
    rng = random.Random(seed)
    recs, windows, t = [], [], 0.0
    index = {w: 0 for w in workers}
    for r in range(plan.rounds if rounds is None else rounds):
        blocks = plan.round_blocks(r, plan.names)
        for i, c in enumerate(blocks):
            scale = 1 + jitter * rng.uniform(-1, 1)
            name = c if c is not None else blocks[i ^ 1]
            start = t
            for k in range(steps):
                for w in workers:
                    x = times[c] * scale
                    recs.append(WorkerStep(w, index[w], t + 1e-6, x, 0.0,
                                           SCHEDULED if c else CHECK, order=c))
                    index[w] += 1
                t += times[c] * scale
            windows.append(Window(r, name, c is not None, start, t))
            t += 0.5  # the install between blocks
    return recs, windows


def test_plan_runs_rounds_in_a_seeded_random_order_and_checks_its_arguments():
    """The first round runs T first (the switch's order is in place), later rounds T or
    D first by the seed's sequence: both, about equally, in no fixed pattern."""
    plan = CheckPlan(rounds=3, block_steps=3, seed=6)
    assert plan.total_steps == 18
    assert [plan.t_first(r) for r in range(3)] == [True, False, True]
    assert [plan.scheduled_block(n) for n in range(18)] == \
        [True] * 3 + [False] * 6 + [True] * 6 + [False] * 3
    two = CheckPlan(rounds=2, block_steps=3, candidates=("tic", "tac"), seed=6)
    assert [two.block(3 * i) for i in range(8)] == ["tic", None, "tac", None,
                                                     None, "tic", None, "tac"]
    firsts = [CheckPlan(8, 3, seed=s).t_first(r) for s in range(50) for r in range(1, 8)]
    assert 0.4 < sum(firsts) / len(firsts) < 0.6
    assert len({tuple(CheckPlan(8, 3, seed=s).t_first(r) for r in range(8))
                for s in range(50)}) > 20
    for bad in (dict(rounds=-1, block_steps=3), dict(rounds=1, block_steps=1),
                dict(rounds=1.5, block_steps=3), dict(rounds=True, block_steps=3)):
        with pytest.raises(ValueError, match="check"):
            CheckPlan(**bad)
    assert CheckPlan(rounds=0, block_steps=0).total_steps == 0
    assert CheckPlan(8, 10).rule().min_rounds == 3 and CheckPlan(2, 10).rule().min_rounds == 2


def test_a_block_needs_three_steps_because_its_first_and_last_are_not_measured():
    with pytest.raises(ValueError, match=r"block_steps must be >= 3 .*straddles"):
        CheckPlan(rounds=1, block_steps=2)
    from tictac_hooks.run.settings import Settings
    with pytest.raises(ValueError, match="check_block_steps"):
        Settings.resolve(check_block_steps=2)


def test_a_block_holds_only_its_window_and_its_label_and_drops_each_first_step():
    """Clean blocks: a step outside the window (profiling, the switch), one the PS
    labelled with another order (it began before the install), a paused one and each
    worker's first in the window are not the block's."""
    w = Window(0, "tic", True, 10.0, 20.0)
    good = [WorkerStep(W0, i, 10.0 + i, 1.0, 0.0, SCHEDULED, order="tic") for i in range(4)]
    odd = [WorkerStep(W0, 9, 9.0, 7.0, 0.0, PROFILING),                  # before
           WorkerStep(W0, 10, 15.5, 7.0, 0.0, CHECK),                      # TF's order
           WorkerStep(W0, 11, 16.0, 7.0, 0.0, SCHEDULED, order="tac"),     # other order
           WorkerStep(W0, 12, 17.0, 7.0, 0.0, SCHEDULED, paused_s=0.1, order="tic"),
           WorkerStep(W0, 13, 20.0, 7.0, 0.0, SCHEDULED, order="tic")]     # after
    (steps,) = order_check.block_steps_of(good + odd, [w])
    assert [r.step for r in steps[W0]] == [1, 2, 3]
    d = Window(0, "tic", False, 10.0, 20.0)
    (steps,) = order_check.block_steps_of(good + odd, [d])
    assert steps[W0] == []  # the one TF-order step is the worker's first in the window


def test_one_value_per_round_pools_the_workers():
    plan = CheckPlan(rounds=3, block_steps=4)
    recs, windows = run_blocks(plan, {"tictac": 1.0, None: 1.25}, workers=(W0, W1))
    values = round_values(recs, windows)
    assert values == {"tictac": pytest.approx([math.log(1.25)] * 3)}
    # W1 slower in TF's order only: the pooled median per block, not per worker pairs.
    recs = [r if not (r.worker == W1 and r.phase == CHECK) else
            WorkerStep(r.worker, r.step, r.start, 2.0, 0.0, CHECK) for r in recs]
    assert len(round_values(recs, windows)["tictac"]) == 3


def test_a_steady_gain_is_kept_with_its_lower_bound_and_a_loss_is_dropped():
    plan = CheckPlan(rounds=8, block_steps=4, candidates=("tic",))
    recs, windows = run_blocks(plan, {"tic": 1.0, None: 1.1}, rounds=3, jitter=0.01)
    r = decide(recs, plan, windows, final=False)
    assert r.decision == order_check.TICTAC and r.chosen == "tic" and r.rounds == 3
    gain, low = r.gain("tic")
    assert gain == pytest.approx(0.1, abs=0.02) and 0 < low < gain
    assert r.bounds["tic"]["verdict"] == "keep" and len(r.values["tic"]) == 3
    assert r.workers[W0].tictac_median_step_time < r.workers[W0].default_median_step_time
    recs, windows = run_blocks(plan, {"tic": 1.1, None: 1.0}, rounds=3, jitter=0.01)
    r = decide(recs, plan, windows, final=False)
    assert r.decision == order_check.DEFAULT and r.chosen is None
    assert r.bounds["tic"]["verdict"] == "drop"


def test_noise_without_a_gain_goes_on_then_keeps_tensorflow_order():
    plan = CheckPlan(rounds=4, block_steps=4, candidates=("tic",))
    recs, windows = run_blocks(plan, {"tic": 1.0, None: 1.0}, rounds=3, jitter=0.2)
    # the blocks' machine state differs: the rounds disagree, the bounds straddle 0
    values = round_values(recs, windows)["tic"]
    assert min(values) < 0 < max(values)
    r = decide(recs, plan, windows, final=False)
    assert r.decision is None and "undecided" in r.reason
    r = decide(recs, plan, windows, final=True)
    assert r.decision == order_check.DEFAULT and r.chosen is None


def test_with_two_candidates_the_one_shown_faster_is_kept():
    plan = CheckPlan(rounds=8, block_steps=4, candidates=("tic", "tac"))
    recs, windows = run_blocks(plan, {"tic": 1.5, "tac": 1.0, None: 2.0}, rounds=3,
                               jitter=0.01)
    r = decide(recs, plan, windows, final=False)
    assert r.decision == order_check.TICTAC and r.chosen == "tac" and r.algorithm == "tac"
    assert r.candidates["tac"].median == pytest.approx(2.0, rel=0.01)
    assert r.candidates["tic"].median == pytest.approx(4 / 3, rel=0.01)
    assert r.spread.pairs == 3
    assert "/ 2" in r.rule  # alpha split over the two candidates
    recs, windows = run_blocks(plan, {"tic": 3.0, "tac": 2.5, None: 2.0}, rounds=3,
                               jitter=0.01)
    r = decide(recs, plan, windows, final=False)
    assert r.decision == order_check.DEFAULT and r.chosen is None


def test_no_measured_round_means_no_decision_and_says_why():
    plan = CheckPlan(rounds=3, block_steps=3)
    r = decide([], plan, [Window(0, "tictac", True, 0.0, 1.0)])
    assert r.decision is None and "no round measured" in r.reason
    assert r.spread.pairs == 0 and r.gain() is None


def test_the_result_round_trips_through_json():
    from tictac_hooks.records import CheckResult
    plan = CheckPlan(rounds=8, block_steps=4, candidates=("tic",))
    recs, windows = run_blocks(plan, {"tic": 1.0, None: 1.1}, rounds=3, jitter=0.01)
    r = decide(recs, plan, windows)
    back = CheckResult.from_json(r.to_json())
    assert back.values == r.values and back.bounds == r.bounds and back.gain() == r.gain()


def test_align_auto_staggers_training_and_aligns_inference_and_can_be_forced():
    from tictac_hooks.run.config import RunConfig
    from tictac_hooks.run.controller import Controller
    from tictac_hooks.run.settings import Settings
    def align(training, **kw):
        return Controller(RunConfig.build(Settings.resolve(**kw), ["127.0.0.1:1"],
                                          training=training)).align
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
    from tictac_hooks.run import planner
    from tictac_hooks.run.config import RunConfig
    from tictac_hooks.run.controller import Controller
    from tictac_hooks.run.settings import Settings
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
    c = Controller(RunConfig.build(Settings.resolve(algorithm="tac"), ["127.0.0.1:1"],
                                   install=False))
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
    from tictac_hooks.run.config import RunConfig
    from tictac_hooks.run.controller import Controller, Settings
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
        c = Controller(RunConfig.build(settings, ["127.0.0.1:1"], install=False))
        ((graph, schedule),) = c._parts_for(algorithm, {"worker:0": g}, None, set(),
                                            {"metric"})
        assert schedule.order == order, algorithm
        assert graph["metric"].declared is None and graph["w1"].declared == 2


def test_blocks_count_steps_per_worker_so_the_check_decides_at_64_workers():
    """Blocks of 10 steps per worker: 640 dispatched steps a block at 64 workers, and
    every worker's steps are in every block."""
    plan = CheckPlan(rounds=3, block_steps=10, candidates=("tic",), workers=64)
    assert plan.block_dispatched == 640 and plan.total_steps == 3 * 2 * 640
    workers = tuple(f"/job:worker/replica:0/task:{w}" for w in range(64))
    recs, windows = run_blocks(plan, {"tic": 1.0, None: 1.2}, workers=workers, steps=10,
                               jitter=0.01)
    r = decide(recs, plan, windows)
    assert r.decision == order_check.TICTAC and r.chosen == "tic"
    assert len(r.workers) == 64 and all(c.spread.pairs == 3 for c in r.workers.values())
    assert r.spread.median == pytest.approx(1.2, rel=0.01)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        CheckPlan(rounds=1, block_steps=3, workers=0)
