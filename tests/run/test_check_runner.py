"""The order check as it runs (run/check_runner.py), against a gate in this
process: the block sequence it installs and clears, step by step; its decision on given
step records, and what the gate runs after it; suspension, re-checks and a failed
switch. The statistics themselves are test_order_check.py's."""

import pytest

from tictac_hooks.run import order_check, planner
from tictac_hooks.run.check_runner import CheckRunner
from tictac_hooks.run.order_check import CheckPlan
from tictac_hooks.enforce import inprocess
from tictac_hooks.enforce.client import clear_everywhere
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.records import CHECK, PROFILING, SCHEDULED, WorkerStep

PS = "127.0.0.1:61301"
W0 = "/job:worker/replica:0/task:0/device:CPU:0"
ROUNDS, BLOCK = 3, 3


def graph() -> Graph:
    """TIC and TAC order it differently: TAC sends the small p1 first, whose op is long."""
    return Graph([Op("p0", "recv", channel="ps:0", bytes=4000)]
                 + [Op(f"p{i}", "recv", channel="ps:0", bytes=100) for i in (1, 2, 3)]
                 + [Op("l0", "compute", ("p0",)), Op("l1", "compute", ("p1",)),
                    Op("l2", "compute", ("l0", "l1", "p2", "p3"))])


def candidates() -> dict:
    g = {"worker": graph()}
    served = {f"p{i}" for i in range(4)}
    return {"tic": planner.parts_for("tic", g, None, served, set()),
            "tac": planner.parts_for("tac", g, {"l0": 0.01, "l1": 0.5, "l2": 0.02}, served,
                                     set(), link_rate=1e4, served_bytes={})}


class Harness:
    """A CheckRunner wired to an in-process gate as the controller wires it. Its clock
    is the steps' own: each dispatched step takes the step time of the order the gate
    runs (``times``: algorithm, None for TensorFlow's -> seconds, each step x a factor
    from ``jitter``), and is recorded as the PS records it, for the next poll."""

    def __init__(self, gate: Gate, plan=CheckPlan(ROUNDS, BLOCK, seed=6), recheck_every: int = 0,
                 installs: bool = True, times=None, jitter: float = 0.0) -> None:
        import random
        self.gate, self.pending, self.t, self.index = gate, [], 0.0, 0
        self.times = dict(times or {"tic": 1.0, "tac": 1.0, None: 1.0})
        self.rng, self.jitter = random.Random(0), jitter
        self.joins, self.pauses, self.lines, self.results = 0, [], [], []
        self.runner = CheckRunner(plan, recheck_every, installs, self.join, host=self,
                                  clock=lambda: self.t)

    # what the runner asks of its host (check_runner.CheckHost), as the controller does
    def install_candidate(self, parts, only=None) -> None:
        planner.install(parts, [PS], 5.0, 0, only=only)

    def clear_orders(self, only=None) -> None:
        clear_everywhere(list(only) if only is not None else [PS])

    def mark_pause(self, start: float, end: float) -> None:
        self.pauses.append((start, end))

    def say(self, message: str) -> None:
        self.lines.append(message)

    def check_decided(self, result) -> None:
        self.results.append(result)

    def join(self) -> None:
        self.joins += 1

    def poll(self) -> None:
        self.runner.recorded(self.pending)
        self.pending = []

    def step(self, n: int = 1) -> None:
        """Dispatches ``n`` steps; each runs in the order the gate enforces then."""
        for _ in range(n):
            self.runner.step_dispatched()
            order = self.running()
            x = self.times[order] * (1 + self.jitter * self.rng.uniform(-1, 1))
            self.pending.append(WorkerStep(W0, self.index, self.t + 1e-6, x, 0.0,
                                           SCHEDULED if order else CHECK, order=order))
            self.index += 1
            self.t += x

    def switch(self, algorithm: str = "tic") -> None:
        """What Controller.switch does: candidates, the install, the check's start."""
        c = candidates()
        self.runner.switched(algorithm, c)
        planner.install(c[algorithm], [PS], 5.0, 0)
        self.runner.installed = algorithm
        self.runner.start()

    def running(self) -> str | None:
        """The algorithm of the order the gate enforces now (None: TensorFlow's)."""
        return self.gate.summary()["algorithm"]

    def until_decided(self, limit: int = 10_000) -> None:
        before = len(self.results)
        for _ in range(limit):
            if len(self.results) > before:
                return
            self.step()
        raise AssertionError("no decision")


@pytest.fixture
def gate():
    g = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, g):
        yield g


