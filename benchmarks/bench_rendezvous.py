"""Benchmark of the TicTac gate's cost on loopback, both backends: prints a table.

1. RecvTensor throughput from four PS of one cluster, the same variables on each
   (NUM_VARS x VAR_MIB), one worker reading them: a plain TensorFlow PS (direct), the
   native gate (grpc+tictac, in the PS), a copy-only forwarder in front of a plain PS
   (the floor of any interposer that copies through the kernel), and the HTTP/2
   rendezvous (the proxy). The order of the four rotates every rep; per-rep ratios to
   direct with a bootstrap 95 % interval, and each PS process's CPU time per GiB.
2. The raw-TCP floor: sender -> receiver directly vs through a copy-only forwarder
   process (no HTTP/2, no gate, no TensorFlow).
3. Step-time overhead with no schedule installed on a communication-heavy model: the
   same model with its variables on a plain PS or on a gated PS of one cluster,
   alternating (--backend native or proxy).
4. Native PS RSS over --rss-steps training steps with a schedule installed, and the
   gate's bounded state at the end.

Loopback only; bench_shaped_overhead.py measures a shaped link.

  .venv/bin/python benchmarks/bench_rendezvous.py [--var-mib 64] [--rss-steps 10000]
      [--only throughput|floor|overhead|memory] [--reps 25] [--backend native]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc  # noqa: E402
import tensorflow as tf  # noqa: E402

from tictac_hooks.enforce.client import connect  # noqa: E402
from tictac_hooks.cluster.launcher import LocalCluster, repo_pythonpath  # noqa: E402
from tictac_hooks.cluster.procs import die_with_parent, on_lasting_thread  # noqa: E402
from tictac_hooks.ports import free_port  # noqa: E402
from tictac_hooks.bench.metrics import median_ci  # noqa: E402
from tictac_hooks.bench.workloads import comm_heavy as comm_heavy_model  # noqa: E402
from benchmarks.lab.procstat import cpu_seconds as cpu_s, rss_mib  # noqa: E402
from tictac_hooks.graph.schedule import Schedule  # noqa: E402

tf.compat.v1.disable_eager_execution()


def read_graph(num_ps: int, var_mib: int, num_vars: int):
    """(graph, initializer, one fetch per PS): worker 0 reads ``num_vars`` variables of
    ``var_mib`` MiB from that PS (and sums them, so every byte is used)."""
    g = tf.Graph()
    with g.as_default():
        fetch = []
        for ps in range(num_ps):
            with tf.device(f"/job:ps/task:{ps}"):
                vs = [tf.compat.v1.get_variable(
                    f"v{ps}_{i}", shape=[var_mib << 18],
                    initializer=tf.compat.v1.ones_initializer()) for i in range(num_vars)]
            with tf.device("/job:worker/task:0"):
                fetch.append(tf.add_n([tf.reduce_sum(v) for v in vs]))
        init = tf.compat.v1.global_variables_initializer()
    return g, init, fetch


# -- the floor: what one more TCP hop costs with no rendezvous logic at all ------------

FLOOR_CHUNK = 4 << 20


def _pump(src: socket.socket, dst: socket.socket) -> None:
    buf = bytearray(FLOOR_CHUNK)
    view = memoryview(buf)
    try:
        while n := src.recv_into(buf):
            dst.sendall(view[:n])
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _floor_receiver(lsock: socket.socket, nbytes: int, done: int) -> None:
    conn, _ = lsock.accept()
    buf = bytearray(FLOOR_CHUNK)
    while True:
        got = 0
        while got < nbytes:
            n = conn.recv_into(buf)
            if not n:
                return
            got += n
        os.write(done, b"x")


def _floor_forwarder(lsock: socket.socket, target: int) -> None:
    a, _ = lsock.accept()
    b = socket.create_connection(("127.0.0.1", target))
    for sock in (a, b):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _pump(a, b)


def _floor_sender(port: int, nbytes: int, go: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = memoryview(bytearray(b"\x01" * FLOOR_CHUNK))
    while os.read(go, 1):
        left = nbytes
        while left:
            k = min(left, FLOOR_CHUNK)
            s.sendall(data[:k])
            left -= k


def floor(mib: int, reps: int) -> tuple[list[float], list[float]]:
    """Raw TCP on loopback, sender -> receiver process, direct vs through a forwarder
    process that only copies (``recv_into`` / ``sendall`` of 4 MiB, no HTTP/2, no
    Python per frame): GiB/s per rep for each, ABBA. The ratio is the most any
    interposer that copies through the kernel can keep on this machine."""
    nbytes = mib << 20
    procs, pipes = [], {}
    try:
        for path in ("direct", "forwarded"):
            with socket.create_server(("127.0.0.1", 0)) as rl:
                done_r, done_w = os.pipe()
                procs.append(_fork_child(_floor_receiver, rl, nbytes, done_w))
                os.close(done_w)
                port = rl.getsockname()[1]
            if path == "forwarded":
                with socket.create_server(("127.0.0.1", 0)) as fl:
                    procs.append(_fork_child(_floor_forwarder, fl, port))
                    port = fl.getsockname()[1]
            go_r, go_w = os.pipe()
            procs.append(_fork_child(_floor_sender, port, nbytes, go_r))
            os.close(go_r)
            pipes[path] = (go_w, done_r)
        rates: dict[str, list[float]] = {"direct": [], "forwarded": []}
        for rep in range(reps + 1):
            order = ("direct", "forwarded") if rep % 2 == 0 else ("forwarded", "direct")
            for path in order:
                go_w, done_r = pipes[path]
                t = time.perf_counter()
                os.write(go_w, b"g")
                os.read(done_r, 1)
                if rep:  # the first round warms up the connections
                    rates[path].append(mib / 1024 / (time.perf_counter() - t))
        return rates["direct"], rates["forwarded"]
    finally:
        for go_w, done_r in pipes.values():
            os.close(go_w)
            os.close(done_r)
        for pid in procs:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _fork_child(fn, *args) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            fn(*args)
        finally:
            os._exit(0)
    return pid


def overhead(steps: int, backend: str) -> dict[str, list[float]]:
    """Step times per PS: one worker trains the same model with its variables on the
    plain ps0, the gated ps1 or the plain ps2 (an A/A control: what two plain PS
    differ by on this machine), in an order that rotates every step."""
    with LocalCluster(num_ps=3, num_workers=1, rendezvous=[False, True, False],
                      backend=backend) as c:
        sessions = []
        for ps in range(3):
            g, init, train = comm_heavy_model(0, ps=ps)
            s = tf.compat.v1.Session("grpc://" + c.worker_addresses[0], graph=g)
            s.run(init)
            s.run(train)
            sessions.append((s, train))
        times: dict[str, list[float]] = {"plain": [], "gate": [], "plain2": []}
        names = list(times)
        for step in range(steps):
            for ps in [(step + j) % 3 for j in range(3)]:
                s, train = sessions[ps]
                t = time.perf_counter()
                s.run(train)
                times[names[ps]].append(time.perf_counter() - t)
        for s, _ in sessions:
            s.close()
        return times


# -- TensorFlow through a copy-only forwarder: the best any interposer could do -------

FORWARDER_KINDS = ("direct", "native", "copy-only", "rendezvous")


def _copy_forwarder(listen_port: int, upstream_port: int) -> None:
    """Forwards every connection to ``listen_port`` to ``upstream_port``, byte for
    byte: two blocking threads per connection, nothing parsed (the GIL is released
    in every recv and send, so the two directions and connections run in parallel)."""
    lsock = socket.create_server(("127.0.0.1", listen_port))

    def accept() -> None:
        while True:
            client, _ = lsock.accept()
            upstream = socket.create_connection(("127.0.0.1", upstream_port))
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()


def forwarder_task(cfg: dict[str, Any]) -> None:
    """A task of the forwarders cluster (run as a child process): a worker, or a PS
    whose TensorFlow server listens on the spec's port (direct, or native: the gate in
    this server) or on a private port behind a copy-only forwarder or the TicTac
    rendezvous, in this process."""
    from tictac_hooks.enforce.proxy import Rendezvous, RendezvousThread

    spec = tf.train.ClusterSpec(cfg["spec"])
    job, index, kind = cfg["job"], cfg["index"], cfg["kind"]
    public = int(cfg["spec"][job][index].rsplit(":", 1)[1])
    port = public if kind in ("direct", "native") else cfg["private"]
    if kind == "native":
        from tictac_hooks.enforce.native.build import load
        load()
    server_def = tf.train.ServerDef(cluster=spec.as_cluster_def(), job_name=job,
                                    task_index=index, port=port,
                                    protocol="grpc+tictac" if kind == "native" else "grpc")
    server = tf.distribute.Server(server_def, start=True)
    if kind == "copy-only":
        _copy_forwarder(public, port)
    elif kind == "rendezvous":
        RendezvousThread(Rendezvous(f"127.0.0.1:{public}", f"127.0.0.1:{port}")).start()
    server.join()


def forwarders(var_mib: int, num_vars: int, reps: int
               ) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One worker reading the same amount from four PS: direct, native gate, behind a
    copy-only forwarder, behind the rendezvous (each forwarder in its PS's process, as
    the rendezvous runs under ``tictac ps``). GiB/s per rep for each (the order of the
    four rotates every rep), and each PS process's CPU seconds per GiB it sent."""
    from tictac_hooks.enforce.native.build import build
    build()  # before the PS processes load it
    k = len(FORWARDER_KINDS)
    ports: list[int] = []
    while len(ports) < 2 * k + 1:  # k PS, 1 worker, k private: all distinct
        if (port := free_port()) not in ports:
            ports.append(port)
    spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:k]], "worker": [f"127.0.0.1:{ports[k]}"]}
    tasks = [dict(job="ps", index=i, kind=kind, private=ports[k + 1 + i])
             for i, kind in enumerate(FORWARDER_KINDS)]
    tasks.append(dict(job="worker", index=0, kind="direct", private=0))
    procs = []
    try:
        for t in tasks:
            argv = [sys.executable, os.path.abspath(__file__), "--forwarder-task",
                    json.dumps(dict(t, spec=spec))]
            procs.append(on_lasting_thread(lambda a=argv: subprocess.Popen(
                a, preexec_fn=die_with_parent, stdout=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONPATH=repo_pythonpath()))))
        for address in spec["ps"] + spec["worker"]:
            with grpc.insecure_channel(address) as channel:
                grpc.channel_ready_future(channel).result(timeout=120)
        g, init, fetch = read_graph(k, var_mib, num_vars)
        rates: dict[str, list[float]] = {kind: [] for kind in FORWARDER_KINDS}
        cpu = {kind: 0.0 for kind in FORWARDER_KINDS}
        gib = var_mib * num_vars / 1024
        with tf.compat.v1.Session("grpc://" + spec["worker"][0], graph=g) as s:
            s.run(init)
            s.run(fetch)
            for rep in range(reps):
                for ps in [(rep + j) % k for j in range(k)]:
                    c0 = cpu_s(procs[ps].pid)
                    t = time.perf_counter()
                    s.run(fetch[ps])
                    rates[FORWARDER_KINDS[ps]].append(gib / (time.perf_counter() - t))
                    cpu[FORWARDER_KINDS[ps]] += cpu_s(procs[ps].pid) - c0
        return rates, {kind: c / (gib * reps) for kind, c in cpu.items()}
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def memory(rss_steps: int) -> tuple[dict[int, float], dict[str, Any]]:
    """PS (+ rendezvous) RSS in MiB after the first scheduled step (0), at step 100,
    then every tenth of ``rss_steps`` steps, with a schedule installed (every step goes
    through the gate's per-step state); and the gate's state at the end."""
    with LocalCluster(num_ps=1, num_workers=1, rendezvous=True) as c, \
            connect(c.ps_addresses[0]) as client:
        pid = c.task("ps", 0).process.pid
        g, init, train = comm_heavy_model(0, num_vars=4, var_mib=1)
        with tf.compat.v1.Session("grpc://" + c.worker_addresses[0], graph=g) as s:
            s.run(init)
            s.run(train)
            # The transfers of a training step, scheduled in reverse of the order
            # TensorFlow used (any fixed order exercises the gate the same way).
            last = client.stats().steps[-1]
            served = [t.name for t in last.transfers]
            client.install(Schedule.from_order("memory", list(reversed(served))))
            s.run(train)
            rss = {0: rss_mib(pid)}
            tenth = max(1, rss_steps // 10)
            marks = sorted({min(100, rss_steps), *range(tenth, rss_steps + 1, tenth)})
            done = 0
            for mark in marks:
                for _ in range(mark - done):
                    s.run(train)
                done = mark
                rss[mark] = rss_mib(pid)
            return rss, client.stats().to_json(steps=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--var-mib", type=int, default=64)
    p.add_argument("--num-vars", type=int, default=4)
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--floor-mib", type=int, default=256)
    p.add_argument("--overhead-steps", type=int, default=60)
    p.add_argument("--rss-steps", type=int, default=10000)
    p.add_argument("--backend", choices=("native", "proxy"), default="native",
                   help="the gate the step-time overhead part measures (default native)")
    p.add_argument("--only", choices=("throughput", "floor", "overhead", "memory"),
                   help="run one part only (default: all four)")
    p.add_argument("--forwarder-task", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.forwarder_task:
        forwarder_task(json.loads(args.forwarder_task))
        return
    if args.only in (None, "throughput"):
        throughput_table(args.var_mib, args.num_vars, args.reps)
    if args.only in (None, "floor"):
        floor_table(args.floor_mib, args.reps)
    if args.only in (None, "overhead"):
        overhead_table(args.overhead_steps, args.backend)
    if args.only in (None, "memory"):
        memory_table(args.rss_steps)


def ratio_cells(direct: list[float], other: list[float]) -> str:
    """Per-rep ratio median with its bootstrap 95 % interval, and range."""
    ratios = sorted(o / d for d, o in zip(direct, other))
    lo, hi = median_ci(ratios)
    return (f"median {statistics.median(ratios):.2f} (95 % CI {lo:.2f}-{hi:.2f}), "
            f"range {ratios[0]:.2f}-{ratios[-1]:.2f}")


def throughput_table(var_mib: int, num_vars: int, reps: int) -> None:
    rates, cpu = forwarders(var_mib, num_vars, reps)
    print(f"| RecvTensor, {num_vars} x {var_mib} MiB from each of four PS, {reps} reps, "
          "order rotating | GiB/s (median) | ratio of medians | / direct per rep | "
          "PS process CPU s per GiB |")
    print("|---|---|---|---|---|")
    direct = statistics.median(rates["direct"])
    for kind in FORWARDER_KINDS:
        ratio = "1" if kind == "direct" else ratio_cells(rates["direct"], rates[kind])
        median = statistics.median(rates[kind])
        print(f"| {kind} | {median:.2f} | {median / direct:.3f} | {ratio} | "
              f"{cpu[kind]:.3f} ({(cpu[kind] / cpu['direct'] - 1) * 100:+.1f} %) |",
              flush=True)


def floor_table(mib: int, reps: int) -> None:
    direct, forwarded = floor(mib, reps)
    print(f"| raw TCP, {mib} MiB, copy-only forwarder, {reps} reps ABBA | direct "
          f"{statistics.median(direct):.2f} GiB/s | forwarded "
          f"{statistics.median(forwarded):.2f} GiB/s | ratio per rep: "
          f"{ratio_cells(direct, forwarded)} |", flush=True)


def overhead_table(steps: int, backend: str) -> None:
    t = overhead(steps, backend)
    plain = statistics.median(t["plain"])
    print(f"| step time, 16 x 4 MiB model, no schedule, {steps} steps each, rotating | "
          f"plain PS {plain * 1e3:.1f} ms | {backend} gate {statistics.median(t['gate']) * 1e3:.1f}"
          f" ms: {ratio_cells(t['plain'], t['gate'])} | A/A control, a second plain PS "
          f"{statistics.median(t['plain2']) * 1e3:.1f} ms: "
          f"{ratio_cells(t['plain'], t['plain2'])} |", flush=True)


def memory_table(rss_steps: int) -> None:
    rss, stats = memory(rss_steps)
    points = ", ".join(f"{k}: {v:.0f}" for k, v in rss.items())
    print(f"| native PS RSS (MiB) by step, schedule installed | {points} |",
          flush=True)
    print(f"| gate after {rss_steps} steps | {json.dumps(stats)} |", flush=True)


if __name__ == "__main__":
    main()
