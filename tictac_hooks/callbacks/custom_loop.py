"""`TicTacLoop`: TicTac for custom `ClusterCoordinator.schedule` training loops.

Keras 3's `model.fit` does not support ParameterServerStrategy; Keras 3 models do
train under it in a custom loop. This object gives such a loop what the callback gives
`fit`: call :meth:`TicTacLoop.step` once per scheduled step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tictac_hooks import checks
from tictac_hooks.run.cluster_spec import (ps_addresses_from_cluster_spec,
                                                 worker_addresses_of)
from tictac_hooks import flags as tictac_flags
from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.controller import Controller
from tictac_hooks.run.settings import Settings, TicTacSetupError
from tictac_hooks.run.driver import StepDAG, StepDriver
from tictac_hooks.run.summary import RunSummary
from tictac_hooks.callbacks.step_function import dag_of, profile_for, traced_function

POLL_EVERY_STEPS = 50  # read step records from the PSes every this many steps


class TicTacLoop:
    """Switches a custom ParameterServerStrategy loop to one fixed transfer order.

    Counts the steps the loop schedules; after ``profile_steps`` it waits for them,
    extracts the DAG of the traced ``step_function`` (the ``tf.function`` passed to
    ``coordinator.schedule``), computes TIC or TAC and installs the order on every
    PS's native gate. Later steps of every worker follow it.

    Every argument is checked here (ValueError naming the allowed range).

    Args:
      coordinator: the loop's ``tf.distribute.experimental.coordinator.ClusterCoordinator``.
      step_function: the ``tf.function`` the loop schedules.
      algorithm: as for :class:`tictac_hooks.TicTac` (``--tictac_algorithm``, default tic).
      profile_steps: steps before the switch, >= 1 (``--tictac_profile_steps``, default 5).
      log_dir: TensorBoard summaries and transfer timeline (``--tictac_log_dir``, default
        None: nothing written).
      skip_timeout: the skip bound, seconds > 0 (``--tictac_skip_timeout``, default 2.0).
      model: the Keras model (optional). Given, per-op compute times are measured for
        the per-step efficiency E; TAC measures them anyway (the traced step function
        itself, run in a child process on synthetic inputs). Its variable list also
        gives each transfer its declaration position (the ``declared`` baseline).
      batch_size: per-worker batch size of that profile's inputs where the step's
        shapes leave it open, >= 1 (default 32).
      bandwidth: link bytes/s, > 0: turns the native gate's pacing on and times TAC's
        transfers (``--tictac_bandwidth``, default None: no pacing; TAC's rate measured).
      window_bytes: the gate's pacing window, or the proxy's look-ahead window, bytes
        >= 0 (``--tictac_window_bytes``, default 1048576; see :class:`tictac_hooks.TicTac`).
      check_rounds, check_block_steps, recheck_every: the order check, as for
        :class:`tictac_hooks.TicTac` (``--tictac_check_rounds``, default 8, 0: off;
        ``--tictac_check_block_steps``, 10 steps per worker; ``--tictac_recheck_every``, 5000).
      align: as for :class:`tictac_hooks.TicTac` (``--tictac_align``); with "auto" (the
        default) it follows ``training``.
      training: whether the steps train (default True); False for an inference loop.

    Example (Keras 3; no ``TF_USE_LEGACY_KERAS`` needed in a custom loop):
      ```python
      import tensorflow as tf
      from tictac_hooks import TicTacLoop

      strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
      coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
      # train_step: the @tf.function of one step; iterator: of a per-worker dataset
      # (coordinator.create_per_worker_dataset); see examples/keras3_custom_loop.py.
      with TicTacLoop(coordinator, train_step) as tictac:
          for _ in range(steps):
              coordinator.schedule(train_step, args=(iterator,))
              tictac.step()
      print(tictac.summary)
      ```
    """

    def __init__(self, coordinator: Any, step_function: Any, algorithm: str | None = None,
                 profile_steps: int | None = None, log_dir: str | None = None,
                 skip_timeout: float | None = None, model: Any = None,
                 batch_size: int = 32, bandwidth: float | None = None,
                 window_bytes: int | None = None, check_rounds: int | None = None,
                 check_block_steps: int | None = None,
                 recheck_every: int | None = None, align: str | None = None,
                 training: bool = True) -> None:
        if not hasattr(step_function, "_list_all_concrete_functions"):
            raise TicTacSetupError(
                "step_function must be the tf.function the loop passes to "
                "coordinator.schedule (wrap it with @tf.function)")
        checks.whole_number("batch_size", batch_size, 1)
        if bandwidth is not None:
            checks.positive_number("bandwidth", bandwidth, "bytes per second")
        self.coordinator = coordinator
        self.step_function = step_function
        self.model = model
        self.batch_size = batch_size
        self.bandwidth = bandwidth
        self.settings = Settings.resolve(algorithm, profile_steps, log_dir, skip_timeout,
                                         window_bytes=window_bytes,
                                         check_rounds=check_rounds,
                                         check_block_steps=check_block_steps,
                                         recheck_every=recheck_every, align=align)
        if not isinstance(training, bool):
            raise ValueError(f"training must be True or False, got {training!r}")
        self.training = training
        self.controller: Controller | None = None
        # the last run's summary, and the same as JSON (tictac_summary.json's content)
        self.run_summary: RunSummary | None = None
        self.summary: dict[str, Any] | None = None
        self._driver: StepDriver | None = None

    @property
    def steps(self) -> int:
        """Steps counted so far (calls of :meth:`step`)."""
        return self._driver.steps if self._driver else 0

    def __enter__(self) -> "TicTacLoop":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()

    def start(self) -> None:
        """Connects to every PS's gate (clear error if one has none)."""
        self._driver = StepDriver(self.run_config(), find_dag=self._find_dag,
                                  join=self.coordinator.join)
        self.controller = self._driver.controller
        self._driver.start()

    def run_config(self) -> RunConfig:
        """The loop's config: the coordinator spreads the steps over every worker."""
        return RunConfig.build(self.settings, self._ps_addresses(),
                               bandwidth=tictac_flags.bandwidth(self.bandwidth),
                               training=self.training,
                               worker_addresses=self._worker_addresses(),
                               poll_every=POLL_EVERY_STEPS)

    def step(self) -> None:
        """Call once after each ``coordinator.schedule`` of the step function."""
        if self._driver is None:
            self.start()
        self._driver.step()

    def finish(self) -> dict[str, Any]:
        """Waits for scheduled steps, reads the final statistics, writes the logs."""
        if self._driver is None:
            return {}
        self.run_summary = self._driver.finish()
        self.summary = self.run_summary.to_json()
        return self.summary

    # --- where a custom loop keeps what the driver needs -------------------------------------
    def _ps_addresses(self) -> list[str]:
        from tictac_hooks.patches import keras_internals
        spec = keras_internals.strategy_cluster_spec(self.coordinator.strategy)
        return ps_addresses_from_cluster_spec(spec)

    def _worker_addresses(self) -> dict[str, str]:
        return worker_addresses_of(self.coordinator.strategy)

    def _find_dag(self) -> StepDAG:
        concrete = traced_function(self.step_function, "the step function")
        dag = dag_of(concrete, None, model=self.model)
        if self.model is not None or self.settings.algorithm == "tac":
            dag = dataclasses.replace(dag, compute_times=profile_for(
                self.controller, concrete, dag, self.batch_size))
        return dag
