"""What the TicTac Keras callback costs the training loop's thread per step.

Under ParameterServerStrategy every step fit dispatches passes through the callback's
``on_train_batch_end`` on the coordinator, between two dispatches of about a
millisecond: anything slow there slows training (tf_keras warns "Callback method
`on_train_batch_end` is slow compared to the batch time"). This drives the callback's
own hooks for a run of steps against a gate in this process (two workers' transfers
made on another thread, as a PS would, while TicTac reads its records on its own), and
prints the time of each ``on_train_batch_end``: median and worst outside the switch,
and the switch's (its DAG, order and install, on the loop's thread).

    .venv/bin/python benchmarks/bench_hook_cost.py --steps 1200 --steps_per_epoch 600

Prints numbers; asserts nothing (tests/test_frontends.py tests the behaviour).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tictac_hooks.run.driver import StepDAG  # noqa: E402
from tictac_hooks.enforce import inprocess  # noqa: E402
from tictac_hooks.enforce.gate import Gate  # noqa: E402
from tictac_hooks.graph.dag import Graph, Op  # noqa: E402

PS = "127.0.0.1:61901"
WORKERS = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(2)]


def model_dag(layers: int) -> Graph:
    """A chain of ``layers`` layers, each reading a kernel and a bias from ps:0."""
    ops, prev = [], None
    for i in range(layers):
        for p in ("kernel", "bias"):
            ops.append(Op(f"fc{i}/{p}/read", "recv", channel="ps:0", bytes=4096))
        inputs = (f"fc{i}/kernel/read", f"fc{i}/bias/read") + ((prev,) if prev else ())
        ops.append(Op(f"fc{i}", "compute", inputs))
        prev = f"fc{i}"
    return Graph(ops)


class PSWorkers(threading.Thread):
    """The workers' transfers at the PS, on a thread of their own, one step each time
    the loop dispatches one (as a PS serves steps while the coordinator dispatches)."""

    def __init__(self, gate: Gate, graph: Graph) -> None:
        super().__init__(daemon=True)
        self.gate, self.names = gate, [op.name for op in graph.recvs]
        self.queue: "list[str]" = []
        self.ready = threading.Condition()
        self.ids = itertools.count(1)
        self.stopping = False

    def dispatch(self, worker: str) -> None:
        with self.ready:
            self.queue.append(worker)
            self.ready.notify()

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            with self.ready:
                while not self.queue and not self.stopping:
                    self.ready.wait()
                if not self.queue:
                    break
                worker = self.queue.pop(0)
            step_id = next(self.ids)

            async def one(name: str) -> None:
                ticket = self.gate.arrive(step_id, worker, name)
                turn = self.gate.request(ticket)
                if turn is not None:
                    await turn
                ticket.nbytes = 4096
                self.gate.handed_back(ticket)

            async def step() -> None:
                await asyncio.gather(*(one(n) for n in self.names))
            with inprocess.gate_lock(PS):
                loop.run_until_complete(step())
        loop.close()

    def stop(self) -> None:
        with self.ready:
            self.stopping = True
            self.ready.notify()
        self.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--steps_per_epoch", type=int, default=600)
    parser.add_argument("--profile_steps", type=int, default=30)
    parser.add_argument("--layers", type=int, default=7)
    parser.add_argument("--dispatch_ms", type=float, default=0.6,
                        help="time between two dispatches, as fit's own work (default 0.6)")
    args = parser.parse_args()

    from tictac_hooks import TicTac
    graph = model_dag(args.layers)
    gate = Gate(window_bytes=0)
    with inprocess.serve_in_process(PS, gate):
        cb = TicTac(measure_compute=False, algorithm="tic", check_rounds=0,
                    profile_steps=args.profile_steps)
        cb._ps_addresses = lambda: [PS]
        cb._find_dag = lambda mode: StepDAG(graph)
        cb._join = lambda: None
        workers = PSWorkers(gate, graph)
        workers.start()
        cost = []
        cb.on_train_begin()
        for i in range(args.steps):
            workers.dispatch(WORKERS[i % len(WORKERS)])
            time.sleep(args.dispatch_ms / 1e3)  # fit's own dispatch work
            t0 = time.perf_counter()
            cb.on_train_batch_end(i)
            if (i + 1) % args.steps_per_epoch == 0:
                cb.on_epoch_end(i // args.steps_per_epoch)
            cost.append(time.perf_counter() - t0)
        workers.stop()
        cb.on_train_end()
    switch = args.profile_steps - 1
    outside = cost[:switch] + cost[switch + 1:]
    summary = cb.summary
    print(f"on_train_batch_end over {args.steps} steps ({args.steps_per_epoch} per epoch, "
          f"{len(WORKERS)} workers, {len(graph.recvs)} transfers per step):")
    print(f"  outside the switch: median {statistics.median(outside) * 1e3:.3f} ms, "
          f"worst {max(outside) * 1e3:.3f} ms "
          f"(95th percentile {sorted(outside)[int(0.95 * len(outside))] * 1e3:.3f} ms)")
    print(f"  the switch (step {switch + 1}): {cost[switch] * 1e3:.1f} ms")
    print(f"  TicTac's own measure (summary 'hook'): {summary['hook']}")
    print(f"  records: {summary['records']}")


if __name__ == "__main__":
    main()