def test_the_rounds_run_blocks_of_each_candidate_and_tensorflow_order(gate):
    h = Harness(gate, plan=CheckPlan(ROUNDS, BLOCK, seed=6))
    h.switch()
    plan = h.runner.plan
    assert plan.candidates == ("tic", "tac") and plan.rule().max_rounds == ROUNDS
    assert plan.seed == 6 and not plan.t_first(1)  # seed 6: round 1 runs D first
    ran = []
    for n in range(2 * 4 * BLOCK):  # two rounds, no look yet (looks from round 3)
        h.step()
        ran.append(h.running())
    assert ran == [plan.block(n) for n in range(len(ran))]
    assert ran[:4 * BLOCK] == ["tic"] * BLOCK + [None] * BLOCK + ["tac"] * BLOCK + [None] * BLOCK
    assert ran[4 * BLOCK:] == [None] * BLOCK + ["tic"] * BLOCK + [None] * BLOCK + ["tac"] * BLOCK
    # Every block closes on a wait for its steps and opens on its install: one
    # window each, from the install in force to the end of its steps.
    h.step()
    assert len(h.runner.windows) == 8 and h.joins == 8
    w = h.runner.windows
    assert [(x.round, x.candidate, x.tictac) for x in w[:4]] == [
        (0, "tic", True), (0, "tic", False), (0, "tac", True), (0, "tac", False)]
    assert all(a.end <= b.start for a, b in zip(w, w[1:]))
    # the switch's, TAC in round 0, TIC and TAC in round 1, TIC opening round 2
    # (seed 6: T first again in round 2)
    assert plan.t_first(2) and inprocess.calls(PS)["install"] == 1 + 1 + 2 + 1
    assert h.runner.running and h.results == []


def test_the_decision_keeps_the_candidate_shown_faster_and_the_gate_runs_it(gate):
    h = Harness(gate, plan=CheckPlan(8, BLOCK, seed=6), times={"tic": 1.5, "tac": 1.0, None: 2.0},
                jitter=0.01)
    h.switch()
    h.until_decided()
    result = h.results[0]
    assert result.decision == order_check.TICTAC and result.chosen == "tac"
    assert result.kept == "tac" and result.rounds == 3  # decided at the first look
    assert h.runner.kept_order == "tac" and h.running() == "tac"
    assert not h.runner.running
    gain, low = result.gain("tac")
    assert gain == pytest.approx(1.0, rel=0.05) and 0 < low < gain
    assert h.lines[-1].startswith("order check: TAC kept: +")
    assert "(at least +" in h.lines[-1] and "3 rounds; TIC +3" in h.lines[-1]
    # With the decision taken, later steps change nothing (recheck_every 0).
    installs = inprocess.calls(PS)["install"]
    h.step(20)
    assert inprocess.calls(PS)["install"] == installs and h.running() == "tac"


def test_slower_orders_are_cleared_and_no_gain_is_claimed(gate):
    h = Harness(gate, plan=CheckPlan(8, BLOCK, seed=6), times={"tic": 3.0, "tac": 2.5, None: 2.0},
                jitter=0.01)
    h.switch()
    h.until_decided()
    assert h.results[-1].decision == order_check.DEFAULT
    assert h.results[-1].kept == order_check.DEFAULT and h.results[-1].rounds == 3
    assert h.runner.kept_order is None and h.running() is None
    assert h.lines[-1].endswith("not shown faster, TensorFlow's order kept; no gain is claimed")


def test_a_candidate_shown_not_worth_it_leaves_the_next_rounds(gate):
    """TIC as fast as TensorFlow's order is dropped at the first look; TAC, 3 % faster,
    is neither shown faster nor shown not worth it yet, and goes on alone."""
    h = Harness(gate, plan=CheckPlan(8, BLOCK, seed=6), times={"tic": 2.0, "tac": 1.94, None: 2.0},
                jitter=0.01)
    h.switch()
    h.step(3 * 4 * BLOCK + 1)
    assert h.results == []
    assert "order check: TIC not 3% faster than TensorFlow's order (round 3): left out " \
        "of the next rounds" in h.lines, h.lines
    h.step(2 * BLOCK)
    assert {w.candidate for w in h.runner.windows[-2:]} == {"tac"}
    assert h.runner.windows[-1].round == 3


def test_identical_orders_are_checked_once_and_named_by_both(gate):
    h = Harness(gate)
    c = candidates()
    c["tac"] = c["tic"]
    h.runner.switched("tac", c)
    assert h.runner.plan.candidates == ("tac",) and h.runner.same_as == {"tic": "tac"}
    h.runner.start()
    assert "TIC gave the same order as TAC: checked once" in h.lines[-1]


