"""Where does a synchronous training step go, order by order, worker by worker?

Two questions: why TIC bought almost nothing on one-worker VGG-16 training (comm/comp
0.5, +2.3 % although the conv weights feed the conv forward pass and could hide the
fully-connected pulls), and, with ``--workers 2``, where a two-worker step spends the
time between the bound no order can beat (the pulls of every worker, then one worker's
pushes: bench/limit.py) and what it measures.

One configuration, as ``tictac bench`` runs it: a native-gate PS and the worker (plus
a direct worker on the PS's plain twin for "none", TensorFlow's default path), each in
its own network namespace behind a link shaped with tc; profiled over a fast link,
then the link reshaped so that comm/comp is ``--ratio`` the way ``--bandwidth auto:R``
computes it, and TIC computed and installed with the bench's own code (its pacing).
Then, per order, a few plain steps and ``--steps`` FULL_TRACE steps; each traced step
read by tictac_hooks.bench.timeline: when the first and last pulls arrive, when each
forward conv/matmul starts against its weights' arrival (the wait the transfer
caused), the compute device's busy and idle time (idle while pulls were still on the
way), where the pushes go against the backward pass, the gate's hand-back of each
transfer against the worker's arrival; beside it the simulator's predicted step per
order (bench/predict.py, as the bench calls it). With several workers, each traced
step is read on every worker, and the summary is that of the worker whose tower
(forward and backward) ended last: the one the step waits for.

    sudo .venv/bin/python benchmarks/probe_step_timeline.py \\
        [--model vgg16] [--mode training] [--workers 1] [--ratio 0.5] [--steps 3] \\
        [--orders none,rendezvous,tic] [--out FILE.json] [--loopback]

Needs root and tc (iproute2) for the shaped link; without them it says so and exits
(status 2) unless ``--loopback`` (the timeline at loopback speed: no comm/comp).
About 5 minutes for VGG-16 on two cores. Prints the summary table and writes the
JSON (``--out``, default results/probes/step-timeline/<model>-<mode>[-w<N>].json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tictac_hooks import flags as tictac_flags  # noqa: E402
from benchmarks.lab import timeline  # noqa: E402
from tictac_hooks.bench import limit, metrics, workloads  # noqa: E402
from tictac_hooks.bench.limit import LinkLimit  # noqa: E402
from tictac_hooks.bench.runner import (PROFILE_RATE, WORKER_ENV, client_result,  # noqa: E402
                                       parse_rates, provenance, serve_client)
from tictac_hooks.enforce.gate import DEFAULT_SKIP_AFTER_S, DEFAULT_WINDOW_BYTES  # noqa: E402

ORDERS = ("none", "rendezvous", "tic")
HERE = os.path.dirname(os.path.abspath(__file__))


def say(msg: str) -> None:
    print(f"[timeline] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- client

def trace_step(tf, session, fetches):
    md = tf.compat.v1.RunMetadata()
    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                   output_partition_graphs=True)
    t0 = time.time()
    session.run(fetches, options=opts, run_metadata=md)
    return time.time() - t0, md


def slim(tl: dict) -> dict:
    """A timeline without its per-op and per-transfer lists."""
    out = {k: v for k, v in tl.items() if k != "gate"}
    out["forward"] = {k: v for k, v in tl["forward"].items() if k != "ops"}
    out["pushes"] = {k: v for k, v in tl["pushes"].items() if k != "items"}
    if tl.get("gate"):
        out["gate"] = {k: v for k, v in tl["gate"].items() if k != "transfers"}
    return out


def inner(cfg: dict) -> dict:
    """Runs in the client's namespace (bench/client.py's role)."""
    from tictac_hooks.bench import client, predict
    from tictac_hooks.bench import orders as bench_orders
    from tictac_hooks.enforce.client import clear_everywhere, steps_everywhere
    from tictac_hooks.records import bytes_per_transfer
    r = client.Runner(cfg)
    tf = r.tf
    w = len(cfg["interposed_tasks"])
    say(f"graph built, parameters {r.work.param_bytes / 2**20:.1f} MiB; warm-up")
    for _ in range(cfg["warmup"]):
        for which in range(len(r.sessions)):
            r.step(which)
    clear_everywhere(cfg["ps_addresses"])
    # as bench/client.py run(): the rates' comp and the compute reference
    fast = bench_orders.settled_makespans(lambda: r.step(0).makespan, 3, 6)
    local = bench_orders.settled_makespans(lambda: r.compute_step().makespan, 3, 6)
    graphs, compute, late, traced = r.profile()
    pushes = bench_orders.traced_pushes(cfg, r, graphs, traced)
    recv_names = {op.name for g in graphs.values() for op in g.recvs}
    traced_comp, traced_bytes = bench_orders.traced_oracle(graphs, compute, late, cfg["ps"])
    comp = max(traced_comp, statistics.median(fast))
    compute_ref = statistics.median(local)
    bytes_per_ps = bench_orders.served_bytes_per_ps(steps_everywhere(cfg["ps_addresses"]),
                                              cfg["ps_addresses"]) or \
        [max(a, b) for a, b in zip(traced_bytes, r.variable_bytes_per_ps())]
    unit = metrics.comm_seconds(bytes_per_ps, w, 1.0)
    rate_bits = float(max(8000, round(unit / (cfg["ratio"] * comp), -5)))
    answer = client._ask({"event": "reshape", "rate_bits": rate_bits})
    comm = metrics.comm_seconds(bytes_per_ps, w, rate_bits)
    say(f"comp {comp * 1e3:.0f} ms (fast link), compute with no transfer "
        f"{compute_ref * 1e3:.0f} ms; link {rate_bits / 1e6:.0f} Mbit/s ({answer}): comm "
        f"{comm * 1e3:.0f} ms, comm/comp {comm / comp:.2f}")
    algos = [o for o in cfg["orders"] if o in bench_orders.ALGORITHMS + bench_orders.OPTIONAL]
    controllers = bench_orders.make_controllers(cfg, algos, graphs, compute, late, rate_bits)
    for which in range(len(r.sessions)):  # settle at the new rate
        r.step(which)
    out: dict = {}
    records = {}
    for name in cfg["orders"]:
        which = 1 if name == bench_orders.DIRECT else 0
        tasks = [f"worker:{k}" for k in
                 (cfg["direct_tasks"] if which else cfg["interposed_tasks"])]
        fetches = r.work.sets[which].fetches
        if name in controllers:
            controllers[name].resume()
        for _ in range(cfg["settle"]):
            r.step(which)
        plain = [r.step(which).step_time for _ in range(cfg["plain_steps"])]
        trace_step(tf, r.sessions[which], fetches)  # the first traced step: not kept
        steps = []
        for _ in range(cfg["steps"]):
            wall, md = trace_step(tf, r.sessions[which], fetches)
            steps.append((wall, md))
        if name in controllers:
            controllers[name].suspend()
        gate_steps = steps_everywhere(cfg["ps_addresses"]) if which == 0 else []
        for s in gate_steps:
            records[(s.ps, s.step_id, s.worker)] = s
        per_worker: dict[str, list] = {}
        for worker in tasks:
            for wall, md in steps:
                trace = timeline.read_step(md.step_stats, worker)
                part = timeline.partition_inputs(md.partition_graphs, worker)
                tl = timeline.analyze(trace, part, wall_s=wall)
                tl["gate"] = (timeline.gate_vs_worker(gate_steps, trace, worker)
                              if which == 0 else None)
                per_worker.setdefault(worker, []).append(tl)
        # the synchronous step waits for the worker whose tower ends last
        timelines = timeline.last_to_finish(per_worker)
        summary = timeline.summarize(timelines)
        gates = [tl["gate"] for tl in timelines if tl["gate"]]
        summary["gate_first_handback_ms"] = timeline.median_of(gates, "first_handback_ms")
        summary["gate_last_handback_ms"] = timeline.median_of(gates, "last_handback_ms")
        summary["gate_held_total_ms"] = timeline.median_of(gates, "held_total_ms")
        summary["handback_to_arrival_median_ms"] = timeline.median_of(
            gates, "handback_to_arrival_median_ms")
        out[name] = {"workers": tasks,
                     "last_worker": [tl["worker"] for tl in timelines],
                     "plain_step_ms": [round(s * 1e3, 1) for s in plain],
                     "plain_median_ms": round(statistics.median(plain) * 1e3, 1),
                     "summary": summary,
                     "per_worker": {w: timeline.summarize(tls)
                                    for w, tls in per_worker.items()},
                     # every op of the worker the step waited for; of each worker, the
                     # timeline without its per-op and per-transfer lists (the file
                     # stays small)
                     "traced": timelines,
                     "traced_per_worker": {w: [slim(tl) for tl in tls]
                                           for w, tls in per_worker.items()}
                     if len(tasks) > 1 else None}
        say(f"{name}: plain median {out[name]['plain_median_ms']:.0f} ms, traced "
            f"{summary['wall_ms']:.0f} ms")
    sizes = bytes_per_transfer(records.values(), recv_names)
    predicted, _ = bench_orders.predict_orders(cfg, list(cfg["orders"]), controllers, compute, comp,
                                     rate_bits, {f"ps:{i}": b for i, b in
                                                 enumerate(bytes_per_ps)},
                                     pushes, compute_ref, sizes)
    # the bound no order beats (bench/limit.py): the pulls of every worker through the
    # PS's egress, then, in training, one worker's pushes (synchronous training's barrier)
    pushed = [tl["pushes"]["bytes"] for o in out.values() for tl in o["traced"]
              if tl["pushes"]["bytes"]]
    push_one = statistics.median(pushed) * 8 / rate_bits if pushed else None
    bound = LinkLimit(compute_ref, limit.PROFILED, comm,
                      None if push_one is None else w * push_one,
                      limit.TRACED if push_one else "", push_one,
                      metrics.comm_seconds(bytes_per_ps, 1, rate_bits))
    r.close()
    return {"bound": {"pulls_ms": round(comm * 1e3, 1),
                      "one_worker_pushes_ms": None if push_one is None
                      else round(push_one * 1e3, 1),
                      "compute_ms": round(compute_ref * 1e3, 1),
                      "barrier_bound_ms": None if bound.sync_s is None
                      else round(bound.sync_s * 1e3, 1),
                      "link_bound_ms": round(bound.bound_s * 1e3, 1)},
            "param_bytes": r.work.param_bytes, "rate_bits": rate_bits, "comp_s": comp,
            "compute_s": compute_ref, "trace_op_sum_s": traced_comp, "comm_s": comm,
            "comm_comp_ratio": comm / comp, "bytes_per_ps": bytes_per_ps,
            "predicted_step_ms": {m: {n: round(s * 1e3, 1) for n, s in v.items()}
                                  for m, v in predicted.items()},
            "orders": out}


# ---------------------------------------------------------------------------- runner

def drive(cluster, net, cfg: dict, tmp: str, timeout_s: float) -> dict:
    """Starts this script as the client (in its namespace) and answers its reshapes
    (bench/runner.py's role)."""
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    argv = [sys.executable, os.path.abspath(__file__), "--inner", path]
    returncode = serve_client(cluster, argv, net, timeout_s)
    if returncode is None:
        raise RuntimeError(f"the probe's client did not finish within {timeout_s:.0f} s")
    return client_result(cluster, cfg["out"], returncode)


def sentences(orders: dict) -> list[str]:
    """The evidence in words, one order beside the other."""
    names = list(orders)
    s = {n: orders[n]["summary"] for n in names}

    def row(key: str) -> str:
        return " vs ".join(f"{s[n].get(key):.0f} ms ({n})" if s[n].get(key) is not None
                           else f"- ({n})" for n in names)
    return [f"step (traced): {row('wall_ms')}; plain: " + " vs ".join(
                f"{orders[n]['plain_median_ms']:.0f} ms ({n})" for n in names),
            f"compute starts at {row('compute_start_ms')}",
            f"first pull arrives at {row('first_pull_ms')}; last pull at "
            f"{row('last_pull_ms')}",
            f"conv forward: first starts at {row('conv_first_start_ms')}, last ends at "
            f"{row('conv_last_end_ms')}",
            f"fc forward: first starts at {row('matmul_first_start_ms')}",
            f"forward ops waiting for their weights, in all: "
            f"{row('forward_wait_for_weights_ms')}",
            f"compute busy {row('busy_ms')}; idle waiting for pulls "
            f"{row('idle_waiting_for_pulls_ms')}; idle in all {row('idle_ms')}",
            f"backward {row('backward_start_ms')} to {row('backward_end_ms')}; pushes "
            f"first leave at {row('pushes_first_leave_ms')}, last arrives at "
            f"{row('pushes_last_arrive_ms')} ({row('pushes_after_backward_ms')} after the "
            f"backward pass)",
            f"gate: first hand-back {row('gate_first_handback_ms')}, last "
            f"{row('gate_last_handback_ms')}, held in all {row('gate_held_total_ms')}, "
            f"hand-back to the worker's arrival (median) "
            f"{row('handback_to_arrival_median_ms')}"]


def outer(args: argparse.Namespace) -> int:
    from tictac_hooks.cluster import netns
    from tictac_hooks.cluster.launcher import LocalCluster
    from tictac_hooks.bench import orders as bench_orders
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    bad = [o for o in orders if o not in bench_orders.SCHEDULES + bench_orders.OPTIONAL]
    if bad or not orders:
        raise SystemExit(f"--orders: unknown {bad}; choose from {bench_orders.SCHEDULES}")
    shaped, why = (False, "--loopback given") if args.loopback else netns.available()
    if not shaped and not args.loopback:
        print(f"SKIPPED: no shaped network here ({why}). This probe needs root and tc "
              f"(iproute2) to shape the link to comm/comp {args.ratio}; --loopback runs it "
              f"unshaped.", flush=True)
        return 2
    w = args.workers
    direct = bench_orders.DIRECT in orders
    direct_tasks = list(range(w, 2 * w)) if direct else []
    total = 2 * w if direct else w
    batch = args.batch or workloads.default_batch(args.model, args.mode)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tictac-timeline-") as tmp:
        cfg = {"label": f"timeline {args.model}/{args.mode}", "model": args.model,
               "mode": args.mode, "ps": 1, "batch": batch, "interposed_tasks": list(range(w)),
               "direct_tasks": direct_tasks, "orders": orders, "ratio": args.ratio,
               "steps": args.steps, "plain_steps": args.plain_steps,
               "warmup": args.warmup, "settle": 2, "profile_steps": 3,
               "skip_timeout": DEFAULT_SKIP_AFTER_S, "window_bytes": DEFAULT_WINDOW_BYTES,
               "check_rounds": tictac_flags.DEFAULTS["check_rounds"],
               "check_block_steps": tictac_flags.DEFAULTS["check_block_steps"],
               "out": os.path.join(tmp, "result.json")}
        common = dict(num_ps=1, num_workers=total, rendezvous=True, backend="native",
                      direct_workers=direct_tasks, env=dict(WORKER_ENV),
                      skip_after_s=DEFAULT_SKIP_AFTER_S, window_bytes=DEFAULT_WINDOW_BYTES)
        if shaped:
            netns.cleanup_stale()
            hosts = netns.cluster_hosts(1, total)
            with netns.ShapedNetwork(hosts, rate=PROFILE_RATE) as net, \
                    LocalCluster(network=net, **common) as cluster:
                cfg.update(ps_addresses=cluster.ps_addresses,
                           masters=[cluster.worker_addresses[0]]
                           + ([cluster.worker_addresses[direct_tasks[0]]] if direct else []))
                result = drive(cluster, net, cfg, tmp, args.timeout)
        else:
            with LocalCluster(**common) as cluster:
                cfg.update(ps_addresses=cluster.ps_addresses,
                           masters=[cluster.worker_addresses[0]]
                           + ([cluster.worker_addresses[direct_tasks[0]]] if direct else []))
                result = drive(cluster, None, cfg, tmp, args.timeout)
    text = [timeline.summary_text({n: o["summary"] for n, o in result["orders"].items()})]
    text += sentences(result["orders"])
    text.append("simulator, predicted step ms: " + "; ".join(
        f"{m}: " + ", ".join(f"{n} {v:.0f}" for n, v in p.items())
        for m, p in result["predicted_step_ms"].items()))
    b = result["bound"]
    text.append(f"bound: pulls {b['pulls_ms']:.0f} ms + one worker's pushes "
                f"{b['one_worker_pushes_ms'] or 0:.0f} ms = barrier bound "
                f"{b['barrier_bound_ms'] or 0:.0f} ms; compute with no transfer "
                f"{b['compute_ms']:.0f} ms; link bound {b['link_bound_ms']:.0f} ms")
    text.append(f"link {result['rate_bits'] / 1e6:.0f} Mbit/s, comm/comp "
                f"{result['comm_comp_ratio']:.2f}, comp {result['comp_s'] * 1e3:.0f} ms, "
                f"compute with no transfer {result['compute_s'] * 1e3:.0f} ms")
    doc = {**provenance(), "model": args.model, "mode": args.mode, "workers": w, "ps": 1,
           "batch": batch, "ratio": args.ratio, "steps": args.steps,
           "network": {"shaped": shaped, "reason": "" if shaped else why},
           "machine": {"loadavg_1m_before": load[0], "loadavg_1m_after": os.getloadavg()[0],
                       "cpus": os.cpu_count()},
           **result, "summary_text": "\n".join(text)}
    out = args.out or os.path.join(HERE, "results", "probes", "step-timeline",
                                   f"{workloads.model_key(args.model)}-{args.mode}"
                                   + (f"-w{w}" if w > 1 else "") + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print("\n".join(text))
    print(f"written: {out}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inner"]:
        with open(argv[1]) as f:
            cfg = json.load(f)
        result = inner(cfg)
        with open(cfg["out"], "w") as f:
            json.dump(result, f)
        print(json.dumps({"event": "done"}), flush=True)
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vgg16")
    p.add_argument("--mode", default="training", choices=workloads.MODES)
    p.add_argument("--workers", type=int, default=1,
                   help="workers in the synchronous step (default 1); the timeline "
                        "read is the worker whose tower ends last, each step")
    p.add_argument("--ratio", type=float, default=0.5,
                   help="comm/comp, as tictac bench --bandwidth auto:R (default 0.5)")
    p.add_argument("--steps", type=int, default=3, help="traced steps per order")
    p.add_argument("--plain-steps", type=int, default=3, help="untraced steps per order")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--orders", default=",".join(ORDERS),
                   help="none (TensorFlow's default, direct path), rendezvous (the gate, "
                        "no order), tic, ... (default none,rendezvous,tic)")
    p.add_argument("--loopback", action="store_true",
                   help="no shaped link (no root/tc needed): loopback speed")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    parse_rates([f"auto:{args.ratio}"])  # the bench's range check
    if args.workers < 1:
        p.error(f"--workers must be at least 1, got {args.workers}")
    return outer(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
