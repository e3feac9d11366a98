"""`TicTacHook`: TicTac for graph-mode (tf.compat.v1) training with a session hook."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Mapping, Sequence

from tictac_hooks import checks
from tictac_hooks.run.cluster_spec import ps_addresses_from_cluster_spec
from tictac_hooks import flags as tictac_flags
from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.controller import Controller
from tictac_hooks.run.settings import Settings, TicTacSetupError
from tictac_hooks.run.driver import StepDAG, StepDriver
from tictac_hooks.run.summary import RunSummary
from tictac_hooks.graph.tf.traced import NoWorkerTaskError, traced_worker_graphs

log = logging.getLogger("tictac")

TRACED_STEPS = 3  # profiled steps run with FULL_TRACE (the last ones before the switch)


def _hook_base() -> type:
    import tensorflow as tf
    return tf.compat.v1.train.SessionRunHook


class TicTacHook(_hook_base()):  # type: ignore[misc]
    """Sends every worker its parameters in one near-optimal order after the first steps.

    For graph-mode training with ``tf.compat.v1.train.MonitoredTrainingSession`` (or
    any ``SessionRunHook``-driven loop), between-graph replication (one hook per worker
    process; the chief installs the schedule) or in-graph replication (one client
    driving every worker's tower). The first ``profile_steps`` steps run in
    TensorFlow's own order; the last few of them are traced
    (``RunOptions(trace_level=FULL_TRACE, output_partition_graphs=True)``): the
    worker's partition graph gives the DAG and ``step_stats`` the time oracle (per-op
    compute times, transfer sizes). TIC or TAC then computes the order, which is
    installed on the native gate of every PS (from step ``profile_steps`` + 1 on).

    Every argument is checked here (ValueError naming the allowed range).

    Args:
      algorithm: ``"tic"`` (default), ``"tac"`` or ``"none"`` (``--tictac_algorithm``).
      profile_steps: steps before the switch, >= 1 (default 5, ``--tictac_profile_steps``);
        the last ``min(3, profile_steps)`` are traced.
      log_dir: TensorBoard step-time summaries and the transfer timeline
        (``--tictac_log_dir``; default: nothing written).
      skip_timeout: the skip bound, seconds > 0 (default 2.0, ``--tictac_skip_timeout``).
      window_bytes: the gate's pacing window, or the proxy's look-ahead window, bytes
        >= 0 (default 1048576, ``--tictac_window_bytes``; see :class:`tictac_hooks.TicTac`).
      cluster_spec: dict or ``tf.train.ClusterSpec`` naming the PS tasks (default: the
        ``cluster`` of ``TF_CONFIG``).
      workers: the worker tasks this client drives, e.g. ``["worker:0"]`` (default:
        every worker task found in the traced partition graphs).
      is_chief: install the schedule from this process (default: True, or the
        ``TF_CONFIG`` task is the chief / worker 0).
      bandwidth: link bytes/s, > 0: turns the native gate's pacing on and times TAC's
        transfers (``--tictac_bandwidth``, default None: no pacing; TAC's rate measured).
      poll_every: read step statistics from the PSes every N steps, >= 1 (default 50).
      check_rounds, check_block_steps, recheck_every: the order check, as for
        :class:`tictac_hooks.TicTac` (``--tictac_check_rounds``, default 8, 0: off;
        ``--tictac_check_block_steps``, 10 steps per worker; ``--tictac_recheck_every``, 5000).
      align: as for :class:`tictac_hooks.TicTac` (``--tictac_align``); with "auto" (the
        default) it follows ``training``.
      training: whether the steps train (default True); False for an inference loop.

    Example:
      ```python
      import tensorflow as tf
      from tictac_hooks import TicTacHook

      tf.compat.v1.disable_eager_execution()
      cluster = {"ps": ["ps0:2222"], "worker": ["worker0:2222"]}
      server = tf.distribute.Server(cluster, job_name="worker", task_index=0)
      with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):
          train_op = make_train_op()  # the model, its loss and optimizer step
      hook = TicTacHook(cluster_spec=cluster)
      with tf.compat.v1.train.MonitoredTrainingSession(
              master=server.target, is_chief=True, hooks=[hook]) as sess:
          while not sess.should_stop():
              sess.run(train_op)
      ```
    """

    def __init__(self, algorithm: str | None = None, profile_steps: int | None = None,
                 log_dir: str | None = None, skip_timeout: float | None = None,
                 cluster_spec: Any = None, workers: Sequence[str] | None = None,
                 is_chief: bool | None = None, bandwidth: float | None = None,
                 poll_every: int = 50, window_bytes: int | None = None,
                 check_rounds: int | None = None,
                 check_block_steps: int | None = None,
                 recheck_every: int | None = None, align: str | None = None,
                 training: bool = True) -> None:
        Settings.check(algorithm=algorithm, profile_steps=profile_steps, log_dir=log_dir,
                       skip_timeout=skip_timeout, window_bytes=window_bytes,
                       check_rounds=check_rounds, check_block_steps=check_block_steps,
                       recheck_every=recheck_every, align=align)
        if not isinstance(training, bool):
            raise ValueError(f"training must be True or False, got {training!r}")
        checks.whole_number("poll_every", poll_every, 1)
        if bandwidth is not None:
            checks.positive_number("bandwidth", bandwidth, "bytes per second")
        if is_chief is not None and not isinstance(is_chief, bool):
            raise ValueError(f"is_chief must be True, False or None, got {is_chief!r}")
        if workers is not None and (isinstance(workers, str) or not all(
                isinstance(w, str) and w.partition(":")[0] == "worker"
                and w.partition(":")[2].isdigit() for w in workers)):
            raise ValueError(f"workers must be a list of worker tasks like ['worker:0'], "
                             f"got {workers!r}")
        if cluster_spec is not None:
            for i, address in enumerate(ps_addresses_from_cluster_spec(cluster_spec)):
                checks.address(f"cluster_spec's address of ps:{i}", address)
        self.algorithm = algorithm
        self.window_bytes = window_bytes
        self.profile_steps = profile_steps
        self.log_dir = log_dir
        self.skip_timeout = skip_timeout
        self.cluster_spec = cluster_spec
        self.workers = list(workers) if workers else None
        self.is_chief = is_chief
        self.bandwidth = bandwidth
        self.poll_every = poll_every
        self.check_rounds = check_rounds
        self.check_block_steps = check_block_steps
        self.recheck_every = recheck_every
        self.align = align
        self.training = training
        self.controller: Controller | None = None
        # the last run's summary, and the same as JSON (tictac_summary.json's content)
        self.run_summary: RunSummary | None = None
        self.summary: dict[str, Any] | None = None
        self._driver: StepDriver | None = None
        self._traced: list[Any] = []
        self._declared: tuple[Any, list[Any]] | None = None  # begin() reads it
        self._trace_start = 0.0

    # --- hook methods -----------------------------------------------------------------------
    def begin(self) -> None:
        self._driver = StepDriver(self.run_config(), find_dag=self._find_dag)
        self.controller = self._driver.controller
        self._declared = _declared_variables()
        self._driver.start()
        self._traced = []

    def before_run(self, run_context: Any) -> Any:
        n = self._driver.settings.profile_steps
        if not self._driver.switched and n - min(TRACED_STEPS, n) <= self._driver.steps:
            import tensorflow as tf
            self._trace_start = time.time()
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                              output_partition_graphs=True)
            return tf.compat.v1.train.SessionRunArgs(fetches=None, options=options)
        return None

    def after_run(self, run_context: Any, run_values: Any) -> None:
        metadata = run_values.run_metadata
        if metadata is not None and metadata.partition_graphs:
            self._traced.append(metadata)
            # Tracing slows the step: its interval is not a step time.
            self.controller.mark_pause(self._trace_start, time.time())
        self._driver.step()

    def end(self, session: Any) -> None:
        if self._driver is not None:
            self.run_summary = self._driver.finish()
            self.summary = self.run_summary.to_json()

    def run_config(self) -> RunConfig:
        """The session's config: its steps are this process's own (each worker task of a
        between-graph job runs its session; no addresses to probe for lost workers)."""
        settings = Settings.resolve(self.algorithm, self.profile_steps, self.log_dir,
                                    self.skip_timeout, window_bytes=self.window_bytes,
                                    check_rounds=self.check_rounds,
                                    check_block_steps=self.check_block_steps,
                                    recheck_every=self.recheck_every, align=self.align)
        return RunConfig.build(settings, self._ps_addresses(),
                               bandwidth=tictac_flags.bandwidth(self.bandwidth),
                               training=self.training, install=self._chief(),
                               poll_every=self.poll_every)

    # --- where graph mode keeps what the driver needs ----------------------------------------
    def _ps_addresses(self) -> list[str]:
        return ps_addresses_from_cluster_spec(self._cluster_spec())

    def _cluster_spec(self) -> Any:
        return self.cluster_spec if self.cluster_spec is not None else _tf_config()["cluster"]

    def _find_dag(self) -> StepDAG:
        """The DAG per worker task from the traced steps' partition graphs and the time
        oracle from their step_stats."""
        if not self._traced:
            raise TicTacSetupError("no traced step: the session did not return run metadata "
                                   "(is the hook's RunOptions honoured by this session?)")
        try:
            graphs, compute, late = traced_worker_graphs(self._traced, self.workers,
                                                         declared=self._declared)
        except NoWorkerTaskError as e:
            raise TicTacSetupError(str(e)) from None
        self._traced = []  # free the metadata
        return StepDAG(graphs, compute, late=frozenset(late))

    def _chief(self) -> bool:
        if self.is_chief is not None:
            return self.is_chief
        if not os.environ.get("TF_CONFIG"):
            return True  # one client (in-graph replication, or a single worker)
        task = _tf_config().get("task", {})
        if not task:
            return True
        return task.get("type") == "chief" or (task.get("type") == "worker"
                                               and int(task.get("index", 0)) == 0)


def _declared_variables() -> tuple[Any, list[Any]] | None:
    """(the graph being run, its variables in declaration order): what
    ``tf.compat.v1.trainable_variables()`` returns, then the other global variables,
    so that the DAGs carry each recv's position (the ``declared`` baseline). Read in
    ``begin``: the default graph is per thread, and the switch may run on another."""
    import tensorflow as tf
    graph = tf.compat.v1.get_default_graph()
    with graph.as_default():
        declared = list(tf.compat.v1.trainable_variables())
        seen = {id(v) for v in declared}
        declared += [v for v in tf.compat.v1.global_variables() if id(v) not in seen]
    return (graph, declared) if declared else None


def _tf_config() -> Mapping[str, Any]:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise TicTacSetupError("TicTacHook needs the cluster: pass cluster_spec=... or set "
                               "TF_CONFIG (with a 'cluster' naming the 'ps' tasks)")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TicTacSetupError(f"TF_CONFIG is not valid JSON: {e}") from None
    if "cluster" not in config:
        raise TicTacSetupError("TF_CONFIG has no 'cluster'")
    return config
