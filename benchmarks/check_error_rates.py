"""The order check's error rates: how often its rule (tictac_hooks/run/sequential.py)
keeps an order that is no faster than TensorFlow's (A/A), and how often it keeps one
that is 10 % faster, on step times recorded on this machine.

Recording (``--record N``): N runs of ``tictac bench --frontend fit`` (dlrm, 2 PS,
``--workers`` each, shaped 1 Gbit/s links where root and tc are available) whose check
measures, besides TIC and TAC, the candidate ``tf-again``: TensorFlow's own order run
as a candidate (its blocks clear the PSes, as a D block does), every round of all
``--check-rounds`` (8), in ABBA order. Each run's JSON keeps every step of its check and
every block's window (``check_steps``, ``check_windows``).

Measured, per worker count:

- **real A/A**: each recorded run's ``tf-again`` rounds, decided as the product decides
  (the rule looks after rounds 3..8 and stops at its first verdict; what it decides at
  round k depends on rounds 1..k only, so a run of all 8 rounds gives the decision of a
  run that stopped earlier);
- **resampled**: per run, each worker's steps in TensorFlow's order (its D blocks and
  tf-again blocks, in time order) are one stream; a resampled check lays ABBA rounds of
  blocks of ``block_steps - 1`` measured steps per worker on the streams from a random
  offset (consecutive steps: the machine's drift and modes are kept), the candidate's
  blocks' step times divided by 1 + gain (A/A: gain 0; "+10 %": 0.10), and runs the rule.
  Resampled checks of one run overlap, so they are not independent: the runs are.

Also printed: the median rounds to a decision and the steps a check costs per worker
(rounds x 2 blocks x block_steps), and that as a share of a recheck period (5,000 steps
per worker, the default ``recheck_every``).

    python3 benchmarks/check_error_rates.py --record 6 --workers 2,4   # ~20 min
    python3 benchmarks/check_error_rates.py [--quick] [RUN.json ...]

The last line reads ``A/A kept <x> % of <n> runs; +10 % kept <y> % of <n> runs`` (the
resampled rates, all worker counts together).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import random
import statistics
import subprocess
import sys
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from tictac_hooks.bench.fit_report import TF_AGAIN  # noqa: E402
from tictac_hooks.run.order_check import CheckPlan, Window  # noqa: E402
from tictac_hooks.run.order_check import block_steps_of  # noqa: E402
from tictac_hooks.records import WorkerStep  # noqa: E402
from tictac_hooks.run.sequential import (GO_ON, KEEP, MIN_AUTO_BLOCK, Rule,  # noqa: E402
                                         block_steps_for, log_spread)

RESULTS = os.path.join(HERE, "results", "check-rates")
RECHECK_EVERY = 5000
from tictac_hooks.flags import DEFAULTS  # noqa: E402
DEFAULT_BLOCK = DEFAULTS["check_block_steps"]  # the product's block, steps per worker
AUTO = "auto"          # --block-steps auto: each run's block chosen from its spread
PROFILED_STEPS = 60    # the steps per worker its spread is measured on


def load(path: str) -> dict[str, Any]:
    """A recorded run: its workers, block steps, records and windows."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        d = json.load(f)
    if "check_steps" not in d:
        raise SystemExit(f"{path}: no check_steps (record it with --record)")
    records = [WorkerStep(w, i, start, t, 0.0, phase, paused_s=p, order=o)
               for i, (w, start, t, phase, o, p) in enumerate(d["check_steps"])]
    windows = [Window(r, c, bool(tt), a, b, c != TF_AGAIN)
               for r, c, tt, a, b in d["check_windows"]]
    cfg = d.get("config", {})
    return {"path": path, "workers": cfg.get("workers"), "block_steps": cfg.get("block_steps"),
            "records": records, "windows": windows, "values": d["check"].get("values", {})}


def compact(src: str, dst: str) -> None:
    """A recorded run as kept in git: its configuration, the check's per-round values,
    and its steps and blocks with times rounded to 10 us (no per-order tables)."""
    with open(src) as f:
        d = json.load(f)
    workers = {w: f"w{i}" for i, w in enumerate(sorted({s[0] for s in d["check_steps"]}))}
    out = {"command": d.get("command"), "commit": d.get("commit"), "config": {
               k: d["config"][k] for k in ("model", "workers", "ps", "rate", "rounds",
                                           "block_steps")},
           "network": d.get("network"),
           "check": {"values": d["check"].get("values", {}),
                     "decision": d["check"].get("decision"),
                     "chosen": d["check"].get("chosen")},
           "check_steps": [[workers[w], round(a, 5), None if t is None else round(t, 5),
                            ph, o, round(p, 5)] for w, a, t, ph, o, p in d["check_steps"]],
           "check_windows": [[r, c, tt, round(a, 5), round(b, 5)]
                             for r, c, tt, a, b in d["check_windows"]]}
    with (gzip.open(dst, "wt") if dst.endswith(".gz") else open(dst, "w")) as f:
        json.dump(out, f, separators=(",", ":"))


