"""The TicTac run loop shared by the Keras callback, the custom-loop API and the hook.

Phases: *profiling* (TensorFlow's own transfer order; the PSes record every transfer),
then, after ``profile_steps`` steps, *scheduled*: the order computed from the worker's
DAG (TIC) or the DAG plus measured times (TAC) is installed on every PS, and from the
next step on every worker receives its parameters in that one order.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from tictac_hooks import flags as tictac_flags
from tictac_hooks.callbacks import coverage, order_check
from tictac_hooks.callbacks.steplog import StepLog
from tictac_hooks.callbacks.tensorboard import StepTimeWriter
from tictac_hooks.graph.simulate import efficiency
from tictac_hooks.graph.algorithms import compute_order
from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.schedule import Schedule, ScheduleError
from tictac_hooks.graph.tf.naming import (canonical_transfer_name, sending_node_name,
                                          task_of)
from tictac_hooks.records import PROFILING, WorkerStep

log = logging.getLogger("tictac")


_KEEP_CHECK_RECORDS = 50_000

# The reading thread reads the PSes' finished records every READ_EVERY_STEPS steps
# dispatched (fewer where a step makes more records: every PS keeps 256, gate.h) and at
# least every READ_EVERY_S seconds.
READ_EVERY_STEPS = 32
READ_EVERY_S = 2.0
GATE_HISTORY = 256  # records a gate keeps by default (enforce/gate.py, gate.h)
CATCH_UP_S = 1.0    # the longest a loop that outruns the reads waits for one
# A worker is lost when the other workers started this many steps since its last one
# and its task does not answer (or, where its address is unknown, LOST_AFTER_STEPS).
SUSPECT_AFTER_STEPS = 8
LOST_AFTER_STEPS = 64


class TicTacSetupError(RuntimeError):
    """TicTac cannot run in this setup; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Resolved settings: constructor argument, else parsed absl flag, else default.

    Every value is checked (ValueError naming the argument and its allowed range): the
    constructors of TicTac, TicTacLoop and TicTacHook call :meth:`check` on their
    arguments, so a wrong one fails there, before any cluster or model is built.
    """

    algorithm: str
    profile_steps: int
    log_dir: str | None
    skip_timeout: float
    stats_every: int
    window_bytes: int = tictac_flags.DEFAULTS["window_bytes"]
    check_rounds: int = tictac_flags.DEFAULTS["check_rounds"]          # 0: no order check
    check_block_steps: int = tictac_flags.DEFAULTS["check_block_steps"]
    recheck_every: int = tictac_flags.DEFAULTS["recheck_every"]        # 0: check once
    align: str = tictac_flags.DEFAULTS["align"]                        # auto / on / off

    @classmethod
    def resolve(cls, algorithm: str | None = None, profile_steps: int | None = None,
                log_dir: str | None = None, skip_timeout: float | None = None,
                stats_every: int | None = None,
                window_bytes: int | None = None, check_rounds: int | None = None,
                check_block_steps: int | None = None,
                recheck_every: int | None = None, align: str | None = None) -> "Settings":
        setting = tictac_flags.setting
        return cls(**cls.check(algorithm=setting("algorithm", algorithm),
                               profile_steps=setting("profile_steps", profile_steps),
                               log_dir=setting("log_dir", log_dir),
                               skip_timeout=setting("skip_timeout", skip_timeout),
                               stats_every=setting("stats_every", stats_every),
                               window_bytes=setting("window_bytes", window_bytes),
                               check_rounds=setting("check_rounds", check_rounds),
                               check_block_steps=setting("check_block_steps",
                                                         check_block_steps),
                               recheck_every=setting("recheck_every", recheck_every),
                               align=setting("align", align)))

    @staticmethod
    def check(**values: Any) -> dict[str, Any]:
        """The given settings, checked (None: not given, left for the flag or default)."""
        from tictac_hooks import checks
        from tictac_hooks.checks import check_window

        checkers = {
            "algorithm": tictac_flags.check_algorithm,
            "profile_steps": lambda v: checks.whole_number("profile_steps", v, 1),
            "log_dir": _check_log_dir,
            "skip_timeout": lambda v: checks.seconds("skip_timeout", v),
            "stats_every": lambda v: checks.whole_number("stats_every", v, 1),
            "window_bytes": check_window,
            "check_rounds": lambda v: checks.whole_number("check_rounds", v, 0),
            "check_block_steps": lambda v: checks.whole_number(
                "check_block_steps", v, tictac_flags.MIN_CHECK_BLOCK_STEPS),
            "recheck_every": lambda v: checks.whole_number("recheck_every", v, 0),
            "align": tictac_flags.check_align,
        }
        return {name: None if value is None else checkers[name](value)
                for name, value in values.items()}


def _check_log_dir(log_dir: Any) -> str:
    if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
        raise ValueError(f"log_dir must be a directory path (str or os.PathLike), or None "
                         f"for no logs; got {log_dir!r}")
    return os.fspath(log_dir)


def _job_tasks(spec: Mapping[str, Sequence[str]] | Any, job: str) -> list[tuple[int, str]]:
    """(task index, address) of a cluster spec's ``job``, in task order (dict or
    tf.train.ClusterSpec; a sparse job {index: address} too); [] without the job."""
    if hasattr(spec, "as_dict"):
        spec = spec.as_dict()
    tasks = spec.get(job) if isinstance(spec, Mapping) else None
    if isinstance(tasks, Mapping):  # sparse cluster spec {task index: address}
        return sorted((int(i), a) for i, a in tasks.items())
    return list(enumerate(tasks or ()))


def ps_addresses_from_cluster_spec(spec: Mapping[str, Sequence[str]] | Any) -> list[str]:
    """The PS addresses, in task order, of a cluster spec (dict or tf.train.ClusterSpec)."""
    ps = _job_tasks(spec, "ps")
    if not ps:
        raise TicTacSetupError(
            "the cluster has no 'ps' job: TicTac orders parameter transfers from "
            "parameter servers, so it needs ParameterServerStrategy or a PS cluster")
    return [address for _, address in ps]


def task_addresses_from_cluster_spec(spec: Mapping[str, Sequence[str]] | Any,
                                     job: str = "worker") -> dict[str, str]:
    """``{"worker:0": address, ...}`` of a cluster spec's ``job``."""
    return {f"{job}:{i}": address for i, address in _job_tasks(spec, job)}