def test_an_order_with_nothing_to_order_is_not_checked(gate):
    h = Harness(gate)
    one = Graph([Op("p0", "recv", channel="ps:0", bytes=100), Op("l0", "compute", ("p0",))])
    parts = planner.parts_for("tic", {"worker": one}, None, {"p0"}, set())
    h.runner.switched("tic", {"tic": parts})
    h.runner.start()
    assert h.runner.plan.candidates == () and not h.runner.running
    assert h.lines == ["TIC order not checked: fewer than two transfers to order"]
    h.step(10)
    assert h.results == []


def test_the_check_runs_again_after_recheck_every_steps(gate):
    h = Harness(gate, plan=CheckPlan(1, BLOCK, seed=6), recheck_every=5)
    h.switch()
    h.until_decided()
    assert len(h.results) == 1 and not h.runner.running
    assert h.results[0].decision == order_check.DEFAULT  # one round bounds nothing
    h.step(4)
    assert not h.runner.running
    h.step()  # the 5th step after the decision starts the check again
    assert h.runner.running and "re-checking after 5 steps" in h.lines


def test_check_again_measures_the_kept_order_alone_in_fresh_blocks(gate):
    h = Harness(gate, plan=CheckPlan(8, BLOCK, seed=6), times={"tic": 1.5, "tac": 1.0, None: 2.0},
                jitter=0.01)
    h.switch()
    h.until_decided()
    assert h.runner.kept_order == "tac"
    with pytest.raises(ValueError, match="the switch computed"):
        h.runner.check_again(("no-such",), 1)
    h.runner.check_again(("tac",), 3)
    assert h.runner.running and h.runner.plan.rounds == 3
    assert h.runner.plan.candidates == ("tac",) and h.runner.plan.block_steps == BLOCK
    with pytest.raises(RuntimeError, match="an order check is running"):
        h.runner.check_again(("tac",), 1)
    h.times["tac"] = 2.2  # only the new blocks count: TAC now slower
    h.until_decided()
    second = h.results[-1]
    assert len(h.results) == 2 and set(second.candidates) == {"tac"}
    assert second.candidates["tac"].pairs == 3
    assert second.decision == order_check.DEFAULT and h.running() is None


def test_suspended_the_gate_runs_tensorflow_order_and_resuming_reinstalls(gate):
    h = Harness(gate, plan=None)  # no check: the switch's order stays
    h.switch()
    assert h.runner.plan is None and not h.runner.running
    h.runner.suspend(True)
    assert h.running() is None
    h.runner.step_dispatched()  # no check: nothing happens
    assert h.running() is None
    h.runner.suspend(False)
    assert h.running() == "tic"


def test_records_are_kept_only_while_a_check_runs_and_without_profiling(gate):
    h = Harness(gate)
    rec = lambda phase: WorkerStep(W0, 0, 0.0, 1.0, 0.0, phase)  # noqa: E731
    h.runner.recorded([rec(SCHEDULED)])
    assert h.runner._after_switch == []  # no check running
    h.switch()
    h.runner.recorded([rec(PROFILING), rec(SCHEDULED)])
    assert [r.phase for r in h.runner._after_switch] == [SCHEDULED]


def test_a_failed_switch_clears_what_was_installed_and_stops_the_check(gate):
    h = Harness(gate)
    h.switch()
    assert h.running() == "tic"
    h.runner.abandon()
    assert h.running() is None and h.runner.installed is None
    assert h.runner.plan is None and h.runner.candidates == {}
    h.step()
    assert h.results == [] and h.running() is None


def test_finish_inside_the_check_decides_on_the_rounds_that_ran(gate):
    h = Harness(gate, times={"tic": 1.0, "tac": 1.0, None: 2.0})
    h.switch()
    h.runner.finish()  # not one step of the check ran: nothing to decide
    assert h.results == []
    h.step(2 * BLOCK)
    h.runner.finish()  # one round of TIC: too few to bound a gain
    assert h.results[-1].decision == order_check.DEFAULT and h.running() is None
    assert "no gain is claimed" in h.lines[-1]


def test_a_process_that_does_not_install_never_touches_the_gate(gate):
    h = Harness(gate, installs=False)
    h.runner.switched("tic", candidates())
    h.runner.start()
    h.until_decided()
    assert inprocess.calls(PS)["install"] == 0 and inprocess.calls(PS)["clear"] == 0
    assert h.joins == 0  # nobody's loop is held


