"""Benchmark of the TicTac rendezvous on loopback: prints a table.

1. Forwarded RecvTensor throughput, interposed vs direct, same cluster, same run
   (PS 0 direct, PS 1 behind the rendezvous; NUM_VARS x VAR_MIB variables each).
2. Step-time overhead with no schedule installed on a communication-heavy model
   (worker 0 reaches the PS through the rendezvous, worker 1 directly; alternating).
3. Rendezvous (PS process) RSS after 100 and after --rss-steps training steps.
Also the CPU time each PS process (and the worker) spends per GiB, direct and interposed: the
difference is what the rendezvous costs, a steadier number than the throughput ratio on
a machine with other load (the ratio is CPU-bound on 2 cores).

Loopback only: no shaped 1 Gbit/s link (see the report).

  .venv/bin/python benchmarks/bench_rendezvous.py [--var-mib 64] [--rss-steps 10000]
      [--only throughput|overhead|memory]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tictac_hooks.enforce.launcher import LocalCluster  # noqa: E402

tf.compat.v1.disable_eager_execution()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(var_mib: int, num_vars: int, reps: int
               ) -> tuple[list[float], list[float], float, float, float, float]:
    """(direct GiB/s per rep, interposed GiB/s per rep, PS CPU s/GiB direct and
    interposed, worker CPU s/GiB direct and interposed); each rep fetches from the
    direct PS, then from the interposed one."""
    with LocalCluster(num_ps=2, num_workers=1, rendezvous=[False, True]) as c:
        g = tf.Graph()
        with g.as_default():
            fetch = []
            for ps in range(2):
                with tf.device(f"/job:ps/task:{ps}"):
                    vs = [tf.compat.v1.get_variable(
                        f"v{ps}_{i}", shape=[var_mib << 18],
                        initializer=tf.compat.v1.ones_initializer()) for i in range(num_vars)]
                with tf.device("/job:worker/task:0"):
                    fetch.append(tf.add_n([tf.reduce_sum(v) for v in vs]))
            init = tf.compat.v1.global_variables_initializer()
        times = {0: [], 1: []}
        cpu = {0: 0.0, 1: 0.0}
        worker_cpu = {0: 0.0, 1: 0.0}
        pids = [c.task("ps", i).process.pid for i in range(2)]
        worker = c.task("worker", 0).process.pid
        with tf.compat.v1.Session("grpc://" + c.worker_addresses[0], graph=g) as s:
            s.run(init)
            s.run(fetch)
            for _ in range(reps):
                for ps in (0, 1):
                    c0, w0 = cpu_s(pids[ps]), cpu_s(worker)
                    t = time.perf_counter()
                    s.run(fetch[ps])
                    times[ps].append(time.perf_counter() - t)
                    cpu[ps] += cpu_s(pids[ps]) - c0
                    worker_cpu[ps] += cpu_s(worker) - w0
        gb = var_mib * num_vars / 1024
        return ([gb / t for t in times[0]], [gb / t for t in times[1]],
                cpu[0] / (gb * reps), cpu[1] / (gb * reps),
                worker_cpu[0] / (gb * reps), worker_cpu[1] / (gb * reps))


def comm_heavy_model(worker: int, num_vars: int = 16, var_mib: int = 4):
    g = tf.Graph()
    with g.as_default():
        n = int((var_mib << 18) ** 0.5)
        with tf.device("/job:ps/task:0"):
            ws = [tf.compat.v1.get_variable(f"w{i}", shape=[n, n],
                  initializer=tf.compat.v1.glorot_uniform_initializer(seed=i))
                  for i in range(num_vars)]
        with tf.device(f"/job:worker/task:{worker}"):
            x = tf.constant(np.random.RandomState(0).randn(8, n).astype("float32"))
            loss = tf.add_n([tf.reduce_mean((x @ w) ** 2) for w in ws])
            train = tf.compat.v1.train.GradientDescentOptimizer(1e-4).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    return g, init, train


def overhead(steps: int) -> tuple[float, float]:
    with LocalCluster(num_ps=1, num_workers=2, rendezvous=True, direct_workers=[1]) as c:
        sessions = []
        for worker in (0, 1):
            g, init, train = comm_heavy_model(worker)
            s = tf.compat.v1.Session("grpc://" + c.worker_addresses[worker], graph=g)
            s.run(init)
            s.run(train)
            sessions.append((s, train))
        times = {0: [], 1: []}
        for _ in range(steps):
            for worker in (0, 1):
                s, train = sessions[worker]
                t = time.perf_counter()
                s.run(train)
                times[worker].append(time.perf_counter() - t)
        for s, _ in sessions:
            s.close()
        return statistics.median(times[1]), statistics.median(times[0])


def memory(rss_steps: int) -> tuple[float, float, float]:
    with LocalCluster(num_ps=1, num_workers=1, rendezvous=True) as c:
        pid = c.task("ps", 0).process.pid
        g, init, train = comm_heavy_model(0, num_vars=4, var_mib=1)
        with tf.compat.v1.Session("grpc://" + c.worker_addresses[0], graph=g) as s:
            s.run(init)
            before = rss_mib(pid)
            for _ in range(100):
                s.run(train)
            at_100 = rss_mib(pid)
            for _ in range(rss_steps - 100):
                s.run(train)
            return before, at_100, rss_mib(pid)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--var-mib", type=int, default=64)
    p.add_argument("--num-vars", type=int, default=4)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--overhead-steps", type=int, default=30)
    p.add_argument("--rss-steps", type=int, default=10000)
    p.add_argument("--only", choices=("throughput", "overhead", "memory"),
                   help="run one part only (default: all three)")
    args = p.parse_args()
    if args.only in (None, "throughput"):
        direct, interposed, cpu_direct, cpu_rv, w_direct, w_rv = throughput(
            args.var_mib, args.num_vars, args.reps)
        ratios = sorted(i / d for d, i in zip(direct, interposed))
        print(f"| RecvTensor throughput, {args.num_vars} x {args.var_mib} MiB, median of "
              f"{args.reps} | direct {statistics.median(direct):.2f} GiB/s | rendezvous "
              f"{statistics.median(interposed):.2f} GiB/s | ratio per rep: median "
              f"{statistics.median(ratios):.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f} |",
              flush=True)
        print(f"| PS process CPU per GiB sent | direct {cpu_direct:.2f} s | with rendezvous "
              f"{cpu_rv:.2f} s | rendezvous {cpu_rv - cpu_direct:+.2f} s |", flush=True)
        print(f"| PS + worker CPU per GiB | direct {cpu_direct + w_direct:.2f} s | with "
              f"rendezvous {cpu_rv + w_rv:.2f} s |", flush=True)
    if args.only in (None, "overhead"):
        overhead_table(args.overhead_steps)
    if args.only in (None, "memory"):
        memory_table(args.rss_steps)


def overhead_table(steps: int) -> None:
    t_direct, t_rv = overhead(steps)
    print(f"| step time, 16 x 4 MiB model, no schedule | direct {t_direct * 1e3:.1f} ms | "
          f"rendezvous {t_rv * 1e3:.1f} ms | overhead {(t_rv / t_direct - 1) * 100:+.1f} % |",
          flush=True)


def memory_table(rss_steps: int) -> None:
    before, at_100, at_n = memory(rss_steps)
    print(f"| PS+rendezvous RSS | start {before:.0f} MiB | 100 steps {at_100:.0f} MiB | "
          f"{rss_steps} steps {at_n:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
