"""`tictac bench --frontend fit`: the orders compared under tf_keras ``fit`` with
ParameterServerStrategy, the way PS users train, on the user's own model.

A local cluster (``--ps`` PS tasks with TicTac's native gate, ``--workers`` workers, a
chief), every task in its own network namespace behind a link shaped to one rate where
root and ``tc`` are available, else on loopback (said in the output and the JSON). The
coordinator (a child process on the chief's host, as examples/pss_cluster.py runs it)
builds the model with ``FUNCTION(batch_size)`` under the strategy's scope
(bench/user_model.py; the strategy's ``variable_partitioner`` is
``MinSizePartitioner(--min-shard-bytes, max_shards=#PS)``), and trains it with
``model.fit`` on the one batch repeated, with the ``TicTac`` callback: the main job's
path. The callback profiles, switches, then runs its order check (order_check.py) with
every order to compare as a candidate: rounds of (candidate order, TensorFlow's order)
block pairs of ``--check-block-steps`` steps, interleaved in the one run. Once the
check decides, fit stops; the per-worker block medians of every pair give each order's
median step time and its ratio to TensorFlow's order (median and range over pairs).

Orders: TensorFlow's (the check's D blocks, no schedule), ``declared`` (the variable
list order: BytePS, ByteScheduler's PyTorch/MXNet plugins, P3), ``first-use`` (by first
consumer in the traced step: ByteScheduler's TensorFlow plugin),
``random`` (a fixed random order, paced as TicTac's are), TIC and TAC. Orders that
cannot be computed are listed as off, with why. Training is asynchronous (each worker
runs its own steps against the PSes): there are no stragglers to wait for, so the
straggler statistics of the compat.v1 bench do not apply.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from tictac_hooks.bench import user_model
from tictac_hooks.bench.fit_report import (BASELINES, ORDERS, STRAGGLERS, TF_AGAIN,
                                           order_results,
                                           product_choice, text_table, with_check)

DEFAULT_RATE = "1gbit"
STEPS_PER_EPOCH = 500
# --emulate-gpu without --byte-scale: every worker's pulls and pushes of one step at
# most 16 MiB together, an eighth of the compat.v1 bench's budget (runner.py): fit's
# workers step on their own, and every byte costs this machine's cores a share of the
# step that a cluster spreads over its machines. Measured here (ResNet-50, 4 x 2, 164 ms
# of compute, unshaped): a step of 334 ms at 64 MiB a step (x 0.082, cores 73 % busy),
# 198 ms at 16 MiB (x 0.02), 182 ms at 4 MiB (x 0.005); at 128 MiB and 10 Gbit/s the
# cores were 88 % busy, over the guard.
FIT_BYTES_PER_STEP = 16 * 2**20


@dataclasses.dataclass
class FitConfig:
    """One fit-mode run (see ``tictac bench --help``)."""

    model: str = "dlrm"
    workers: int = 2
    ps: int = 2
    batch: int | None = None        # default: the built-in's, else user_model's
    rate: str = DEFAULT_RATE        # the shaped links' rate
    loopback: bool = False
    orders: Sequence[str] = ORDERS
    rounds: int = 3                 # block pairs per order
    # after the decision, rounds of (kept order, TensorFlow's) block pairs in fresh
    # blocks, where the check kept TIC or TAC: what TicTac with its check gives (0: off)
    verify_rounds: int = 3
    block_steps: int = 10           # training steps per worker per block
    profile_steps: int = 20
    min_shard_bytes: int = 256 << 10  # 0: no partitioner
    timeout_s: float = 1800.0
    max_steps: int = 1_000_000      # fit's bound; the check's end stops it first
    # --emulate-gpu (bench/replay_fit.py): ``model`` is a profile replayed with its
    # compute as delay ops summing to compute_ms per step; bytes and links x byte_scale
    # (None: picked as the compat.v1 bench picks it, runner.emulated_byte_scale)
    compute_ms: float | None = None
    byte_scale: float | None = None
    max_ops: int = 16

    @property
    def emulated(self) -> bool:
        return self.compute_ms is not None

    def validate(self) -> None:
        from tictac_hooks.flags import MIN_CHECK_BLOCK_STEPS
        for name, lo, hi in (("workers", 1, 64), ("ps", 1, 16), ("rounds", 1, 20),
                             ("verify_rounds", 0, 20),
                             ("block_steps", MIN_CHECK_BLOCK_STEPS, 1000),
                             ("profile_steps", 1, 1000), ("min_shard_bytes", 0, 1 << 40)):
            value = getattr(self, name)
            if not lo <= value <= hi:
                flag = {"rounds": "check-rounds", "block_steps": "check-block-steps",
                        "profile_steps": "profile-steps"}.get(name, name.replace("_", "-"))
                raise ValueError(f"--{flag} must be in {lo}..{hi}, got {value}")
        bad = [o for o in self.orders if o not in ORDERS]
        if bad or len(set(self.orders)) != len(self.orders):
            raise ValueError(f"--schedules in fit mode: distinct names from "
                             f"{','.join(ORDERS)} (TensorFlow's order is always measured), "
                             f"got {','.join(self.orders)}")
        if self.batch is not None and self.batch < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch}")
        if self.emulated:
            from tictac_hooks.bench.runner import check_emulation
            check_emulation(self)
            if self.min_shard_bytes:
                raise ValueError("--emulate-gpu replays the profile's own shards: leave "
                                 "out --min-shard-bytes (the strategy runs with no "
                                 "partitioner)")
        from tictac_hooks.cluster.netns import rate_bits
        rate_bits(self.rate)

    def batch_size(self) -> int:
        from tictac_hooks.bench.models import DEFAULT_BATCH as BUILTIN_BATCH
        return self.batch or BUILTIN_BATCH.get(self.model, user_model.DEFAULT_BATCH)


# --- --emulate-gpu: the replay fit trains ------------------------------------------------

def emulation(config: FitConfig) -> dict[str, Any]:
    """What the coordinator replays (its ``cfg["emulate"]``): the profile, compute,
    delay ops and the byte scale (--byte-scale, or picked as the compat.v1 bench picks
    it), with the replay described in one line."""
    from tictac_hooks.bench.runner import emulated_byte_scale
    whole = _replay(config.model, config.ps, config.compute_ms, config.max_ops, 1.0)
    scale = emulated_byte_scale(config, whole.pull_bytes, whole.push_bytes,
                                per_step=FIT_BYTES_PER_STEP)
    return {"model": config.model, "compute_ms": config.compute_ms, "byte_scale": scale,
            "max_ops": config.max_ops, "picked": config.byte_scale is None,
            "describe": _replay(config.model, config.ps, config.compute_ms, config.max_ops,
                                scale).describe()}


def _replay(model: str, ps: int, compute_ms: float, max_ops: int, byte_scale: float) -> Any:
    from tictac_hooks.bench.runner import bench_replay
    return bench_replay(model, ps, compute_ms, max_ops, byte_scale=byte_scale)


def _emulated_source(cfg: Mapping[str, Any]) -> tuple[user_model.ModelSource, Any]:
    from tictac_hooks.bench import replay_fit
    e = cfg["emulate"]
    plan = _replay(e["model"], cfg["ps"], e["compute_ms"], e["max_ops"], e["byte_scale"])
    return user_model.ModelSource(e["model"], f"{e['model']} (emulated)",
                                  replay_fit.builder(plan), None, "replayed"), plan


def compute_reference(tf: Any, coordinator: Any, plan: Any, calls: int) -> list[float]:
    """Seconds of each of ``calls`` runs of the replay's delays alone (no read, no
    push), scheduled on the workers as fit's steps are: the emulated compute a worker
    delivers under this machine's load."""
    from tictac_hooks.bench import emulate

    @tf.function
    def compute_only() -> Any:
        start = tf.timestamp()
        act = tf.cast(start, tf.float32)
        for seg in plan.segments:
            act = emulate.delay([act], seg.ms)[0]
        with tf.control_dependencies([act]):
            # (act returned too: a delay whose output only a control input needs is
            # pruned from the function)
            return tf.timestamp() - start, act
    spans = [coordinator.schedule(compute_only) for _ in range(calls)]
    coordinator.join()
    return [float(s.fetch()[0]) for s in spans]