def test_blocks_dispatch_block_steps_for_each_worker(gate):
    """Under ParameterServerStrategy the loop's steps are spread over the workers: a
    block dispatches block_steps x workers of them, and the check comes again after
    recheck_every x workers."""
    h = Harness(gate, recheck_every=5, plan=CheckPlan(1, BLOCK, seed=6))
    c = candidates()
    h.runner.switched("tic", c, workers=3)
    assert h.runner.plan.workers == 3
    assert h.runner.plan.block_dispatched == 3 * BLOCK
    h.runner.start()
    seen = []
    for _ in range(2 * 3 * BLOCK):
        h.step()
        seen.append(h.runner.want)
    assert seen[:3 * BLOCK] == ["tic"] * (3 * BLOCK)
    assert seen[3 * BLOCK:6 * BLOCK] == [None] * (3 * BLOCK)
    h.until_decided()
    assert not h.runner.running
    for i in range(3 * 5):
        assert not h.runner.running, i
        h.step()
    assert h.runner.running and "re-checking after 15 steps" in h.lines


def test_a_restarted_ps_gets_the_order_it_should_run_again_in_one_line():
    """The PS restarted: a new gate at its address, with no order. sync() installs
    the order the runner has installed on it alone, and says so once; while the PS
    cannot take it yet, each read tries again (one line, at the first)."""
    h = Harness(Gate(skip_after_s=5.0, window_bytes=0), plan=None)
    with inprocess.serve_in_process(PS, h.gate):
        h.switch()
    h.runner.sync([PS])  # nothing answers at PS: it fails, and says so
    assert h.runner.out_of_step == {PS} and len(h.lines) == 1, h.lines
    assert "installing the TIC order on it failed" in h.lines[0]
    fresh = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, fresh):
        h.gate = fresh
        h.runner.sync([])  # the next read: it answers now
        assert h.running() == "tic" and h.runner.out_of_step == set()
        assert h.lines[1] == (f"the PS at {PS} was restarted (a new gate): the TIC "
                              "order installed on it again")
        # TensorFlow's order kept (e.g. by the check): nothing to install, one line
        h.runner.want = None
        h.runner._apply()
        h.runner.sync([PS])
        assert h.running() is None and "runs TensorFlow's order" in h.lines[2]


def test_a_gate_error_inside_the_check_ends_the_check_not_training(gate):
    """A PS that stops answering mid-check (restarting, gone): the install of the next
    block raises; the check ends with TensorFlow's order and one line, and later
    steps go on without touching the check."""
    from tictac_hooks.enforce.api import GateError
    h = Harness(gate)
    h.switch()
    h.step(BLOCK)  # the first block (the switch's order)
    calls = {"n": 0}

    def failing(*a, **k):
        calls["n"] += 1
        raise GateError("PS 127.0.0.1:61301 unreachable")
    h.clear_orders = failing  # the host (the controller) fails to clear
    h.step()  # the D block's clear fails
    assert not h.runner.running and h.runner.kept_order is None
    assert h.results[-1].decision == order_check.DEFAULT
    assert "the check stopped: GateError: PS 127.0.0.1:61301 unreachable" in h.lines[-1]
    assert h.lines[-1].endswith("training goes on")
    h.step(20)
    assert len(h.results) == 1


def test_a_clear_that_fails_is_tried_at_every_read_until_every_ps_runs_the_kept_order(gate):
    """The check stops on a failed clear (a PS away): the gate still runs the TIC order
    while the check keeps TensorFlow's. Every read (sync) tries again, with one line at
    the first failure; once the PS answers, it is cleared, with one line: no PS stays
    on an order the run no longer claims."""
    from tictac_hooks.enforce.api import GateError
    h = Harness(gate)
    h.switch()
    h.step(BLOCK)
    real = h.clear_orders

    def failing(only=None):
        raise GateError("PS 127.0.0.1:61301 unreachable")
    h.clear_orders = failing
    h.step()  # the D block's clear fails: the check stops, TensorFlow's order kept
    assert h.runner.kept_order is None and h.running() == "tic"
    assert h.runner.out_of_step, "the run knows the PSes may not run what it says"
    for _ in range(3):  # reads while the PS does not answer: one line in all
        h.runner.sync()
    failed = [line for line in h.lines if "trying again at every read" in line]
    assert failed == ["bringing every PS to TensorFlow's order failed (PS 127.0.0.1:61301 "
                      "unreachable); a PS may still run another order: trying again at "
                      "every read"], h.lines
    assert h.running() == "tic"
    h.clear_orders = real  # it answers again: the next read clears it
    h.runner.sync()
    assert h.running() is None and not h.runner.out_of_step
    assert h.lines[-1] == ("every PS runs TensorFlow's order now (an install or clear "
                           "had failed part-way)")
    h.runner.sync()
    h.step(20)
    assert h.running() is None and len(h.results) == 1