def _merged(parts: Sequence[tuple[Graph, Schedule]]) -> Schedule:
    """The one schedule of a candidate's per-worker orders."""
    return parts[0][1] if len(parts) == 1 else Schedule.merged([sched for _, sched in parts])


def _channel_index(channel: str) -> int:
    job, _, task = channel.partition(":")
    if job != "ps" or not task.isdigit():
        raise ScheduleError(f"transfer channel {channel!r} is not a PS task ('ps:<index>')")
    return int(task)


class Controller:
    """Talks to every PS's rendezvous; computes, installs and reports the schedule.

    Args:
      ps_addresses: the PS addresses of the cluster spec (each a TicTac rendezvous).
      settings: see :class:`Settings`.
      install: whether this process installs schedules (the chief does; other workers
        of a between-graph job only report).
      destination_jobs: the jobs whose steps are scheduled and reported ("worker";
        "chief" for Keras predict, which runs on the coordinator).
    """

    def __init__(self, ps_addresses: Sequence[str], settings: Settings,
                 install: bool = True, destination_jobs: Sequence[str] = ("worker",),
                 check: "order_check.CheckPlan | None" = None,
                 join: "Callable[[], None] | None" = None, verbose: bool = True,
                 training: bool = True) -> None:
        self.ps_addresses = list(ps_addresses)
        # The order check after the switch (order_check.py); 0 rounds: off. Default:
        # the settings' (argument, else --tictac_check_* flag, else built-in default).
        if check is None:
            check = order_check.CheckPlan(settings.check_rounds, settings.check_block_steps)
        self.check = check if check.rounds and install else None
        self.check_results: list[dict[str, Any]] = []  # every check's result, in order
        self._join = join  # waits until dispatched steps ran (PSS: coordinator.join)
        self._check_n = -1  # steps dispatched since the running check began; -1: none
        self._since_decision = 0  # steps dispatched since the last check's decision
        self._after_switch: list[WorkerStep] = []  # records the check reads (bounded)
        # The candidate orders (algorithm -> per-worker (DAG, schedule)), the one the
        # check or its decision asks for, and the one installed (None: TF's order).
        self._candidates: dict[str, list[tuple[Graph, Schedule]]] = {}
        self._want: str | None = None
        self._decided: str | None = None
        self._installed: str | None = None
        self._suspended = False       # validation inside fit: TF's own order
        self.verbose = verbose
        # Bytes/s of a PS's link for the native gate's pacing (gate.h); None: off.
        self.pace_rate: float | None = None
        # How the native gate's pacing shares a PS link among the workers of one step
        # (gate.h): aligned (k-th transfer to every worker before any (k+1)-th) or one
        # worker after the other; "auto": the latter for training, where staggered
        # workers push gradients while others still pull (measured in benchmarks/RESULTS.md).
        self.align: bool | None = {"on": True, "off": False}.get(settings.align,
                                                                 not training)
        self.destination_jobs = tuple(destination_jobs)
        self.settings = settings
        self.installs = install
        self.schedule: Schedule | None = None
        self.steplog = StepLog(destination_jobs)
        self._pauses: list[tuple[float, float]] = []
        self._beside: list[list[float]] = []  # [start, end] of work beside the loop
        self._link_rate: float | None = None
        self._writer = StepTimeWriter(settings.log_dir) if settings.log_dir else None
        self.compute_seconds: float | None = None  # per-step compute, when profiled
        self.not_ordered_reason: str | None = None  # why the switch left TF's order
        self.coverage: "coverage.Coverage | None" = None  # of the order, at the switch
        # Why the frontend's compute profile failed (it said so in one warning line).
        self.compute_profile_error: str | None = None
        self.tac_off: str | None = None  # why TAC is off for this run, when it is
        # Reading the PSes' records: one cursor (a client per PS), a thread of its own,
        # one lock for everything the reads change (step log, check records, writer).
        self.cursor: Any = None
        self._reading: ReadingThread | None = None
        self._lock = threading.RLock()
        self.dispatched = 0  # training steps the loop dispatched
        self.holds = 0       # times the order check held the loop (joins, installs)
        # task ("worker:1") -> its address, to tell a dead worker from a slow one
        self.worker_addresses: dict[str, str] = {}
        self._probed: dict[str, float] = {}

    # --- connection --------------------------------------------------------------------
    def connect(self) -> None:
        """Checks every PS has a TicTac gate; clears old schedules (profiling phase)."""
        from tictac_hooks.enforce.client import RendezvousError, connect
        for i, address in enumerate(self.ps_addresses):
            try:
                with connect(address, timeout_s=10.0) as client:
                    client.ping()
                    if self.installs:
                        client.clear()
            except RendezvousError as e:
                raise TicTacSetupError(
                    f"PS task ps:{i} ({address}): {e}. TicTac needs its gate at every PS: "
                    "launch PS tasks with `tictac ps --cluster-spec ... --task-index N` "
                    "(or tictac_hooks.enforce.server.TicTacServer in place of "
                    "tf.distribute.Server), or use LocalCluster for a local run") from None
        from tictac_hooks.enforce.cursor import RecordCursor
        self.cursor = RecordCursor(self.ps_addresses)
        self.cursor.start()
        if self.installs:
            self.say(f"profiling {self.settings.profile_steps} steps in TensorFlow's own "
                     f"transfer order ({len(self.ps_addresses)} PS reached)")

    def start_reading(self, every_steps: int | None = None) -> None:
        """Reads the PSes' records on a thread of its own from now on, every
        ``every_steps`` dispatched steps (default: often enough that no gate's history
        overflows) and every READ_EVERY_S seconds."""
        if self._reading is None:
            self._reading = ReadingThread(self._read_in_background, every_steps,
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
        """Reads (running steps' records too) until some worker has ``steps`` profiled
        steps recorded, or ``timeout_s`` passed; whether it has. A worker runs its
        steps one after the other, so all but its latest are whole: the served names
        then hold every transfer of a step (a gather comes late in it, after the ids).
        For a switch that does not join the loop's dispatched steps."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            per_worker: dict[str, set] = {}
            for rec in self.steplog.profiled_records():
                if not rec.dead:
                    per_worker.setdefault(rec.worker, set()).add((rec.step_id, rec.iteration))
            enough = any(len(keys) >= steps for keys in per_worker.values())
            if enough or time.monotonic() > deadline:
                return enough
            time.sleep(0.05)

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
            self.steplog.add(read.steps)
            if everything:
                self._find_lost_workers()
            records = self.steplog.finalize(self._paused_within, self._efficiency,
                                            everything, beside=self._beside_within)
            if self._check_n >= 0:
                self._after_switch.extend(r for r in records if r.phase != PROFILING)
                del self._after_switch[:-_KEEP_CHECK_RECORDS]
            if self._writer:
                self._writer.write(records)
        return records

    def _find_lost_workers(self) -> None:
        """Marks a worker lost, with one line, when the others went on without it: for
        SUSPECT_AFTER_STEPS of their steps and its task does not answer, or for
        LOST_AFTER_STEPS where its address is unknown."""
        with self._lock:
            for worker in self.steplog.workers():
                if worker in self.steplog.lost:
                    continue
                last, others = self.steplog.silent(worker) or (0.0, 0)
                if others < SUSPECT_AFTER_STEPS:
                    continue
                address = self.worker_addresses.get(task_of(worker) or "")
                if address is not None:
                    if time.time() - self._probed.get(worker, 0.0) < 1.0:
                        continue
                    self._probed[worker] = time.time()
                    alive = task_answers(address)
                    if alive is not False:
                        continue
                    reason = f"its task at {address} does not answer"
                elif others >= LOST_AFTER_STEPS:
                    reason = "no step of it since"
                else:
                    continue
                now = time.time()
                self.steplog.mark_lost(worker, now, reason)
                from tictac_hooks.callbacks.tensorboard import worker_run_name
                self.say(f"{worker_run_name(worker)} ({worker}) lost: its last step started "
                         f"at {time.strftime('%H:%M:%S', time.localtime(last))}, "
                         f"{now - last:.1f} s ago, and the other workers started {others} "
                         f"steps since ({reason}); ParameterServerStrategy runs its work on "
                         "the others, and its last step counts as unfinished")

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
        return sum(max(0.0, min(end, p1) - max(start, p0)) for p0, p1 in self._pauses)

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
        return dict(self.steplog.served)

    def link_rate(self) -> float | None:
        """Bytes per second of the fastest profiled step on a PS link: a transfer
        oracle Time(recv) = bytes / rate when no bandwidth is given."""
        return self.steplog.best_link_rate

    # --- the switch ---------------------------------------------------------------------
    def switch(self, graphs: Graph | Mapping[str, Graph],
               compute_times: Mapping[str, float] | None = None,
               bandwidth: float | None = None, late: "set[str] | None" = None,
               holds_loop: bool = True) -> Schedule | None:
        """Computes the order and installs it on every PS.

        ``graphs`` is the worker's DAG as traced, or one DAG per worker task when the
        workers receive differently named transfers (in-graph replication); each worker
        then gets its own order, and each PS enforces every worker's order for that
        worker. Recvs the PSes never served while profiling become free compute ops
        (PS-side reads). ``late`` names recvs that in TensorFlow depend on work done in
        the same step (e.g. a read of a variable after an update the worker's gradient
        feeds): they cannot be ready at the start of the step, so scheduling them early
        would stall every transfer behind them; they are left unscheduled (they pass
        the rendezvous straight through). ``compute_times`` (seconds per compute op) is
        needed for TAC and for measured E. Returns the (merged) schedule, or None for
        algorithm "none".
        """
        import time as _time
        pause_start = _time.time()
        self.poll()
        if isinstance(graphs, Graph):
            graphs = {"worker": graphs}
        served = set().union(*self.served_transfers().values())
        self._link_rate = bandwidth or self.link_rate()
        if bandwidth:
            self.pace_rate = float(bandwidth)
        algorithm = self.settings.algorithm
        if algorithm == "none":
            self.say("algorithm 'none': profiling only, no schedule installed")
            return None
        late = set(late or ())
        t0 = _time.perf_counter()
        parts = None
        if algorithm == "tac":
            try:
                parts = self._parts_for(algorithm, graphs, compute_times, served, late)
            except TicTacSetupError as e:
                algorithm = self._fall_back_to_tic(str(e))
        if parts is None:
            parts = self._parts_for(algorithm, graphs, compute_times, served, late)
        self._candidates = {algorithm: parts}
        self.schedule = _merged(parts)
        self.coverage = coverage.measure(self.steplog.profiled_records(),
                                         set(self.schedule.order))
        self.say(f"{algorithm.upper()} order of {len(self.schedule)} transfers "
                 f"({self.coverage.phrase()}) computed in "
                 f"{(_time.perf_counter() - t0) * 1e3:.0f} ms "
                 f"({len(parts)} worker DAG{'s' if len(parts) > 1 else ''})")
        short = coverage.warning(self.coverage, self._why_unlisted(graphs, late))
        if short:
            log.warning("TicTac: %s", short)
        if self.check is not None:
            # The check also tries the other algorithm where it can be computed (TAC
            # needs measured compute times and transfer sizes).
            other = {"tic": "tac", "tac": "tic"}[algorithm]
            try:
                self._candidates[other] = self._parts_for(other, graphs, compute_times,
                                                          served, late)
            except (TicTacSetupError, ScheduleError) as e:
                self.say(f"the order check tries {algorithm.upper()} only: "
                         f"{other.upper()} is off ({e})")
            self.check = order_check.CheckPlan(self.check.rounds, self.check.block_steps,
                                               tuple(self._candidates))
        self._want = self._decided = algorithm
        if self.installs:
            self._install(parts)
            self._installed = algorithm
        self.steplog.switched_at = _time.time()
        if holds_loop:
            self.mark_pause(pause_start, _time.time())
        if self._writer:
            self._writer.switched(algorithm, len(self.schedule), len(self.ps_addresses),
                                  self.coverage.phrase(), self.coverage.bytes_share)
        if self.check is not None:
            self._check_n = 0
            names = " and ".join(c.upper() for c in self._candidates)
            self.say(f"checking {names} against TensorFlow's order: {self.check.rounds} "
                     f"round{'s' if self.check.rounds > 1 else ''} of "
                     f"{self.check.block_steps}-step block pairs"
                     + (f", again every {self.settings.recheck_every} steps"
                        if self.settings.recheck_every else ""))
        return self.schedule

    @staticmethod
    def _why_unlisted(graphs: Mapping[str, Graph], late: set[str]) -> "Callable[[str], str]":
        """Why a served transfer is not in the order, in words, by its name."""
        reads = {canonical_transfer_name(op.name) for g in graphs.values() for op in g.recvs}
        after_write = {canonical_transfer_name(n) for n in late}

        def why(name: str) -> str:
            key = canonical_transfer_name(name)
            if key in after_write:
                return ("a read ordered after work of the same step (e.g. after a "
                        "variable's update), so it cannot be served at the step's start")
            if key in reads:
                return "a read of the traced step that the PSes did not serve while profiling"
            return ("not a parameter read of the traced step (a control edge, a loop's "
                    "bookkeeping, or a value computed on the PS)")
        return why

    def not_ordered(self, error: BaseException) -> None:
        """The switch failed: one line saying why, TensorFlow's order stays on every PS
        (nothing was installed, or it is cleared), no order check; training goes on."""
        reason = str(error) or type(error).__name__
        if not isinstance(error, (ScheduleError, TicTacSetupError)):
            reason = f"{type(error).__name__}: {reason}"
        self.not_ordered_reason = reason
        self.check, self._candidates, self.schedule = None, {}, None
        self._want = self._decided = None
        if self.installs and self._installed is not None:
            try:
                from tictac_hooks.enforce.client import clear_everywhere
                clear_everywhere(self.ps_addresses)
                self._installed = None
            except Exception:  # noqa: BLE001 - a PS that went away: nothing to clear
                log.debug("TicTac: clearing after a failed switch", exc_info=True)
        log.debug("TicTac: the switch failed", exc_info=error)
        self.say(f"TensorFlow's own transfer order kept, training goes on: {reason}")

    def _fall_back_to_tic(self, reason: str) -> str:
        """TAC cannot run (no compute profile, no transfer times): TIC for this run.
        Said in one line, unless the failed profile already said it."""
        self.tac_off = reason
        self.settings = dataclasses.replace(self.settings, algorithm="tic")
        if self.compute_profile_error is None:
            self.say(f"TAC is off for this run ({reason}): TIC instead")
        else:
            log.info("TicTac: TAC is off for this run (%s): TIC instead", reason)
        return "tic"

    def _parts_for(self, algorithm: str, graphs: Mapping[str, Graph],
                   compute_times: Mapping[str, float] | None, served: set[str],
                   late: set[str]) -> list[tuple[Graph, Schedule]]:
        """Each worker DAG, restricted to what the PSes served, with its order."""
        parts = []
        for i, graph in enumerate(graphs.values()):
            graph = self._received_only(graph, served, late)
            if compute_times is not None and i == 0:
                self.compute_seconds = sum(compute_times.get(op.name, 0.0)
                                           for op in graph.compute_ops)
            if algorithm == "tac":
                graph = self._timed(graph, compute_times)
            parts.append((graph, compute_order(graph, algorithm)))
        return parts

    def orders(self, algorithm: str | None = None) -> list[tuple[Graph, Schedule]]:
        """Per worker DAG (restricted to the recvs the PSes served) and its order, for
        ``algorithm`` (default: the configured one); computed at the switch."""
        name = algorithm or self.settings.algorithm
        if name not in self._candidates:
            raise KeyError(f"no {name!r} order was computed (computed: "
                           f"{sorted(self._candidates) or 'none yet'})")
        return list(self._candidates[name])

    # --- the order check ---------------------------------------------------------------
    @property
    def kept_order(self) -> str | None:
        """The algorithm whose order runs after the last decision (None: TensorFlow's)."""
        return self._decided

    @property
    def check_result(self) -> dict[str, Any] | None:
        """The last order check's result (None before the first decision)."""
        return self.check_results[-1] if self.check_results else None

    def step_dispatched(self) -> None:
        """The frontends call this once per step they dispatch after the switch: runs
        the order check's blocks (order_check.py), applies its decision, and starts the
        check again every ``recheck_every`` steps."""
        if self.check is None or not self._candidates:
            return
        if self._check_n >= 0:
            n = self._check_n
            self._check_n += 1
            if n < self.check.total_steps:
                self._to_block(self.check.block(n))
            else:
                self._finish_check()
        elif self.settings.recheck_every:
            self._since_decision += 1
            if self._since_decision >= self.settings.recheck_every:
                self.say(f"re-checking after {self._since_decision} steps")
                self._after_switch = []
                self._check_n = 0
                self._to_block(self.check.block(0))

    def _to_block(self, want: str | None) -> None:
        """Starts a check block running ``want`` (None: TensorFlow's order). Under PSS the
        loop dispatches ahead of what runs, so at a block boundary it first waits for
        the dispatched steps: every step dispatched in a block then runs in that block's
        order, and each worker gets its share of every block (without the wait a short
        block could run almost entirely in the previous block's order on one worker).
        The dispatched steps run back to back during the wait; from its end to the new
        order's install the workers idle, and that interval is marked as a pause, so
        the step times that include the idle time are left out."""
        import time as _time
        if want == self._want:
            return
        self.holds += 1
        if self._join is not None and self.installs:
            self._join()
        idle_from = _time.time()
        self._want = want
        self._apply()
        self.mark_pause(idle_from, _time.time())

    def _finish_check(self) -> None:
        import time as _time
        self.holds += 1
        if self._join is not None:
            self._join()  # the blocks' steps ran, so the PSes recorded them
        pause_start = _time.time()  # the drained steps ran back to back: not a pause
        self.poll()
        result = order_check.decide(self._after_switch, self.check, self.settings.algorithm)
        self.check_results.append(result)
        self._after_switch = []
        self._check_n, self._since_decision = -1, 0
        if result["decision"] == order_check.TICTAC:
            self._decided = result["chosen"]
            self.schedule = _merged(self._candidates[self._decided])
        elif result["decision"] == order_check.DEFAULT:
            self._decided = None
        self._want = self._decided  # inconclusive: the order before the check stays
        self._apply()
        self.mark_pause(pause_start, _time.time())
        if result["decision"] is None:
            kept = self._decided.upper() + " order" if self._decided else "TensorFlow's order"
            self.say(f"order check inconclusive ({result['reason']}); {kept} kept")
        else:
            gain = (result["ratio_median"] - 1) * 100
            others = "".join(
                f"; {c.upper()} {(spread['ratio_median'] - 1) * 100:+.1f} %"
                for c, spread in result["candidates"].items()
                if c != result["algorithm"] and spread.get("pairs"))
            self.say(f"order check: {result['algorithm'].upper()} order "
                     f"{gain:+.1f} % throughput vs TensorFlow's (median of {result['pairs']} "
                     f"block pairs, range {(result['ratio_min'] - 1) * 100:+.1f} to "
                     f"{(result['ratio_max'] - 1) * 100:+.1f} %{others}): "
                     + ("kept" if self._decided else "cleared, TensorFlow's order kept"))
        if self._writer:
            self._writer.choice(result)

    def _apply(self) -> None:
        """Installs the wanted candidate order, or clears the PSes for TensorFlow's, so
        that the PSes run what the check asks for, unless suspended (validation)."""
        want = None if self._suspended else self._want
        if not self.installs or not self._candidates or want == self._installed:
            return
        if want is not None:
            self._install(self._candidates[want], quiet=True)
        else:
            from tictac_hooks.enforce.client import clear_everywhere
            clear_everywhere(self.ps_addresses)
        self._installed = want

    @staticmethod
    def _received_only(graph: Graph, served: set[str], late: set[str]) -> Graph:
        """The DAG with only the recvs the PSes served while profiling (the others are
        reads that never left their PS), each named as the PSes name it: a tensor sent
        over two edges in one step is two recvs named by their edges (edge_<n>_<node>),
        which the PSes report by its sending node; a read inside a step loop is named by
        the loop's body, which TensorFlow numbers when it lowers the loop
        (canonical_transfer_name)."""
        recv_names = {op.name for op in graph.recvs} - late
        if not served:
            return graph.with_recvs_only(recv_names)
        by_canonical: dict[str, str] = {}
        for name in sorted(served):
            by_canonical.setdefault(canonical_transfer_name(name), name)
        matched, renamed = set(), {}
        for n in recv_names:
            if n in served or sending_node_name(n) in served:
                matched.add(n)
            elif (as_served := by_canonical.get(canonical_transfer_name(n))) is not None:
                matched.add(n)
                renamed[n] = as_served
        if not matched:
            reads = sorted(recv_names) or sorted(op.name for op in graph.recvs)
            raise ScheduleError(
                f"none of the {len(served)} transfers the PSes served while profiling "
                f"(e.g. {sorted(served)[0]!r}) matches a parameter read of the step "
                f"function TicTac traced ({len(reads)} reads, e.g. "
                f"{reads[0] if reads else 'none'!r}), so TicTac cannot tell which "
                "transfer feeds which part of the step")
        return graph.with_recvs_only(matched).renamed(renamed)

    def suspend(self) -> None:
        """Clears the schedule on every PS (e.g. while fit runs validation, whose
        transfers the training schedule does not describe)."""
        self._suspended = True
        self._apply()

    def resume(self) -> None:
        """Re-installs the schedule after :meth:`suspend` (if the check wants it)."""
        self._suspended = False
        self._apply()

    def mark_pause(self, start: float, end: float) -> None:
        """Steps whose interval overlaps [start, end] (time TicTac itself held the
        training loop, e.g. to profile) get no step time."""
        self._pauses.append((start, end))

    def _timed(self, graph: Graph, compute_times: Mapping[str, float] | None) -> Graph:
        if compute_times is None:
            raise TicTacSetupError(
                "TAC needs measured compute times: " +
                (f"no compute profile ({self.compute_profile_error})"
                 if self.compute_profile_error else "none were profiled"))
        if not self._link_rate:
            raise TicTacSetupError(
                "TAC needs transfer times: no transfer was recorded while profiling and "
                "no bandwidth was given")
        # Time(recv) = bytes / rate, with the bytes the PS served it with while profiling
        # where recorded: the trace gives both edges of a tensor sent over two the
        # tensor's size, but the PS serves it over one and a few bytes over the other
        # (ResNet-50 training: 188.3 MB traced per worker, 94.4 MB served).
        served = self.steplog.transfer_bytes()
        sizes = {op.name: served.get(op.name, op.bytes) for op in graph.recvs}
        missing_bytes = [n for n, b in sizes.items() if b is None]
        if missing_bytes:
            raise TicTacSetupError(f"TAC needs the size of every transfer; unknown for "
                                   f"{missing_bytes[0]!r}")
        times = {op.name: compute_times.get(op.name, 0.0) for op in graph.compute_ops}
        times.update({name: b / self._link_rate for name, b in sizes.items()})
        return graph.with_times(times)

    def _install(self, parts: Sequence[tuple[Graph, Schedule]], quiet: bool = False) -> None:
        """Each PS gets, per worker, that worker's order restricted to its transfers."""
        from tictac_hooks.enforce.client import install_plan
        per_channel: dict[str, list[Schedule]] = {}
        for graph, schedule in parts:
            for channel, sub in schedule.per_channel(graph).items():
                per_channel.setdefault(channel, []).append(sub)
        plan: dict[str, Schedule] = {}
        for channel, subs in sorted(per_channel.items()):
            index = _channel_index(channel)
            if index >= len(self.ps_addresses):
                raise ScheduleError(f"graph names channel {channel!r} but the cluster has "
                                    f"{len(self.ps_addresses)} PS tasks")
            plan[self.ps_addresses[index]] = subs[0] if len(subs) == 1 else \
                Schedule.merged(subs)
        # All or nothing: checked on every PS first, rolled back on a failure half-way.
        results = install_plan(plan, skip_after_s=self.settings.skip_timeout,
                               window_bytes=self.settings.window_bytes,
                               pace_rate=self.pace_rate, align=self.align)
        for address, result in results.items():
            if result.unmatched:
                log.warning("TicTac: %d scheduled transfers were not served by %s (e.g. %r); "
                            "that PS enforces the other %d", len(result.unmatched), address,
                            result.unmatched[0], result.expected)
        if not quiet:
            self.say(f"installed on {len(per_channel)} of {len(self.ps_addresses)} PS "
                     f"(every PS the order has transfers on); every later step follows it")

    # --- end ------------------------------------------------------------------------------
    def finish(self, hook: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Final poll; writes the transfer timeline next to the event files; returns a
        summary (median step time before and after the switch, per worker; what was
        read, ``records``; the frontend's cost per step, ``hook``, when given)."""
        self.stop_reading()
        if self.check is not None and self._check_n > 0:
            self._finish_check()  # training ended inside the check: decide on what ran
        self.poll(everything=True)
        summary = self.steplog.summary()
        if self.not_ordered_reason:
            summary["not_ordered"] = self.not_ordered_reason
        if self.coverage is not None:
            summary["coverage"] = self.coverage.to_json()
        if self.schedule is not None:  # the order of the last install, as installed
            summary["schedule"] = {"algorithm": self.schedule.algorithm,
                                   "order": list(self.schedule.order),
                                   "priority": dict(self.schedule.priority)}
        if self.tac_off:
            summary["tac_off"] = self.tac_off
        summary["records"] = self.records_summary()
        if hook is not None:
            summary["hook"] = dict(hook)
        if self.check_results:
            results = [{k: v for k, v in r.items() if k != "blocks"}
                       for r in self.check_results]
            summary["check"] = results[-1]
            if len(results) > 1:
                summary["checks"] = results
        if self.settings.log_dir:
            from tictac_hooks.enforce.client import stats_everywhere
            from tictac_hooks.enforce.trace import write_chrome_trace
            os.makedirs(self.settings.log_dir, exist_ok=True)
            write_chrome_trace(stats_everywhere(self.ps_addresses),
                               os.path.join(self.settings.log_dir, "tictac_transfers.trace.json"))
            with open(os.path.join(self.settings.log_dir, "tictac_summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
        if self._writer:
            self._writer.close()
        self.cursor.close()
        return summary

    def stop_reading(self) -> None:
        """Stops the reading thread (its last read finishes first)."""
        if self._reading is not None:
            self._reading.stop()
            self._reading = None

    def records_summary(self) -> dict[str, Any]:
        """What was read: training steps dispatched; worker steps recorded, each
        training step once, where it finished; steps missing in gaps (so that
        worker_steps + missing = dispatched); unfinished: lost workers' last steps that
        another worker ran again (counted there); and per PS the records read and
        dropped (finished ones; the active ones of the last read beside)."""
        if self.cursor is None:
            return {"dispatched": self.dispatched}
        workers = self.steplog.summary()["workers"].values()
        recorded = sum(w["steps"] for w in workers)
        missing = sum(w["missing"] for w in workers)
        held = sum(w.get("unfinished", 0) for w in workers)  # lost workers' last steps
        # A closure whose worker died mid-step ParameterServerStrategy runs again on
        # another worker, where it is recorded: it counts once, there. A lost worker's
        # last step that no other worker ran again had finished where it started.
        rerun = min(held, max(0, recorded + missing + held - self.dispatched))
        return {"dispatched": self.dispatched,
                "worker_steps": recorded + held - rerun,
                "missing": missing,
                "unfinished": rerun,
                "read": sum(self.cursor.read_records.values()) + self.cursor.active_records,
                "dropped": sum(self.cursor.dropped.values()),
                "per_ps": {ps: {"read": self.cursor.read_records[ps],
                                "dropped": self.cursor.dropped[ps]}
                           for ps in self.ps_addresses}}


class ReadingThread:
    """Reads the PSes' records off the training loop's thread: woken every
    ``every_steps`` dispatched steps (default: a quarter of a gate's history at the
    records per step seen so far, at most READ_EVERY_STEPS) and every READ_EVERY_S
    seconds. A failed read is logged once and tried again; it never stops training."""

    def __init__(self, read: Callable[[], None], every_steps: int | None,
                 cursor: Any = None) -> None:
        self._read = read
        self._fixed = every_steps
        self.every_steps = every_steps or READ_EVERY_STEPS
        self._cursor = cursor
        self._since_read = 0
        self._dispatched = 0
        self._wake = threading.Event()
        self._stopping = False
        self._failing = False
        # Back-pressure, for a loop that outruns the reads: past half a gate's history
        # of unread steps the loop waits (at most CATCH_UP_S) for a read to finish.
        self._read_started_at = 0  # steps dispatched when the last finished read began
        self._per_step = 1.0       # records a step makes at a PS, as measured
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tictac-records",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def dispatched(self, count: int) -> None:
        self._dispatched += count
        self._since_read += count
        if self._since_read >= self.every_steps:
            self._since_read = 0
            self._wake.set()
        limit = max(2 * self.every_steps, int(GATE_HISTORY / 2 / self._per_step))
        if self._dispatched - self._read_started_at >= limit and not self._stopping:
            self._caught_up.clear()
            self._wake.set()
            self._caught_up.wait(CATCH_UP_S)  # never long: training goes on regardless

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping = True
        self._wake.set()
        self._caught_up.set()
        self._thread.join(timeout_s)

    def _adapt(self) -> None:
        """Reads often enough that a quarter of a gate's history holds what finishes
        between two reads (a step makes a record per worker and loop iteration)."""
        if self._fixed or self._cursor is None or not self._dispatched:
            return
        per_step = max(self._cursor.read_records.values(), default=0) / self._dispatched
        if per_step > 0:
            self._per_step = per_step
            self.every_steps = max(1, min(READ_EVERY_STEPS,
                                          int(GATE_HISTORY / 4 / per_step)))

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(READ_EVERY_S)
            self._wake.clear()
            if self._stopping:
                break
            started = self._dispatched
            try:
                self._read()
                self._adapt()
                self._failing = False
            except Exception as e:  # noqa: BLE001 - never stop training for a read
                if not self._failing:
                    log.warning("TicTac: reading the PSes' step records failed (%s: %s); "
                                "trying again", type(e).__name__, e)
                self._failing = True
            finally:
                self._read_started_at = started
                self._caught_up.set()


def task_answers(address: str, timeout_s: float = 2.0) -> bool | None:
    """Whether the TensorFlow task at ``address`` answers (its worker service's
    GetStatus): False when nothing listens there, None when it did not answer in time
    (a busy task), True when it answered."""
    import grpc

    from tictac_hooks.enforce.native.client import GET_STATUS
    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary(GET_STATUS)(b"", timeout=timeout_s)
            return True
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                return False
            return None if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else True
