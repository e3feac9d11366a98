"""The order check as it runs (callbacks/check_runner.py), against a gate in this
process: the block sequence it installs and clears, step by step; its decision on given
step records, and what the gate runs after it; suspension, re-checks and a failed
switch. The statistics themselves are test_order_check.py's."""

import pytest

from tictac_hooks.callbacks import order_check, planner
from tictac_hooks.callbacks.check_runner import CheckRunner
from tictac_hooks.callbacks.order_check import CheckPlan
from tictac_hooks.enforce import inprocess
from tictac_hooks.enforce.client import clear_everywhere
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.records import CHECK, PROFILING, SCHEDULED, WorkerStep

PS = "127.0.0.1:61301"
W0 = "/job:worker/replica:0/task:0/device:CPU:0"
ROUNDS, BLOCK = 2, 3


def graph() -> Graph:
    return Graph([Op(f"p{i}", "recv", channel="ps:0", bytes=100 * (i + 1)) for i in range(4)]
                 + [Op("l0", "compute", ("p0", "p1")), Op("l1", "compute", ("l0", "p2", "p3"))])


def candidates() -> dict:
    g = {"worker": graph()}
    served = {f"p{i}" for i in range(4)}
    return {"tic": planner.parts_for("tic", g, None, served, set()),
            "tac": planner.parts_for("tac", g, {"l0": 0.01, "l1": 0.02}, served, set(),
                                     link_rate=1e4, served_bytes={})}


def records(pattern) -> list[WorkerStep]:
    """pattern: [(phase, order, step time)] of one worker, back to back."""
    out, t = [], 0.0
    for i, (phase, order, x) in enumerate(pattern):
        out.append(WorkerStep(W0, i, t, x, 0.0, phase, order=order))
        t += x
    return out


def block(phase, order, x):
    return [(phase, order, x)] * 4


def decided(h: "Harness", pending: list) -> None:
    """Hands ``pending`` to the next poll and dispatches the check's steps, and the one
    after the last, which decides."""
    h.pending = pending
    for _ in range(h.runner.plan.total_steps + 1):
        h.runner.step_dispatched()


class Harness:
    """A CheckRunner wired to an in-process gate as the controller wires it, with
    records that the next poll hands it."""

    def __init__(self, gate: Gate, plan=CheckPlan(ROUNDS, BLOCK), recheck_every: int = 0,
                 installs: bool = True) -> None:
        self.gate, self.pending = gate, []
        self.joins, self.pauses, self.lines, self.results = 0, [], [], []
        self.runner = CheckRunner(
            plan, recheck_every, installs, self.join, algorithm=lambda: "tic",
            install=lambda parts, only=None: planner.install(parts, [PS], 5.0, 0,
                                                             only=only),
            clear=lambda: clear_everywhere([PS]), poll=self.poll,
            mark_pause=lambda a, b: self.pauses.append((a, b)), say=self.lines.append,
            on_result=self.results.append)

    def join(self) -> None:
        self.joins += 1

    def poll(self) -> None:
        self.runner.recorded(self.pending)
        self.pending = []

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


@pytest.fixture
def gate():
    g = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, g):
        yield g


def test_the_blocks_alternate_each_candidate_and_tensorflow_order(gate):
    h = Harness(gate)
    h.switch()
    plan = h.runner.plan
    assert plan.candidates == ("tic", "tac") and plan.total_steps == 2 * ROUNDS * 2 * BLOCK
    ran = []
    for n in range(plan.total_steps):
        h.runner.step_dispatched()
        ran.append(h.running())
    assert ran == [plan.block(n) for n in range(plan.total_steps)]
    assert ran[:2 * BLOCK] == ["tic"] * BLOCK + [None] * BLOCK
    assert ran[2 * BLOCK:4 * BLOCK] == ["tac"] * BLOCK + [None] * BLOCK
    # One hold per block change (the first block is the switch's order): each joins
    # the dispatched steps first and marks the idle time to the install as a pause.
    changes = sum(a != b for a, b in zip(["tic"] + ran, ran))
    assert h.runner.holds == h.joins == len(h.pauses) == changes
    assert inprocess.calls(PS)["install"] == 1 + ROUNDS * 2 - 1  # the first T is the switch's
    assert inprocess.calls(PS)["clear"] == 2 * ROUNDS
    assert h.runner.running and h.results == []


