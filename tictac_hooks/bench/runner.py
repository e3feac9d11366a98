"""`tictac bench`: TensorFlow's default vs TicTac on a shaped network, in one run.

Every task (PS, workers, the client) runs in its own network namespace behind a veth
link shaped with ``tc`` (:class:`~tictac_hooks.cluster.netns.ShapedNetwork`). There are
two sets of ``W`` identical worker tasks with identical links: the *interposed* set
reaches the PS tasks through the TicTac gate (schedules "rendezvous" = the gate with no
schedule, "tic", "tac", "random", "first-use", "declared"), the *direct* set reaches
plain TensorFlow servers ("none": TensorFlow's default, no gate): with the native
backend (default) a plain twin of each PS on the same host, with the proxy the
TensorFlow server behind it. Only one set runs at a time, in rotating blocks, so both see the same PS links, CPU and drift.
Without root or ``tc`` it falls back to loopback and says so, in its output and JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from tictac_hooks import flags as tictac_flags
from tictac_hooks.bench import workloads
from tictac_hooks.bench.orders import (ALIGNED, DIRECT, FIFO, NOPACE, OPTIONAL, SCHEDULES,
                                       STOCK, WC)
from tictac_hooks.graph.algorithms import ALIASES, canonical_algorithm
from tictac_hooks.enforce.gate import DEFAULT_SKIP_AFTER_S, DEFAULT_WINDOW_BYTES
from tictac_hooks.records import BenchConfigRecord, BenchRun, MachineLoad

WORKER_ENV = {"TF_NUM_INTRAOP_THREADS": "1"}  # one compute thread per op


def canonical_schedule(name: str) -> str:
    """A schedule name with an old algorithm name replaced (``layer`` -> ``first-use``,
    ``layer-aligned`` -> ``first-use-aligned``; said once, graph/algorithms.py)."""
    for old in ALIASES:
        if name == old or (name.startswith(old + "-")
                           and name[len(old):] in (ALIGNED, FIFO, NOPACE, WC)):
            return canonical_algorithm(old) + name[len(old):]
    return name


def default_schedules(backend: str) -> tuple[str, ...]:
    """Every order and baseline; with the native backend also "stock" (the same PS and
    workers with the gate bypassed: TensorFlow's own code on TicTac's path)."""
    return SCHEDULES + ((STOCK,) if backend == "native" else ())


@dataclasses.dataclass
class BenchConfig:
    """One configuration (see ``tictac bench --help``)."""

    model: str = "resnet50"
    mode: str = "training"
    workers: int = 2
    ps: int = 1
    bandwidth: Sequence[str] = ("auto",)
    steps: int = 20
    block_steps: int = 5
    settle_steps: int = 1
    warmup: int = 2
    profile_steps: int = 3
    batch: int | None = None
    schedules: Sequence[str] | None = None  # None: default_schedules(backend)
    skip_timeout: float = DEFAULT_SKIP_AFTER_S
    window_bytes: int = DEFAULT_WINDOW_BYTES
    timeout_s: float = 1800.0
    loopback: bool = False
    backend: str = "native"
    pin_workers: bool = False  # worker k (of each set) on CPU k mod #CPUs
    # schedule "checked": TicTac's order check, as its frontends run it by default
    check_rounds: int = tictac_flags.DEFAULTS["check_rounds"]
    check_block_steps: int = tictac_flags.DEFAULTS["check_block_steps"]
    conserve_after_s: float = 0.002  # the "-wc" schedules' idle bound (gate.h)
    # calibration blocks in each round (bench/orders.py CALIBRATION): the simulator's
    # compute measured in the same rounds as the steps it predicts
    calibrate: bool = True
    # --emulate-gpu (bench/replay.py): the model's profile replayed with its compute as
    # delay ops summing to compute_ms per step (None: the model's real compute on this
    # machine's cores); bytes and links x byte_scale (None: picked, emulated_byte_scale)
    compute_ms: float | None = None
    byte_scale: float | None = None
    max_ops: int = 16  # (each op a delay and its PS reads: at 16-32 workers the RPCs' CPU
                       # is what 2 cores run out of)

    def __post_init__(self) -> None:
        if self.schedules is None:
            self.schedules = (list(EMULATED_SCHEDULES) if self.compute_ms is not None
                              else default_schedules(self.backend))
        self.schedules = [canonical_schedule(s) for s in self.schedules]

    @property
    def emulated(self) -> bool:
        return self.compute_ms is not None

    def validate(self) -> None:
        if self.emulated:
            check_emulation(self)
        else:
            workloads.check_model(self.model)
        if self.mode not in workloads.MODES:
            raise ValueError(f"--mode must be one of {workloads.MODES}, got {self.mode!r}")
        most_workers, most_ps = (32, 8) if self.emulated else (8, 4)
        for name, lo, hi in (("workers", 1, most_workers), ("ps", 1, most_ps),
                             ("steps", 1, 10000),
                             ("block_steps", 1, 1000), ("warmup", 0, 100),
                             ("profile_steps", 1, 20), ("settle_steps", 0, 10),
                             ("check_rounds", 1, 20), ("check_block_steps", tictac_flags.MIN_CHECK_BLOCK_STEPS, 200)):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"--{name.replace('_', '-')} must be in {lo}..{hi}, got {value}")
        bad = [s for s in self.schedules if s not in SCHEDULES + OPTIONAL]
        if bad or not self.schedules or len(set(self.schedules)) != len(self.schedules):
            raise ValueError(f"--schedules must be distinct names from "
                             f"{','.join(SCHEDULES + OPTIONAL)}, "
                             f"got {','.join(self.schedules)}")
        parse_rates(self.bandwidth)
        if self.backend not in ("native", "proxy"):
            raise ValueError(f"--backend must be native or proxy, got {self.backend!r}")
        if STOCK in self.schedules and self.backend != "native":
            raise ValueError(f"schedule {STOCK!r} bypasses the native gate: it needs "
                             "--backend native")
        native_only = [s for s in self.schedules if s.endswith(WC)]
        if native_only and self.backend != "native":
            raise ValueError(f"schedules {','.join(native_only)} use the native gate's work "
                             "conservation: they need --backend native")
        if not 0 <= self.conserve_after_s <= 1:
            raise ValueError(f"--conserve-after must be in 0..1 seconds, got "
                             f"{self.conserve_after_s}")

    @property
    def label(self) -> str:
        pinned = "/pinned" if self.pin_workers else ""
        if self.emulated:
            return (f"{os.path.basename(self.model).split('.')[0]}/{self.mode}/W{self.workers}"
                    f"/P{self.ps}/gpu{self.compute_ms:g}ms{pinned}")
        return f"{workloads.model_key(self.model)}/{self.mode}/W{self.workers}/P{self.ps}{pinned}"


PROFILE_RATE = "100gbit"
# --emulate-gpu: TensorFlow's order on the same PS and workers (the gate bypassed), TIC
# and TAC: one worker set, so 32 workers are 32 processes, not 64
EMULATED_SCHEDULES = (STOCK, "tic", "tac")
# the byte scale picked without --byte-scale (bench/replay.py): every worker's pulls and
# pushes per step at most 128 MiB together, one worker's at most 64 MiB. Measured here:
# one ResNet-50 worker moving 195 MiB a step used 43 % of a core and its PS 52 %;
# 16 moving 800 MiB together kept a core 94 % busy (2.3 s steps): over the guard
EMULATED_BYTES_PER_STEP = 128 * 2**20
EMULATED_BYTES_PER_WORKER = 64 * 2**20


def replay_profile(model: str) -> Any:
    """The profile --emulate-gpu replays: a built-in's (graph/profile.py), or a
    profile file or directory (`tictac analyze --profile`, a TicTac run's log_dir)."""
    from tictac_hooks.graph import profile
    if model in profile.builtin_names():
        return profile.builtin(model)
    if os.path.exists(model):
        return profile.load(model)
    raise ValueError(f"--emulate-gpu replays a profile: --model is one of "
                     f"{', '.join(profile.builtin_names())} or a profile's path "
                     f"(`tictac analyze --model M --profile DIR`), got {model!r}")


def bench_replay(model: str, ps: int, compute_ms: float, max_ops: int, training: bool = True,
                 byte_scale: float = 1.0) -> Any:
    """The replay every --emulate-gpu run builds (both frontends, coordinator and
    client): ``model``'s profile on ``ps`` PSes, a variable's reads merged."""
    from tictac_hooks.bench import replay
    return replay.plan(replay_profile(model), ps, compute_ms, training=training,
                       byte_scale=byte_scale, max_ops=max_ops, merge_reads=True)


def check_emulation(config: Any) -> None:
    """--emulate-gpu's settings (``config.model``, ``compute_ms``, ``byte_scale``,
    ``max_ops``; either frontend's config), each error naming its flag."""
    replay_profile(config.model)  # a clear error where there is none
    if not config.compute_ms > 0:
        raise ValueError(f"--compute-ms must be > 0, got {config.compute_ms}")
    if config.byte_scale is not None and not 0 < config.byte_scale <= 1:
        raise ValueError(f"--byte-scale must be in (0, 1], got {config.byte_scale}")
    if not 1 <= config.max_ops <= 1000:
        raise ValueError(f"--max-ops must be in 1..1000, got {config.max_ops}")


def emulated_byte_scale(config: Any, pull_bytes: int, push_bytes: int = 0,
                        per_step: int = EMULATED_BYTES_PER_STEP) -> float:
    """--byte-scale (``config.byte_scale``), or the largest scale that keeps the
    ``config.workers`` workers' pulls and pushes per step within ``per_step`` and one
    worker's within EMULATED_BYTES_PER_WORKER."""
    if config.byte_scale is not None:
        return config.byte_scale
    own = max(1, pull_bytes + push_bytes)
    return min(1.0, per_step / (own * config.workers), EMULATED_BYTES_PER_WORKER / own)


def parse_rates(specs: Sequence[str]) -> list[dict[str, Any]]:
    """``auto`` (comm/comp = 1), ``auto:R`` (comm/comp = R) or a rate like ``500mbit``."""
    from tictac_hooks.cluster.netns import rate_bits
    out = []
    for spec in specs:
        spec = spec.strip()
        if spec.startswith("auto"):
            _, _, ratio = spec.partition(":")
            try:
                value = float(ratio) if ratio else 1.0
            except ValueError:
                value = -1.0
            if not 0.05 <= value <= 20:
                raise ValueError(f"bandwidth {spec!r}: write auto or auto:R with R the "
                                 "comm/comp ratio in [0.05, 20]")
            out.append({"kind": "ratio", "value": value, "spec": spec})
        else:
            out.append({"kind": "rate", "value": rate_bits(spec), "spec": spec})
    if not out:
        raise ValueError("--bandwidth needs at least one rate")
    return out


def machine_load() -> MachineLoad:
    load = os.getloadavg()
    return MachineLoad(loadavg_1m=load[0], loadavg_5m=load[1], cpus=os.cpu_count() or 0)


def source_revision(path: str | None = None) -> tuple[str, bool]:
    """(commit, dirty) of the git checkout holding ``path`` (default: this package):
    ``git rev-parse HEAD``, and whether a tracked file differs from it. ("", False)
    where it is no git checkout (an installed wheel) or git is missing."""
    where = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0:
            return "", False
        status = subprocess.run(["git", "-C", where, "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "", False
    return head.stdout.strip(), bool(status.stdout.strip()) or status.returncode != 0


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command line that ran this process (``argv``, default ``sys.argv``), the
    program by its base name, ``tictac`` for ``python -m tictac_hooks.cli``: e.g.
    ``tictac bench --quick``."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cli.py")
    program = "tictac" if os.path.abspath(argv[0]) == cli else os.path.basename(argv[0])
    return shlex.join([program] + argv[1:])


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """What every result JSON records of how it was made: ``commit`` and ``dirty``
    (:func:`source_revision`) and ``command`` (:func:`command_line`)."""
    commit, dirty = source_revision()
    return {"commit": commit, "dirty": dirty, "command": command_line(argv)}


def _worker_cpus(config: BenchConfig, w: int, total: int) -> dict[int, int] | None:
    """With ``pin_workers``: worker k of each set (interposed, direct) on the k-th CPU
    this process may use, so that the workers of a step do not share a core (one
    machine per worker, as on a cluster; the PS and the client run anywhere)."""
    if not config.pin_workers:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return {i: cpus[(i % w) % len(cpus)] for i in range(total)}


def run(config: BenchConfig, progress: Callable[[str], None] | None = None,
        command: str | None = None) -> BenchRun:
    """Runs one configuration (every bandwidth of it) and returns its result, which
    records the package's commit and ``command`` (default: this process's command
    line)."""
    from tictac_hooks.cluster import netns
    from tictac_hooks.cluster.launcher import LocalCluster
    config.validate()
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    rates = parse_rates(config.bandwidth)
    w = config.workers
    direct = DIRECT in config.schedules
    total_workers = 2 * w if direct else w
    direct_tasks = list(range(w, 2 * w)) if direct else []
    if config.loopback:
        shaped, why = False, "--loopback given"
    else:
        shaped, why = netns.available()
    if not shaped:
        banner = ("=" * 78 + f"\nWARNING: NO SHAPED NETWORK ({why}).\nFalling back to "
                  "LOOPBACK: these numbers do NOT measure a shaped link; TicTac's gains\n"
                  "need a communication-bound setting. Run as root with iproute2 (tc).\n"
                  + "=" * 78)
        say(banner)
    batch = config.batch or workloads.default_batch(config.model, config.mode)
    started = time.time()
    load_before = machine_load()
    with tempfile.TemporaryDirectory(prefix="tictac-bench-") as tmp:
        cfg = {
            "label": config.label, "model": config.model, "mode": config.mode, "ps": config.ps,
            "batch": batch, "interposed_tasks": list(range(w)), "direct_tasks": direct_tasks,
            "schedules": list(config.schedules), "rates": rates, "steps": config.steps,
            "block_steps": config.block_steps, "settle_steps": config.settle_steps,
            "warmup": config.warmup, "profile_steps": config.profile_steps,
            "skip_timeout": config.skip_timeout, "window_bytes": config.window_bytes,
            "check_rounds": config.check_rounds, "check_block_steps": config.check_block_steps,
            "conserve_after_s": config.conserve_after_s,
            "shaped": shaped, "calibrate": config.calibrate,
            "profile_rate_bits": parse_rates([PROFILE_RATE])[0]["value"],
            "out": os.path.join(tmp, "result.json"),
        }
        if config.emulated:
            given = config.byte_scale is not None
            whole = bench_replay(config.model, config.ps, config.compute_ms, config.max_ops,
                                 training=config.mode == "training")
            scale = emulated_byte_scale(config, whole.pull_bytes, whole.push_bytes)
            config.byte_scale = scale
            cfg["emulate"] = {"compute_ms": config.compute_ms, "byte_scale": scale,
                              "max_ops": config.max_ops, "model": config.model}
            say(f"[bench {config.label}] emulated GPU workers: {config.compute_ms:g} ms of "
                f"compute per step, bytes and links x {scale:.3g}"
                + (" (--byte-scale)" if given else
                   f" (picked: pulls and pushes at most {EMULATED_BYTES_PER_STEP / 2**20:.0f} "
                   f"MiB a step, a worker's at most "
                   f"{EMULATED_BYTES_PER_WORKER / 2**20:.0f} MiB)"))
        env = dict(WORKER_ENV)
        queues = None  # the shaped queues' counters (shaped runs only)
        if shaped:
            netns.cleanup_stale()
            # Profiling (compute time, the trace) runs on links far faster than this
            # machine can fill, so that communication costs the step next to nothing;
            # the client then reshapes to each measured rate. (At 10 Gbit/s, ResNet-50's
            # 180 MiB per worker and step took 0.3 s, which counted as compute.)
            first = PROFILE_RATE
            hosts = netns.cluster_hosts(config.ps, total_workers)
            with netns.ShapedNetwork(hosts, rate=first) as net, LocalCluster(
                    num_ps=config.ps, num_workers=total_workers, rendezvous=True,
                    backend=config.backend,
                    direct_workers=direct_tasks, network=net, env=env,
                    skip_after_s=config.skip_timeout,
                    window_bytes=config.window_bytes,
                    worker_cpus=_worker_cpus(config, w, total_workers),
                    workers_load_native=config.emulated) as cluster:
                say(f"[bench {config.label}] shaped network: {len(hosts)} namespaces "
                    f"({', '.join(hosts)}), PS {cluster.ps_addresses}")
                result = _drive(cluster, cfg, tmp, config.timeout_s, net, say)
                queues = read_queues(net, say, config.label)
        else:
            with LocalCluster(num_ps=config.ps, num_workers=total_workers, rendezvous=True,
                              backend=config.backend, direct_workers=direct_tasks, env=env,
                              skip_after_s=config.skip_timeout,
                              window_bytes=config.window_bytes,
                              worker_cpus=_worker_cpus(config, w, total_workers),
                              workers_load_native=config.emulated) as cluster:
                result = _drive(cluster, cfg, tmp, config.timeout_s, None, say)
    commit, dirty = source_revision()
    # the client's output (read from its file) with what the runner knows
    return BenchRun.from_json({
        **result, "config": config_record(config, batch).to_json(),
        "network": {"shaped": shaped, "reason": "" if shaped else why,
                    **({"queues": queues} if queues is not None else {})},
        "machine": {"before": load_before.to_json(), "after": machine_load().to_json()},
        "wall_s": time.time() - started, "commit": commit, "dirty": dirty,
        "command": command_line() if command is None else command})


def read_queues(net: Any, say: Callable[[str], None], label: str) -> Any:
    """The shaped queues' counters at a run's end, said in one line (None, said too,
    where ``tc`` could not give them: the run's result stands without them)."""
    from tictac_hooks.cluster import netns
    try:
        queues = net.queue_stats()
    except (netns.NetworkError, ValueError, OSError, subprocess.SubprocessError) as e:
        say(f"[bench {label}] the shaped queues' counters could not be read: {e}")
        return None
    say(f"[bench {label}] {netns.drops_line(queues)}")
    return queues


def config_record(config: BenchConfig, batch: int) -> BenchConfigRecord:
    """``config`` as its result records it, with the per-worker batch it ran."""
    return BenchConfigRecord(**{**dataclasses.asdict(config), "batch": batch,
                                "label": config.label})


def _drive(cluster: Any, cfg: dict, tmp: str, timeout_s: float, net: Any,
           say: Callable[[str], None]) -> dict:
    groups = {}
    for task in cluster.tasks:
        with contextlib.suppress(OSError):
            groups[f"{task.job}{task.index}"] = os.getpgid(task.process.pid)
    cfg = dict(cfg, ps_addresses=cluster.ps_addresses, task_groups=groups,
               masters=[cluster.worker_addresses[cfg["interposed_tasks"][0]]]
               + ([cluster.worker_addresses[cfg["direct_tasks"][0]]] if cfg["direct_tasks"]
                  else []))
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    argv = [sys.executable, "-m", "tictac_hooks.bench.client", path]
    returncode = serve_client(cluster, argv, net, timeout_s)
    if returncode is None:
        return _cut_short(cfg["out"], f"the benchmark client did not finish "
                                      f"within {timeout_s:.0f} s (--timeout)", say)
    return client_result(cluster, cfg["out"], returncode)


def serve_client(cluster: Any, argv: list[str], net: Any, timeout_s: float) -> int | None:
    """Runs a benchmark client ``argv`` in the cluster's ``client`` namespace and answers
    its reshape requests (one JSON event per line on its stdout: ``{"event":
    "reshape", "rate_bits": N}`` gets ``shaped`` once ``net`` runs at N, or
    ``unshaped`` without a shaped network; ``{"event": "done"}`` ends it). Its exit
    status; None where it did not end within ``timeout_s`` (it is killed)."""
    env = cluster.child_env()
    env.pop("TF_NUM_INTEROP_THREADS", None)
    env.pop("TF_NUM_INTRAOP_THREADS", None)
    proc = cluster.spawn_in("client", argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not sel.select(timeout=min(left, 5.0)):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "reshape":
                if net is not None:
                    net.reshape(rate=int(event["rate_bits"]))
                proc.stdin.write("shaped\n" if net is not None else "unshaped\n")
                proc.stdin.flush()
            elif event.get("event") == "done":
                break
        return proc.wait(60)
    finally:
        sel.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def client_result(cluster: Any, out: str, returncode: int) -> dict:
    """The result file ``out`` a client wrote; where it exited badly or wrote none, an
    error that carries every task's log tail."""
    if returncode != 0 or not os.path.exists(out):
        logs = "\n".join(f"--- {t.job}{t.index}:\n{t.log(1500)}" for t in cluster.tasks)
        raise RuntimeError(f"the benchmark client failed (exit {returncode}); task "
                           f"logs:\n{logs}")
    with open(out) as f:
        return json.load(f)


def _cut_short(out: str, why: str, say: Callable[[str], None]) -> dict:
    """The bandwidths the client finished before ``why`` (it saves each as it ends),
    marked ``incomplete``; raises TimeoutError where it finished none."""
    try:
        with open(out) as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError):
        result = {}
    if not result.get("runs"):
        raise TimeoutError(f"{why}, before any bandwidth was measured")
    done = ", ".join(f"{r['rate_bits'] / 1e6:.0f} Mbit/s" for r in result["runs"])
    say(f"WARNING: {why}; keeping the {len(result['runs'])} bandwidth(s) it finished "
        f"({done})")
    result["incomplete"] = why
    return result
