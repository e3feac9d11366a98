"""What the examples print and write after a run (shared by all of them)."""

from __future__ import annotations

import json
import os
from typing import Any


def print_summary(tictac: Any, log_dir: str) -> None:
    """Step time before and after the switch, per worker; where the logs are."""
    c = tictac.controller
    summary = tictac.summary or {}
    print(f"\nTicTac ({c.settings.algorithm}): switched after {c.settings.profile_steps} steps; "
          f"{len(c.schedule) if c.schedule else 0} transfers scheduled")
    order = summary.get("order", {})
    if order.get("scheduled_steps"):
        print(f"  scheduled steps following the order: {order.get('followed', 0)} of "
              f"{order['scheduled_steps']} (skips {order.get('skips', 0)}, "
              f"violations {order.get('violations', 0)})")
    for worker, s in summary.get("workers", {}).items():
        before = s.get("profiling_median_step_time")
        after = s.get("scheduled_median_step_time")
        line = f"  {worker}: {s['steps']} steps"
        if before:
            line += f"; median step time before {before * 1e3:.1f} ms"
        if after:
            line += f", after {after * 1e3:.1f} ms"
        if before and after:
            line += f" ({(before / after - 1) * 100:+.1f} % throughput)"
        print(line)
    print("  (a loopback cluster on a shared CPU: transfers cost almost nothing here, so "
          "step-time differences are mostly noise; README, 'End to end on a shaped "
          "network', has the measured gains)")
    print(f"\nTensorBoard: .venv/bin/python -m tensorboard.main --logdir {log_dir}\n"
          f"Transfer timeline (Perfetto / chrome://tracing): "
          f"{os.path.join(log_dir, 'tictac_transfers.trace.json')}")


def write_summary(tictac: Any, path: str | None) -> None:
    if not path:
        return
    c = tictac.controller
    with open(path, "w") as f:
        json.dump((tictac.summary or {}) | {"algorithm": c.settings.algorithm,
                                            "scheduled_transfers": len(c.schedule or ())}, f)
