"""The TicTac run loop shared by the Keras callback, the custom-loop API and the hook.

Phases: *profiling* (TensorFlow's own transfer order; the PSes record every transfer),
then, after ``profile_steps`` steps, *scheduled*: the order computed from the worker's
DAG (TIC) or the DAG plus measured times (TAC) is installed on every PS, and from the
next step on every worker receives its parameters in that one order.

The controller sequences these phases; the work is done beside it: settings.py (the
settings, and what each gate backend honours), planner.py (the DAG restricted to what
the PSes served, timed for TAC, the per-PS install plan, the run's profile),
check_runner.py (the order check's blocks and decision; order_check.py its
statistics), reading.py (the records read on a thread of their own, lost workers, what
was read), switching.py (the switch itself, or an order restored after a restart:
saved_order.py).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from tictac_hooks.enforce.pool import GateClients
from tictac_hooks.run import coverage, order_check, phases, planner, reading
from tictac_hooks.run import settings as settings_mod
from tictac_hooks.run.check_runner import CheckRunner
from tictac_hooks.run.phases import Phases
from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.settings import Settings, TicTacSetupError
from tictac_hooks.run.steplog import Pauses, StepLog
from tictac_hooks.run.summary import OrderCounts, RunSummary
from tictac_hooks.run.switching import Switching
from tictac_hooks.run.tensorboard import StepTimeWriter
from tictac_hooks.graph.simulate import efficiency
from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.records import CheckResult, WorkerStep

log = logging.getLogger("tictac")


class Controller(Switching):
    """Talks to every PS's rendezvous; computes, installs and reports the schedule.

    Args:
      config: the run's :class:`RunConfig` (settings, addresses, link rate, ...): read
        from there only. ``settings`` starts as the config's and changes once at most,
        when TAC cannot run and the run falls back to TIC.
      check: the order check's plan (None: the settings').
      join: waits until every dispatched step has run.
    """

    def __init__(self, config: RunConfig, check: "order_check.CheckPlan | None" = None,
                 join: "Callable[[], None] | None" = None, verbose: bool = True) -> None:
        self.config = config
        settings, install = config.settings, config.install
        self.ps_addresses = list(config.ps_addresses)
        # One client per PS for everything the run asks the gates (the connect check,
        # installs, clears, the record reads): enforce/pool.py.
        from tictac_hooks.enforce import client as gate_client
        # (looked up at each use: tests count the clients made)
        self.gates = GateClients(self.ps_addresses,
                                 lambda a, t: gate_client.connect(a, t))
        # Where the run is (phases.py): moved by this object alone.
        self.phases = Phases()
        # The order check after the switch (order_check.py); 0 rounds: off. Default:
        # the settings' (argument, else --tictac_check_* flag, else built-in default).
        if check is None:
            check = order_check.CheckPlan(settings.check_rounds, settings.check_block_steps)
        # The order check's blocks and decisions, and what the PSes run (check_runner.py).
        self.runner = CheckRunner(check if check.rounds and install else None,
                                  settings.recheck_every, install, join, host=self)
        self.verbose = verbose
        self.settings = settings
        self.installs = install
        self.schedule: Schedule | None = None
        self.steplog = StepLog(config.destination_jobs)
        self._pauses = Pauses()
        self._beside: list[list[float]] = []  # [start, end] of work beside the loop
        # The rate TAC's recv times and E use: the config's bandwidth, else the fastest
        # link measured while profiling (at the switch), or the saved order's.
        self._link_rate: float | None = config.bandwidth
        self._writer = StepTimeWriter(settings.log_dir) if settings.log_dir else None
        self.compute_seconds: float | None = None  # per-step compute, when profiled
        self.not_ordered_reason: str | None = None  # why the switch left TF's order
        self.coverage: "coverage.Coverage | None" = None  # of the order, at the switch
        # Why the frontend's compute profile failed (it said so in one warning line).
        self.compute_profile_error: str | None = None
        self.tac_off: str | None = None  # why TAC is off for this run, when it is
        # More orders the check measures beside TIC and TAC, label -> algorithm name of
        # graph/algorithms.py (`tictac bench --frontend fit`: the baselines); each
        # candidate's schedule carries its label, which the gates label its steps with.
        # Those that cannot be computed are left out, with why in ``check_off``.
        self.check_extra: dict[str, str] = {}
        self.check_off: dict[str, str] = {}
        # The gate backend of each PS: address -> (backend, the install settings it
        # cannot honour, with why); found by connect.
        self.backends: dict[str, tuple[str, Mapping[str, str]]] = {}
        # Reading the PSes' records: one cursor (a client per PS), a thread of its own,
        # one lock for everything the reads change (step log, check records, writer).
        self.cursor: Any = None
        self._timeline: "reading.TransferTimeline | None" = None
        self._reading: reading.ReadingThread | None = None
        self._lock = threading.RLock()
        self.dispatched = 0  # training steps the loop dispatched
        # worker -> when its task was last asked whether it answers (lost workers)
        self._probed: dict[str, float] = {}
        # Where the order is saved for a job restart (saved_order.py; None: not saved),
        # what it is valid for, and the file a restored order came from.
        self.order_dir: str | None = None
        self._fingerprint: str | None = None
        self._switched_on: Any = None  # the switch's (DAGs, served names, late recvs)
        self.restored_from: str | None = None

    # --- the order check (check_runner.py) -----------------------------------------------
    @property
    def check(self) -> "order_check.CheckPlan | None":
        """The order check's plan (None: no check)."""
        return self.runner.plan

    @property
    def check_results(self) -> list[CheckResult]:
        """Every check's result, in order."""
        return self.runner.results

    @property
    def holds(self) -> int:
        """Times the order check held the loop (joins, installs)."""
        return self.runner.holds

    @property
    def kept_order(self) -> str | None:
        """The algorithm whose order runs after the last decision (None: TensorFlow's)."""
        return self.runner.kept_order

    @property
    def check_result(self) -> CheckResult | None:
        """The last order check's result (None before the first decision)."""
        return self.runner.check_result

    def step_dispatched(self) -> None:
        """Once per step a frontend dispatches after the switch: the order check's
        blocks and decision (CheckRunner.step_dispatched)."""
        self.runner.step_dispatched()
        if self.phases.now in (phases.CHECKING, phases.DECIDED):  # a re-check began
            self._sync_phase("a re-check")

    # --- what the check runner asks of the run (check_runner.CheckHost) ----------------
    def install_candidate(self, parts: Sequence[tuple[Graph, Schedule]],
                          only: Sequence[str] | None = None) -> None:
        self._install(parts, quiet=True, only=only)

    def clear_orders(self, only: Sequence[str] | None = None) -> None:
        self._clear(only)

    def check_decided(self, result: CheckResult) -> None:
        """A check decided (CheckRunner's on_result): the schedule is the kept order."""
        self.phases.to(phases.DECIDED, f"the check kept {result.kept}")
        parts = self.runner.candidates.get(self.runner.decided or "")
        if result.decision == order_check.TICTAC and parts is not None:
            self.schedule = planner.merged(parts)
        if self._writer:
            self._writer.choice(result)
        self._save_order()

    # --- connection --------------------------------------------------------------------
    def connect(self, restorable: bool = False, records_since: float | None = None) -> None:
        """Checks every PS has a TicTac gate; clears old schedules (profiling phase).
        ``restorable``: an order saved by an earlier run of the job may be restored at
        the first step (the line says so, rather than promise profiling).
        ``records_since``: the wall time this run's steps began, where they began
        before this call (the bench profiles first): their records are read too."""
        from tictac_hooks.enforce.client import RendezvousError
        for i, address in enumerate(self.ps_addresses):
            try:
                with self.gates.using(address) as client:
                    client.ping()
                    self.backends[address] = (client.backend, dict(client.unhonoured))
                    if self.installs:
                        client.clear()
            except RendezvousError as e:
                self.gates.close()
                raise TicTacSetupError(
                    f"PS task ps:{i} ({address}): {e}. TicTac needs its gate at every PS: "
                    "launch PS tasks with `tictac ps --cluster-spec ... --task-index N` "
                    "(or tictac_hooks.enforce.server.TicTacServer in place of "
                    "tf.distribute.Server), or use LocalCluster for a local run") from None
        # A setting the user set that a PS's backend cannot honour is refused here,
        # before training; those left to their default resolve per backend (_install).
        settings_mod.check_backends(self.settings, self.backends)
        from tictac_hooks.enforce.cursor import RecordCursor
        self.cursor = RecordCursor(self.ps_addresses, clients=self.gates)
        self.cursor.start(after=records_since)
        if self.settings.log_dir and self._timeline is None:
            self._timeline = reading.TransferTimeline(self.settings.log_dir)
        if self.installs:
            unless = (", unless an order saved by an earlier run of this job fits"
                      if restorable else "")
            self.say(f"profiling {self.settings.profile_steps} steps in TensorFlow's own "
                     f"transfer order ({len(self.ps_addresses)} PS reached){unless}")

    def start_reading(self, every_steps: int | None = None) -> None:
        """Reads the PSes' records on a thread of its own from now on, every
        ``every_steps`` dispatched steps (default: often enough that no gate's history
        overflows) and every READ_EVERY_S seconds."""
        if self._reading is None:
            self._reading = reading.ReadingThread(self._read_in_background, every_steps,
                                                  self.cursor)
            self._reading.start()

    def steps_dispatched(self, count: int = 1) -> None:
        """The loop dispatched ``count`` training steps: wakes the reading thread when
        it is time to read (cheap: no I/O on the caller's thread)."""
        self.dispatched += count
        if self._reading is not None:
            self._reading.dispatched(count)

    def read_now(self) -> None:
        """Asks the reading thread for a read (e.g. at an epoch's end); does not wait."""
        if self._reading is not None:
            self._reading.wake()

    def _read_in_background(self) -> None:
        self.poll(include_active=False)
        self._find_lost_workers()

    def wait_for_profiled_records(self, timeout_s: float = 30.0, steps: int = 2) -> bool:
        """Reads until some worker has ``steps`` profiled steps recorded, or
        ``timeout_s`` passed; whether it has (reading.wait_for_profiled_records)."""
        return reading.wait_for_profiled_records(self.poll, self.steplog, timeout_s, steps)

    # --- statistics ---------------------------------------------------------------------
    def poll(self, everything: bool = False, include_active: bool = True) -> list[WorkerStep]:
        """Reads the step records every PS finished since the last read (and, with
        ``include_active``, those still running), finalizes the steps that can be,
        writes their TensorBoard summaries and returns them (each step once)."""
        with self._lock:
            read = self.cursor.read(include_active)
            lost = {ps: n for ps, n in read.dropped.items() if n}
            if lost:
                log.warning("TicTac: %s dropped step records before they were read (its "
                            "history bound); the steps lost are counted as gaps",
                            ", ".join(f"{ps}: {n}" for ps, n in lost.items()))
            for address in read.restarted:
                self.steplog.restarted(address)
            if read.restarted or self.runner.out_of_step:
                self.runner.sync(read.restarted)
            self.steplog.add(read.steps)
            if self._timeline is not None:
                self._timeline.add(read.steps, final=everything)
            if everything:
                self._find_lost_workers()
            records = self.steplog.finalize(self._paused_within, self._efficiency,
                                            everything, beside=self._beside_within)
            self.runner.recorded(records)
            if self._writer:
                self._writer.write(records)
        return records

    def _find_lost_workers(self) -> None:
        """Marks a worker lost, with one line, when the others went on without it
        (reading.find_lost_workers)."""
        with self._lock:
            reading.find_lost_workers(self.steplog, self.worker_addresses, self._probed,
                                      self.say)

    def say(self, message: str) -> None:
        """A progress line: printed when ``verbose`` (the default), always logged."""
        log.info("%s", message)
        if self.verbose:
            print(f"[tictac] {message}", file=sys.stdout, flush=True)

    def _efficiency(self, step: Any, step_time: float | None) -> float | None:
        """Measured E of one step: (U - m) / (U - L) with m the step time, comm the
        step's transfer time per PS link (bytes / measured link rate) and comp the
        profiled compute time (paper Eq. 4)."""
        if step_time is None or self.compute_seconds is None or not self._link_rate:
            return None
        per_ps = [r.bytes / self._link_rate for r in step.per_ps.values()]
        upper = sum(per_ps) + self.compute_seconds
        lower = max(max(per_ps), self.compute_seconds)
        return efficiency(step_time, upper, lower)

    def _paused_within(self, start: float, end: float) -> float:
        """Seconds of TicTac's own pauses inside [start, end]."""
        return self._pauses.within(start, end)

    def _beside_within(self, start: float, end: float) -> bool:
        """Whether TicTac's own work ran beside the loop during [start, end]."""
        return any(min(end, b[1]) > max(start, b[0]) for b in self._beside)

    def begin_beside(self) -> list[float]:
        """TicTac's own work starts beside the loop (a switch in the background): the
        steps it overlaps get no step time (they share the machine with it). Returns
        the interval, whose end :meth:`end_beside` sets."""
        interval = [time.time(), math.inf]
        self._beside.append(interval)
        return interval

    @staticmethod
    def end_beside(interval: list[float]) -> None:
        interval[1] = time.time()

    def served_transfers(self) -> dict[str, set[str]]:
        """worker -> names of the transfers the PSes served it during profiling."""
        return self.steplog.served_copy()

    @property
    def destination_jobs(self) -> tuple[str, ...]:
        return self.config.destination_jobs

    @property
    def worker_addresses(self) -> dict[str, str]:
        """task ("worker:1") -> its address, to tell a dead worker from a slow one."""
        return dict(self.config.worker_addresses)

    @property
    def spread_over(self) -> int:
        """The workers the dispatched steps go to (CheckPlan.workers)."""
        return self.config.spread_over

    @property
    def pace_rate(self) -> float | None:
        """The native gate's pacing rate (gate.h): the config's link rate (bytes/s)."""
        return self.config.pace_rate

    @property
    def align(self) -> bool | None:
        """How the paced service shares a PS link among a step's workers (RunConfig)."""
        return self.config.align

    def link_rate(self) -> float | None:
        """Bytes per second of the fastest profiled step on a PS link: a transfer
        oracle Time(recv) = bytes / rate when no bandwidth is given."""
        return self.steplog.best_link_rate

    def suspend(self) -> None:
        """Clears the schedule on every PS (e.g. while fit runs validation, whose
        transfers the training schedule does not describe)."""
        self.runner.suspend(True)

    def resume(self) -> None:
        """Re-installs the schedule after :meth:`suspend` (if the check wants it)."""
        self.runner.suspend(False)

    def mark_pause(self, start: float, end: float) -> None:
        """Steps whose interval overlaps [start, end] (time TicTac itself held the
        training loop, e.g. to profile) get no step time."""
        self._pauses.add(start, end)

    def _install(self, parts: Sequence[tuple[Graph, Schedule]], quiet: bool = False,
                 only: Sequence[str] | None = None) -> None:
        """Each PS (of ``only``, when given) gets, per worker, that worker's order
        restricted to its transfers (planner.per_ps), with the pacing settings its
        backend honours."""
        pacing = settings_mod.honoured(self.backends, pace_rate=self.pace_rate,
                                       align=self.align)
        # All or nothing: checked on every PS first, rolled back on a failure half-way.
        ordered = planner.install(parts, self.ps_addresses, self.settings.skip_timeout,
                                  self.settings.window_bytes, only=only,
                                  clients=self.gates, **pacing)
        if only is None:
            self.steplog.set_ordered_ps(set(ordered))
        if not quiet:
            self.say(f"installed on {len(ordered)} of {len(self.ps_addresses)} PS "
                     f"(every PS the order has transfers on); every later step follows it")

    def _clear(self, only: Sequence[str] | None = None) -> None:
        # The step log keeps the PSes of the last install: a step read after this
        # clear that ran scheduled is still judged against every PS that carried it.
        from tictac_hooks.enforce.client import clear_everywhere
        clear_everywhere(list(only) if only is not None else self.ps_addresses,
                         clients=self.gates)

    # --- end ------------------------------------------------------------------------------
    def finish(self, hook: Mapping[str, Any] | None = None) -> RunSummary:
        """Final poll; writes the transfer timeline and the summary next to the event
        files; returns the run's :class:`RunSummary` (the one place it is built)."""
        self.stop_reading()
        self.runner.finish()  # training ended inside the check: decide on what ran
        self.phases.to(phases.ENDED, "training ended")
        self.poll(everything=True)
        logged = self.steplog.summary()
        results = [{k: v for k, v in r.to_json().items() if k != "blocks"}
                   for r in self.check_results]
        check = None
        if results:
            if self.runner.block_choice:   # how the checks' block length was set
                results[-1]["block"] = dict(self.runner.block_choice)
            check = dict(results[-1])
            if self.runner.same_as:
                check["same_as"] = dict(self.runner.same_as)
            if self.runner.not_checked:
                check["not_checked"] = dict(self.runner.not_checked)
        summary = RunSummary(
            config=self.config.fields(), workers=logged["workers"],
            order=OrderCounts.from_counts(logged["order"]), records=self.records_summary(),
            check=check, checks=tuple(results),
            # the order of the last install, as installed
            schedule=None if self.schedule is None else {
                "algorithm": self.schedule.algorithm, "order": list(self.schedule.order),
                "priority": dict(self.schedule.priority)},
            coverage=None if self.coverage is None else self.coverage.to_json(),
            not_ordered=self.not_ordered_reason or None, tac_off=self.tac_off or None,
            restored_from=self.restored_from or None,
            hook=None if hook is None else dict(hook), phases=self.phases.to_json())
        if self.settings.log_dir:
            reading.write_logs(self.settings.log_dir, summary.to_json())
        if self._timeline is not None:
            self._timeline.close()
        if self._writer:
            self._writer.close()
        self.cursor.close()
        self.gates.close()
        return summary

    def stop_reading(self) -> None:
        """Stops the reading thread (its last read finishes first)."""
        if self._reading is not None:
            self._reading.stop()
            self._reading = None

    def records_summary(self) -> dict[str, Any]:
        """What was read (reading.records_summary)."""
        return reading.records_summary(self.dispatched, self.steplog, self.cursor,
                                       self.ps_addresses)
