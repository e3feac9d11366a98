"""The Chrome / Perfetto trace export: overlapping transfers on lanes of their own."""

import asyncio
import collections
import itertools
import json
import os
import random
import re

import pytest

from tictac_hooks.enforce import gate as gate_mod
from tictac_hooks.enforce import trace
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.records import GateStep


def _records(stats):
    return [GateStep.from_json(s) for s in stats["steps"]]

W0 = "/job:worker/replica:0/task:0/device:CPU:0"
W1 = "/job:worker/replica:0/task:1/device:CPU:0"
T0 = 1_700_000_000.0  # a Unix time, as the gates record


def _transfer(name, state, arrive, handback, priority=-1, nbytes=8, release=None):
    return {"name": name, "state": state, "priority": priority, "bytes": nbytes,
            "arrive": T0 + arrive, "release": T0 + (arrive if release is None else release),
            "release_seq": -1, "handback": T0 + handback if handback else 0.0}


def _step(ps, worker, step_id, transfers, skipped=()):
    """A step record with every field of records.GateStep."""
    handed = [t for t in transfers if t["handback"]]
    return {"ps": ps, "worker": worker, "step_id": step_id, "complete": True,
            "schedule_version": None, "algorithm": None,
            "order": [t["name"] for t in handed], "transfers": transfers,
            "skipped": list(skipped), "skips": len(skipped), "violations": 0,
            "reordered": 0, "unlisted": [],
            "start": min((t["arrive"] for t in transfers), default=T0),
            "end": max((t["handback"] for t in handed), default=T0),
            "bytes": sum(t["bytes"] for t in transfers)}


def _stats():
    """Two PS, two workers; transfers overlapping partially, nested, touching, across
    steps, zero-long; one never handed back; every state and a skip."""
    steps = [
        _step("ps0:1", W0, 1, [
            _transfer("a", "listed", 0.000, 0.010, priority=0, release=0.001),
            _transfer("b", "listed", 0.002, 0.012, priority=1, release=0.004),  # partial
            _transfer("c", "listed", 0.003, 0.005, priority=2),                 # nested
            _transfer("d", "pass", 0.010, 0.020),   # touches a's end
            _transfer("e", "duplicate", 0.011, 0.011),  # zero-long, inside b and d
            _transfer("f", "late", 0.004, 0.030),
            _transfer("lost", "listed", 0.005, 0.0, priority=3),  # never handed back
        ], skipped=[{"name": "ghost", "reason": "timeout", "time": T0 + 0.025}]),
        # The next step of the same worker starts before the last one's transfers end.
        _step("ps0:1", W0, 2, [
            _transfer("a", "listed", 0.015, 0.040, priority=0),
            _transfer("b", "unexpected", 0.016, 0.018),
        ]),
        _step("ps0:1", W1, 1, [
            _transfer("a", "pass", 0.001, 0.009),
            _transfer("b", "pass", 0.001, 0.009),  # same interval twice
        ]),
        _step("ps1:2", W0, 1, [
            _transfer("x", "listed", 0.000, 0.003, priority=0),
            _transfer("y", "listed", 0.001, 0.004, priority=1),
        ], skipped=[{"name": "z", "reason": "absent", "time": T0 + 0.002}]),
    ]
    return {"ps": {"ps0:1": {}, "ps1:2": {}}, "steps": steps}


def _ns(us):
    return round(us * 1000)


def _check_layout(stats, out):
    """The properties every exported trace has; returns the X events per (pid, tid)."""
    json.dumps(out)  # serialisable
    events = out["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(set((pid, n) for (pid, _), n in names.items())) == len(names)  # per PS
    tracks = collections.defaultdict(list)
    for e in events:
        if e["ph"] in ("X", "i"):
            assert (e["pid"], e["tid"]) in names, e  # every track is named
            assert e["pid"] in processes
        if e["ph"] == "X":
            assert e["dur"] >= 0
            tracks[(e["pid"], e["tid"])].append(e)
    # No two slices on one track overlap (touching is fine), in the ns the viewers use.
    for key, slices in tracks.items():
        spans = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in slices)
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert e0 <= s1, f"{names[key]}: [{s0}, {e0}] and [{s1}, {e1}] overlap"
        # A track holds either steps or transfers, never both.
        assert len({e["cat"] == "step" for e in slices}) == 1, names[key]
    # Every handed-back transfer appears exactly once, with its state as the category.
    expected = collections.Counter(
        (s["ps"], s["worker"], s["step_id"], t["name"], t["state"])
        for s in stats["steps"] for t in s["transfers"] if t["handback"])
    seen = collections.Counter()
    for (pid, tid), slices in tracks.items():
        for e in slices:
            if e["cat"] == "step":
                continue
            worker = names[(pid, tid)].split(" · ")[0]
            seen[(processes[pid].removeprefix("PS "), worker, e["args"]["step_id"],
                  e["name"], e["cat"])] += 1
    assert seen == expected
    # One step slice per step record, on the worker's steps track.
    step_slices = collections.Counter(
        (processes[pid].removeprefix("PS "), names[(pid, tid)].split(" · ")[0],
         e["args"]["step_id"])
        for (pid, tid), slices in tracks.items() for e in slices if e["cat"] == "step")
    assert all(" · steps" in names[k] for k, sl in tracks.items() if sl[0]["cat"] == "step")
    assert step_slices == collections.Counter(
        (s["ps"], s["worker"], s["step_id"]) for s in stats["steps"]
        if any(t["handback"] for t in s["transfers"]) or s["skipped"])
    # Skips are instants on a steps track, one per skip.
    skips = [e for e in events if e["ph"] == "i"]
    assert len(skips) == sum(len(s["skipped"]) for s in stats["steps"])
    assert all(e["cat"] == "skip" and " · steps" in names[(e["pid"], e["tid"])]
               for e in skips)
    return tracks, names


