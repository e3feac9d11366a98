"""The frontend core: what TicTac, TicTacLoop and TicTacHook do per step, in one place.

Each frontend is an adapter that knows where its framework keeps three things (the PS
addresses, a way to wait for dispatched steps, the DAG of the step that runs) and calls
:class:`StepDriver` from its hooks. The driver:

- counts the training steps the loop dispatches (a dispatched call may run several:
  Keras's ``steps_per_execution``);
- once ``profile_steps`` training steps were dispatched, pauses the loop, waits for the
  profiled steps, asks the adapter for the DAG and switches the controller to the
  computed order (the pause is marked, so no step time includes it); a switch that
  fails for any reason says why in one line and leaves TensorFlow's order: training
  goes on;
- after the switch tells the controller of every dispatched step, which runs the order
  check's blocks and then keeps or clears the order (order_check.py);
- reads the PSes' step records on a thread of its own (Controller.start_reading),
  woken by the steps dispatched (every ``poll_every`` when given) and, for Keras,
  every ``stats_every`` epochs: nothing is read on the loop's thread between switches;
- measures its own cost per step (``hook`` in the summary);
- ends the run: final read, summary, logs.

Nothing here imports TensorFlow: the adapters do.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import logging
import statistics
import threading
import time
from typing import Any, Callable, Iterator, Mapping

from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.controller import Controller
from tictac_hooks.run.summary import RunSummary
from tictac_hooks.graph.dag import Graph

log = logging.getLogger("tictac")


@dataclasses.dataclass
class StepDAG:
    """What the adapter found for the switch: the worker's DAG (or one per worker task,
    in-graph replication), measured compute times (TAC, E) and recvs that depend on the
    step's own work (left unscheduled). The link rate is the run's (RunConfig)."""

    graphs: Graph | Mapping[str, Graph]
    compute_times: Mapping[str, float] | None = None
    late: frozenset[str] | set[str] = frozenset()


_KEEP_COSTS = 1 << 20  # per-step costs kept for the median (8 MiB at most)


class StepDriver:
    """One run of a frontend (a fit / evaluate / predict call, a custom loop, a hooked
    session): counts steps and drives its :class:`Controller`.

    Args:
      config: the run's :class:`RunConfig` (settings, addresses, link rate, whether
        this process installs, the jobs reported, how often records are read, whether
        the switch runs in the background).
      find_dag: called once, at the switch, after ``join``: the adapter's
        :class:`StepDAG` of the step function that runs.
      join: waits until every dispatched step has run (``ClusterCoordinator.join``);
        None where steps run synchronously (graph mode).
      find_times: measures the compute times of a DAG found by ``find_dag`` (None:
        ``find_dag`` brings them). Given, TIC's order, which needs none, is installed
        before they are measured (the order check then waits for them).
      order_dir: gives, at the first step, the directory where the order is saved
        for a job restart (saved_order.py; None: not saved); an order saved there by
        an earlier run of the job is restored, without profiling, when it fits.
      find_graphs: the step function's DAG (or one per worker task) as traced, without
        compute times: what a saved order must fit (needed with ``order_dir``).
    """

    def __init__(self, config: RunConfig, find_dag: Callable[[], StepDAG],
                 join: Callable[[], None] | None = None,
                 find_times: "Callable[[StepDAG], Mapping[str, float] | None] | None"
                 = None,
                 order_dir: Callable[[], str | None] | None = None,
                 find_graphs: Callable[[], Graph | Mapping[str, Graph]] | None = None
                 ) -> None:
        self.config = config
        self.controller = Controller(config, join=join)
        self.settings = config.settings
        self._find_dag = find_dag
        self._join = join
        self.poll_every = config.poll_every
        self.steps = 0
        self.epochs = 0
        # Seconds :meth:`step` took, per call (bounded), and which calls held the loop
        # on purpose (the switch, the order check's block boundaries).
        self._cost = array.array("d")
        self._held_cost: dict[str, list[float]] = {"switch": [], "check": []}
        self.background_switch = config.background_switch
        self._switching: threading.Thread | None = None  # the switch in the background
        self._switched = threading.Event()  # the order is in place (or the switch ended)
        self._in_place = False                # the loop has seen it
        self.switch_seconds: float | None = None  # from the switch's start to the order
        self._find_times = find_times
        self.installed_at_step: int | None = None  # training steps dispatched by then
        # An order saved by an earlier run of the job, restored at the first step on a
        # thread of its own (TensorFlow's order meanwhile); restored: it fitted.
        self._order_dir, self._find_graphs = order_dir, find_graphs
        self._restoring: threading.Thread | None = None
        self.restored = False

    def start(self) -> "StepDriver":
        """Reaches every PS's gate (clear error if one has none), clears old orders and
        starts reading records on a thread of its own."""
        self.controller.connect(restorable=self._order_dir is not None)
        self.controller.start_reading(self.poll_every)
        return self

    @property
    def switched(self) -> bool:
        return self.steps >= self.settings.profile_steps

    def step(self, count: int = 1) -> None:
        """Call once per call the loop dispatches (under PSS: schedules on a worker),
        with the number of training steps it runs (``count``: Keras's
        ``steps_per_execution``)."""
        t0 = time.perf_counter()
        holds = self.controller.holds
        before = self.steps
        self.steps += count
        self.controller.steps_dispatched(count)
        if before == 0 and self._order_dir is not None:
            self._start_restore()
        if self._restoring is not None:
            if self._restoring.is_alive() and self.steps < self.settings.profile_steps:
                self._record_cost(time.perf_counter() - t0, holds)
                return  # restoring: TensorFlow's order meanwhile
            self._restoring.join()  # (at the switch's step: the restore decides first)
            self._restoring = None
            if self.restored:
                self.installed_at_step = before
        if self.restored:
            for _ in range(count):  # the order check counts training steps
                self.controller.step_dispatched()
            self._record_cost(time.perf_counter() - t0, holds)
            return
        if before < self.settings.profile_steps <= self.steps:
            if self.background_switch:
                self._switching = threading.Thread(target=self._switch_in_background,
                                                   name="tictac-switch", daemon=True)
                self._switching.start()
            else:
                self.switch()
                self._held_cost["switch"].append(time.perf_counter() - t0)
                return
        if self._switching is not None and not self._in_place:
            if not self._switched.is_set():  # still switching: TensorFlow's order
                self._record_cost(time.perf_counter() - t0, holds)
                return
            self._in_place = True  # installed: this call is the first after it
            self.installed_at_step = before
        if before >= self.settings.profile_steps:
            for _ in range(count):  # the order check counts training steps
                self.controller.step_dispatched()
        self._record_cost(time.perf_counter() - t0, holds)

    def _start_restore(self) -> None:
        """Where the order is saved, and whether an earlier run of the job saved one
        there: if so, restores it on a thread of its own (the DAG is found without a
        compute profile). A file that is not a saved order is one line; training goes
        on and profiles."""
        from tictac_hooks.run import saved_order
        directory = self._order_dir()
        self.controller.save_orders_in(directory)
        if not directory or not self.controller.installs or self.settings.algorithm == "none":
            return  # (algorithm "none": TensorFlow's order, a saved order included)
        def restore() -> None:  # (reading the file too: off fit's dispatch thread)
            try:
                saved = saved_order.load(directory)
            except saved_order.SavedOrderError as e:
                self.controller.say(f"the saved order is not used ({e}): profiling again")
                return
            if saved is None:
                return
            try:
                self.restored = self.controller.restore(
                    self._find_graphs(), saved, saved_order.path_in(directory))
            except Exception as e:  # noqa: BLE001 - never kill training: say it, go on
                self.controller.say(f"the saved order in {directory} could not be "
                                    f"restored ({type(e).__name__}: {e}): profiling again")
        self._restoring = threading.Thread(target=restore, name="tictac-restore",
                                           daemon=True)
        self._restoring.start()

    def _record_cost(self, took: float, holds: int) -> None:
        if self.controller.holds != holds:
            self._held_cost["check"].append(took)
        elif len(self._cost) < _KEEP_COSTS:
            self._cost.append(took)

    def epoch_end(self) -> None:
        """Call at the end of each epoch (Keras): asks for a read every ``stats_every``
        epochs (on the reading thread; this returns at once)."""
        self.epochs += 1
        if self.epochs % self.settings.stats_every == 0:
            self.controller.read_now()

    def hook_cost(self) -> dict[str, Any]:
        """What :meth:`step` cost the loop's thread, in ms: median and worst over the
        steps that did not hold the loop on purpose, and the worst of those that did
        (the switch; the order check's block boundaries, which wait for the workers)."""
        out: dict[str, Any] = {"steps": len(self._cost)}
        if self._cost:
            out["median_ms"] = statistics.median(self._cost) * 1e3
            out["worst_ms"] = max(self._cost) * 1e3
        for kind, costs in self._held_cost.items():
            if costs:
                out[f"{kind}_steps"] = len(costs)
                out[f"{kind}_worst_ms"] = max(costs) * 1e3
        if self.switch_seconds is not None and self.background_switch:
            out["switch_in_background_ms"] = self.switch_seconds * 1e3
            # Training steps dispatched when the order was in place (None: fit ended
            # first). Under ParameterServerStrategy fit dispatches ahead of what runs,
            # so steps dispatched before it may still run in TicTac's order.
            out["installed_at_step"] = self.installed_at_step
        if self.restored:  # an order saved by an earlier run: no switch
            out["restored_at_step"] = self.installed_at_step
        return out

    def switch(self) -> None:
        """The switch at step N: wait for the profiled steps (so the PSes saw them), find
        the DAG, compute and install the order; the loop's pause is marked."""
        with self.paused():
            if self._join is not None:
                self._join()
            self._find_dag_and_switch(holds_loop=True)

    def _switch_in_background(self) -> None:
        """The switch, off the loop's thread: no join (the loop keeps dispatching); the
        profiled steps finish while the DAG is found, and the switch waits until the
        gates recorded whole ones (it reads running steps' records too, so the served
        names are every profiled step's). The steps dispatched meanwhile run in
        TensorFlow's order and get no step time (``switching``: the compute profile
        shares the machine with them)."""
        self._t_switch = time.perf_counter()
        beside = self.controller.begin_beside()
        try:
            self._find_dag_and_switch(holds_loop=False)
        finally:
            self.controller.end_beside(beside)
            self._in_place_now()

    def _in_place_now(self) -> None:
        if not self._switched.is_set():
            self.switch_seconds = time.perf_counter() - self._t_switch
            self._switched.set()

    def _find_dag_and_switch(self, holds_loop: bool) -> None:
        """Finds the DAG and switches the controller to its order. Never raises: a
        failure is one line, and TensorFlow's order stays."""
        try:
            dag = self._find_dag()
            # TIC's order needs no compute times: it goes in first, and the times the
            # check's other candidates (TAC) and E need are measured after it.
            tic_first = self._find_times is not None and \
                self.controller.settings.algorithm == "tic"
            if self._find_times is not None and not tic_first:
                dag = dataclasses.replace(dag, compute_times=self._find_times(dag))
            if not holds_loop:
                self.controller.wait_for_profiled_records()
            self.controller.switch(dag.graphs, dag.compute_times, late=set(dag.late),
                                   holds_loop=holds_loop, check_later=tic_first)
            if tic_first:
                if not holds_loop:
                    self._in_place_now()
                try:
                    times = self._find_times(dag)
                except Exception:  # noqa: BLE001 - TIC stays; the check goes without
                    log.debug("TicTac: the compute profile after the switch", exc_info=True)
                    times = None
                self.controller.timed(times)
        except Exception as e:  # noqa: BLE001 - never kill training: say it, go on
            self.controller.not_ordered(e)

    def _ended_before_the_order(self) -> str | None:
        """Why no step ran in TicTac's order, when training ended before the switch put
        it in place (None: it did, or nothing was to be installed)."""
        if (self.restored or not self.controller.installs or self._in_place
                or self.settings.algorithm == "none" or self.controller.not_ordered_reason):
            return None
        if self.steps < self.settings.profile_steps:
            return (f"the run ended after {self.steps} steps, before the switch at "
                    f"{self.settings.profile_steps} (profile_steps): every step ran in "
                    "TensorFlow's order; profile fewer steps or train longer")
        if self._switching is None:
            return None
        into = time.perf_counter() - self._t_switch
        if self._switched.is_set():  # installed as the last dispatched steps ran
            return (f"the run ended as the switch put the order in place ({into:.1f} s "
                    "into it): no step was dispatched after it, and only steps already "
                    "queued can have run in it (counted below); profile fewer steps or "
                    "train longer")
        return (f"the run ended {into:.1f} s into the switch, before the order was in "
                "place: every step ran in TensorFlow's order; profile fewer steps or "
                "train longer")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time TicTac itself holds the loop (profiling, tracing, the switch): the steps
        it overlaps get no step time."""
        start = time.time()
        try:
            yield
        finally:
            self.controller.mark_pause(start, time.time())

    def suspend(self) -> None:
        """TensorFlow's own order for a while (e.g. validation inside fit); a switch
        still running in the background finishes first."""
        for thread in (self._switching, self._restoring):
            if thread is not None:
                thread.join()
        self.controller.suspend()

    def resume(self) -> None:
        self.controller.resume()

    def finish(self) -> RunSummary:
        """Waits for dispatched steps, reads the last records, writes the logs; returns
        the run's summary."""
        ended = self._ended_before_the_order()
        for thread in (self._switching, self._restoring):  # training ended meanwhile
            if thread is not None:
                thread.join()
        self._switching = self._restoring = None
        if ended:
            self.controller.ended_unordered(ended)
        if self._join is not None:
            self._join()
        return self.controller.finish(hook=self.hook_cost())
