"""TensorFlow's default vs TicTac on a shaped network: the results table and plots.

Runs `tictac bench` on a list of configurations (one JSON each, under --out), then
`tictac bench-report` on all of them (report.md + PNG plots in --out). Needs root and
tc for a shaped network; otherwise every run falls back to loopback and says so.

  sudo .venv/bin/python benchmarks/bench_tictac.py [--out benchmarks/results]
      [--steps 15] [--configs resnet50:training:2:1:auto,...|sweep]

A configuration is MODEL[/BATCH]:MODE:WORKERS:PS:BANDWIDTH[;BANDWIDTH...] (bandwidths as
in `tictac bench --bandwidth`, ';'-separated for a sweep; BATCH per worker, default the
model's). The defaults are the configurations in the README (about 35 minutes).
`--report-only` reruns nothing: it rebuilds the report from the results in --out, with
the simulator's predictions recomputed from the inputs each run saved beside its result.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

DEFAULT_CONFIGS = (
    "resnet50:training:2:1:auto",
    "vgg16:training:1:1:auto",
    "mobilenetv2:inference:2:1:auto",
    "resnet50:inference:2:1:auto",
    "vgg16:inference:1:1:auto",
    "inceptionv3:inference:2:1:auto",
    "inceptionv3:training:2:1:auto",
    "resnet50/32:inference:4:2:auto",
    "resnet50:training:2:1:auto:0.5",
    "vgg16:training:1:1:auto:0.5",
)

# gain against comm/comp: `--configs sweep`
SWEEP_CONFIGS = (
    "resnet50:training:2:1:auto:0.25;auto:0.5;auto;auto:2",
    "resnet50:inference:2:1:auto:0.25;auto:0.5;auto;auto:2",
    "inceptionv3:training:2:1:auto:0.5;auto;auto:2",
)


def result_name(model: str, mode: str, workers: str, ps: str, bandwidth: str) -> str:
    """``resnet50-training-w2-p1.json``; a non-default bandwidth is named too
    (``...-comm0.5.json`` for ``auto:0.5``)."""
    name = f"{model}-{mode}-w{workers}-p{ps}"
    if bandwidth != "auto":
        tag = bandwidth.replace("auto:", "comm").replace(";", "_").replace(":", "")
        name += f"-{tag}"
    return name + ".json"


def _wait_for_other_benchmarks(limit_s: float = 600.0) -> None:
    """Timing fidelity: wait (bounded) while another benchmark runs on this machine."""
    deadline = time.monotonic() + limit_s
    me = {str(os.getpid()), str(os.getppid())}
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-af", "bench_|tictac bench"], capture_output=True,
                             text=True).stdout.splitlines()
        others = [line for line in out if line.split()[0] not in me
                  and "bench_tictac.py" not in line and "pgrep" not in line]
        if not others:
            return
        print(f"waiting for other benchmarks: {others[:2]}", file=sys.stderr, flush=True)
        time.sleep(15)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="configurations (see above), or 'sweep' for the comm/comp sweep")
    p.add_argument("--steps", type=int, default=15, help="measured steps per schedule")
    p.add_argument("--block-steps", type=int, default=5)
    p.add_argument("--schedules", default=None,
                   help="passed to `tictac bench --schedules` (default: its own)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild the report from the configurations' results already in --out, the "
                        "simulator's predictions recomputed from their saved inputs")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    configs = SWEEP_CONFIGS if args.configs == "sweep" else args.configs.split(",")
    outputs = []
    for spec in configs:
        model, mode, workers, ps, bandwidth = spec.split(":", 4)
        model, _, batch = model.partition("/")
        path = os.path.join(args.out, result_name(model, mode, workers, ps, bandwidth))
        if args.report_only:
            if not os.path.exists(path) and os.path.exists(path + ".gz"):
                path += ".gz"  # kept compressed (compact_results.py)
            if not os.path.exists(path):
                print(f"no result for {spec}: {path} (run without --report-only)",
                      file=sys.stderr)
                return 1
            outputs.append(path)
            continue
        _wait_for_other_benchmarks()
        argv = [sys.executable, "-m", "tictac_hooks.cli", "bench", "--model", model,
                "--mode", mode, "--workers", workers, "--ps", ps,
                "--bandwidth", bandwidth.replace(";", ","), "--steps", str(args.steps),
                "--block-steps", str(args.block_steps), "--json", path]
        if batch:
            argv += ["--batch-size", batch]
        if args.schedules:
            argv += ["--schedules", args.schedules]
        print(f"== {' '.join(argv[2:])}", file=sys.stderr, flush=True)
        rc = subprocess.run(argv, cwd=ROOT, timeout=3600).returncode
        if rc != 0:
            print(f"FAILED ({rc}): {spec}", file=sys.stderr, flush=True)
            continue
        outputs.append(path)
    if not outputs:
        return 1
    rc = subprocess.run([sys.executable, "-m", "tictac_hooks.cli", "bench-report", *outputs,
                         "--output-dir", args.out] + (["--repredict"] if args.report_only else []),
                        cwd=ROOT).returncode
    with open(os.path.join(args.out, "report.md")) as f:
        print(f.read())
    return rc


if __name__ == "__main__":
    sys.exit(main())
