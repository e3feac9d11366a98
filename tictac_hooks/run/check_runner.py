"""The order check as it runs (the statistics are order_check.py's): after the switch,
blocks of steps in a candidate order and in TensorFlow's by turns, each block's order
installed (or cleared) at its boundary, a decision at the end, and the check again
every ``recheck_every`` steps per worker.

The runner holds what the check asks the PSes to run (``want``), what its last decision
kept (``decided``), what they run (``installed``) and whether it is suspended
(validation inside fit runs TensorFlow's order); the controller hands it the candidates
at the switch and the records it reads.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import random
import threading
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

from tictac_hooks.run import order_check
from tictac_hooks.run.planner import Parts
from tictac_hooks.records import PROFILING, CheckResult, WorkerStep
from tictac_hooks.run import sequential

log = logging.getLogger("tictac")

_KEEP_CHECK_RECORDS = 50_000
EVERY_PS = "*"  # in CheckRunner.out_of_step: every PS, not one named
_KEEP_PROFILED_TIMES = 500


class CheckHost(Protocol):
    """What the order check asks of the run it checks (the Controller)."""

    def install_candidate(self, parts: Parts, only: Sequence[str] | None = None) -> None:
        """Installs a candidate's order on every PS (quietly), or on those of ``only``."""

    def clear_orders(self, only: Sequence[str] | None = None) -> None:
        """Clears every PS (or those of ``only``): TensorFlow's order. Tries every PS,
        then raises if any failed."""

    def poll(self) -> Any:
        """Reads the PSes' records (which reach :meth:`CheckRunner.recorded`)."""

    def mark_pause(self, start: float, end: float) -> None:
        """[start, end] is TicTac's own pause: no step time."""

    def say(self, message: str) -> None:
        """One progress line."""

    def check_decided(self, result: CheckResult) -> None:
        """A check's result, after its decision was applied."""