def test_clearing_tries_every_ps_and_names_the_ones_that_failed(gate):
    """clear_everywhere with the first PS away: the second is cleared all the same, and
    the error names the one that may still hold its order."""
    from tictac_hooks.enforce.api import GateError
    from tictac_hooks.ports import free_port
    h = Harness(gate)
    h.switch()
    assert h.running() == "tic"
    away = f"127.0.0.1:{free_port()}"
    with pytest.raises(GateError, match=f"clearing failed on 1 of 2 PS, which may still "
                       f"hold an order: {away} "):
        clear_everywhere([away, PS], timeout_s=1.0)
    assert h.running() is None


def _profiled(h: "Harness", workers: int, steps: int, spread: float) -> None:
    """Profiled steps whose log step time is spread evenly over +-spread (MAD = spread/2)
    on each of ``workers`` workers, as the PSes record them before the switch."""
    import math
    records = []
    for w in range(workers):
        worker = W0.replace("task:0", f"task:{w}")
        for i in range(steps):
            x = -spread + 2 * spread * i / (steps - 1)
            records.append(WorkerStep(worker, i + 1, float(i), 0.1 * math.exp(x), 0.0,
                                      PROFILING))
    h.runner.recorded(records)


def test_an_auto_block_is_chosen_from_the_profiled_spread_and_said(gate):
    """check_block_steps 0: the shortest block the profiled spread says would keep a true
    +10 % in 90 % of checks, within the share of the recheck period; the line and the
    summary's ``block`` say what it gives."""
    from tictac_hooks.run import sequential
    h = Harness(gate, plan=CheckPlan(8, order_check.AUTO_BLOCK, seed=1), recheck_every=5000)
    _profiled(h, workers=2, steps=41, spread=0.15)   # MAD 0.075: spread 0.111
    spread = sequential.log_spread({w: list(t) for w, t in h.runner._profiled_times.items()})
    assert spread == pytest.approx(1.4826 * 0.075, rel=0.02)
    h.switch()
    want, power, share = sequential.block_steps_for(spread, h.runner.plan.rule(), 5000)
    assert h.runner.plan.block_steps == want and MIN_AUTO < want < 15
    assert power >= 0.9 and share <= 0.10
    # one step shorter would not have had the power
    assert sequential.power(0.1, sequential.round_sd(spread, want - 1),
                            h.runner.plan.rule()) < 0.9 or want == MIN_AUTO
    choice = h.runner.block_choice
    assert choice["auto"] and choice["block_steps"] == want
    line = next(x for x in h.lines if x.startswith("checking"))
    assert f"rounds of {want} steps per worker" in line
    assert f"blocks of {want} steps from the profiled steps' spread (step time varies 11 %)" \
        in line and "of checks (estimated)" in line and "of a recheck period" in line
    h.until_decided()   # the blocks run at the chosen length
    assert h.results[-1].block_steps == want


def test_a_wide_spread_is_capped_by_the_recheck_share_and_says_the_power_it_has(gate):
    from tictac_hooks.run import sequential
    h = Harness(gate, plan=CheckPlan(8, order_check.AUTO_BLOCK, seed=1), recheck_every=5000)
    _profiled(h, workers=1, steps=41, spread=1.0)
    h.switch()
    rule = h.runner.plan.rule()   # two candidates: 2 x 8 x 2 blocks per check
    assert h.runner.plan.block_steps == int(0.10 * 5000 / (2 * 8 * 2)) == 15
    assert h.runner.block_choice["power_plus10"] < 0.9
    assert sequential.block_steps_for(0.5, rule, 0)[0] == 60   # no rechecks: at most 60


def test_a_set_block_reports_its_power_and_no_profile_keeps_the_minimum(gate):
    h = Harness(gate, plan=CheckPlan(ROUNDS, BLOCK, seed=6))
    _profiled(h, workers=1, steps=21, spread=0.2)
    h.switch()
    assert h.runner.plan.block_steps == BLOCK and not h.runner.block_choice["auto"]
    assert f"blocks of {BLOCK} steps as set" in next(x for x in h.lines
                                                     if x.startswith("checking"))
    bare = Harness(gate, plan=CheckPlan(ROUNDS, order_check.AUTO_BLOCK, seed=6))
    bare.switch()
    assert bare.runner.plan.block_steps == MIN_AUTO
    assert bare.runner.block_choice["why"] == "too few profiled steps to measure"


MIN_AUTO = 10