def emulated_line(e: Mapping[str, Any], workers: int, spans: Sequence[float],
                  cpu: Any) -> dict[str, Any]:
    """The emulated compute measured (median of ``spans``) against the requested, the
    workers' CPU over the check (a :class:`~tictac_hooks.bench.cpu_guard.CpuUse`) and
    the guard's verdict: printed, and returned for the result."""
    import statistics

    from tictac_hooks.bench.cpu_guard import emulated_lines
    measured = statistics.median(spans) * 1e3
    tasks = list(range(workers))
    for line in emulated_lines(measured, e["compute_ms"], tasks, cpu):
        print(line, flush=True)
    shares = cpu.worker_shares(tasks)
    return {"compute_ms_measured": measured, "worker_cpu_share": sum(shares) / len(shares),
            "cpu_bound": cpu.reasons(tasks), "cpu": cpu.to_json()}


# --- the parent: cluster, coordinator, result ---------------------------------------------

def run(config: FitConfig, argv: Sequence[str] | None = None,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs the benchmark and returns the result JSON (see :func:`text_table`)."""
    from tictac_hooks.cluster import netns
    from tictac_hooks.cluster.launcher import ClusterError, LocalCluster
    config.validate()
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    emulate = None
    if config.emulated:  # a bad profile: before any cluster
        emulate = emulation(config)
        label = f"{config.model} (emulated)"
        say(f"[bench fit] emulated GPU workers: {emulate['describe']}; links "
            f"{config.rate} x {emulate['byte_scale']:.3g} (the byte scale)")
    else:  # a bad file or function: before any cluster
        label = user_model.resolve(config.model).label
    if config.loopback:
        shaped, why = False, "--loopback given"
    else:
        shaped, why = netns.available()
    network: dict[str, Any] = {"shaped": shaped}
    link_bits = netns.rate_bits(config.rate)
    if emulate:  # the cluster's link, scaled with the bytes
        link_bits = max(8000, round(link_bits * emulate["byte_scale"], -5))
    if shaped:
        network["rate"] = config.rate
        network["shaped_bits"] = link_bits
    else:
        network["reason"] = why
        say("=" * 78 + f"\nWARNING: NO SHAPED NETWORK ({why}).\nFalling back to LOOPBACK: "
            "these numbers do NOT measure a shaped link; TicTac's gains\nneed a "
            "communication-bound setting. Run as root with iproute2 (tc).\n" + "=" * 78)
    started = time.time()
    kwargs = dict(num_ps=config.ps, num_workers=config.workers, rendezvous=True, chief=True,
                  env={"TF_USE_LEGACY_KERAS": "1"}, workers_load_native=config.emulated)
    ps_usage: dict[str, Any] = {}
    worker_usage: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tictac-fitbench-") as tmp:
        cfg = {"model": config.model, "batch": config.batch_size(),
               # label -> the algorithm it runs (tf-again: TensorFlow's own order)
               "orders": {o: "none" if o == TF_AGAIN else o
                          for o in config.orders if o in BASELINES},
               "rounds": config.rounds, "block_steps": config.block_steps,
               "verify_rounds": config.verify_rounds,
               "profile_steps": config.profile_steps, "ps": config.ps,
               "min_shard_bytes": config.min_shard_bytes, "max_steps": config.max_steps,
               "link_bytes_per_s": link_bits // 8 if shaped else None,
               "emulate": emulate, "out": os.path.join(tmp, "result.json")}
        try:
            if shaped:
                netns.cleanup_stale()
                hosts = netns.cluster_hosts(config.ps, config.workers, chief=True, clients=())
                with netns.ShapedNetwork(hosts, rate=link_bits) as net, \
                        LocalCluster(network=net, **kwargs) as cluster:
                    say(f"[bench fit] shaped network: {len(hosts)} namespaces, links at "
                        f"{link_bits / 1e6:g} Mbit/s")
                    code = _coordinate(cluster, cfg, tmp, "chief", config.timeout_s,
                                       ps_usage, worker_usage)
                    from tictac_hooks.bench.runner import read_queues
                    queues = read_queues(net, say, "fit")
                    if queues is not None:
                        network["queues"] = queues
            else:
                with LocalCluster(**kwargs) as cluster:
                    code = _coordinate(cluster, cfg, tmp, None, config.timeout_s, ps_usage,
                                      worker_usage)
        except ClusterError as e:
            raise RuntimeError(f"tictac bench --frontend fit: {e}") from None
        try:
            with open(cfg["out"]) as f:
                result = json.load(f)
        except (OSError, json.JSONDecodeError):
            result = {}
    if result.get("model_error"):
        raise user_model.UserModelError(result["model_error"])
    if code or result.get("error") or not result:
        raise RuntimeError(f"tictac bench --frontend fit: the coordinator failed (exit "
                           f"{code}): {result.get('error') or 'no result written'}")
    from tictac_hooks.bench.runner import provenance
    return {
        "benchmark": "fit",
        **provenance(argv),  # commit, dirty, command
        "config": {**dataclasses.asdict(config), "orders": list(config.orders),
                   "batch": config.batch_size(), "model_label": label},
        "network": network,
        "stragglers": STRAGGLERS,
        "ratio": "median(TensorFlow's order) / median(this order) in each block pair of "
                 "one worker: > 1, this order is faster (1 + its throughput gain)",
        "wall_s": time.time() - started,
        "ps_usage": ps_usage,
        "worker_usage": worker_usage,
        **result,
    }


def _coordinate(cluster: Any, cfg: dict, tmp: str, host: str | None,
                timeout_s: float, usage: dict[str, Any],
                worker_usage: dict[str, Any] | None = None) -> int:
    """Runs the coordinator; ``usage`` gets each PS process's CPU seconds over the run
    and its resident memory at its end (cluster/usage.py: the whole PS process, the
    TensorFlow server with its gate, not the gate alone); ``worker_usage`` each
    worker's CPU seconds and, as ``coordinator``, the coordinator process's (what one
    step costs the whole cluster's CPU: `tictac whatif --cpus`)."""
    import resource
    from tictac_hooks.cluster.usage import group_usage
    ps = [cluster.task("ps", i) for i in range(cfg["ps"])]
    workers = [t for t in cluster.tasks if t.job == "worker"]
    groups = {}
    for t in ps + workers:  # for the CPU guard (bench/cpu_guard.py)
        with contextlib.suppress(OSError):
            groups[f"{t.job}{t.index}"] = os.getpgid(t.process.pid)
    cfg = dict(cfg, cluster_spec=cluster.spec, task_groups=groups)
    before = [group_usage(t.process.pid) for t in ps + workers]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    argv = [sys.executable, "-m", "tictac_hooks.bench.fit_mode", path]
    (code,) = cluster.run_clients([argv], host=host, dead_task_grace_s=10.0,
                                  timeout_s=timeout_s, workers_may_die=True)
    for k, (t, b) in enumerate(zip(ps + workers, before)):
        a = group_usage(t.process.pid)
        if a is None or b is None:
            continue
        if k < len(ps):
            usage[t.address] = {"cpu_s": round(a.cpu_s - b.cpu_s, 2),
                                "rss_mb": round(a.rss_bytes / 2**20, 1),
                                "peak_rss_mb": round(a.peak_rss_bytes / 2**20, 1)}
        elif worker_usage is not None:
            worker_usage[t.address] = {"cpu_s": round(a.cpu_s - b.cpu_s, 2)}
    if worker_usage is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        worker_usage["coordinator"] = {"cpu_s": round(
            after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime, 2)}
    return code


# --- the coordinator (a child process) --------------------------------------------------------

def _tictac_class() -> type:
    from tictac_hooks.callbacks.keras_callback import TicTac
    from tictac_hooks.run.phases import CHECKING

    class BenchTicTac(TicTac):
        """TicTac with the baselines as more order-check candidates. Once the check
        decided, where TicTac's own check (TIC and TAC alone: :func:`product_choice`)
        would have kept one of its orders and ``verify_rounds`` > 0, that order is
        checked alone against TensorFlow's in fresh blocks (what TicTac with its check
        gives, measured on steps the decision did not see); fit stops after that (or at
        the decision, or when the switch failed)."""

        def __init__(self, extra: Mapping[str, str], verify_rounds: int = 0,
                     meter: Any = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.extra = dict(extra)
            self.verify_rounds = verify_rounds
            self.verifying = False
            self.meter = meter      # a CpuMeter over the check's blocks (--emulate-gpu)
            self.metering = False
            self.cpu = None         # what it measured

        def _stop(self) -> None:
            self.model.stop_training = True
            if self.metering:
                self.cpu, self.metering = self.meter.stop(), False

        def _begin(self, mode: str) -> None:
            super()._begin(mode)
            self.controller.check_extra = dict(self.extra)
            self.controller.runner.fixed_rounds = True  # every order, every round

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            super().on_train_batch_end(batch, logs)
            c = self.controller
            if c is None:
                return
            if self.meter is not None and not self.metering and self.cpu is None \
                    and c.phases.now == CHECKING:
                self.meter.start()
                self.metering = True
            if c.not_ordered_reason:
                self._stop()
            elif len(c.check_results) == 1 and not self.verifying:
                kept = product_choice(c.check_results[0])
                if self.verify_rounds and kept is not None:
                    c.runner.check_again((kept,), self.verify_rounds)
                    self.verifying = True
                else:
                    self._stop()
            elif len(c.check_results) >= 2:
                self._stop()
    return BenchTicTac


def coordinate(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """model.fit under ParameterServerStrategy with the TicTac callback; the result."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import warnings
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
    import tensorflow as tf
    import tf_keras as keras
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cfg["cluster_spec"]), task_type="chief", task_id=0,
        rpc_layer="grpc")
    partitioner = None
    if cfg["min_shard_bytes"]:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=cfg["min_shard_bytes"], max_shards=cfg["ps"])
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner)
    plan, meter = None, None
    if cfg.get("emulate"):
        source, plan = _emulated_source(cfg)
        from tictac_hooks.bench.cpu_guard import CpuMeter
        meter = CpuMeter(cfg["task_groups"])
    else:
        source = user_model.resolve(cfg["model"])
    keras.utils.set_random_seed(7)
    with strategy.scope():
        loaded = user_model.load(source, cfg["batch"], keras)
    model = loaded.model
    variables = parameters(model.trainable_variables)
    print(f"[bench fit] {source.label}: {len(variables)} trainable variables, "
          f"{sum(v['bytes'] for v in variables) / 2**20:.1f} MiB, "
          f"{sum(v['shards'] > 1 for v in variables)} sharded over {cfg['ps']} PS; "
          f"compiled with {loaded.compiled_by}", flush=True)
    verify_rounds = cfg["verify_rounds"]
    tictac = _tictac_class()(
        cfg["orders"], verify_rounds=verify_rounds, meter=meter, algorithm="tic",
        profile_steps=cfg["profile_steps"],
        check_rounds=cfg["rounds"], check_block_steps=cfg["block_steps"], recheck_every=0,
        bandwidth=cfg["link_bytes_per_s"], measure_compute=True)
    epochs = max(1, -(-cfg["max_steps"] // STEPS_PER_EPOCH))
    model.fit(user_model.dataset(tf, loaded), epochs=epochs, steps_per_epoch=STEPS_PER_EPOCH,
              callbacks=[tictac], verbose=0)
    c = tictac.controller
    summary = tictac.summary or {}
    if not c.check_results:
        raise RuntimeError(c.not_ordered_reason or "the order check did not finish")
    emulated = None
    if plan is not None:
        from tictac_hooks.patches import keras_internals
        if tictac.cpu is None:
            raise RuntimeError("the CPU guard measured no check block")
        spans = compute_reference(tf, keras_internals.cluster_coordinator(model), plan,
                                  3 * len(cfg["cluster_spec"]["worker"]))
        emulated = {**cfg["emulate"], **emulated_line(
            cfg["emulate"], len(cfg["cluster_spec"]["worker"]), spans, tictac.cpu)}
    first = c.check_results[0]
    verify = c.check_results[1] if len(c.check_results) > 1 else None
    check = first.to_json()
    if c.runner.same_as:  # orders identical to another's, checked once under its name
        check["same_as"] = dict(c.runner.same_as)
    # The first check's raw steps and blocks, for resampling the rule's error rates
    # (benchmarks/check_error_rates.py): per step [worker, start, step time, phase,
    # order, paused s]; per block [round, candidate, T, start, end].
    check_steps = [[r.worker, r.start, r.step_time, r.phase, r.order, r.paused_s]
                   for r in c.runner.first_check_records]
    check_windows = [[w.round, w.candidate, w.tictac, w.start, w.end]
                     for w in c.runner.first_check_windows]
    off = dict(c.check_off)
    if c.tac_off:
        off.setdefault("tac", c.tac_off)
    return {
        "model": {"spec": cfg["model"], "label": source.label, "name": model.name,
                  "batch": cfg["batch"], "compiled_by": loaded.compiled_by,
                  "variables": variables},
        "orders": order_results(check, off),
        "off": off,
        "check": check,
        "with_check": with_check(first, verify, verify_rounds),
        "check_steps": check_steps, "check_windows": check_windows,
        "tictac": {k: summary[k] for k in ("coverage", "order", "records", "hook", "tac_off")
                   if k in summary},
        **({"emulate": emulated} if emulated else {}),
    }


def parameters(variables: Sequence[Any]) -> list[dict[str, Any]]:
    """The model's parameters in ``trainable_variables`` order, each with its bytes and
    the shards the partitioner cut it into (ParameterServerStrategy lists the shards
    of a ShardedVariable, ``.../part_<i>:0``, one after the other), named without
    the ``:0``, with the PS task of each shard (where its device names one)."""
    out: dict[str, dict[str, Any]] = {}
    for v in variables:
        name = re.sub(r"(/part_\d+)?(:\d+)?$", "", v.name)
        entry = out.setdefault(name, {"name": name, "bytes": 0, "shards": 0, "ps": []})
        entry["bytes"] += int(v.shape.num_elements() or 0) * v.dtype.size
        entry["shards"] += 1
        task = re.search(r"/job:ps/(?:replica:\d+/)?task:(\d+)", getattr(v, "device", ""))
        if task:
            entry["ps"].append(int(task.group(1)))
    return list(out.values())


def config_from_args(args: Any) -> FitConfig:
    """The FitConfig of `tictac bench --frontend fit` arguments (bench/cli.py)."""
    if args.mode != "training":
        raise ValueError("--frontend fit trains (model.fit): --mode inference is the "
                         "compat.v1 bench's (--frontend graph)")
    if args.backend != "native":
        raise ValueError("--frontend fit runs the PSes with the native gate (the TicTac "
                         "callback's path): leave out --backend proxy")
    rates = [b.strip() for b in args.bandwidth.split(",") if b.strip()]
    if rates == ["auto"]:
        rate = DEFAULT_RATE  # the compat.v1 default; fit mode has no profiled rate sweep
    elif len(rates) == 1 and not rates[0].startswith("auto"):
        rate = rates[0]
    else:
        raise ValueError(f"--frontend fit runs at one link rate (e.g. --bandwidth 1gbit; "
                         f"default {DEFAULT_RATE}), got --bandwidth {args.bandwidth}")
    settings: dict[str, Any] = dict(
        model=args.model, workers=args.workers, ps=args.ps, batch=args.batch, rate=rate,
        loopback=args.loopback, timeout_s=args.timeout)
    if args.schedules is not None:
        settings["orders"] = [s.strip() for s in args.schedules.split(",") if s.strip()]
    if args.check_rounds is not None:
        settings["rounds"] = args.check_rounds
    if args.check_block_steps is not None:
        settings["block_steps"] = args.check_block_steps
    if args.emulate_gpu != (args.compute_ms is not None):
        raise ValueError("--emulate-gpu and --compute-ms go together: the emulated step's "
                         "compute is --compute-ms")
    if args.emulate_gpu:  # the replay's shards are the partitioner's: none in the strategy
        settings.update(compute_ms=args.compute_ms, byte_scale=args.byte_scale,
                        max_ops=args.max_ops, min_shard_bytes=0)
    if args.min_shard_bytes is not None:
        settings["min_shard_bytes"] = args.min_shard_bytes
    if getattr(args, "verify_rounds", None) is not None:
        settings["verify_rounds"] = args.verify_rounds
    if args.quick:  # a smoke run: two rounds, short blocks, short profile
        settings.setdefault("rounds", 2)
        # per worker: 12 dispatched steps at 1-2 workers, 6 per worker beyond
        settings.setdefault("block_steps", max(6, -(-12 // args.workers)))
        settings["profile_steps"] = 8
    return FitConfig(**settings)


def main_from_args(args: Any) -> int:
    """`tictac bench --frontend fit`: runs, prints the table, writes the JSON."""
    config = config_from_args(args)  # a ValueError (UserModelError too): `tictac` says it
    result = run(config)
    print(text_table(result))
    if args.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0


def _coordinator_main(path: str) -> int:
    with open(path) as f:
        cfg = json.load(f)
    try:
        result = coordinate(cfg)
        code = 0
    except user_model.UserModelError as e:
        result, code = {"model_error": str(e)}, 2
    except Exception as e:  # noqa: BLE001 - said in the result, and on stderr
        import traceback
        traceback.print_exc()
        result, code = {"error": f"{type(e).__name__}: {e}"}, 1
    with open(cfg["out"], "w") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(_coordinator_main(sys.argv[1]))
