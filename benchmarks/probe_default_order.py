"""Is TensorFlow's own transfer order fixed per PS process, or new every step?

Per launch of a native PS with no order installed (loopback): the gate's hand-back
order of each step, and the Spearman correlation of the transfers' positions between
consecutive steps of one launch and between the first steps of two launches.

    .venv/bin/python benchmarks/probe_default_order.py resnet50 inference 3 5
    # MODEL MODE LAUNCHES STEPS; about 3 minutes
"""
import os, sys, statistics, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tensorflow as tf
from tictac_hooks.cluster.launcher import LocalCluster
from tictac_hooks.bench import workloads
from tictac_hooks.enforce.client import steps_everywhere, clear_everywhere
from tictac_hooks.bench.runner import provenance

model, mode, launches, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def spearman(a, b):
    common = [n for n in a if n in set(b)]
    ra = {n: i for i, n in enumerate([x for x in a if x in set(common)])}
    rb = {n: i for i, n in enumerate([x for x in b if x in set(common)])}
    n = len(common)
    if n < 3: return float("nan")
    d2 = sum((ra[x] - rb[x]) ** 2 for x in common)
    return 1 - 6 * d2 / (n * (n * n - 1))

orders = []
for launch in range(launches):
    tf.compat.v1.reset_default_graph()
    with LocalCluster(num_ps=1, num_workers=1, rendezvous=True, backend="native") as c:
        work = workloads.build(model, mode, [[0]], 1, 2)
        with tf.compat.v1.Session("grpc://" + c.worker_addresses[0], graph=work.graph) as s:
            s.run(work.init)
            for _ in range(2):
                s.run(work.sets[0].fetches)
            clear_everywhere(c.ps_addresses)
            n0 = len(steps_everywhere(c.ps_addresses))
            for _ in range(steps):
                s.run(work.sets[0].fetches)
            recs = sorted(steps_everywhere(c.ps_addresses), key=lambda r: r.start)[-steps:]
            orders.append([list(r.order) for r in recs])
            print(f"launch {launch}: {len(recs)} steps, {len(recs[0].order)} transfers; "
                  f"first 6: {[n.split(';')[-2][-30:] if ';' in n else n[-30:] for n in recs[0].order[:6]]}",
                  flush=True)
within = [spearman(o[i], o[i + 1]) for o in orders for i in range(len(o) - 1)]
across = [spearman(orders[a][0], orders[b][0]) for a in range(launches) for b in range(a + 1, launches)]
print(json.dumps({**provenance(), "within_launch_rho": [round(x, 3) for x in within],
                  "across_launch_rho": [round(x, 3) for x in across]}))
