"""Overhead of the TicTac gate on a shaped link (default 1 Gbit/s): prints a table.

One gated PS (--backend native, the default, or proxy) and two workers, each task in
its own network namespace behind a link shaped to --rate in both directions (tbf;
--latency-ms with netem where the kernel has it). Worker 0 reaches the PS through the
gate (no schedule installed), worker 1 a plain TensorFlow server on the same PS host
(native: a plain twin PS; proxy: the TensorFlow server behind the rendezvous), over the
same PS link; only one of them runs at a time, so each measurement is "1 PS, 1 worker".
The client runs in a namespace of its own.

1. The link: a bulk TCP transfer PS -> worker 0, against the configured rate.
2. RecvTensor throughput: fetching --tp-num-vars x --tp-var-mib of PS variables,
   interposed vs direct, alternating (ABBA) fetches.
3. Graph-mode step time of a communication-heavy model (--num-vars x --var-mib
   variables; SGD, so every step pulls and pushes them all), interposed vs direct,
   interleaved in blocks of --block-steps steps (ABBA), medians and the ratio.

Without root / tc it falls back to loopback and says so (the numbers then measure CPU
cost, not a shaped link).

--relaunch N measures step 3 another way, for fast links where the PS's plain twin and
the second worker share the 2 cores with what is measured (at 10 Gbit/s the twin's step
time swung 30 % between runs): N rounds, each launching a 1-PS 1-worker cluster three
times in a rotating order, with a plain PS, the gated PS and a plain PS again (an A/A
control: what two launches of the same thing differ by). PS and worker are pinned to
one core each (--no-pin: not). Per round, gate / plain and plain again / plain, each
the ratio of the launches' median step times; the medians of those ratios with their
bootstrap 95 % intervals.

--bypass N takes the launches' own variance out (two launches of the same plain PS
differ by up to 14 % at 10 Gbit/s here): one launch of the native gated PS, N rounds of
three blocks of --block-steps steps, the gate bypassed (the `bypass 1` control verb:
the process hands RecvTensor to TensorFlow's stock code, exactly as a plain PS), not
bypassed, and bypassed again (the A/A control), in rotating order; the ratios per round
of block medians as above. It measures what the gate's own path costs.

  sudo .venv/bin/python benchmarks/bench_shaped_overhead.py [--rate 1gbit]
      [--latency-ms 0] [--blocks 6] [--block-steps 4] [--relaunch 6 --relaunch-steps 40 | --bypass 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.lab import linkmeter  # noqa: E402
from tictac_hooks.bench.metrics import median_ci  # noqa: E402
from benchmarks.lab.procstat import cpu_seconds as process_cpu_s  # noqa: E402
from tictac_hooks.cluster import netns  # noqa: E402
from tictac_hooks.cluster.launcher import LocalCluster  # noqa: E402
from tictac_hooks.bench.runner import provenance  # noqa: E402


def _abba(n: int):
    """Path order per round: (0, 1), (1, 0), (1, 0), (0, 1), ... (balances drift)."""
    for i in range(n):
        yield (0, 1) if i % 4 in (0, 3) else (1, 0)


def _timed_steps(run, n: int) -> list[float]:
    """Seconds of each of ``n`` calls of ``run`` (one step each)."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        out.append(time.perf_counter() - t)
    return out