def decide_sequentially(values: Sequence[float], rule: Rule) -> tuple[bool, int]:
    """(kept, rounds) of the rule looking after each round, as the product runs it."""
    for n in range(1, len(values) + 1):
        b = rule.bounds(values[:n])
        if b.verdict != GO_ON:
            return b.verdict == KEEP, n
    return False, len(values)


def streams(run: dict[str, Any]) -> dict[str, list[float]]:
    """Per worker, its measured steps in TensorFlow's order (D and tf-again blocks),
    in time order."""
    tf_windows = [w for w in run["windows"] if not w.tictac or w.candidate == TF_AGAIN]
    per = block_steps_of(run["records"], tf_windows)
    out: dict[str, list[tuple[float, float]]] = {}
    for steps in per:
        for worker, rs in steps.items():
            out.setdefault(worker, []).extend((r.start, r.step_time) for r in rs)
    return {w: [t for _, t in sorted(v)] for w, v in out.items()}


def resample(run_streams: dict[str, list[float]], per_block: int, gain: float,
             rule: Rule, rng: random.Random) -> tuple[bool, int] | None:
    """One resampled check on the streams (None: too short for ``rule.max_rounds``)."""
    need = rule.max_rounds * 2 * per_block
    length = min(len(s) for s in run_streams.values())
    if length < need:
        return None
    offset = rng.randrange(0, length - need + 1)
    values = []
    # the order of the sides as a run draws it (a fresh seed per check)
    plan = CheckPlan(rule.max_rounds, per_block + 1, seed=rng.randrange(1 << 31))
    for r in range(rule.max_rounds):
        sides = ("T", "D") if plan.t_first(r) else ("D", "T")
        medians = {}
        for k, side in enumerate(sides):
            lo = offset + (2 * r + k) * per_block
            times = [t for s in run_streams.values() for t in s[lo:lo + per_block]]
            if side == "T":
                times = [t / (1 + gain) for t in times]
            medians[side] = statistics.median(times)
        values.append(math.log(medians["D"] / medians["T"]))
        b = rule.bounds(values)
        if b.verdict != GO_ON:
            return b.verdict == KEEP, len(values)
    return False, len(values)


def measure(runs: list[dict[str, Any]], checks: int, seed: int = 0,
            block_steps: int | None = None) -> dict[str, Any]:
    """The real A/A decisions of ``runs`` and ``checks`` resampled checks per gain, with
    blocks of ``block_steps`` per worker (default: the runs' own)."""
    rule = Rule(candidates=1)
    out: dict[str, Any] = {"runs": len(runs)}
    real = [decide_sequentially(r["values"][TF_AGAIN], rule)
            for r in runs if r["values"].get(TF_AGAIN)]
    out["real_aa"] = {"kept": sum(k for k, _ in real), "of": len(real),
                      "rounds": statistics.median(n for _, n in real) if real else None}
    if block_steps == AUTO:   # each run's block from its first steps' spread
        usable = [(s, auto_block(s) - 1) for s in map(streams, runs)]
        out["auto_blocks"] = sorted(b + 1 for _, b in usable)
    else:
        usable = [(streams(r), (block_steps or r["block_steps"]) - 1) for r in runs]
    usable = [(s, b) for s, b in usable if s]  # each run's streams, once for every gain
    for label, gain in (("aa", 0.0), ("plus10", 0.10), ("plus5", 0.05), ("plus20", 0.20)):
        rng = random.Random(seed)
        results = []
        for i in range(checks):
            s, per_block = usable[i % len(usable)]
            got = resample(s, per_block, gain, rule, rng)
            if got is not None:
                results.append(got)
        rounds = [n for _, n in results]
        block = (statistics.median(out["auto_blocks"]) if block_steps == AUTO
                 else block_steps or runs[0]["block_steps"])
        out[label] = {"kept": sum(k for k, _ in results), "of": len(results),
                      "rounds_median": statistics.median(rounds) if rounds else None,
                      "check_steps_per_worker": (statistics.median(rounds) * 2 * block
                                                 if rounds else None)}
    return out


def auto_block(run_streams: dict[str, list[float]]) -> int:
    """The block the product would choose (check_block_steps 0) from a run's first
    PROFILED_STEPS steps per worker, as its profiling period would give them."""
    spread = log_spread({w: s[:PROFILED_STEPS] for w, s in run_streams.items()})
    if spread is None:
        return MIN_AUTO_BLOCK
    return block_steps_for(spread, Rule(candidates=1), RECHECK_EVERY)[0]


