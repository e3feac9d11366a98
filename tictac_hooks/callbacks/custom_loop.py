"""`TicTacLoop`: TicTac for custom `ClusterCoordinator.schedule` training loops.

Keras 3's `model.fit` does not support ParameterServerStrategy; Keras 3 models do
train under it in a custom loop. This object gives such a loop what the callback gives
`fit`: call :meth:`TicTacLoop.step` once per scheduled step.
"""

from __future__ import annotations

import time
from typing import Any

from tictac_hooks import checks
from tictac_hooks.callbacks.controller import (Controller, Settings, TicTacSetupError,
                                               ps_addresses_from_cluster_spec)



class TicTacLoop:
    """Switches a custom ParameterServerStrategy loop to one fixed transfer order.

    Counts the steps the loop schedules; after ``profile_steps`` it waits for them,
    extracts the DAG of the traced ``step_function`` (the ``tf.function`` passed to
    ``coordinator.schedule``), computes TIC or TAC and installs the order on every
    PS's rendezvous. Later steps of every worker follow it.

    Every argument is checked here (ValueError naming the allowed range).

    Args:
      coordinator: the loop's ``tf.distribute.experimental.coordinator.ClusterCoordinator``.
      step_function: the ``tf.function`` the loop schedules.
      algorithm: as for :class:`tictac_hooks.TicTac` (``--tictac_algorithm``, default tic).
      profile_steps: steps before the switch, >= 1 (``--tictac_profile_steps``, default 5).
      log_dir: TensorBoard summaries and transfer timeline (``--tictac_log_dir``, default
        None: nothing written).
      skip_timeout: the skip bound, seconds > 0 (``--tictac_skip_timeout``, default 2.0).
      model: the Keras model, needed for TAC's compute profile (rebuilt from its config
        in a child process) and for the per-step efficiency E; optional for TIC.
      batch_size: per-worker batch size for that profile, >= 1 (default 32).
      bandwidth: link bytes/s, > 0, for TAC's transfer times (default: measured).
      window_bytes: the proxy's look-ahead window, >= 0 (``--tictac_window_bytes``,
        default 1048576).

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
                 window_bytes: int | None = None) -> None:
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
                                         window_bytes=window_bytes)
        self.controller: Controller | None = None
        self.summary: dict[str, Any] | None = None
        self.steps = 0

    def __enter__(self) -> "TicTacLoop":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()

    def start(self) -> None:
        """Connects to every PS's rendezvous (clear error if one has none)."""
        from tictac_hooks.patches import keras_internals
        spec = keras_internals.strategy_cluster_spec(self.coordinator.strategy)
        self.controller = Controller(ps_addresses_from_cluster_spec(spec), self.settings,
                                     join=self.coordinator.join)
        self.controller.connect()

    def step(self) -> None:
        """Call once after each ``coordinator.schedule`` of the step function."""
        if self.controller is None:
            self.start()
        self.steps += 1
        if self.steps == self.settings.profile_steps:
            self._switch()
        else:
            if self.steps > self.settings.profile_steps:
                self.controller.step_dispatched()
            if self.steps % 50 == 0:
                self.controller.poll()

    def finish(self) -> dict[str, Any]:
        """Waits for scheduled steps, reads the final statistics, writes the logs."""
        if self.controller is None:
            return {}
        self.coordinator.join()
        self.summary = self.controller.finish()
        return self.summary

    def _switch(self) -> None:
        from tictac_hooks.callbacks.keras_callback import switch_from_function
        from tictac_hooks.patches import keras_internals
        pause_start = time.time()
        self.coordinator.join()  # the profiled steps ran; the PSes recorded them
        functions = keras_internals.traced_step_functions(self.step_function)
        if not functions:
            raise TicTacSetupError("the step function has not been traced yet")
        compute_times = None
        if self.model is not None:
            from tictac_hooks.callbacks.compute_profile import compute_times_for
            compute_times = compute_times_for(self.model, self.batch_size, training=True,
                                              required=self.settings.algorithm == "tac")
        elif self.settings.algorithm == "tac":
            raise TicTacSetupError("TAC needs the model (TicTacLoop(..., model=model)) to "
                                   "measure compute times; or use algorithm='tic'")
        switch_from_function(self.controller, functions[-1], compute_times, self.bandwidth)
        self.controller.mark_pause(pause_start, time.time())
