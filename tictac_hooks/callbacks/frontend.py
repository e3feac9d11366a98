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
- polls the PSes for step records every ``poll_every`` steps (and, for Keras, every
  ``stats_every`` epochs);
- ends the run: final poll, summary, logs.

Nothing here imports TensorFlow: the adapters do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from tictac_hooks.callbacks.controller import Controller, Settings
from tictac_hooks.graph.dag import Graph


@dataclasses.dataclass
class StepDAG:
    """What the adapter found for the switch: the worker's DAG (or one per worker task,
    in-graph replication), measured compute times (TAC, E), recvs that depend on the
    step's own work (left unscheduled), and the link rate in bytes/s when known."""

    graphs: Graph | Mapping[str, Graph]
    compute_times: Mapping[str, float] | None = None
    late: frozenset[str] | set[str] = frozenset()
    bandwidth: float | None = None


class StepDriver:
    """One run of a frontend (a fit / evaluate / predict call, a custom loop, a hooked
    session): counts steps and drives its :class:`Controller`.

    Args:
      ps_addresses: the cluster's PS addresses, in task order.
      settings: resolved :class:`Settings`.
      find_dag: called once, at the switch, after ``join``: the adapter's
        :class:`StepDAG` of the step function that runs.
      join: waits until every dispatched step has run (``ClusterCoordinator.join``);
        None where steps run synchronously (graph mode).
      install: whether this process installs orders (the chief).
      destination_jobs: the jobs whose steps are scheduled and reported.
      poll_every: read step records every this many steps (None: only on
        :meth:`epoch_end` and at the end).
      training: whether the steps train (the ``align`` setting's "auto" picks by it).
    """

    def __init__(self, ps_addresses: Sequence[str], settings: Settings,
                 find_dag: Callable[[], StepDAG], join: Callable[[], None] | None = None,
                 install: bool = True, destination_jobs: Sequence[str] = ("worker",),
                 poll_every: int | None = None, training: bool = True) -> None:
        self.controller = Controller(ps_addresses, settings, install=install,
                                     destination_jobs=destination_jobs, join=join,
                                     training=training)
        self.settings = settings
        self._find_dag = find_dag
        self._join = join
        self.poll_every = poll_every
        self.steps = 0
        self.epochs = 0

    def start(self) -> "StepDriver":
        """Reaches every PS's gate (clear error if one has none) and clears old orders."""
        self.controller.connect()
        return self

    @property
    def switched(self) -> bool:
        return self.steps >= self.settings.profile_steps

    def step(self, count: int = 1) -> None:
        """Call once per call the loop dispatches (under PSS: schedules on a worker),
        with the number of training steps it runs (``steps_per_execution``)."""
        before, self.steps = self.steps, self.steps + count
        profile = self.settings.profile_steps
        if before < profile <= self.steps:
            self.switch()
        elif before >= profile:
            for _ in range(count):  # the order check counts training steps
                self.controller.step_dispatched()
        if self.poll_every and before // self.poll_every != self.steps // self.poll_every:
            self.controller.poll()

    def epoch_end(self) -> None:
        """Call at the end of each epoch (Keras): polls every ``stats_every`` epochs."""
        self.epochs += 1
        if self.epochs % self.settings.stats_every == 0:
            self.controller.poll()

    def switch(self) -> None:
        """The switch at step N: wait for the profiled steps (so the PSes saw them), find
        the DAG, compute and install the order; the loop's pause is marked."""
        with self.paused():
            if self._join is not None:
                self._join()
            try:
                dag = self._find_dag()
                self.controller.switch(dag.graphs, dag.compute_times,
                                       bandwidth=dag.bandwidth, late=set(dag.late))
            except Exception as e:  # noqa: BLE001 - never kill training: say it, go on
                self.controller.not_ordered(e)

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
        """TensorFlow's own order for a while (e.g. validation inside fit)."""
        self.controller.suspend()

    def resume(self) -> None:
        self.controller.resume()

    def finish(self) -> dict[str, Any]:
        """Waits for dispatched steps, reads the last records, writes the logs; returns
        the summary."""
        if self._join is not None:
            self._join()
        return self.controller.finish()
