"""Trace export: the per-transfer timeline as Chrome / Perfetto trace JSON.

One process per PS, one thread (track) per (worker, PS) channel; each transfer is a
complete event from its arrival at the rendezvous to its hand-back, with the time it
waited for its turn in ``args``. Open the file in https://ui.perfetto.dev or
chrome://tracing.
"""

from __future__ import annotations

import json
import os
from typing import Any


def chrome_trace(stats: dict[str, Any]) -> dict[str, Any]:
    """Chrome trace JSON from :func:`tictac_hooks.enforce.client.stats_everywhere`
    output (or one PS's stats)."""
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    default_ps = stats.get("ps") if isinstance(stats.get("ps"), str) else ""
    for step in stats.get("steps", []):
        ps = step.get("ps", default_ps)
        pid = pids.setdefault(ps, len(pids) + 1)
        tid = tids.setdefault((ps, step["worker"]), len(tids) + 1)
        for t in step["transfers"]:
            if not t["handback"]:
                continue
            events.append({
                "name": t["name"], "cat": t["state"], "ph": "X", "pid": pid, "tid": tid,
                "ts": t["arrive"] * 1e6, "dur": max(t["handback"] - t["arrive"], 0) * 1e6,
                "args": {"step_id": step["step_id"], "bytes": t["bytes"],
                         "priority": t["priority"],
                         "held_s": t["release"] - t["arrive"],
                         "ps_s": max(t["handback"] - t["release"], 0.0)}})
        for s in step.get("skipped", []):
            events.append({"name": f"skip {s['name']}", "cat": "skip", "ph": "i", "s": "t",
                           "pid": pid, "tid": tid, "ts": s["time"] * 1e6,
                           "args": {"step_id": step["step_id"], "reason": s["reason"]}})
    for ps, pid in pids.items():
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"PS {ps}"}})
    for (ps, worker), tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pids[ps], "tid": tid,
                       "args": {"name": f"{worker} <- {ps}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(stats: dict[str, Any], path: str | os.PathLike) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(stats), f)