def test_overlapping_transfers_get_disjoint_lanes_and_each_appears_once():
    stats = _stats()
    out = trace.chrome_trace(_records(stats))
    tracks, names = _check_layout(stats, out)
    # Lanes per channel: the most transfers in flight at once. ps0 / W0: a, b, c, f at
    # 0.004-0.005 s (also b, d, f with e at 0.011 s; d, f and step 2's a, b at 0.016 s).
    per_channel = collections.Counter((k[0], names[k].split(" · ")[0]) for k in tracks
                                      if " · lane " in names[k])
    assert per_channel == {(1, W0): 4, (1, W1): 2, (2, W0): 2}
    steps_tracks = collections.Counter((k[0], names[k].split(" · ")[0]) for k in tracks
                                       if " · steps" in names[k])
    # Step 2 of W0 at ps0 starts before step 1 ends: a second steps track.
    assert steps_tracks == {(1, W0): 2, (1, W1): 1, (2, W0): 1}
    assert names[next(k for k in tracks if k[0] == 1 and names[k].startswith(W1))] == (
        f"{W1} · steps")
    # Lanes are named "<worker> · lane <n>", numbered from 1 without gaps.
    for pid, worker in per_channel:
        got = sorted(int(names[k].rsplit(" ", 1)[1]) for k in tracks
                     if k[0] == pid and names[k].startswith(f"{worker} · lane "))
        assert got == list(range(1, per_channel[(pid, worker)] + 1))
    # Timestamps are relative to the earliest event; the origin is kept.
    xs = [e for e in out["traceEvents"] if e["ph"] == "X"]
    assert min(e["ts"] for e in xs) == 0
    assert out["otherData"]["origin_unix_s"] == pytest.approx(T0)
    a = next(e for e in xs if e["name"] == "a" and e["args"]["step_id"] == 1
             and e["cat"] == "listed" and e["pid"] == 1)
    # Whole µs, as integers (exact in every viewer).
    assert all(isinstance(e["ts"], int) and isinstance(e["dur"], int) for e in xs)
    assert a["dur"] == 10_000
    assert a["args"]["held_s"] == pytest.approx(0.001, abs=1e-6)
    assert a["args"]["ps_s"] == pytest.approx(0.009, abs=1e-6)


def test_categories_are_the_documented_ones_and_the_gates_states():
    out = trace.chrome_trace(_records(_stats()))
    cats = {e["cat"] for e in out["traceEvents"] if e["ph"] != "M"}
    assert cats == set(trace.CATEGORIES)
    assert set(trace.CATEGORIES) == {"listed", "pass", "late", "unexpected", "duplicate",
                                     "step", "skip"}
    for cat in trace.CATEGORIES:  # each has its own entry in the module docstring
        assert re.search(rf"^``{cat}``$", trace.__doc__, re.M), cat
    # The transfer categories are exactly the ticket states of both gates.
    states = {v for k, v in vars(gate_mod).items()
              if k in ("PASS", "LISTED", "LATE", "UNEXPECTED", "DUPLICATE")}
    assert states == set(trace.TRANSFER_CATEGORIES)
    source = open(os.path.join(os.path.dirname(gate_mod.__file__), "native",
                               "gate_records.cc")).read()
    body = source[source.index("const char* StateName"):]
    body = body[:body.index("\n}\n")]
    assert set(re.findall(r'return "(\w+)";', body)) == set(trace.TRANSFER_CATEGORIES)


def test_assign_lanes_is_greedy_and_uses_the_fewest_lanes():
    rng = random.Random(12)
    for _ in range(200):
        spans = []
        for _ in range(rng.randrange(0, 30)):
            start = rng.randrange(0, 100)
            spans.append((start, start + rng.randrange(0, 20)))
        lanes = trace.assign_lanes(spans)
        assert len(lanes) == len(spans)
        by_lane = collections.defaultdict(list)
        for span, lane in zip(spans, lanes):
            by_lane[lane].append(span)
        for group in by_lane.values():
            group.sort()
            assert all(e0 <= s1 for (_, e0), (s1, _) in zip(group, group[1:]))
        # As many lanes as the most intervals open at one moment (zero-long ones count
        # at their instant, touching ones do not overlap).
        most = max((sum(1 for s, e in spans if s <= t < e)
                    + any(s == e == t for s, e in spans) for t in range(0, 121)), default=0)
        assert (max(lanes) + 1 if lanes else 0) == most
        assert sorted(set(lanes)) == list(range(len(set(lanes))))