def client(cfg: dict) -> dict:
    """Runs in the client namespace: the measurements, returned as JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    from tictac_hooks.bench.workloads import comm_heavy as comm_heavy_model

    from tictac_hooks.enforce.client import connect

    workers = cfg["workers"]  # [through the rendezvous, direct]
    out: dict = {}

    # RecvTensor throughput: the same PS variables, read by either worker.
    g = tf.Graph()
    with g.as_default():
        with tf.device("/job:ps/task:0"):
            vs = [tf.compat.v1.get_variable(f"t{i}", shape=[cfg["tp_var_mib"] << 18],
                                            initializer=tf.compat.v1.ones_initializer())
                  for i in range(cfg["tp_num_vars"])]
        fetch = []
        for w in (0, 1):
            with tf.device(f"/job:worker/task:{w}"):
                fetch.append(tf.add_n([tf.reduce_sum(v) for v in vs]))
        init = tf.compat.v1.global_variables_initializer()
    sessions = [tf.compat.v1.Session("grpc://" + a, graph=g) for a in workers]
    for s in sessions:  # a native PS's plain twin holds its own copy
        s.run(init)
    times: dict[int, list[float]] = {0: [], 1: []}
    for w in (0, 1):
        sessions[w].run(fetch[w])  # warm-up
    for order in _abba(cfg["tp_reps"]):
        for w in order:
            times[w] += _timed_steps(lambda: sessions[w].run(fetch[w]), 1)
    for s in sessions:
        s.close()
    out["tp_seconds"] = times

    # Step time: a communication-heavy model, blocks of steps, interleaved.
    runs = []
    for w in (0, 1):
        g, init, train = comm_heavy_model(w, cfg["num_vars"], cfg["var_mib"])
        s = tf.compat.v1.Session("grpc://" + workers[w], graph=g)
        s.run(init)
        for _ in range(cfg["warmup"]):
            s.run(train)
        runs.append((s, train))
    steps: dict[int, list[float]] = {0: [], 1: []}
    blocks: dict[int, list[float]] = {0: [], 1: []}
    for order in _abba(cfg["blocks"]):
        for w in order:
            s, train = runs[w]
            block = _timed_steps(lambda: s.run(train), cfg["block_steps"])
            steps[w] += block
            blocks[w].append(statistics.median(block))
    for s, _ in runs:
        s.close()
    out["step_seconds"], out["block_medians"] = steps, blocks
    steps = list(connect(cfg["ps"]).stats().steps)
    out["rendezvous_steps_by_worker"] = {}
    for st in steps:
        key = st.worker
        out["rendezvous_steps_by_worker"][key] = out["rendezvous_steps_by_worker"].get(key, 0) + 1
    return out


def step_client(cfg: dict) -> dict:
    """Runs in the client namespace (--relaunch): the step times of one launch."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    from tictac_hooks.bench.workloads import comm_heavy as comm_heavy_model

    from tictac_hooks.enforce.client import connect

    g, init, train = comm_heavy_model(0, cfg["num_vars"], cfg["var_mib"])
    with tf.compat.v1.Session("grpc://" + cfg["worker"], graph=g) as s:
        s.run(init)
        for _ in range(cfg["warmup"]):
            s.run(train)
        steps = _timed_steps(lambda: s.run(train), cfg["steps"])
    out = {"step_seconds": steps}
    if cfg["gated"]:  # proof that the steps went through the gate
        out["gated_steps"] = len(connect(cfg["ps"]).stats().steps)
    return out


def bypass_client(cfg: dict) -> dict:
    """Runs in the client namespace (--bypass): one launch of a native gated PS, blocks
    of steps with its gate bypassed (the stock RecvTensor path in the same process,
    "plain") or not ("gate"), in rotating order; a second bypassed block per round is
    the A/A control."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    from tictac_hooks.bench.workloads import comm_heavy as comm_heavy_model

    from tictac_hooks.enforce.client import connect

    gate = connect(cfg["ps"])
    g, init, train = comm_heavy_model(0, cfg["num_vars"], cfg["var_mib"])
    out: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    cpu: dict[str, list[float]] = {k: [] for k in KINDS}  # PS CPU seconds per block
    gated = 0
    with tf.compat.v1.Session("grpc://" + cfg["worker"], graph=g) as s:
        s.run(init)
        for _ in range(cfg["warmup"]):
            s.run(train)
        try:
            for order in rotations(cfg["rounds"]):
                for kind in order:
                    gate.call("bypass", "0" if kind == "gate" else "1")
                    s.run(train)  # not timed: the switch lands between steps
                    before = len(gate.stats().steps) if kind == "gate" else 0
                    c0 = process_cpu_s(cfg["ps_pid"])
                    block = _timed_steps(lambda: s.run(train), cfg["steps"])
                    cpu[kind].append(process_cpu_s(cfg["ps_pid"]) - c0)
                    if kind == "gate":
                        gated += len(gate.stats().steps) - before
                    out[kind].append(block)
        finally:
            gate.call("bypass", "0")
    return {"step_seconds": out, "gated_steps": gated, "ps_cpu_seconds": cpu}


# A/A control: a second launch of a plain PS in every round (with --bypass: a second
# bypassed block).
KINDS = ("plain", "gate", "plain again")


def rotations(rounds: int):
    """Launch order per round: each kind once, the order rotating (balances drift)."""
    for i in range(rounds):
        k = i % len(KINDS)
        yield KINDS[k:] + KINDS[:k]


def _pins(args: argparse.Namespace) -> dict[str, dict[int, int]]:
    """LocalCluster arguments that pin the PS and the worker to a core each (unless
    --no-pin, or there is one core)."""
    cpus = sorted(os.sched_getaffinity(0))
    if not args.pin or len(cpus) < 2:
        return {}
    return dict(ps_cpus={0: cpus[0]}, worker_cpus={0: cpus[-1]})


def relaunch(args: argparse.Namespace, net, cfg: dict) -> dict[str, list[list[float]]]:
    """Step times per kind and round, each round's launches in rotating order."""
    pin = _pins(args)
    out: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    for r, order in enumerate(rotations(args.relaunch)):
        for kind in order:
            with LocalCluster(num_ps=1, num_workers=1, rendezvous=[kind == "gate"],
                              network=net, backend=args.backend, **pin) as c:
                run = dict(cfg, worker=c.worker_addresses[0], ps=c.ps_addresses[0],
                           gated=kind == "gate", steps=args.relaunch_steps)
                result = run_client(c, run, "client" if net else None, args.timeout,
                                    flag="--step-client")
            if kind == "gate" and result["gated_steps"] < args.relaunch_steps:
                raise SystemExit(f"the gate saw {result['gated_steps']} steps of "
                                 f"{args.relaunch_steps}: the worker bypassed it")
            out[kind].append(result["step_seconds"])
            print(f"round {r + 1}/{args.relaunch} {kind}: median "
                  f"{statistics.median(result['step_seconds']) * 1e3:.1f} ms",
                  file=sys.stderr, flush=True)
    return out


