"""`TicTac`: the Keras callback that switches TicTac on for `model.fit`."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from tictac_hooks import checks
from tictac_hooks import flags as tictac_flags
from tictac_hooks.run.cluster_spec import (ps_addresses_from_cluster_spec,
                                                 worker_addresses_of)
from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.controller import Controller
from tictac_hooks.run.settings import Settings, TicTacSetupError
from tictac_hooks.run.driver import StepDAG, StepDriver
from tictac_hooks.run.summary import RunSummary
from tictac_hooks.callbacks.step_function import dag_of, profile_for, traced_function

log = logging.getLogger("tictac")


def _callback_base() -> type:
    """tf_keras's Callback where installed (model.fit under ParameterServerStrategy
    needs tf_keras), else Keras 3's."""
    try:
        import tf_keras
        return tf_keras.callbacks.Callback
    except ImportError:  # pragma: no cover - tf_keras is a dependency of the test setup
        import keras
        return keras.callbacks.Callback


class TicTac(_callback_base()):  # type: ignore[misc]
    """Sends every worker its parameters in one near-optimal order after the first steps.

    The first ``profile_steps`` training steps (counted over all workers; 5 by default)
    run in TensorFlow's own transfer order while every parameter server (PS) records
    each transfer. Then TicTac extracts the DAG of the step function that actually
    runs, computes a transfer order with TIC (from the graph alone) or TAC (graph plus
    measured op times), installs it on the native gate of every PS, and lets training
    continue: every later training step of every worker follows that order, and the
    order check keeps it only if it is not slower than TensorFlow's. Nothing that is
    trained changes; only the order (and, with ``bandwidth``, the pacing) of the
    transfers does.

    Needs tf_keras ``model.fit`` under ``ParameterServerStrategy`` (Keras 3's fit does
    not support that strategy; use :class:`tictac_hooks.TicTacLoop` in a custom
    ``ClusterCoordinator`` loop) and PS tasks that run the TicTac gate (``tictac ps``,
    :class:`tictac_hooks.enforce.TicTacServer`, or ``LocalCluster``).

    Every argument is checked here (ValueError naming the allowed range). An argument
    left at None takes the ``--tictac_<name>`` absl flag if the program parsed flags,
    else the default written below; an argument given always wins.

    Args:
      algorithm: ``"tic"``, ``"tac"`` or ``"none"`` (profile and log only, install no
        order). None: ``--tictac_algorithm`` if parsed, else ``"tic"``.
      profile_steps: training steps run in TensorFlow's order before the switch, a
        whole number >= 1, over all workers (each worker runs about profile_steps /
        workers of them). Training steps, not dispatched calls: with
        ``compile(steps_per_execution=10)`` and 20 the switch comes after two calls.
        None: ``--tictac_profile_steps`` if parsed, else 5.
      log_dir: where TensorBoard step-time summaries, the transfer timeline
        (``tictac_transfers.trace.json``) and ``tictac_summary.json`` go. None:
        ``--tictac_log_dir`` if parsed, else nothing is written.
      skip_timeout: the skip bound: seconds, finite and > 0, a PS's gate waits for a
        scheduled transfer before it skips it and releases the next; training never
        hangs. The same bound as ``tictac ps --skip-timeout``. None:
        ``--tictac_skip_timeout`` if parsed, else 2.0.
      bandwidth: the link rate of a PS in bytes/s, finite and > 0. Turns the native
        gate's pacing on: each PS hands transfers to gRPC no faster than this rate
        (most of the training gain measured comes from this paced service), and TAC
        times transfers with it: the PS NIC's line rate. None: ``--tictac_bandwidth``
        if parsed, else nothing (no pacing; TAC's transfer times come from the rate
        measured in the profiled steps).
      measure_compute: profile per-op compute times (in a child process, a few
        seconds, while fit goes on in TensorFlow's order) for TAC in the order check
        and for the per-step efficiency E. False: TIC alone, installed within a second
        of the switch. None: ``--tictac_measure_compute`` if parsed, else True.
      stats_every: read step statistics from the PSes every N epochs, a whole number
        >= 1. None: ``--tictac_stats_every`` if parsed, else 1.
      window_bytes: bytes, a whole number >= 0. On the native gate (the default
        backend), the pacing window: while it paces (``bandwidth`` given) a transfer is
        handed to gRPC only while the bytes handed and not yet drained at the link rate
        are within this window. On the proxy backend, the look-ahead window: scheduled
        transfers may go to the PS ahead of their turn while at most this many bytes
        are in flight. 0: strictly one at a time. None: ``--tictac_window_bytes`` if
        parsed, else 1048576 (1 MiB).
      check_rounds: the order check after the switch: at most this many rounds, each a
        block in each TicTac order (TIC, and TAC where compute times are measured) and
        one in TensorFlow's (either first at random); from round 3 on it stops as
        soon as a one-sided t test shows an order faster (kept) or not 3 % faster; an
        order not shown faster is not kept. 0: no check, TicTac's order stays. None:
        ``--tictac_check_rounds`` if parsed, else 8.
      check_block_steps: training steps per worker per block of the check, >= 3 (a
        block's first and last steps are not measured); a block runs this many
        training steps times the workers and ends with the call that reaches it.
        0 or ``"auto"``: chosen from the profiled steps' spread (docs/ALGORITHMS.md,
        "The block length"). None: ``--tictac_check_block_steps`` if parsed, else 10.
      recheck_every: run the check again this many training steps per worker after
        each decision, >= 0; 0: check once. None: ``--tictac_recheck_every`` if
        parsed, else 5000.
      align: how a PS shares its link among the workers of one step while it paces:
        ``"on"``, each gets its k-th transfer before any its (k+1)-th (fewer
        stragglers); ``"off"``, one worker after the other (faster synchronous
        training); ``"auto"``: off for fit, on for evaluate and predict. None:
        ``--tictac_align`` if parsed, else ``"auto"``.

    Example:
      ```python
      import os
      os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported: tf_keras
      import tensorflow as tf
      from tictac_hooks import TicTac

      resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
      strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
      with strategy.scope():
          model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
          model.compile("sgd", "mse")
      dataset = tf.data.Dataset.from_tensors(
          (tf.zeros([32, 4]), tf.zeros([32, 10]))).repeat()
      # bandwidth: the PS link's bytes/s (here 1 Gbit/s); it turns the gate's pacing on
      model.fit(dataset, epochs=3, steps_per_epoch=100,
                callbacks=[TicTac(bandwidth=125e6)])
      ```
    """

    def __init__(self, algorithm: str | None = None, profile_steps: int | None = None,
                 log_dir: str | None = None, skip_timeout: float | None = None,
                 bandwidth: float | None = None, measure_compute: bool | None = None,
                 stats_every: int | None = None, window_bytes: int | None = None,
                 check_rounds: int | None = None,
                 check_block_steps: int | None = None,
                 recheck_every: int | None = None, align: str | None = None) -> None:
        Settings.check(algorithm=algorithm, profile_steps=profile_steps, log_dir=log_dir,
                       skip_timeout=skip_timeout, stats_every=stats_every,
                       window_bytes=window_bytes, check_rounds=check_rounds,
                       check_block_steps=check_block_steps,
                       recheck_every=recheck_every, align=align)
        if bandwidth is not None:
            checks.positive_number("bandwidth", bandwidth, "bytes per second")
        if measure_compute is not None and not isinstance(measure_compute, bool):
            raise ValueError(f"measure_compute must be True, False or None (the "
                             f"--tictac_measure_compute flag), got {measure_compute!r}")
        super().__init__()
        self.window_bytes = window_bytes
        self.algorithm = algorithm
        self.profile_steps = profile_steps
        self.log_dir = log_dir
        self.skip_timeout = skip_timeout
        self.bandwidth = bandwidth
        self.measure_compute = measure_compute
        self.stats_every = stats_every
        self.check_rounds = check_rounds
        self.check_block_steps = check_block_steps
        self.recheck_every = recheck_every
        self.align = align
        self.controller: Controller | None = None   # of the current / last run
        # the last finished run's summary, and the same as JSON (tictac_summary.json's)
        self.run_summary: RunSummary | None = None
        self.summary: dict[str, Any] | None = None
        self._driver: StepDriver | None = None       # of the current run
        self._mode: str | None = None                # "train", "test" or "predict"
        # The last batch index fit reported per mode, in the current epoch: a call
        # that runs steps_per_execution steps reports its last step's index.
        self._last_batch: dict[str, int] = {}
        # The switch runs on a thread of its own while fit goes on (StepDriver).
        self.background_switch = True
        self._batches = 0                            # steps of the current epoch so far
        self._counter_at_begin: int | None = None    # the model's step counter at fit
        self._epoch_first_step = 0                   # training steps before this epoch
        # Batch-level hooks under ParameterServerStrategy (logs stay RemoteValues).
        from tictac_hooks.patches import keras_internals
        keras_internals.allow_batch_hooks_under_pss(self)

    # --- hooks ---------------------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        _refuse_keras3_under_pss(model)
        super().set_model(model)

    def on_train_begin(self, logs: Any = None) -> None:
        from tictac_hooks.patches import keras_internals
        self._counter_at_begin = keras_internals.steps_run(self.model)
        self._epoch_first_step = 0
        self._begin("train")

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._last_batch["train"] = -1
        # Every step of earlier epochs ran (fit syncs at an epoch's end).
        self._epoch_first_step = self._driver.steps if self._driver else 0

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._driver and self._mode == "train":
            self._driver.epoch_end()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._batches = batch + 1  # steps of this epoch so far (the profile's batch size)
        self._step("train", batch)

    def on_train_end(self, logs: Any = None) -> None:
        self._end("train")

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self._batches = batch + 1
        self._step("test", batch)

    def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
        self._step("predict", batch)

    def on_test_begin(self, logs: Any = None) -> None:
        self._last_batch["test"] = -1
        if self._driver and self._mode == "train":
            self._driver.suspend()  # validation inside fit: TF's own order
        else:
            self._begin("test")

    def on_test_end(self, logs: Any = None) -> None:
        if self._driver and self._mode == "train":
            self._driver.resume()
        else:
            self._end("test")

    def on_predict_begin(self, logs: Any = None) -> None:
        self._last_batch["predict"] = -1
        self._begin("predict")

    def on_predict_end(self, logs: Any = None) -> None:
        self._end("predict")

    # --- runs: one StepDriver per fit / evaluate / predict call ----------------------------
    def _begin(self, mode: str) -> None:
        config = self.run_config(mode)
        settings = config.settings
        # The switch leaves fit's dispatch thread (a step's dispatch takes well under
        # a millisecond; the switch seconds): fit goes on in TensorFlow's order meanwhile.
        # fit saves its order for a restart beside BackupAndRestore's state (else in
        # log_dir), and restores one saved there by an earlier run (saved_order.py).
        restarts = dict(order_dir=lambda: self._order_dir(settings.log_dir),
                        find_graphs=lambda: self._find_dag(mode, times=False).graphs
                        ) if mode == "train" else {}
        driver = StepDriver(config,
                            find_dag=lambda: self._find_dag(mode, times=False),
                            find_times=lambda dag: self._compute_times(mode, dag),
                            join=self._join, **restarts)
        self.controller = driver.controller
        driver.start()
        self._driver, self._mode = driver, mode

    def run_config(self, mode: str) -> RunConfig:
        """The config of a fit ("train"), evaluate ("test") or predict run (evaluate's
        and predict's logs go to a folder of their own in ``log_dir``)."""
        settings = Settings.resolve(self.algorithm, self.profile_steps, self.log_dir,
                                    self.skip_timeout, self.stats_every,
                                    self.window_bytes, self.check_rounds,
                                    self.check_block_steps,
                                    recheck_every=self.recheck_every, align=self.align)
        if settings.log_dir and mode != "train":
            settings = dataclasses.replace(settings, log_dir=os.path.join(settings.log_dir, mode))
        # predict runs on the coordinator (tf_keras does not dispatch it to workers);
        # fit's and evaluate's steps are spread over every worker.
        return RunConfig.build(settings, self._ps_addresses(),
                               bandwidth=tictac_flags.bandwidth(self.bandwidth),
                               training=mode == "train",
                               destination_jobs=("chief",) if mode == "predict"
                               else ("worker",),
                               worker_addresses=self._worker_addresses(),
                               spread=mode != "predict",
                               background_switch=self.background_switch)

    def _step(self, mode: str, batch: int) -> None:
        """A call of the current run was dispatched (scheduled on a worker under PSS).
        ``batch`` is the index, within the epoch, of the last training step it runs:
        with ``steps_per_execution = k`` it runs k steps (fewer at an epoch's end)."""
        last = self._last_batch.get(mode, -1)
        count = batch - last if isinstance(batch, int) and batch > last else 1
        self._last_batch[mode] = batch if isinstance(batch, int) else last + 1
        if self._driver and self._mode == mode:
            self._driver.step(count)

    def _end(self, mode: str) -> None:
        driver = self._driver
        if driver is None or self._mode != mode:
            return
        self.run_summary = driver.finish()
        self.summary = self.run_summary.to_json()
        self._driver = self._mode = None
        if driver.settings.log_dir:
            log.info("TicTac: TensorBoard summaries in %s", driver.settings.log_dir)

    # --- where tf_keras keeps what the driver needs -----------------------------------------
    def _ps_addresses(self) -> list[str]:
        return _ps_addresses(self.model)

    def _worker_addresses(self) -> dict[str, str]:
        """Each worker task's address ({} where fit runs under no cluster), so that a
        worker that stops can be told from a slow one."""
        return worker_addresses_of(getattr(self.model, "distribute_strategy", None))

    def _join(self) -> None:
        _join(self.model)

    def _order_dir(self, log_dir: str | None) -> str | None:
        """Where the order is saved for a restart: BackupAndRestore's backup_dir when fit
        runs with one (its state is set by the first step), else ``log_dir``."""
        from tictac_hooks.patches import keras_internals
        return keras_internals.backup_dir(self.model) or log_dir

    def _find_dag(self, mode: str, times: bool = True) -> StepDAG:
        """The DAG of the step function fit runs (traced by now), with the compute
        profile when asked for or when TAC needs it (compute_profile.py: the traced step
        itself, run in a child process; a failure turns TAC off, never training), unless
        ``times`` is False."""
        dag = dag_of(self._concrete(mode), None, model=self.model)
        if times:
            dag = dataclasses.replace(dag, compute_times=self._compute_times(mode, dag))
        return dag

    def _concrete(self, mode: str) -> Any:
        return traced_function(getattr(self.model, _MODE_FUNCTION[mode]),
                               f"Keras's {mode} function")

    def _compute_times(self, mode: str, dag: StepDAG) -> Any:
        """The compute profile of ``dag`` when asked for or when TAC needs it (None:
        not asked for, or it failed, which turns TAC off and says why)."""
        measure = tictac_flags.setting("measure_compute", self.measure_compute)
        if not (measure or self.controller.settings.algorithm == "tac"):
            return None
        batch = self._batch_size() if mode != "predict" else None
        return profile_for(self.controller, self._concrete(mode), dag, batch)

    def _batch_size(self) -> int | None:
        """The batch size fit feeds, for the compute profile: the examples the loss
        metric counted this epoch over the steps that ran this epoch. The switch runs
        while fit goes on (background_switch), so the steps that ran are read from the
        model's step counter (at the same time as the examples) rather than taken as
        the steps dispatched."""
        from tictac_hooks.patches import keras_internals
        examples = keras_internals.examples_this_epoch(self.model)
        if examples is None:
            return None
        ran = keras_internals.steps_run(self.model)
        if ran is None or self._counter_at_begin is None:
            steps = self._batches  # the steps dispatched this epoch, where no counter
        else:
            steps = ran - self._counter_at_begin - self._epoch_first_step
        return max(1, round(examples / steps)) if steps >= 1 and examples > 0 else None