def test_a_real_gate_record_exports_without_overlaps(tmp_path):
    """Records from the Python gate itself (concurrent transfers, a fake clock that
    moves a little with every call) written with write_chrome_trace."""
    ticks = itertools.count()

    async def main():
        gate = Gate(skip_after_s=1.0, clock=lambda: T0 + next(ticks) * 1e-4)
        gate.install(Schedule.from_order("test", ["a", "b", "c", "d"]))

        async def one(step, name, delay):
            t = gate.arrive(step, W0, name)
            turn = gate.request(t)
            if turn is not None:
                await turn
            await asyncio.sleep(delay)
            gate.handed_back(t)

        for step in (1, 2):
            await asyncio.gather(*(one(step, n, 0.001 * (i % 3))
                                   for i, n in enumerate(["d", "x", "c", "y", "b", "a"])))
        return gate.records()

    records = asyncio.run(main())
    path = tmp_path / "tictac_transfers.trace.json"
    trace.write_chrome_trace([GateStep.from_json(r, ps="ps0:1") for r in records], path)
    out = json.loads(path.read_text())
    _check_layout({"steps": [dict(r, ps="ps0:1") for r in records]}, out)
    cats = {e["cat"] for e in out["traceEvents"] if e["ph"] == "X"}
    assert {"listed", "pass", "step"} <= cats


def test_a_streamed_trace_is_the_same_timeline_with_bounded_lanes(tmp_path):
    """Records written as they are read (finish order, several reads) give the same
    slices as the trace written at once, and a lane forgets slices past its horizon."""
    steps = _records(_stats())
    at_once = trace.chrome_trace(steps)
    path = tmp_path / "streamed.trace.json"
    with open(path, "w") as f, trace.TraceWriter(f) as writer:
        for i in range(0, len(steps), 2):  # two records per read
            writer.add(sorted(steps[i:i + 2], key=lambda s: s.end))
    streamed = json.loads(path.read_text())
    _check_layout(_stats(), streamed)
    # The same slices, shifted by the difference of the origins.
    shift = round((streamed["otherData"]["origin_unix_s"]
                   - at_once["otherData"]["origin_unix_s"]) * 1e6)

    def slices(out, dt=0):
        return sorted((e["name"], e["cat"], e["ts"] + dt, e.get("dur", 0)) for e in out["traceEvents"]
                      if e["ph"] in ("X", "i"))
    assert slices(streamed, shift) == slices(at_once)

    # 10,000 steps one after the other, one minute apart: the lanes keep only what is
    # within the horizon, and one lane serves them all.
    far = []
    for k in range(10_000):
        t0 = T0 + 60.0 * k
        far.append(GateStep.from_json(_step("ps0:1", W0, k, [
            _transfer("a", "pass", 60.0 * k, 60.0 * k + 0.5)]), ps="ps0:1"))
    with open(tmp_path / "long.trace.json", "w") as f, trace.TraceWriter(f) as writer:
        for step in far:
            writer.add([step])
        kept = sum(len(spans) for lanes in writer._lanes.values() for _, spans in lanes)
        assert writer.records == 10_000
        assert len(writer._lanes[("ps0:1", W0, "lanes")]) == 1
        assert kept <= 2 * (trace.LANE_HORIZON_S / 60.0 + 2)
    assert len(json.loads((tmp_path / "long.trace.json").read_text())["traceEvents"]) > 20_000


def test_the_file_keeps_at_most_max_records_and_says_how_many_it_left_out(tmp_path):
    """A long run's timeline keeps its first ``max_records`` step records (the
    profiling, the switch, the first check) and counts the rest; the file stays valid
    JSON. The run's timeline (run/reading.py) is bounded so."""
    from tictac_hooks.run.reading import TIMELINE_RECORDS
    steps = [GateStep.from_json(_step("ps0:1", W0, k, [
        _transfer("a", "pass", 1.0 * k, 1.0 * k + 0.5)]), ps="ps0:1") for k in range(50)]
    path = tmp_path / "capped.trace.json"
    with open(path, "w") as f, trace.TraceWriter(f, max_records=20) as writer:
        for i in range(0, 50, 7):
            writer.add(steps[i:i + 7])
    out = json.loads(path.read_text())
    written = sorted(e["args"]["step_id"] for e in out["traceEvents"] if e.get("cat") == "step")
    assert written == list(range(20))
    assert out["otherData"]["records_written"] == 20
    assert out["otherData"]["records_left_out"] == 30
    uncapped = trace.chrome_trace(steps)
    assert "records_left_out" not in uncapped["otherData"]
    assert 1_000 <= TIMELINE_RECORDS <= 100_000
