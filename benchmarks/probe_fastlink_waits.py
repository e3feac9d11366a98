"""Where does an enforced order lose time on a fast link?

One launch of a native PS and 2 workers on loopback (the fastest link there is), one
in-graph step for both workers, blocks of TensorFlow's order (schedule cleared) and of
TIC's alternating. Per (step, worker) from the gate's records: when its requests came
(the spread from the first to the last arrival), how long responses that were ready
waited in the gate for their turn, and the span from the first arrival to the last
hand-back; beside the client's step time. An order that costs at a fast link shows
here whether the cost is in the gate (held responses) or in the workers (requests
that come later, compute that starts later).

    .venv/bin/python benchmarks/probe_fastlink_waits.py resnet50 inference 6 5 [RATE_BYTES_PER_S]
    # MODEL MODE ROUNDS STEPS_PER_BLOCK [pace rate]; about 3 minutes
"""
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tensorflow as tf  # noqa: E402

from tictac_hooks.bench import workloads  # noqa: E402
from tictac_hooks.run.config import RunConfig  # noqa: E402
from tictac_hooks.run.controller import Controller  # noqa: E402
from tictac_hooks.run.settings import Settings  # noqa: E402
from tictac_hooks.cluster.launcher import LocalCluster  # noqa: E402
from tictac_hooks.enforce.client import steps_everywhere  # noqa: E402
from tictac_hooks.graph.tf.traced import traced_worker_graphs  # noqa: E402
from tictac_hooks.bench.runner import provenance  # noqa: E402

model, mode, rounds, block = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rate = float(sys.argv[5]) if len(sys.argv) > 5 else None
median = statistics.median


def per_step(rec):
    """(arrival spread, summed and largest hold of ready responses, span), seconds."""
    ts = [t for t in rec.transfers if t.handback and t.release]
    holds = [t.held_s for t in ts]
    arrivals = [t.arrive for t in ts]
    return (max(arrivals) - min(arrivals), sum(holds), max(holds),
            max(t.handback for t in ts) - min(arrivals))


with LocalCluster(num_ps=1, num_workers=2, rendezvous=True, backend="native") as c:
    work = workloads.build(model, mode, [[0, 1]], 1, workloads.default_batch(model, mode))
    with tf.compat.v1.Session("grpc://" + c.worker_addresses[0], graph=work.graph) as s:
        s.run(work.init)
        for _ in range(3):
            s.run(work.sets[0].fetches)
        traced = []
        for _ in range(2):
            md = tf.compat.v1.RunMetadata()
            opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                           output_partition_graphs=True)
            s.run(work.sets[0].fetches, options=opts, run_metadata=md)
            traced.append(md)
        graphs, compute, late = traced_worker_graphs(traced, ["worker:0", "worker:1"])
        ctl = Controller(RunConfig.build(Settings.resolve(algorithm="tic", profile_steps=1,
                                                          check_rounds=0),
                                         c.ps_addresses, bandwidth=rate,
                                         training=mode == "training"), verbose=False)
        ctl.connect()
        ctl.switch(graphs, compute_times=compute, late=late)
        client = {"none": [], "tic": []}
        for r in range(rounds):
            for name in (("none", "tic") if r % 2 else ("tic", "none")):
                (ctl.resume if name == "tic" else ctl.suspend)()
                s.run(work.sets[0].fetches)  # the block's first step straddles the change
                for _ in range(block):
                    t0 = time.perf_counter()
                    s.run(work.sets[0].fetches)
                    client[name].append(time.perf_counter() - t0)
        ctl.suspend()
        recs = steps_everywhere(c.ps_addresses)
        by = {"none": [], "tic": []}
        for rec in recs:
            if rec.transfers and rec.start >= ctl.steplog.switched_at:
                by["tic" if rec.scheduled else "none"].append(per_step(rec))
        out = {}
        for name, rows in by.items():
            out[name] = {"client_step_ms": round(1e3 * median(client[name]), 1),
                         "gate_steps": len(rows)}
            for i, key in enumerate(("arrival_spread_ms", "held_sum_ms", "held_max_ms",
                                     "span_ms")):
                out[name][key] = round(1e3 * median(r[i] for r in rows), 1) if rows else None
        print(json.dumps({**provenance(), "model": model, "mode": mode, "pace_rate": rate, **out}, indent=1))