class CheckRunner:
    """Runs the order check of ``plan`` (None: no check; a switch still installs).

    Args:
      plan: the check's rounds and block steps (order_check.CheckPlan), or None.
      recheck_every: steps per worker after a decision until the check runs again (0:
        once); under ParameterServerStrategy that many times the workers are dispatched.
      installs: whether this process installs (only the chief does).
      join: waits until the dispatched steps ran (PSS: coordinator.join), or None.
      host: the run it checks (:class:`CheckHost`: the Controller), which installs
        and clears the candidates' orders, reads records, marks pauses, says lines and
        takes each check's result.
      clock: the PSes' step records' clock (wall time).
    """

    def __init__(self, plan: "order_check.CheckPlan | None", recheck_every: int,
                 installs: bool, join: "Callable[[], None] | None", host: "CheckHost",
                 clock: Callable[[], float] = time.time) -> None:
        self.plan = plan
        # the plan's seed as given (None: each check draws one)
        self._given_seed = plan.seed if plan is not None else None
        self.recheck_every = recheck_every
        self.installs = installs
        self._join = join
        self._host = host
        self._clock = clock   # the PSes' step records' clock (wall time)
        self.results: list[CheckResult] = []  # every check's result, in order
        self.n = -1  # steps dispatched since the running check began; -1: none
        self._since_decision = 0  # steps dispatched since the last check's decision
        self._after_switch: list[WorkerStep] = []  # records the check reads (bounded)
        # Per worker, the step times of its last profiled steps: their spread sets the
        # block length where the plan's is AUTO_BLOCK, and the power line.
        self._profiled_times: dict[str, collections.deque] = {}
        self.block_choice: dict[str, Any] | None = None  # how the block length was set
        # The running check: its candidates still in it, the round, the round's
        # blocks, the block and its steps dispatched so far, the blocks that ran.
        self._active: tuple[str, ...] = ()
        self._round = 0
        self._blocks: list[str | None] = []
        self._bi = 0
        self._in_block = 0
        self._block_start = 0.0
        self.windows: list[order_check.Window] = []
        # The first check's records and blocks, as it decided on them (the bench's).
        self.first_check_records: list[WorkerStep] = []
        self.first_check_windows: list[order_check.Window] = []
        # The candidate orders (algorithm -> per-worker (DAG, schedule)), the one the
        # check or its decision asks for, and the one installed (None: TF's order).
        self.candidates: dict[str, Parts] = {}
        # Candidates whose order is identical to another's: name -> the one checked.
        self.same_as: dict[str, str] = {}
        # Candidates not checked, and why (e.g. nothing to order).
        self.not_checked: dict[str, str] = {}
        self.want: str | None = None
        self.decided: str | None = None
        self.installed: str | None = None
        self.suspended = False       # validation inside fit: TF's own order
        self.holds = 0       # times the order check held the loop (joins, installs)
        # PSes that may not run what `installed` says, brought to it at every read
        # (sync): restarted ones (a new gate, no order), or EVERY_PS after an install
        # or clear that failed part-way. What the PSes run changes under this lock (the
        # reading thread finds restarts).
        self.out_of_step: set[str] = set()
        self._sync_failing = False
        # The switch installed its order before the compute times came (TIC): the
        # check waits for them (Switching.timed), then start() runs it.
        self.waiting = False
        # Every round runs for every candidate, decided at the end (the bench's
        # comparisons of many orders); False: the rule's looks stop the rounds.
        self.fixed_rounds = False
        self._lock = threading.RLock()

    @property
    def running(self) -> bool:
        """Whether a check is running (between its first block and its decision)."""
        return self.n >= 0

    def switched(self, algorithm: str, candidates: dict[str, Parts],
                 workers: int = 1, wait_for_times: bool = False,
                 decided: bool = True) -> None:
        """The switch computed ``candidates`` and installs (or not) ``algorithm``'s;
        ``workers``: those the loop's dispatched steps are spread over (CheckPlan);
        ``wait_for_times``: the check waits for the compute times (start() runs it);
        ``decided`` False: a restored decision for TensorFlow's order (none wanted).
        Candidates whose orders are identical on every worker and PS are checked once,
        under the first name (``same_as`` keeps the others); one with fewer than two
        transfers has nothing to order and is not checked (``not_checked`` says so)."""
        self.candidates, self.same_as, self.not_checked = {}, {}, {}
        seen: dict[tuple, str] = {}
        first = sorted(candidates, key=lambda c: c != algorithm)  # the configured first
        for name, parts in ((c, candidates[c]) for c in first):
            key = (name,) if parts is None else \
                tuple(tuple(schedule.order) for _, schedule in parts)
            if key in seen:
                self.same_as[name] = seen[key]
                continue
            seen[key] = name
            self.candidates[name] = parts
        self.want = self.decided = algorithm if algorithm in self.candidates else \
            self.same_as.get(algorithm, algorithm)
        if not decided:
            self.want = self.decided = None
        self.waiting = wait_for_times
        # (a candidate without parts is TensorFlow's own order: checked as it is)
        checked = [c for c, parts in self.candidates.items()
                   if parts is None or max((len(s.order) for _, s in parts), default=0) >= 2]
        for c in self.candidates:
            if c not in checked:
                self.not_checked[c] = "fewer than two transfers to order"
        if self.plan is not None:
            self.plan = order_check.CheckPlan(self.plan.rounds, self.plan.block_steps,
                                              tuple(checked), max(1, workers),
                                              self.plan.seed)

    def mark_installed(self, algorithm: str | None) -> None:
        """``algorithm``'s order is what the PSes now run (None: TensorFlow's)."""
        with self._lock:
            self.installed = algorithm

    def start(self) -> None:
        """The check begins with the next dispatched step; one line says what it runs."""
        self.waiting = False
        if self.plan is None:
            return
        plan = self.plan
        for c, why in self.not_checked.items():
            self._host.say(f"{c.upper()} order not checked: {why}")
        if not plan.candidates:
            return
        plan = self._choose_block(plan)
        same = "".join(f" ({a.upper()} gave the same order as {b.upper()}: checked once)"
                       for a, b in self.same_as.items())
        names = " and ".join(c.upper() for c in plan.candidates)
        per = (f" ({plan.block_dispatched} dispatched over {plan.workers} workers)"
               if plan.workers > 1 else "")
        rule = plan.rule()
        self._host.say(f"checking {names} against TensorFlow's order{same}: rounds of "
                  f"{plan.block_steps} steps per worker in each order{per}, "
                  f"{rule.min_rounds} to {rule.max_rounds} rounds (the rounds stop when "
                  "the test decides)"
                  + (f", again every {self.recheck_every} steps per worker"
                     if self.recheck_every else "")
                  + self._block_line())
        self._begin_check(opened=True)

    def _choose_block(self, plan: "order_check.CheckPlan") -> "order_check.CheckPlan":
        """Sets the block length where the plan's is AUTO_BLOCK, from the profiled
        steps' spread (sequential.block_steps_for), and records the power it gives a
        true +10 % (``block_choice``)."""
        rule = plan.rule()
        spread = sequential.log_spread({w: list(t) for w, t in
                                        self._profiled_times.items()})
        auto = plan.block_steps == order_check.AUTO_BLOCK
        if auto:
            if spread is None:
                block, why = sequential.MIN_AUTO_BLOCK, "too few profiled steps to measure"
            else:
                block, _, _ = sequential.block_steps_for(spread, rule, self.recheck_every)
                why = "from the profiled steps' spread"
            plan = self.plan = dataclasses.replace(plan, block_steps=block)
        else:
            why = "as set"
        self.block_choice = {
            "block_steps": plan.block_steps, "auto": auto, "why": why,
            "step_spread": spread,
            "power_plus10": (None if spread is None else sequential.power(
                sequential.POWER_GAIN,
                sequential.round_sd(spread, plan.block_steps), rule)),
            "longest_check_share": (plan.total_steps / plan.workers / self.recheck_every
                                    if self.recheck_every else None)}
        return plan

    def _block_line(self) -> str:
        """What the block length gives: the profiled spread and the power it predicts
        (an estimate: independent steps, decided at the last round; on recorded runs of
        this machine it said 43 % where resampled checks kept a +10 % in 56 %)."""
        c = self.block_choice
        if not c or c["step_spread"] is None:
            return ""
        line = (f"; blocks of {c['block_steps']} steps {c['why']} (step time varies "
                f"{100 * c['step_spread']:.0f} %): a true +{100 * sequential.POWER_GAIN:.0f} % "
                f"would be kept in ~{100 * c['power_plus10']:.0f} % of checks (estimated)")
        if c["longest_check_share"] is not None:
            line += (f", the longest check {100 * c['longest_check_share']:.0f} % of a "
                     "recheck period")
        return line

    def abandon(self) -> None:
        """The switch failed: no candidates, no check, TensorFlow's order on every PS."""
        self.plan, self.candidates = None, {}
        self.n = -1
        self.want = self.decided = None
        if self.installs and self.installed is not None:
            try:
                self._host.clear_orders()
                self.out_of_step.clear()
            except Exception:  # noqa: BLE001 - a PS away: cleared at a later read (sync)
                log.debug("TicTac: clearing after a failed switch", exc_info=True)
                self.out_of_step.add(EVERY_PS)
            self.installed = None

    def recorded(self, records: Sequence[WorkerStep]) -> None:
        """Records read while a check runs: what it decides on (the last 50,000); until
        the first check starts, the profiled steps' times (each worker's last
        _KEEP_PROFILED_TIMES) for the block length."""
        for r in records if self.block_choice is None else ():  # until the first check
            if r.phase == PROFILING and r.step_time and not r.paused_s and r.step > 0:
                self._profiled_times.setdefault(
                    r.worker, collections.deque(maxlen=_KEEP_PROFILED_TIMES)
                ).append(r.step_time)
        if self.n >= 0:
            self._after_switch.extend(r for r in records if r.phase != PROFILING)
            del self._after_switch[:-_KEEP_CHECK_RECORDS]

    def finish(self) -> None:
        """Training ended inside the check: decides on the rounds that ran."""
        if self.plan is not None and self.n > 0:
            self._close_block()
            self._finish_check(self._look(final=True))

    def suspend(self, suspended: bool) -> None:
        self.suspended = suspended
        self._apply()

    # --- the order check ---------------------------------------------------------------
    @property
    def kept_order(self) -> str | None:
        """The algorithm whose order runs after the last decision (None: TensorFlow's)."""
        return self.decided

    @property
    def check_result(self) -> CheckResult | None:
        """The last order check's result (None before the first decision)."""
        return self.results[-1] if self.results else None

    def step_dispatched(self) -> None:
        """The frontends call this once per step they dispatch after the switch: runs
        the order check's blocks (order_check.py), looks at its rule after each round,
        applies its decision, and starts the check again every ``recheck_every`` steps
        per worker."""
        if self.plan is None or not self.candidates or self.waiting:
            return
        if self.n >= 0:
            if self._in_block >= self.plan.block_dispatched:
                try:
                    self._next_block()
                except Exception as e:  # noqa: BLE001 - a PS gone mid-check: not training's
                    self._abort_check(e)
                if self.n < 0:
                    return  # decided: this step runs in the kept order
            self.n += 1
            self._in_block += 1
        elif self.recheck_every and self.plan.candidates:
            self._since_decision += 1
            if self._since_decision >= self.recheck_every * self.plan.workers:
                self._host.say(f"re-checking after {self._since_decision} steps")
                self._begin_check()

    def check_again(self, candidates: Sequence[str], rounds: int) -> None:
        """Runs the check once more from the next dispatched step, in fresh blocks, with
        ``candidates`` (computed at the switch) against TensorFlow's order for at most
        ``rounds`` rounds: e.g. the kept order alone, so that what the decision gave is
        measured on steps it was not decided on. Its decision applies as any check's."""
        if self.running:
            raise RuntimeError("an order check is running: check again after its decision")
        unknown = [c for c in candidates if c not in self.candidates]
        if unknown or not candidates:
            raise ValueError(f"check again with {list(candidates)}: the switch computed "
                             f"{sorted(self.candidates)}")
        self.plan = order_check.CheckPlan(rounds, self.plan.block_steps, tuple(candidates),
                                          self.plan.workers, self._given_seed)
        self._begin_check()

    def _begin_check(self, opened: bool = False) -> None:
        """A check from its first block; ``opened``: the switch's install is that
        block's order already in force (its window opens now)."""
        self._after_switch = []
        self.windows = []
        self.n = 0
        if self._given_seed is None:  # each check draws its order of the sides
            self.plan = dataclasses.replace(self.plan,
                                            seed=random.SystemRandom().randrange(1 << 31))
        self._active = self.plan.candidates
        self._round = 0
        self._blocks = self.plan.round_blocks(0, self._active)
        self._bi = 0
        self._open_block(join=not opened)

    def _open_block(self, join: bool = True) -> None:
        """Starts block ``_bi`` of the round: its order installed (or cleared) on every
        PS, then its window opens. Under PSS the loop dispatches ahead of what runs, so
        the dispatched steps are waited for first (``join``): every step dispatched in a
        block then runs in that block's order. From the wait's end to the install the
        workers idle, marked as a pause: the step times that include it are left out."""
        want = self._blocks[self._bi]
        if join and self._join is not None and self.installs:
            self.holds += 1
            self._join()
        idle_from = self._clock()
        self.want = want
        self._apply()
        now = self._clock()
        self._host.mark_pause(idle_from, now)
        self._in_block = 0
        self._block_start = now

    def _close_block(self) -> None:
        """The running block's window ends (after its steps ran, where this process
        can wait for them)."""
        self.holds += 1
        if self._join is not None and self.installs:
            self._join()
        c = self._blocks[self._bi]
        name = c if c is not None else self._blocks[self._bi ^ 1]
        self.windows.append(order_check.Window(self._round, name, c is not None,
                                               self._block_start, self._clock(),
                                               self.candidates.get(name) is not None))

    def _next_block(self) -> None:
        """The running block has its steps: its window closes; the next block of the
        round opens, or after a round's last block the rule looks (from its first
        round of looks on) and the check ends or goes on with the candidates left."""
        self._close_block()
        self._bi += 1
        if self._bi < len(self._blocks):
            self._open_block(join=False)
            return
        self._round += 1
        rule = self.plan.rule()
        if self._round >= (self.plan.rounds if self.fixed_rounds else rule.min_rounds):
            final = self._round >= self.plan.rounds
            result = self._look(final)
            if result.decision is not None or final:
                self._finish_check(result)
                return
            going = self._active if self.fixed_rounds else tuple(c for c in self._active
                          if result.bounds.get(c, {}).get("verdict") != sequential.DROP)
            if going != self._active:
                dropped = [c.upper() for c in self._active if c not in going]
                self._host.say(f"order check: {' and '.join(dropped)} not {rule.margin:.0%} "
                          f"faster than TensorFlow's order (round {self._round}): "
                          "left out of the next rounds")
                self._active = going
        self._blocks = self.plan.round_blocks(self._round, self._active)
        self._bi = 0
        self._open_block(join=False)

    def _look(self, final: bool) -> CheckResult:
        """The rule on the blocks that ran (the PSes' records read first)."""
        self._host.poll()
        return order_check.decide(self._after_switch, self.plan, self.windows, final=final)

    def _abort_check(self, error: BaseException) -> None:
        """An install, read or wait failed inside the check (a PS restarting, gone):
        the check ends there, TensorFlow's order is kept (cleared where the PSes
        answer), and one line says so; training goes on."""
        log.debug("TicTac: the order check failed", exc_info=True)
        why = f"{type(error).__name__}: {error}"
        self.want = None
        empty = order_check.decide([], self.plan, [], final=True)
        self._finish_check(dataclasses.replace(
            empty, decision=order_check.DEFAULT, chosen=None,
            reason=f"the check stopped: {why}"))

    def _finish_check(self, result: CheckResult) -> None:
        pause_start = self._clock()
        if not self.results:
            self.first_check_records = list(self._after_switch)
            self.first_check_windows = list(self.windows)
        self._after_switch = []
        self.n, self._since_decision = -1, 0
        if result.decision == order_check.TICTAC:
            self.decided = result.chosen
        elif result.decision == order_check.DEFAULT:
            self.decided = None
        self.want = self.decided  # inconclusive: the order before the check stays
        result = dataclasses.replace(result, kept=self.decided or order_check.DEFAULT)
        self.results.append(result)
        try:
            self._apply()
        except Exception:  # noqa: BLE001 - a PS gone: the decision applies where it can
            log.debug("TicTac: applying the check's decision", exc_info=True)
        self._host.mark_pause(pause_start, self._clock())
        self._host.say(verdict_line(result, self.same_as))
        self._host.check_decided(result)

    def _apply(self) -> None:
        """Installs the wanted candidate order, or clears the PSes for TensorFlow's, so
        that the PSes run what the check asks for, unless suspended (validation). If
        that fails part-way (a PS away), the PSes may run different orders: every PS
        is then brought to the wanted one at each read until that works (sync), and
        the error goes on to the caller."""
        with self._lock:
            want = None if self.suspended else self.want
            if not self.installs or not self.candidates or want == self.installed:
                return
            try:
                if want is not None and self.candidates[want] is not None:
                    self._host.install_candidate(self.candidates[want])
                else:
                    self._host.clear_orders()
            except Exception:
                self.out_of_step.add(EVERY_PS)
                raise
            finally:
                self.installed = want
            self.out_of_step.clear()
            self._sync_failing = False

    def sync(self, restarted: Sequence[str] = ()) -> None:
        """At every read: brings the PSes that may not run what ``installed`` says to
        it, with one line: the ``restarted`` ones (a new gate runs TensorFlow's order),
        and every PS after an install or clear that failed part-way. One that cannot
        take it yet is tried again at the next read (one line, at the first failure)."""
        with self._lock:
            if restarted:
                where = ", ".join(restarted)
                if not self.installs or (self.installed is None
                                         and EVERY_PS not in self.out_of_step):
                    self._host.say(f"the PS at {where} was restarted (a new gate); it runs "
                                   "TensorFlow's order, as every PS does now")
                    return
                self.out_of_step.update(restarted)
            if not self.out_of_step or not self.installs:
                return
            everyone = EVERY_PS in self.out_of_step
            pending = sorted(self.out_of_step - {EVERY_PS})
            only = None if everyone else pending
            where = "every PS" if everyone else f"the PS at {', '.join(pending)}"
            name = f"the {self.installed.upper()} order" if self.installed else \
                "TensorFlow's order"
            parts = self.candidates.get(self.installed) if self.installed else None
            try:
                if parts is None:
                    self._host.clear_orders(only=only)
                else:
                    self._host.install_candidate(parts, only=only)
            except Exception as e:  # noqa: BLE001 - say it once, try at the next read
                log.debug("TicTac: bringing %s to %s", where, name, exc_info=True)
                if not self._sync_failing:
                    self._host.say(
                        f"bringing every PS to {name} failed ({e}); a PS may still run "
                        "another order: trying again at every read" if everyone else
                        f"{where} was restarted; installing {name} on it failed ({e}): "
                        "trying again at every read")
                self._sync_failing = True
                return
            self.out_of_step.clear()
            self._sync_failing = False
            self._host.say(f"every PS runs {name} now (an install or clear had failed "
                           "part-way)" if everyone else
                           f"{where} was restarted (a new gate): {name} installed on it "
                           "again")


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def verdict_line(result: CheckResult, same_as: Mapping[str, str] | None = None) -> str:
    """The check's decision in one line: the kept order's gain with its lower bound,
    or why TensorFlow's order stays (and that nothing is claimed then)."""
    aka = {b: a for a, b in (same_as or {}).items()}
    name = lambda c: c.upper() + (f" (= {aka[c].upper()})" if c in aka else "")  # noqa: E731
    rounds = f"{result.rounds} round{'s' if result.rounds != 1 else ''}"
    if result.decision is None:
        kept = (result.kept or "").upper() + " order" if result.kept not in (
            None, order_check.DEFAULT) else "TensorFlow's order"
        return f"order check inconclusive ({result.reason}); {kept} kept"
    if result.decision == order_check.DEFAULT and result.reason.startswith("the check stopped"):
        return (f"order check: {result.reason}; TensorFlow's order kept, no gain is "
                "claimed; training goes on")
    gains = {c: result.gain(c) for c in result.candidates}
    others = "".join(f"; {name(c)} {_pct(g[0])}" for c, g in gains.items()
                     if g and c != result.algorithm)
    if result.decision == order_check.TICTAC:
        g, low = result.gain(result.chosen) or (result.spread.median - 1
                                               if result.spread.median else 0.0, None)
        at_least = f"at least {_pct(low)}, " if low is not None else ""
        return (f"order check: {name(result.chosen or result.algorithm)} kept: {_pct(g)} "
                f"throughput vs TensorFlow's order ({at_least}{rounds}{others})")
    g = result.gain(result.algorithm)
    b = result.bounds.get(result.algorithm, {})
    upper = b.get("upper")
    shown = f" (at most {_pct(math.expm1(upper))})" if upper is not None else ""
    return (f"order check: {name(result.algorithm)} {_pct(g[0]) if g else 'unmeasured'}"
            f"{shown} vs TensorFlow's order over {rounds}{others}: not shown faster, "
            "TensorFlow's order kept; no gain is claimed")
