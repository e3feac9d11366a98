"""The order check's keep margin, chosen from measured runs: for each margin, which
orders a check with that rule would have kept, and how those orders did when measured
again, after the check, in held-out blocks of the same run.

Reads the fit-bench runs of the scale benchmark (benchmarks/results/scale/, cnn and
dlrm at 1-16 workers on 4 PS): each run's check measured TIC and TAC against
TensorFlow's order in block pairs (every pair's ratio is in the run's per-worker
figures), kept an order by the rule with no margin, and then measured the kept order
against TensorFlow's in fresh blocks (``with_check``). A margin that clears an order the
no-margin rule kept avoids a slowdown where the held-out ratio is below 1, and gives up
a gain where it is above.

    python3 benchmarks/check_margin.py [RESULTS_DIR ...]
"""
from __future__ import annotations

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tictac_hooks.records.files import json_paths, load_json  # noqa: E402

MARGINS = (1.0, 1.02, 1.03, 1.05, 1.07, 1.10)


def pair_ratios(run: dict, candidate: str) -> list[float]:
    """Every block pair's ratio of ``candidate`` in a run's check: per worker, the
    pairs' min and max (a worker has at most 2 pairs in these runs: they are its
    pairs), or its median for each pair where it had more."""
    out: list[float] = []
    for worker in run["orders"][candidate]["workers"].values():
        n = worker["pairs"]
        if n == 1:
            out.append(worker["ratio_min"])
        elif n == 2:
            out += [worker["ratio_min"], worker["ratio_max"]]
        else:
            out += [worker["ratio_median"]] * n
    return out


def kept(medians: dict[str, float], margin: float) -> str | None:
    best = max(medians, key=medians.get, default=None)
    return best if best is not None and medians[best] >= margin else None


def main(dirs: list[str]) -> int:
    runs = []
    for d in dirs:
        for path in json_paths(os.path.join(d, "*-r*.json")):
            run = load_json(path)
            held = (run.get("with_check") or {}).get("ratio_median")
            cands = [c for c in run["check"]["candidates"] if c in run["orders"]]
            medians = {c: statistics.median(pair_ratios(run, c)) for c in cands}
            runs.append((os.path.basename(path), medians, held))
    print(f"{len(runs)} runs; held-out ratio measured for the {sum(h is not None for *_, h in runs)}"
          " where the no-margin rule kept an order\n")
    print("| keep when median pair ratio >= | orders kept | held-out gains of those kept "
          "| slowdowns avoided | gains given up | sum of held-out gains |")
    print("|---|---|---|---|---|---|")
    for margin in MARGINS:
        gains, avoided, given_up = [], [], []
        for _, medians, held in runs:
            if held is None:
                continue  # no-margin rule kept TensorFlow's: a margin keeps it too
            if kept(medians, margin):
                gains.append((held - 1) * 100)
            elif held < 1:
                avoided.append((held - 1) * 100)
            else:
                given_up.append((held - 1) * 100)
        fmt = lambda xs: ", ".join(f"{x:+.1f}" for x in sorted(xs)) or "-"  # noqa: E731
        print(f"| {margin:.2f} | {len(gains)} | {fmt(gains)} | {len(avoided)} ({fmt(avoided)}) "
              f"| {len(given_up)} ({fmt(given_up)}) | {sum(gains):+.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or [os.path.join(HERE, "results", "scale")]))