_MODE_FUNCTION = {"train": "train_function", "test": "test_function",
                  "predict": "predict_function"}


def _join(model: Any) -> None:
    from tictac_hooks.patches import keras_internals
    coordinator = keras_internals.cluster_coordinator(model)
    if coordinator is not None:
        coordinator.join()


def _ps_addresses(model: Any) -> list[str]:
    import tensorflow as tf
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    pss = (tf.distribute.ParameterServerStrategy,
           tf.distribute.experimental.ParameterServerStrategy)
    if not isinstance(strategy, pss):
        raise TicTacSetupError(
            f"TicTac orders parameter-server transfers, but model.fit runs under "
            f"{type(strategy).__name__}: build and compile the model inside "
            "tf.distribute.experimental.ParameterServerStrategy(...).scope()")
    from tictac_hooks.patches import keras_internals
    return ps_addresses_from_cluster_spec(keras_internals.strategy_cluster_spec(strategy))


def _refuse_keras3_under_pss(model: Any) -> None:
    if not type(model).__module__.startswith("keras."):
        return
    import tensorflow as tf
    if isinstance(tf.distribute.get_strategy(), (tf.distribute.ParameterServerStrategy,
                                                 tf.distribute.experimental.ParameterServerStrategy)):
        raise TicTacSetupError(
            "Keras 3 model.fit does not support ParameterServerStrategy (upstream): "
            "either set TF_USE_LEGACY_KERAS=1 and use tf_keras, or train in a custom "
            "ClusterCoordinator.schedule loop with tictac_hooks.TicTacLoop")
