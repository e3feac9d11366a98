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

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Sequence

from tictac_hooks.callbacks import order_check
from tictac_hooks.callbacks.planner import Parts
from tictac_hooks.records import PROFILING, CheckResult, WorkerStep

log = logging.getLogger("tictac")

_KEEP_CHECK_RECORDS = 50_000


class CheckRunner:
    """Runs the order check of ``plan`` (None: no check; a switch still installs).

    Args:
      plan: the check's rounds and block steps (order_check.CheckPlan), or None.
      recheck_every: steps per worker after a decision until the check runs again (0:
        once); under ParameterServerStrategy that many times the workers are dispatched.
      installs: whether this process installs (only the chief does).
      join: waits until the dispatched steps ran (PSS: coordinator.join), or None.
      algorithm: the configured algorithm, when the check decides.
      install: installs a candidate's parts on every PS (quietly), or on the PSes of
        its ``only`` keyword.
      clear: clears every PS (TensorFlow's order).
      poll: reads the PSes' records (which reach :meth:`recorded`).
      mark_pause: marks [start, end] as TicTac's own pause (no step time).
      say: a progress line.
      on_result: each check's result, after its decision was applied.
    """

    def __init__(self, plan: "order_check.CheckPlan | None", recheck_every: int,
                 installs: bool, join: "Callable[[], None] | None",
                 algorithm: Callable[[], str], install: Callable[[Parts], None],
                 clear: Callable[[], None], poll: Callable[[], Any],
                 mark_pause: Callable[[float, float], None], say: Callable[[str], None],
                 on_result: "Callable[[CheckResult], None] | None" = None) -> None:
        self.plan = plan
        self.recheck_every = recheck_every
        self.installs = installs
        self._join = join
        self._algorithm = algorithm
        self._install = install
        self._clear = clear
        self._poll = poll
        self._mark_pause = mark_pause
        self._say = say
        self._on_result = on_result
        self.results: list[CheckResult] = []  # every check's result, in order
        self.n = -1  # steps dispatched since the running check began; -1: none
        self._since_decision = 0  # steps dispatched since the last check's decision
        self._after_switch: list[WorkerStep] = []  # records the check reads (bounded)
        # The candidate orders (algorithm -> per-worker (DAG, schedule)), the one the
        # check or its decision asks for, and the one installed (None: TF's order).
        self.candidates: dict[str, Parts] = {}
        self.want: str | None = None
        self.decided: str | None = None
        self.installed: str | None = None
        self.suspended = False       # validation inside fit: TF's own order
        self.holds = 0       # times the order check held the loop (joins, installs)
        # PSes restarted (a new gate, no order) that still wait for theirs; what the
        # PSes run changes under this lock (the reading thread finds restarts).
        self.to_reinstall: set[str] = set()
        # The switch installed its order before the compute times came (TIC): the
        # check waits for them (Switching.timed), then start() runs it.
        self.waiting = False
        self._lock = threading.RLock()

    @property
    def running(self) -> bool:
        """Whether a check is running (between its first block and its decision)."""
        return self.n >= 0

    def switched(self, algorithm: str, candidates: dict[str, Parts],
                 workers: int = 1) -> None:
        """The switch computed ``candidates`` and installs (or not) ``algorithm``'s;
        ``workers``: those the loop's dispatched steps are spread over (CheckPlan)."""
        self.candidates = candidates
        self.want = self.decided = algorithm
        if self.plan is not None:
            self.plan = order_check.CheckPlan(self.plan.rounds, self.plan.block_steps,
                                              tuple(candidates), max(1, workers))

    def start(self) -> None:
        """The check begins with the next dispatched step; one line says what it runs."""
        self.waiting = False
        if self.plan is None:
            return
        self.n = 0
        plan = self.plan
        names = " and ".join(c.upper() for c in self.candidates)
        per = (f" ({plan.block_dispatched} dispatched over {plan.workers} workers)"
               if plan.workers > 1 else "")
        self._say(f"checking {names} against TensorFlow's order: {plan.rounds} "
                  f"round{'s' if plan.rounds > 1 else ''} of block pairs of "
                  f"{plan.block_steps} steps per worker{per}"
                  + (f", again every {self.recheck_every} steps per worker"
                     if self.recheck_every else ""))

    def abandon(self) -> None:
        """The switch failed: no candidates, no check, TensorFlow's order on every PS."""
        self.plan, self.candidates = None, {}
        self.want = self.decided = None
        if self.installs and self.installed is not None:
            try:
                self._clear()
                self.installed = None
            except Exception:  # noqa: BLE001 - a PS that went away: nothing to clear
                log.debug("TicTac: clearing after a failed switch", exc_info=True)

    def recorded(self, records: Sequence[WorkerStep]) -> None:
        """Records read while a check runs: what it decides on (the last 50,000)."""
        if self.n >= 0:
            self._after_switch.extend(r for r in records if r.phase != PROFILING)
            del self._after_switch[:-_KEEP_CHECK_RECORDS]

    def finish(self) -> None:
        """Training ended inside the check: decides on what ran."""
        if self.plan is not None and self.n > 0:
            self._finish_check()

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
        the order check's blocks (order_check.py), applies its decision, and starts the
        check again every ``recheck_every`` steps per worker."""
        if self.plan is None or not self.candidates or self.waiting:
            return
        if self.n >= 0:
            n = self.n
            self.n += 1
            if n < self.plan.total_steps:
                self._to_block(self.plan.block(n))
            else:
                self._finish_check()
        elif self.recheck_every:
            self._since_decision += 1
            if self._since_decision >= self.recheck_every * self.plan.workers:
                self._say(f"re-checking after {self._since_decision} steps")
                self._begin_check()

    def check_again(self, candidates: Sequence[str], rounds: int) -> None:
        """Runs the check once more from the next dispatched step, in fresh blocks, with
        ``candidates`` (computed at the switch) against TensorFlow's order for
        ``rounds`` rounds: e.g. the kept order alone, so that what the decision gave is
        measured on steps it was not decided on. Its decision applies as any check's."""
        if self.running:
            raise RuntimeError("an order check is running: check again after its decision")
        unknown = [c for c in candidates if c not in self.candidates]
        if unknown or not candidates:
            raise ValueError(f"check again with {list(candidates)}: the switch computed "
                             f"{sorted(self.candidates)}")
        self.plan = order_check.CheckPlan(rounds, self.plan.block_steps, tuple(candidates),
                                          self.plan.workers)
        self._begin_check()

    def _begin_check(self) -> None:
        self._after_switch = []
        self.n = 0
        self._to_block(self.plan.block(0))

    def _to_block(self, want: str | None) -> None:
        """Starts a check block running ``want`` (None: TensorFlow's order). Under PSS the
        loop dispatches ahead of what runs, so at a block boundary it first waits for
        the dispatched steps: every step dispatched in a block then runs in that block's
        order, and each worker gets its share of every block (without the wait a short
        block could run almost entirely in the previous block's order on one worker).
        The dispatched steps run back to back during the wait; from its end to the new
        order's install the workers idle, and that interval is marked as a pause, so
        the step times that include the idle time are left out."""
        if want == self.want:
            return
        self.holds += 1
        if self._join is not None and self.installs:
            self._join()
        idle_from = time.time()
        self.want = want
        self._apply()
        self._mark_pause(idle_from, time.time())

    def _finish_check(self) -> None:
        self.holds += 1
        if self._join is not None:
            self._join()  # the blocks' steps ran, so the PSes recorded them
        pause_start = time.time()  # the drained steps ran back to back: not a pause
        self._poll()
        result = order_check.decide(self._after_switch, self.plan, self._algorithm())
        self._after_switch = []
        self.n, self._since_decision = -1, 0
        if result.decision == order_check.TICTAC:
            self.decided = result.chosen
        elif result.decision == order_check.DEFAULT:
            self.decided = None
        self.want = self.decided  # inconclusive: the order before the check stays
        result = dataclasses.replace(result, kept=self.decided or order_check.DEFAULT)
        self.results.append(result)
        self._apply()
        self._mark_pause(pause_start, time.time())
        if result.decision is None:
            kept = self.decided.upper() + " order" if self.decided else "TensorFlow's order"
            self._say(f"order check inconclusive ({result.reason}); {kept} kept")
        else:
            spread = result.spread
            gain = (spread.median - 1) * 100
            others = "".join(
                f"; {c.upper()} {(s.median - 1) * 100:+.1f} %"
                for c, s in result.candidates.items() if c != result.algorithm and s.pairs)
            self._say(f"order check: {result.algorithm.upper()} order "
                      f"{gain:+.1f} % throughput vs TensorFlow's (median of "
                      f"{spread.pairs} block pairs, range "
                      f"{(spread.low - 1) * 100:+.1f} to "
                      f"{(spread.high - 1) * 100:+.1f} %{others}): "
                      + ("kept" if self.decided else "cleared, TensorFlow's order kept"))
        if self._on_result is not None:
            self._on_result(result)

    def _apply(self) -> None:
        """Installs the wanted candidate order, or clears the PSes for TensorFlow's, so
        that the PSes run what the check asks for, unless suspended (validation)."""
        with self._lock:
            want = None if self.suspended else self.want
            if not self.installs or not self.candidates or want == self.installed:
                return
            if want is not None:
                self._install(self.candidates[want])
            else:
                self._clear()
            self.installed = want
            self.to_reinstall.clear()

    def restarted(self, addresses: Sequence[str]) -> None:
        """PSes found restarted (a new gate: TensorFlow's order, no records of earlier
        steps): the order the others run is installed on them again now, within the
        read that found them, with one line; one that cannot take it yet is tried again
        at the next read."""
        with self._lock:
            if addresses:
                self.to_reinstall.update(addresses)
                where = ", ".join(addresses)
                if not self.installs or self.installed is None:
                    self._say(f"the PS at {where} was restarted (a new gate); it runs "
                              "TensorFlow's order, as every PS does now")
                    self.to_reinstall.clear()
                    return
            pending = sorted(self.to_reinstall)
            if not pending or not self.installs or self.installed is None:
                return
            try:
                self._install(self.candidates[self.installed], only=pending)
            except Exception as e:  # noqa: BLE001 - say it once, try at the next read
                log.debug("TicTac: reinstalling on %s", pending, exc_info=True)
                if addresses:
                        self._say(f"the PS at {', '.join(pending)} was restarted; installing "
                              f"the {self.installed.upper()} order on it failed ({e}): "
                              "trying again at every read")
                return
            self.to_reinstall.clear()
            self._say(f"the PS at {', '.join(pending)} was restarted (a new gate): the "
                      f"{self.installed.upper()} order installed on it again")
