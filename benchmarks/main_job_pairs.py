"""Is the gain the main job prints the gain a user gets? Runs the main job
(scripts/main.sh) with TicTac and without (``--notictac``: plain fit), alternately, and
compares the fit's wall time ("fit: N steps in X s", profiling, switch and check
included) with what TicTac's order check printed: the kept order's gain and its lower
bound, or that TensorFlow's order was kept and no gain claimed.

    python3 benchmarks/main_job_pairs.py [--pairs 3] [--out results/main-job-pairs.json]

Measured gain per pair: time without / time with - 1 (> 0: TicTac's run was faster).
The last line reads ``median measured gain <g> % over <n> pairs; printed: <what>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIT = re.compile(r"^fit: (\d+) steps in ([\d.]+) s", re.M)
KEPT = re.compile(r"order check: (\S+)(?: \(= \S+\))? kept: ([+-][\d.]+) % throughput.*?"
                  r"\(at least ([+-][\d.]+) %, (\d+) rounds?")
NOT_KEPT = re.compile(r"order check: .*not shown faster, TensorFlow's order kept")


def run(extra: Sequence[str], log: str | None = None) -> dict[str, Any]:
    t0 = time.time()
    out = subprocess.run([os.path.join(ROOT, "scripts", "main.sh"), *extra], cwd=ROOT,
                         capture_output=True, text=True)
    text = out.stdout + out.stderr
    if log:
        with open(log, "w") as f:
            f.write(text)
    fit = FIT.search(text)
    if out.returncode or not fit:
        raise SystemExit(f"main.sh {' '.join(extra)} failed (exit {out.returncode}):\n"
                         + text[-3000:])
    got: dict[str, Any] = {"fit_s": float(fit.group(2)), "steps": int(fit.group(1)),
                           "wall_s": round(time.time() - t0, 1)}
    kept = KEPT.search(text)
    if kept:
        got.update(printed="kept", order=kept.group(1), gain=float(kept.group(2)),
                   lower=float(kept.group(3)), rounds=int(kept.group(4)))
    elif NOT_KEPT.search(text):
        got.update(printed="tensorflow")
    elif "--notictac" not in extra:
        got.update(printed="other")
    return got


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the runs as JSON")
    ap.add_argument("--logs", default=None, help="write each run's output in this folder")
    args = ap.parse_args(argv)
    pairs = []
    for i in range(args.pairs):
        # alternate which goes first, so drift of the machine favours neither
        order = [("with", []), ("without", ["--notictac"])]
        if i % 2:
            order.reverse()
        if args.logs:
            os.makedirs(args.logs, exist_ok=True)
        got = {name: run(extra, args.logs and os.path.join(args.logs, f"pair{i + 1}-{name}.txt"))
               for name, extra in order}
        got["measured_gain"] = got["without"]["fit_s"] / got["with"]["fit_s"] - 1
        pairs.append(got)
        w = got["with"]
        printed = (f"{w['order']} kept {w['gain']:+.1f} % (at least {w['lower']:+.1f} %, "
                   f"{w['rounds']} rounds)" if w.get("printed") == "kept"
                   else "TensorFlow's order kept, no gain claimed"
                   if w.get("printed") == "tensorflow" else w.get("printed"))
        print(f"pair {i + 1}: fit {got['with']['fit_s']:.1f} s with TicTac, "
              f"{got['without']['fit_s']:.1f} s without: measured "
              f"{100 * got['measured_gain']:+.1f} %; printed: {printed}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(pairs, f, indent=1)
    median = statistics.median(p["measured_gain"] for p in pairs)
    lowers = [p["with"].get("lower") for p in pairs if p["with"].get("printed") == "kept"]
    printed = (f"kept in {len(lowers)} of {len(pairs)}, lower bounds "
               f"{', '.join(f'{x:+.1f} %' for x in lowers)}" if lowers
               else "TensorFlow's order kept in every run, no gain claimed")
    print(f"median measured gain {100 * median:+.1f} % over {len(pairs)} pairs; "
          f"printed: {printed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