def test_the_decision_keeps_the_faster_candidate_and_the_gate_runs_it(gate):
    h = Harness(gate)
    h.switch()
    # TIC 1.5 s, TAC 1.0 s, TensorFlow's 2.0 s per step; the profiled steps are ignored.
    decided(h, records(block(PROFILING, None, 9.0)
                       + (block(SCHEDULED, "tic", 1.5) + block(CHECK, None, 2.0)
                          + block(SCHEDULED, "tac", 1.0) + block(CHECK, None, 2.0)) * 2))
    assert len(h.results) == 1 and h.runner.check_result is h.results[0]
    result = h.results[0]
    assert result.decision == order_check.TICTAC and result.chosen == "tac"
    assert result.kept == "tac"
    assert result.spread.pairs == ROUNDS  # TAC's: one pair per round
    assert h.runner.kept_order == "tac" and h.running() == "tac"
    assert not h.runner.running
    assert h.lines[-1].startswith("order check: TAC order +100.0 % throughput vs "
                                  "TensorFlow's (median of 2 block pairs")
    assert h.lines[-1].endswith("; TIC +33.3 %): kept")
    # With the decision taken, later steps change nothing (recheck_every 0).
    installs = inprocess.calls(PS)["install"]
    for _ in range(20):
        h.runner.step_dispatched()
    assert inprocess.calls(PS)["install"] == installs and h.running() == "tac"


def test_slower_orders_are_cleared_and_no_pair_keeps_the_order_before(gate):
    h = Harness(gate)
    h.switch()
    decided(h, records((block(SCHEDULED, "tic", 3.0) + block(CHECK, None, 2.0)
                        + block(SCHEDULED, "tac", 2.5) + block(CHECK, None, 2.0)) * 2))
    assert h.results[-1].decision == order_check.DEFAULT
    assert h.results[-1].kept == order_check.DEFAULT
    assert h.runner.kept_order is None and h.running() is None
    assert h.lines[-1].endswith("cleared, TensorFlow's order kept")

    h = Harness(gate)
    h.switch("tac")
    for _ in range(h.runner.plan.total_steps + 1):  # no records at all: inconclusive
        h.runner.step_dispatched()
    assert h.results[-1].decision is None
    assert h.results[-1].kept == "tac"  # in the summary: which order stays
    assert h.results[-1].to_json()["kept"] == "tac"
    assert h.runner.kept_order == "tac" and h.running() == "tac"
    assert "inconclusive" in h.lines[-1] and h.lines[-1].endswith("TAC order kept")


def test_the_check_runs_again_after_recheck_every_steps(gate):
    h = Harness(gate, plan=CheckPlan(1, BLOCK), recheck_every=5)
    h.switch()
    first = h.runner.plan.total_steps + 1
    for _ in range(first):
        h.runner.step_dispatched()
    assert len(h.results) == 1 and not h.runner.running
    for _ in range(4):
        h.runner.step_dispatched()
    assert not h.runner.running
    h.runner.step_dispatched()  # the 5th step after the decision starts the check again
    assert h.runner.running and h.lines[-1] == "re-checking after 5 steps"
    assert h.running() == h.runner.plan.block(0)


def test_check_again_measures_the_kept_order_alone_in_fresh_blocks(gate):
    h = Harness(gate)
    h.switch()
    decided(h, records((block(SCHEDULED, "tic", 1.5) + block(CHECK, None, 2.0)
                        + block(SCHEDULED, "tac", 1.0) + block(CHECK, None, 2.0)) * 2))
    assert h.runner.kept_order == "tac"
    with pytest.raises(ValueError, match="the switch computed"):
        h.runner.check_again(("no-such",), 1)
    h.runner.check_again(("tac",), 3)
    assert h.runner.running and h.runner.plan == CheckPlan(3, BLOCK, ("tac",))
    with pytest.raises(RuntimeError, match="an order check is running"):
        h.runner.check_again(("tac",), 1)
    ran = []
    for _ in range(h.runner.plan.total_steps):
        h.runner.step_dispatched()
        ran.append(h.running())
    assert ran == (["tac"] * BLOCK + [None] * BLOCK) * 3  # TIC is not measured again
    # only the records of the new blocks count: TAC now 2.2 s against 2.0 s
    h.pending = records((block(SCHEDULED, "tac", 2.2) + block(CHECK, None, 2.0)) * 3)
    h.runner.step_dispatched()
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
    h.runner.recorded(records(block(SCHEDULED, "tic", 1.0)))
    assert h.runner._after_switch == []  # no check running
    h.switch()
    h.runner.recorded(records(block(PROFILING, None, 1.0) + block(SCHEDULED, "tic", 1.0)))
    assert [r.phase for r in h.runner._after_switch] == [SCHEDULED] * 4