def bypass_blocks(args: argparse.Namespace, net, cfg: dict
                  ) -> tuple[dict[str, list[list[float]]], dict[str, list[float]]]:
    """Step times per kind and round, and the PS's CPU seconds per block, from one
    launch of a native gated PS (--bypass)."""
    if args.backend != "native":
        raise SystemExit("--bypass measures the native gate against its own bypass; "
                         "the proxy has none (use --relaunch)")
    pin = _pins(args)
    with LocalCluster(num_ps=1, num_workers=1, rendezvous=[True], network=net,
                      backend="native", **pin) as c:
        run = dict(cfg, worker=c.worker_addresses[0], ps=c.ps_addresses[0],
                   rounds=args.bypass, steps=args.block_steps,
                   ps_pid=c.task("ps", 0).process.pid)
        result = run_client(c, run, "client" if net else None, args.timeout,
                            flag="--bypass-client")
    want = args.bypass * args.block_steps
    if result["gated_steps"] < want:
        raise SystemExit(f"the gate recorded {result['gated_steps']} of the {want} steps "
                         "timed through it")
    return result["step_seconds"], result["ps_cpu_seconds"]


def cpu_bound(steps: dict[str, list[list[float]]], cpu: dict[str, list[float]]) -> dict:
    """PS CPU seconds per step of each kind (totals over its blocks), and the gate's
    extra CPU per step as a share of the plain median step: with no order installed the
    gate holds nothing back, so its own work bounds what it can add to a step."""
    per_step = {k: sum(cpu[k]) / sum(len(b) for b in steps[k]) for k in cpu}
    plain_step = statistics.median([t for b in steps["plain"] for t in b])
    return {"cpu_per_step": per_step, "plain_step": plain_step,
            "gate_extra": per_step["gate"] - per_step["plain"],
            "aa_extra": per_step["plain again"] - per_step["plain"],
            "bound": (per_step["gate"] - per_step["plain"]) / plain_step}