def record(n: int, workers: Sequence[int], rounds: int, block_steps: int,
           out_dir: str) -> list[str]:
    """``n`` recorded fit-bench runs per worker count (see the module docstring)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for w in workers:
        for i in range(1, n + 1):
            path = os.path.join(out_dir, f"dlrm-w{w}-p2-b{block_steps}-r{i}.json")
            cmd = [sys.executable, "-m", "tictac_hooks.cli", "bench", "--frontend", "fit",
                   "--model", "dlrm", "--workers", str(w), "--ps", "2",
                   "--bandwidth", "1gbit", "--schedules", TF_AGAIN,
                   "--check-rounds", str(rounds), "--check-block-steps", str(block_steps),
                   "--verify-rounds", "0", "--json", path]
            print(" ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, cwd=ROOT, check=True)
            compact(path, path + ".gz")
            os.remove(path)
            paths.append(path + ".gz")
    return paths


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="recorded runs (default: results/check-rates/)")
    ap.add_argument("--record", type=int, default=0, help="record this many runs per "
                    "worker count first")
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--check-rounds", type=int, default=8)
    ap.add_argument("--check-block-steps", type=int, default=10)
    ap.add_argument("--checks", type=int, default=400,
                    help="resampled checks per gain and worker count (default 400)")
    ap.add_argument("--quick", action="store_true", help="100 resampled checks each")
    ap.add_argument("--compact", nargs=2, metavar=("RUN.json", "OUT.json.gz"),
                    help="write a recorded run as kept in git, and stop")
    ap.add_argument("--block-steps", default="",
                    help="resample with these block lengths too (comma-separated; steps "
                         "per worker per block, the first not measured; 'auto': each "
                         "run's block as check_block_steps 0 chooses it from the run's "
                         f"first {PROFILED_STEPS} steps per worker)")
    args = ap.parse_args(argv)
    if args.compact:
        compact(*args.compact)
        return 0
    workers = [int(w) for w in args.workers.split(",") if w]
    paths = list(args.runs)
    if args.record:
        paths += record(args.record, workers, args.check_rounds, args.check_block_steps,
                        RESULTS)
    if not paths:
        paths = sorted(glob.glob(os.path.join(RESULTS, "*.json.gz")))
    if not paths:
        raise SystemExit(f"no recorded runs in {RESULTS}: record some with --record N")
    runs = [load(p) for p in paths]
    checks = 100 if args.quick else args.checks
    total = {"aa": [0, 0], "plus10": [0, 0]}
    print("| workers | block steps | runs | real A/A kept | A/A kept (resampled) | +5 % kept "
          "| +10 % kept | +20 % kept | median rounds (+10 %) "
          "| check steps per worker and candidate (+10 %) | share of a recheck period |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    sweep = [b if b == AUTO else int(b) for b in args.block_steps.split(",") if b]
    def pct(x: dict[str, Any]) -> str:
        return f"{100 * x['kept'] / x['of']:.1f} % of {x['of']}" if x["of"] else "-"
    for w, recorded in sorted({(r["workers"], r["block_steps"]) for r in runs}):
        mine = [r for r in runs if (r["workers"], r["block_steps"]) == (w, recorded)]
        for block in [None] + [b for b in sweep if b == AUTO or b < recorded]:
            m = measure(mine, checks, block_steps=block)
            if block is None and recorded == DEFAULT_BLOCK:
                for label in total:
                    total[label][0] += m[label]["kept"]
                    total[label][1] += m[label]["of"]
            steps = m["plus10"]["check_steps_per_worker"]
            share = steps / (steps + RECHECK_EVERY) if steps else None
            real = (f"{m['real_aa']['kept']} of {m['real_aa']['of']}" if block is None
                    else "(resampled only)")
            shown = (f"auto ({', '.join(map(str, m['auto_blocks']))})" if block == AUTO
                     else block or mine[0]['block_steps'])
            print(f"| {w} | {shown} | {m['runs']} | {real} "
                  f"| {pct(m['aa'])} | {pct(m['plus5'])} | {pct(m['plus10'])} "
                  f"| {pct(m['plus20'])} "
                  f"| {m['plus10']['rounds_median']} | {steps} "
                  f"| {'-' if share is None else f'{100 * share:.1f} %'} |")
    aa, p10 = total["aa"], total["plus10"]
    print(f"(the last line: the product's block, {DEFAULT_BLOCK} steps per worker)")
    print(f"A/A kept {100 * aa[0] / max(1, aa[1]):.1f} % of {aa[1]} runs; "
          f"+10 % kept {100 * p10[0] / max(1, p10[1]):.1f} % of {p10[1]} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
