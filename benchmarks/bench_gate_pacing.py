"""The native gate's paced service, per hand-back, as the workers grow: the C++ gate
alone (no TensorFlow, no network), driven through its C API as the conformance tests
drive it.

Per worker count W: one schedule of two transfers (a, b), pacing on at a rate the link
never reaches (every hand-back goes through the paced service, none is held for the
link), W workers each in its own step, all in one turn. Every worker's b is made ready
first: it waits for a, so W channels wait at once. Then each worker's a is made ready,
one worker after the other, and each hands back a and b. The figure is the wall time
of that second loop per hand-back (the Python driver's cost included, the same at
every W), its median over ``--repeats`` gates, and its ratio to the smallest W's.
A service that walks the waiting channels per hand-back grows with W; the indexed one
(gate.h, eligible_ / behind_) does not.

    .venv/bin/python benchmarks/bench_gate_pacing.py --workers 64,512,4096 --repeats 5

The last line reads ``per hand-back: <us> us at W=<w> ... ; <ratio>x from W=<min> to
W=<max>``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def key(worker: int, name: str) -> str:
    return (f"/job:ps/replica:0/task:0/device:CPU:0;1;/job:worker/replica:0/task:{worker}"
            f"/device:CPU:0;edge_1_{name};0:0")


def one_gate(library: str, workers: int) -> float:
    """Seconds per hand-back of the timed loop, at ``workers`` waiting channels."""
    from tictac_hooks.enforce.native.cgate import CGate
    from tictac_hooks.enforce.native.client import install_argument
    from tictac_hooks.graph.schedule import Schedule
    gate = CGate.alone(library, skip_after_s=600.0)
    handed = [0]

    def back() -> None:
        handed[0] += 1
    try:
        gate.control("configure", f"workers\t{workers}\nfinish_after_s\t600\n")
        gate.control("install", install_argument(Schedule.from_order("tic", ["a", "b"]),
                                                 pace_rate=1e15, window_bytes=1 << 30))
        tickets = {}
        for w in range(workers):
            for name in ("a", "b"):
                tickets[w, name] = gate.arrive(w + 1, key(w, name))
        for w in range(workers):
            gate.ready(tickets[w, "b"], 100, back)  # waits for a: W channels waiting
        if handed[0]:
            raise SystemExit(f"{handed[0]} b handed back before its a: not paced by order")
        started = time.perf_counter()
        for w in range(workers):
            gate.ready(tickets[w, "a"], 100, back)
        elapsed = time.perf_counter() - started
        if handed[0] != 2 * workers:
            raise SystemExit(f"{handed[0]} of {2 * workers} handed back")
        return elapsed / (2 * workers)
    finally:
        gate.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="64,512,4096",
                        help="comma-separated worker counts (default 64,512,4096)")
    parser.add_argument("--repeats", type=int, default=5, help="gates per count (default 5)")
    args = parser.parse_args(argv)
    counts = sorted({int(x) for x in args.workers.split(",")})
    from tictac_hooks.enforce.native.build import build
    library = build(with_tensorflow=False, quiet=True).path
    per = {}
    for w in counts:
        runs = [one_gate(library, w) for _ in range(args.repeats)]
        per[w] = statistics.median(runs)
        print(f"W={w}: {1e6 * per[w]:.1f} us per hand-back (median of {len(runs)}; "
              f"{1e6 * min(runs):.1f}-{1e6 * max(runs):.1f})", flush=True)
    lo, hi = counts[0], counts[-1]
    print("per hand-back: " + ", ".join(f"{1e6 * per[w]:.1f} us at W={w}" for w in counts)
          + f"; {per[hi] / per[lo]:.2f}x from W={lo} to W={hi}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