def test_a_failed_switch_clears_what_was_installed_and_stops_the_check(gate):
    h = Harness(gate)
    h.switch()
    assert h.running() == "tic"
    h.runner.abandon()
    assert h.running() is None and h.runner.installed is None
    assert h.runner.plan is None and h.runner.candidates == {}
    h.runner.step_dispatched()
    assert h.results == [] and h.running() is None


def test_finish_inside_the_check_decides_on_what_ran(gate):
    h = Harness(gate)
    h.switch()
    h.runner.finish()  # not one step of the check ran: nothing to decide
    assert h.results == []
    h.pending = records(block(SCHEDULED, "tic", 1.0) + block(CHECK, None, 2.0))
    for _ in range(2 * BLOCK):
        h.runner.step_dispatched()
    h.runner.finish()
    assert h.results[-1].decision == order_check.TICTAC and h.running() == "tic"


def test_a_process_that_does_not_install_never_touches_the_gate(gate):
    h = Harness(gate, installs=False)
    h.runner.switched("tic", candidates())
    h.runner.start()
    for _ in range(h.runner.plan.total_steps + 1):
        h.runner.step_dispatched()
    assert inprocess.calls(PS)["install"] == 0 and inprocess.calls(PS)["clear"] == 0
    # The blocks hold nobody's loop; only the decision waits for the dispatched steps
    # (it reads what they recorded).
    assert h.joins == 1 and h.runner.holds == (2 * 2 * ROUNDS - 1) + 1  # changes, decision


def test_blocks_dispatch_block_steps_for_each_worker(gate):
    """Under ParameterServerStrategy the loop's steps are spread over the workers: a
    block dispatches block_steps x workers of them, and the check comes again after
    recheck_every x workers."""
    h = Harness(gate, recheck_every=5)
    c = candidates()
    h.runner.switched("tic", c, workers=3)
    assert h.runner.plan.workers == 3
    assert h.runner.plan.block_dispatched == 3 * BLOCK
    h.runner.start()
    seen = []
    for _ in range(2 * 3 * BLOCK):
        h.runner.step_dispatched()
        seen.append(h.runner.want)
    assert seen[:3 * BLOCK] == ["tic"] * (3 * BLOCK)
    assert seen[3 * BLOCK:] == [None] * (3 * BLOCK)
    for _ in range(h.runner.plan.total_steps - len(seen) + 1):  # the decision
        h.runner.step_dispatched()
    assert not h.runner.running
    for i in range(3 * 5):
        assert not h.runner.running, i
        h.runner.step_dispatched()
    assert h.runner.running and h.lines[-1] == "re-checking after 15 steps"


def test_a_restarted_ps_gets_the_order_it_should_run_again_in_one_line():
    """The PS restarted: a new gate at its address, with no order. restarted() installs
    the order the runner has installed on it alone, and says so once; while the PS
    cannot take it yet, each read tries again (one line, at the first)."""
    h = Harness(Gate(skip_after_s=5.0, window_bytes=0), plan=None)
    with inprocess.serve_in_process(PS, h.gate):
        h.switch()
    h.runner.restarted([PS])  # nothing answers at PS: it fails, and says so
    assert h.runner.to_reinstall == {PS} and len(h.lines) == 1, h.lines
    assert "installing the TIC order on it failed" in h.lines[0]
    fresh = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, fresh):
        h.gate = fresh
        h.runner.restarted([])  # the next read: it answers now
        assert h.running() == "tic" and h.runner.to_reinstall == set()
        assert h.lines[1] == (f"the PS at {PS} was restarted (a new gate): the TIC "
                              "order installed on it again")
        # TensorFlow's order kept (e.g. by the check): nothing to install, one line
        h.runner.want = None
        h.runner._apply()
        h.runner.restarted([PS])
        assert h.running() is None and "runs TensorFlow's order" in h.lines[2]