def relaunch_ratios(steps: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    """Per round: each kind's launch median over the plain launch's median."""
    plain = [statistics.median(r) for r in steps["plain"]]
    return {k: [statistics.median(r) / p for r, p in zip(steps[k], plain)]
            for k in KINDS[1:]}


def report_relaunch(args: argparse.Namespace, shaped: bool, steps: dict,
                    cpu: dict | None = None) -> dict:
    where = (f"shaped link {args.rate}" if shaped else "LOOPBACK FALLBACK - NOT A SHAPED LINK")
    pinned = "PS and worker on one core each" if args.pin else "not pinned"
    if args.bypass:
        print(f"\n## TicTac native gate overhead against its own bypass, one PS process "
              f"({where}, {pinned})\n")
        print(f"{args.bypass} rounds x {len(KINDS)} blocks (rotating order) of "
              f"{args.block_steps} steps after {args.warmup} warm-up steps; plain: the same "
              f"PS with its gate bypassed (TensorFlow's own RecvTensor path); "
              f"{args.num_vars} x {args.var_mib} MiB model, no schedule installed\n")
        unit = "block"
    else:
        print(f"\n## TicTac {args.backend} gate overhead, one cluster launch per measurement "
              f"({where}, {pinned})\n")
        print(f"{args.relaunch} rounds x {len(KINDS)} launches (rotating order), "
              f"{args.warmup} warm-up + {args.relaunch_steps} steps each, "
              f"{args.num_vars} x {args.var_mib} MiB model, no schedule installed\n")
        unit = "launch"
    print(f"| {unit} | median step per {unit}, ms | / plain, per round: median (95 % CI), "
          "range |")
    print("|---|---|---|")
    ratios = relaunch_ratios(steps)
    summary = {}
    for kind in KINDS:
        meds = ", ".join(f"{statistics.median(r) * 1e3:.1f}" for r in steps[kind])
        cell = "1"
        if kind in ratios:
            xs = ratios[kind]
            lo, hi = median_ci(xs) if len(xs) > 1 else (xs[0], xs[0])
            m = statistics.median(xs)
            summary[kind] = {"median": m, "ci": [lo, hi], "ratios": xs}
            cell = (f"{(m - 1) * 100:+.1f} % ({(lo - 1) * 100:+.1f} to {(hi - 1) * 100:+.1f} %), "
                    f"{(min(xs) - 1) * 100:+.1f} to {(max(xs) - 1) * 100:+.1f} %")
        print(f"| {kind} | {meds} | {cell} |")
    if cpu:
        b = cpu_bound(steps, cpu)
        summary["cpu"] = b
        per = b["cpu_per_step"]
        print(f"\nPS process CPU per step: plain {per['plain'] * 1e3:.1f} ms, gate "
              f"{per['gate'] * 1e3:.1f} ms, plain again {per['plain again'] * 1e3:.1f} ms; "
              f"the gate's extra {b['gate_extra'] * 1e3:+.2f} ms per step (A/A "
              f"{b['aa_extra'] * 1e3:+.2f} ms) is {b['bound'] * 100:+.2f} % of the plain "
              f"median step ({b['plain_step'] * 1e3:.1f} ms): with no order installed the "
              f"gate holds nothing back, so this bounds its step-time overhead")
    gate, aa = summary["gate"], summary["plain again"]
    print(f"\nA/A control: two {unit}s of a plain PS differ by a median "
          f"{(aa['median'] - 1) * 100:+.1f} % (interval {(aa['ci'][0] - 1) * 100:+.1f} to "
          f"{(aa['ci'][1] - 1) * 100:+.1f} %)")
    if shaped and netns.rate_bits(args.rate) in (10 ** 9, 10 ** 10):
        met = gate["median"] <= 1.01
        print(f"target (native backend): step-time overhead <= 1 % at 1 and 10 Gbit/s -> "
              f"{'met' if met else 'NOT met'} in this run (median "
              f"{(gate['median'] - 1) * 100:+.1f} %; the interval's upper end "
              f"{(gate['ci'][1] - 1) * 100:+.1f} %)")
    return summary


def run_client(cluster: LocalCluster, cfg: dict, host: str | None, timeout_s: float,
               flag: str = "--client") -> dict:
    argv = [sys.executable, os.path.abspath(__file__), flag, json.dumps(cfg)]
    popen = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = cluster.spawn_in(host, argv, **popen) if host else cluster.spawn(argv, **popen)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit(f"the benchmark client did not finish within {timeout_s} s; "
                         f"PS log:\n{cluster.task('ps', 0).log()}")
    if proc.returncode != 0:
        raise SystemExit(f"the benchmark client failed ({proc.returncode}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def report(args: argparse.Namespace, shaped: bool, link: dict | None, r: dict) -> None:
    where = (f"shaped link {args.rate}, one-way latency {args.latency_ms} ms" if shaped
             else "LOOPBACK FALLBACK - NOT A SHAPED LINK")
    print(f"\n## TicTac {args.backend} gate overhead ({where})\n")
    print(f"| measurement | direct | {args.backend} gate | gate / direct |")
    print("|---|---|---|---|")
    if link:
        want = netns.rate_bits(args.rate)
        print(f"| link PS->worker, TCP bulk {args.link_mib} MiB (configured {want / 1e6:.0f} "
              f"Mbit/s) | wire {link['wire_bits'] / 1e6:.1f} Mbit/s "
              f"({(link['wire_bits'] / want - 1) * 100:+.1f} %), goodput "
              f"{link['goodput_bits'] / 1e6:.1f} Mbit/s | | |")
    gib = args.tp_num_vars * args.tp_var_mib / 1024
    tp = {w: gib / statistics.median(r["tp_seconds"][str(w)]) for w in (0, 1)}
    print(f"| RecvTensor throughput, {args.tp_num_vars} x {args.tp_var_mib} MiB, "
          f"{args.tp_reps} fetches each | {tp[1] * 8 * 1.073741824:.3f} Gbit/s | "
          f"{tp[0] * 8 * 1.073741824:.3f} Gbit/s | {tp[0] / tp[1]:.3f} |")
    st = {w: statistics.median(r["step_seconds"][str(w)]) for w in (0, 1)}
    pairs = [a / b for a, b in zip(r["block_medians"]["0"], r["block_medians"]["1"])]
    print(f"| step time, {args.num_vars} x {args.var_mib} MiB model, no schedule, "
          f"{args.blocks} blocks x {args.block_steps} steps each | {st[1] * 1e3:.1f} ms | "
          f"{st[0] * 1e3:.1f} ms | {st[0] / st[1]:.3f} (overhead "
          f"{(st[0] / st[1] - 1) * 100:+.1f} %) |")
    print(f"\nper-block overhead (gate block median / adjacent direct block median): "
          f"median {(statistics.median(pairs) - 1) * 100:+.1f} %, min "
          f"{(min(pairs) - 1) * 100:+.1f} %, max {(max(pairs) - 1) * 100:+.1f} %; step-time "
          f"quartiles direct {_q(r['step_seconds']['1'], .25) * 1e3:.0f}-"
          f"{_q(r['step_seconds']['1'], .75) * 1e3:.0f} ms, gate "
          f"{_q(r['step_seconds']['0'], .25) * 1e3:.0f}-"
          f"{_q(r['step_seconds']['0'], .75) * 1e3:.0f} ms")
    print(f"the gate saw steps per destination: {r['rendezvous_steps_by_worker']} "
          f"(the direct worker must not appear)")
    if shaped and netns.rate_bits(args.rate) in (10 ** 9, 10 ** 10):
        print(f"target (native backend): step-time overhead <= 1 % at 1 and 10 Gbit/s -> "
              f"{'met' if st[0] / st[1] <= 1.01 else 'NOT met'} in this run")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="link rate, both directions (default 1gbit)")
    p.add_argument("--latency-ms", type=float, default=0.0,
                   help="one-way latency between hosts (default 0; needs netem)")
    p.add_argument("--num-vars", type=int, default=16)
    p.add_argument("--var-mib", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2, help="steps per worker first (default 2)")
    p.add_argument("--blocks", type=int, default=6, help="blocks per path (default 6)")
    p.add_argument("--block-steps", type=int, default=4, help="steps per block (default 4)")
    p.add_argument("--tp-num-vars", type=int, default=4)
    p.add_argument("--tp-var-mib", type=int, default=16)
    p.add_argument("--tp-reps", type=int, default=8, help="fetches per path (default 8)")
    p.add_argument("--link-mib", type=int, default=64, help="bulk link test size (default 64)")
    p.add_argument("--loopback", action="store_true", help="do not shape: loopback only")
    p.add_argument("--backend", choices=("native", "proxy"), default="native")
    p.add_argument("--timeout", type=float, default=1200.0,
                   help="bound on the whole client run, seconds (default 1200)")
    p.add_argument("--relaunch", type=int, default=0, metavar="ROUNDS",
                   help="measure step time over ROUNDS rounds of cluster launches (plain, "
                        "gate, plain again) instead of the three in-cluster measurements")
    p.add_argument("--relaunch-steps", type=int, default=40,
                   help="timed steps per launch with --relaunch (default 40)")
    p.add_argument("--bypass", type=int, default=0, metavar="ROUNDS",
                   help="measure step time in one launch of a native gated PS over ROUNDS "
                        "rounds of blocks (--block-steps each) with its gate bypassed, "
                        "not bypassed, bypassed again")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="with --relaunch/--bypass: do not pin the PS and the worker to a "
                        "core each")
    p.add_argument("--json", metavar="PATH", help="with --relaunch/--bypass: write the step times here")
    p.add_argument("--client", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--step-client", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--bypass-client", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        print(json.dumps(client(json.loads(args.client))), flush=True)
        return
    if args.step_client:
        print(json.dumps(step_client(json.loads(args.step_client))), flush=True)
        return
    if args.bypass_client:
        print(json.dumps(bypass_client(json.loads(args.bypass_client))), flush=True)
        return
    for name in ("blocks", "block_steps", "tp_reps", "num_vars", "tp_num_vars",
                 "relaunch_steps"):
        if not 1 <= getattr(args, name) <= 1000:
            p.error(f"--{name.replace('_', '-')} must be in 1..1000")
    if not 0 <= args.relaunch <= 100 or not 0 <= args.bypass <= 100:
        p.error("--relaunch and --bypass must be in 0..100")
    if args.relaunch and args.bypass:
        p.error("--relaunch and --bypass are two ways to measure; pick one")
    cfg = {k: getattr(args, k) for k in ("num_vars", "var_mib", "warmup", "blocks",
                                         "block_steps", "tp_num_vars", "tp_var_mib", "tp_reps")}
    ok, why = (False, "--loopback given") if args.loopback else netns.available(
        latency=args.latency_ms > 0)
    if not ok:
        print("=" * 78 + f"\nWARNING: NO SHAPED NETWORK ({why}).\nFalling back to LOOPBACK: "
              f"these numbers do NOT measure a {args.rate} link.\n" + "=" * 78,
              file=sys.stderr, flush=True)
        if args.relaunch or args.bypass:
            steps, cpu = _measured(args, None, cfg)
            _save(args, steps, cpu, report_relaunch(args, False, steps, cpu))
            return
        with LocalCluster(num_ps=1, num_workers=2, rendezvous=True, direct_workers=[1],
                          backend=args.backend) as c:
            cfg.update(workers=c.worker_addresses, ps=c.ps_addresses[0])
            result = run_client(c, cfg, None, args.timeout)
        report(args, False, None, result)
        return
    netns.cleanup_stale()
    if args.relaunch or args.bypass:
        with netns.ShapedNetwork(netns.cluster_hosts(1, 1), rate=args.rate,
                                 latency_ms=args.latency_ms) as net:
            steps, cpu = _measured(args, net, cfg)
        _save(args, steps, cpu, report_relaunch(args, True, steps, cpu))
        return
    with netns.ShapedNetwork(netns.cluster_hosts(1, 2), rate=args.rate,
                             latency_ms=args.latency_ms) as net:
        link = linkmeter.bulk_transfer(net, "ps0", "worker0", args.link_mib << 20, timeout_s=300)
        with LocalCluster(num_ps=1, num_workers=2, rendezvous=True, direct_workers=[1],
                          network=net, backend=args.backend) as c:
            cfg.update(workers=c.worker_addresses, ps=c.ps_addresses[0])
            print(f"cluster {c.spec}, direct {c.direct_spec()['ps']}; client in "
                  f"{net.namespace('client')} ({net.address('client')})", file=sys.stderr,
                  flush=True)
            result = run_client(c, cfg, "client", args.timeout)
    report(args, True, link, result)


def _measured(args: argparse.Namespace, net, cfg: dict) -> tuple[dict, dict | None]:
    """(step times per kind and round, PS CPU per block or None) by the chosen method."""
    if args.bypass:
        return bypass_blocks(args, net, cfg)
    return relaunch(args, net, cfg), None


def _save(args: argparse.Namespace, steps: dict, cpu: dict | None, summary: dict) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance(), "rate": args.rate, "backend": args.backend,
                       "pinned": args.pin,
                       "method": "bypass" if args.bypass else "relaunch",
                       "rounds": args.relaunch or args.bypass,
                       "steps": args.block_steps if args.bypass else args.relaunch_steps,
                       "step_seconds": steps, "summary": summary,
                       "ps_cpu_seconds": cpu}, f, indent=1)


if __name__ == "__main__":
    main()
