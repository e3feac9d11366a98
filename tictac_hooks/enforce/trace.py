"""Trace export: the per-transfer timeline as Chrome / Perfetto trace JSON.

Open the file in https://ui.perfetto.dev or chrome://tracing.

Layout:

* one process per PS (``PS <address>``);
* per worker (the destination of the PS's transfers), one ``<worker> · steps`` thread
  and as many ``<worker> · lane <n>`` threads as it had transfers in flight at once.

A lane's slices never overlap: a worker's transfers of one step are in flight together
(every variable is read at the start of a step, and the rendezvous lets several go at
once), and both viewers mis-draw slices that partially overlap on one thread. Each
transfer goes to the lowest-numbered lane that is free when it arrives (the greedy
colouring of an interval graph, which needs exactly as many lanes as the most
transfers in flight at one moment). Lane numbers carry no meaning beyond that; the
transfer's ``args`` (``step_id``, ``priority``) say which step and slot it was.

Each transfer is a complete event from its arrival at the PS's gate to its hand-back
(the PS's response leaving), with ``args``: ``step_id``, ``bytes``, ``priority`` (its
slot in the schedule, -1 when it has none), ``held_s`` (how long the gate held it back
waiting for its turn), ``ps_s`` (from its release to the hand-back: the PS producing
the response) and ``error`` when the call failed.

Event categories (``cat``; filter on them in either viewer):

``listed``
    a transfer the installed schedule names and this PS expected: the gate held it
    until its turn. The only category TicTac reorders.
``pass``
    a transfer the schedule does not name (or no schedule was installed yet, e.g. the
    profiling steps): forwarded at once, untouched.
``late``
    a scheduled transfer that arrived (or finished) after its slot had been skipped:
    forwarded at once. Counts as a violation of the order.
``unexpected``
    a transfer the schedule names but that this PS had not served when the schedule
    was installed (so it did not wait for it): forwarded at once; a violation.
``duplicate``
    a second transfer of the same name in the same step (e.g. a variable read twice):
    forwarded at once.
``step``
    on the ``steps`` thread: one slice per step, from the step's first arrival to its
    last hand-back at this PS (``args``: ``transfers``, ``bytes``, ``skips``,
    ``violations``, ``complete``, ``algorithm``, ``schedule_version``).
``skip``
    on the (first) ``steps`` thread: an instant where the gate gave up a scheduled
    transfer's slot and let the later ones go. ``args.reason``: ``timeout`` (it had not
    arrived within the skip timeout), ``slow`` (it had arrived and gone to the PS, whose
    response did not leave in time), ``absent`` (skipped at once: it had not come in
    the previous steps either) or ``cancelled`` (its call ended without a response).

Timestamps are whole microseconds from the earliest event in the file;
``otherData.origin_unix_s`` is that moment as Unix time.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable

from tictac_hooks.records import GateStep

#: The transfer categories: the gate's ticket states (tictac_hooks/enforce/gate.py,
#: and the same names from the native gate).
TRANSFER_CATEGORIES = ("listed", "pass", "late", "unexpected", "duplicate")
#: Every category :func:`chrome_trace` emits.
CATEGORIES = TRANSFER_CATEGORIES + ("step", "skip")


def assign_lanes(intervals: Iterable[tuple[int, int]]) -> list[int]:
    """The lane of each ``(start, end)`` interval, in input order: the lowest lane whose
    last interval ended at or before the start, in order of start. Intervals in one lane
    are disjoint (touching ends allowed); the lane count is the most that overlap."""
    intervals = list(intervals)
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1], i))
    ends: list[int] = []  # per lane, the end of its last interval
    lanes = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        for lane, last in enumerate(ends):
            if last <= start:
                break
        else:
            lane = len(ends)
            ends.append(end)
        ends[lane] = end
        lanes[i] = lane
    return lanes


def chrome_trace(stats: dict[str, Any]) -> dict[str, Any]:
    """Chrome trace JSON from :func:`tictac_hooks.enforce.client.stats_everywhere`
    output (or one PS's stats)."""
    default_ps = stats.get("ps") if isinstance(stats.get("ps"), str) else ""
    steps = [GateStep.from_json(s, ps=s.get("ps", default_ps)) for s in stats.get("steps", [])]
    times = [t for step in steps for t in _times(step)]
    origin = min(times, default=0.0)

    def us(t: float) -> int:
        # Whole µs from the origin: integers, which every viewer reads exactly, so that a
        # slice that starts where another ends does not overlap it by a rounding error.
        # (A Unix time in a double is good to about 0.25 µs anyway.)
        return round((t - origin) * 1e6)

    # Per (ps, worker) channel, in order of first appearance.
    channels: dict[tuple[str, str], dict[str, list]] = {}
    for step in steps:
        ch = channels.setdefault((step.ps, step.worker),
                                 {"transfers": [], "steps": [], "skips": []})
        handed = [t for t in step.transfers if t.handback]
        for t in handed:
            start = us(t.arrive)
            args = {"step_id": step.step_id, "bytes": t.bytes,
                    "priority": t.priority,
                    "held_s": max(t.release - t.arrive, 0.0) if t.release else 0.0,
                    "ps_s": max(t.handback - (t.release or t.arrive), 0.0)}
            if t.error:
                args["error"] = t.error
            ch["transfers"].append(((start, max(us(t.handback), start)),
                                    {"name": t.name, "cat": t.state, "args": args}))
        if handed or step.skipped:
            span = [us(x) for x in _times(step)]
            ch["steps"].append(((min(span), max(span)), {
                "name": f"step {step.step_id}", "cat": "step",
                "args": {"step_id": step.step_id, "transfers": len(handed),
                         "bytes": step.bytes,
                         "skips": len(step.skipped),
                         "violations": step.violations,
                         "complete": step.complete,
                         "algorithm": step.algorithm,
                         "schedule_version": step.schedule_version}}))
        for s in step.skipped:
            ch["skips"].append((us(s.time), {
                "name": f"skip {s.name}", "cat": "skip",
                "args": {"step_id": step.step_id, "reason": s.reason}}))

    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tid = 0

    def thread(pid: int, name: str) -> int:
        nonlocal tid
        tid += 1
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
        return tid

    def slices(pid: int, names: Callable[[int], str], items: list) -> list[int]:
        """Complete events for ``items`` on as many threads (``names(lane)``) as they
        need; their tids."""
        lanes = assign_lanes(span for span, _ in items)
        tids = [thread(pid, names(n)) for n in range(max(lanes, default=-1) + 1)]
        for ((start, end), event), lane in zip(items, lanes):
            events.append({**event, "ph": "X", "pid": pid, "tid": tids[lane],
                           "ts": start, "dur": end - start})
        return tids

    for (ps, worker), ch in channels.items():
        if ps not in pids:
            pids[ps] = len(pids) + 1
            events.append({"name": "process_name", "ph": "M", "pid": pids[ps],
                           "args": {"name": f"PS {ps}"}})
        pid = pids[ps]
        step_tids = slices(pid, lambda n, w=worker: f"{w} · steps{f' {n + 1}' if n else ''}",
                           ch["steps"])
        for ts, event in ch["skips"]:  # every skip's step has a slice, so step_tids[0]
            events.append({**event, "ph": "i", "s": "t", "pid": pid, "tid": step_tids[0],
                           "ts": ts})
        slices(pid, lambda n, w=worker: f"{w} · lane {n + 1}", ch["transfers"])
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"origin_unix_s": origin}}


def _times(step: GateStep) -> list[float]:
    """The moments a step record's events start or end."""
    out = [x for t in step.transfers if t.handback for x in (t.arrive, t.handback)]
    return out + [s.time for s in step.skipped]


def write_chrome_trace(stats: dict[str, Any], path: str | os.PathLike) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(stats), f)
