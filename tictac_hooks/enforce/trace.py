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
waiting for its turn: records.TransferRecord.held_s), ``ps_s`` (the PS producing the
response: TransferRecord.ps_s) and ``error`` when the call failed.

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

Timestamps are whole microseconds from the origin, ``otherData.origin_unix_s`` (Unix
time): the earliest event in the file when it is written at once, the first record's
earliest event when it is streamed (:class:`TraceWriter`, as the callbacks write it
while training runs).
"""

from __future__ import annotations

import io
import json
import os
from typing import IO, Any, Callable, Iterable

from tictac_hooks.records import GateStep

#: The transfer categories: the gate's ticket states (tictac_hooks/enforce/gate.py,
#: and the same names from the native gate).
TRANSFER_CATEGORIES = ("listed", "pass", "late", "unexpected", "duplicate")
#: Every category :func:`chrome_trace` emits.
CATEGORIES = TRANSFER_CATEGORIES + ("step", "skip")
#: How long a lane remembers a slice after the latest start seen: a record that
#: finishes this much after a later one started could share a lane with an overlap.
LANE_HORIZON_S = 120.0


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


class TraceWriter:
    """Writes the trace as records come, with bounded memory: each step record's events
    go to ``out`` (a text file) at once, and the lanes remember only the slices that
    end within :data:`LANE_HORIZON_S` of the latest start seen.

    ``origin`` (Unix seconds) is the trace's zero; None: the earliest moment of the
    first record written. An event before it (a step that started earlier but finished
    later) gets a negative timestamp, which both viewers place correctly.

    ``max_records`` bounds the file too: after that many step records the rest are
    counted (``left_out``), not written, and the file's ``otherData`` says so.

    Example:
      with open(path, "w") as f, TraceWriter(f) as trace:
          trace.add(cursor.read().steps)
    """

    def __init__(self, out: IO[str], origin: float | None = None,
                 max_records: int | None = None) -> None:
        self._out = out
        self.origin = origin
        self.max_records = max_records
        self.left_out = 0
        self._pids: dict[str, int] = {}
        self._tid = 0
        # Per (ps, worker): lanes of transfers and of steps, each lane a list of the
        # (start, end) µs spans still within the horizon, with its tid.
        self._lanes: dict[tuple[str, str, str], list[tuple[int, list[tuple[int, int]]]]] = {}
        self._latest = 0
        self._first = True
        self.records = 0
        out.write('{"displayTimeUnit": "ms", "traceEvents": [')

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _us(self, t: float) -> int:
        # Whole µs from the origin: integers, which every viewer reads exactly, so that a
        # slice that starts where another ends does not overlap it by a rounding error.
        # (A Unix time in a double is good to about 0.25 µs anyway.)
        return round((t - self.origin) * 1e6)

    def _emit(self, event: dict[str, Any]) -> None:
        self._out.write(("" if self._first else ",\n") + json.dumps(event))
        self._first = False

    def _pid(self, ps: str) -> int:
        pid = self._pids.get(ps)
        if pid is None:
            pid = self._pids[ps] = len(self._pids) + 1
            self._emit({"name": "process_name", "ph": "M", "pid": pid,
                        "args": {"name": f"PS {ps}"}})
        return pid

    def _thread(self, pid: int, name: str) -> int:
        self._tid += 1
        self._emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": self._tid,
                    "args": {"name": name}})
        self._emit({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": self._tid,
                    "args": {"sort_index": self._tid}})
        return self._tid

    def _lane_tid(self, pid: int, key: tuple[str, str, str], span: tuple[int, int],
                  name: Callable[[int], str]) -> int:
        """The tid of the lowest lane of ``key`` where ``span`` overlaps no slice
        (touching ends allowed); a new lane when none is free."""
        start, end = span
        lanes = self._lanes.setdefault(key, [])
        horizon = self._latest - round(LANE_HORIZON_S * 1e6)
        for tid, spans in lanes:
            spans[:] = [s for s in spans if s[1] >= horizon]
            if not any(_overlap(span, other) for other in spans):
                spans.append(span)
                return tid
        tid = self._thread(pid, name(len(lanes)))
        lanes.append((tid, [span]))
        return tid

    def add(self, steps: Iterable[GateStep]) -> None:
        """Writes the events of ``steps`` (step records, each naming its ``ps``)."""
        for step in steps:
            times = _times(step)
            if not times:
                continue
            if self.max_records is not None and self.records >= self.max_records:
                self.left_out += 1
                continue
            if self.origin is None:
                self.origin = min(times)
            self.records += 1
            pid = self._pid(step.ps)
            ps, worker = step.ps, step.worker
            span = [self._us(x) for x in times]
            self._latest = max(self._latest, min(span))
            steps_tid = self._lane_tid(
                pid, (ps, worker, "steps"), (min(span), max(span)),
                lambda n: f"{worker} · steps{f' {n + 1}' if n else ''}")
            first_steps_tid = self._lanes[(ps, worker, "steps")][0][0]
            handed = [t for t in step.transfers if t.handback]
            self._emit({"name": f"step {step.step_id}", "cat": "step", "ph": "X",
                        "pid": pid, "tid": steps_tid, "ts": min(span),
                        "dur": max(span) - min(span),
                        "args": {"step_id": step.step_id, "transfers": len(handed),
                                 "bytes": step.bytes, "skips": len(step.skipped),
                                 "violations": step.violations, "complete": step.complete,
                                 "algorithm": step.algorithm,
                                 "schedule_version": step.schedule_version}})
            for s in step.skipped:
                self._emit({"name": f"skip {s.name}", "cat": "skip", "ph": "i", "s": "t",
                            "pid": pid, "tid": first_steps_tid, "ts": self._us(s.time),
                            "args": {"step_id": step.step_id, "reason": s.reason}})
            spans = [(self._us(t.arrive), max(self._us(t.handback), self._us(t.arrive)))
                     for t in handed]
            for i in sorted(range(len(handed)), key=lambda i: (spans[i][0], -spans[i][1], i)):
                t = handed[i]
                tid = self._lane_tid(pid, (ps, worker, "lanes"), spans[i],
                                     lambda n: f"{worker} · lane {n + 1}")
                args = {"step_id": step.step_id, "bytes": t.bytes, "priority": t.priority,
                        "held_s": t.held_s, "ps_s": t.ps_s}
                if t.error:
                    args["error"] = t.error
                self._emit({"name": t.name, "cat": t.state, "ph": "X", "pid": pid,
                            "tid": tid, "ts": spans[i][0], "dur": spans[i][1] - spans[i][0],
                            "args": args})

    def close(self) -> None:
        """Ends the JSON (the file stays open: its owner closes it)."""
        if self._out is None:
            return
        other: dict[str, Any] = {"origin_unix_s": self.origin or 0.0}
        if self.left_out:
            other.update(records_written=self.records, records_left_out=self.left_out)
        self._out.write('], "otherData": ' + json.dumps(other) + "}")
        self._out = None  # type: ignore[assignment]


def chrome_trace(steps: Iterable[GateStep]) -> dict[str, Any]:
    """Chrome trace JSON of step records (each naming its ``ps``), with the earliest
    event at 0."""
    steps = list(steps)
    out = io.StringIO()
    writer = TraceWriter(out, origin=min((x for s in steps for x in _times(s)), default=0.0))
    writer.add(steps)
    writer.close()
    return json.loads(out.getvalue())


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two spans cannot share a lane: they overlap (touching ends do not), or
    a zero-long one lies at or after the other's start and before its end."""
    (s1, e1), (s2, e2) = a, b
    if s1 == e1:
        return s2 <= s1 < e2
    if s2 == e2:
        return s1 <= s2 < e1
    return s1 < e2 and s2 < e1


def _times(step: GateStep) -> list[float]:
    """The moments a step record's events start or end."""
    out = [x for t in step.transfers if t.handback for x in (t.arrive, t.handback)]
    return out + [s.time for s in step.skipped]


def write_chrome_trace(steps: Iterable[GateStep], path: str | os.PathLike) -> None:
    with open(path, "w") as f, TraceWriter(f) as writer:
        writer.add(sorted(steps, key=lambda s: s.start))
