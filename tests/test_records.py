"""records.py: the one definition of what the gates record, and its wire format."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from tictac_hooks import records
from tictac_hooks.records import (GateStats, GateStep, RecordError, SkipRecord,
                                  TransferRecord)

NATIVE = os.path.join(os.path.dirname(os.path.dirname(records.__file__)), "enforce", "native")


def _gate_source() -> str:
    """The native gate's sources (gate.cc and the gate_*.cc beside it), one text."""
    names = sorted(n for n in os.listdir(NATIVE) if re.fullmatch(r"gate(_\w+)?\.cc", n))
    return "\n".join(open(os.path.join(NATIVE, n)).read() for n in names)


def _cc_function(source: str, signature: str) -> str:
    body = source[source.index(signature):]
    return body[:body.index("\n}\n")]


def _cc_keys(text: str) -> set[str]:
    return set(re.findall(r'\\"(\w+)\\":', text))


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_native_gates_record_fields_are_records_py_fields():
    source = _gate_source()
    record = _cc_function(source, "std::string Channel::Record() const {")
    numbered = _cc_function(source, "std::string Numbered(")
    written = _cc_keys(record) | _cc_keys(numbered)
    # Every field of the three record classes, less the one the reading client sets.
    defined = (_fields(GateStep) - {"ps"}) | _fields(TransferRecord) | _fields(SkipRecord)
    assert written == defined, (
        f"the native gate writes {sorted(written - defined)} that records.py does not define, "
        f"and lacks {sorted(defined - written)}")


def test_the_native_gates_stats_fields_are_gate_stats_fields():
    source = _gate_source()
    written = (_cc_keys(_cc_function(source, "std::string Gate::SummaryLocked() {"))
               | _cc_keys(_cc_function(source, "std::string Gate::StatsLocked(")))
    # The client sets ps and device; upstream is the proxy's.
    defined = _fields(GateStats) - {"ps", "device", "upstream"}
    assert written == defined, (sorted(written - defined), sorted(defined - written))


def test_states_and_skip_reasons_are_the_native_gates_strings():
    source = _gate_source()
    names = set(re.findall(r'return "(\w+)";', _cc_function(source, "const char* StateName")))
    assert names == set(records.STATES)
    calls = re.findall(r"\bSkip\(ch, ([^;]*)\);", source)
    reasons = {r for call in calls for r in re.findall(r'"(\w+)"', call)}
    assert reasons == {records.ABSENT, records.SLOW, records.TIMEOUT}, calls


def _transfer(**kw) -> TransferRecord:
    base = dict(name="a", state=records.LISTED, priority=0, bytes=8, arrive=10.0,
                release=0.0, release_seq=0, handback=0.0)
    return TransferRecord(**(base | kw))


def test_held_and_ps_time_mean_the_same_on_both_backends():
    # Proxy: the request waits 2 s, the PS takes 1 s; ready is the hand-back.
    proxy = _transfer(release=12.0, handback=13.0, ready=13.0)
    assert proxy.held_s == pytest.approx(2.0) and proxy.ps_s == pytest.approx(1.0)
    # Native: the PS takes 1 s, the response waits 2 s for its turn.
    native = _transfer(ready=11.0, release=13.0, handback=13.0)
    assert native.held_s == pytest.approx(2.0) and native.ps_s == pytest.approx(1.0)
    # Not yet released: held for nothing yet; an old record without ready.
    assert _transfer().held_s == 0.0 and _transfer().ps_s == 0.0
    old = _transfer(release=12.0, handback=13.0)
    assert old.held_s == pytest.approx(2.0) and old.ps_s == pytest.approx(1.0)


def _step_json(**kw):
    t = _transfer(release=12.0, handback=13.0, ready=13.0, dead=True, tensor="edge_1_a",
                  error="CANCELLED")
    return {"step_id": 3, "worker": "/w:0", "schedule_version": 2, "algorithm": "tic",
            "complete": True, "order": ["a"], "transfers": [t.to_json()], "bytes": 8,
            "start": 10.0, "end": 13.0,
            "skipped": [SkipRecord("b", records.TIMEOUT, 12.5).to_json()], "skips": 1,
            "violations": 0, "reordered": 0, "unlisted": [], "frame": 1, "iteration": 2,
            "seq": 7, "worker_seq": 4} | kw


def test_a_step_record_round_trips_and_a_missing_field_is_named():
    step = GateStep.from_json(_step_json(), ps="ps:1")
    assert step.ps == "ps:1" and step.transfers[0].dead and step.skipped[0].reason == "timeout"
    again = GateStep.from_json(step.to_json())
    assert again == step
    broken = _step_json()
    del broken["violations"]
    with pytest.raises(RecordError, match="'violations'"):
        GateStep.from_json(broken)
    broken = _step_json()
    del broken["transfers"][0]["release_seq"]
    with pytest.raises(RecordError, match="transfer record has no 'release_seq'"):
        GateStep.from_json(broken)


def _stats_json(**kw):
    return {"backend": "native", "schedule_version": 2, "algorithm": "tic", "expected": 5,
            "window_bytes": 0, "pace_rate": 0.0, "align": True, "conserve_after_s": None,
            "skip_after_s": 2.0, "active_steps": 1, "history": 3, "served_names": 9,
            "totals": {"listed": 4, "pass": 1}, "since": 6, "last_seq": 7, "dropped": 0,
            "steps": [_step_json()]} | kw


def test_gate_stats_round_trip_name_the_ps_on_every_record_and_refuse_gaps():
    stats = GateStats.from_json(_stats_json(), ps="ps:1")
    assert stats.ps == "ps:1" and stats.steps[0].ps == "ps:1"
    assert stats.skip_after_s == 2.0 and stats.conserve_after_s is None
    assert stats.since == 6 and stats.last_seq == 7 and stats.totals == {"listed": 4, "pass": 1}
    assert GateStats.from_json(stats.to_json()) == stats
    assert "steps" not in stats.to_json(steps=False)
    # A full read (no cursor) says neither since nor last_seq.
    full = GateStats.from_json(_stats_json(since=None), ps="p")
    assert "since" not in full.to_json() and full.since is None
    for missing in ("expected", "steps", "totals"):
        d = _stats_json()
        del d[missing]
        with pytest.raises(RecordError, match=repr(missing)):
            GateStats.from_json(d, ps="p")
    with pytest.raises(RecordError, match="list of step records"):
        GateStats.from_json(_stats_json(steps={"a": 1}), ps="p")


def test_the_python_gates_stats_are_gate_stats():
    from tictac_hooks.enforce.gate import Gate
    gate = Gate()
    stats = gate.stats(ps="p:1", backend="proxy", upstream="u:2")
    assert isinstance(stats, GateStats) and stats.backend == "proxy"
    assert stats.upstream == "u:2" and stats.steps == () and stats.pace_rate is None
    assert GateStats.from_json(stats.to_json()) == stats
    read = gate.stats(since=0)
    assert read.since == 0 and read.last_seq == 0 and read.dropped == 0


def test_an_order_check_result_round_trips_in_the_summarys_json_shape():
    from tictac_hooks.run.order_check import CheckPlan, Window, decide
    from tictac_hooks.records import CHECK, SCHEDULED, CheckResult, WorkerStep
    recs, windows, t, i = [], [], 0.0, 0
    plan = CheckPlan(3, 4, ("tic",))
    for r in range(3):
        for c in plan.round_blocks(r, plan.names):
            start = t
            for _ in range(4):
                x = 1.0 if c else 2.0
                recs.append(WorkerStep("/w:0", i, t, x, 0.0, SCHEDULED if c else CHECK,
                                       order=c))
                t, i = t + x, i + 1
            windows.append(Window(r, "tic", c is not None, start, t))
    result = decide(recs, plan, windows)
    d = result.to_json()
    # The summary's keys, as examples/summary.py and users read them.
    assert d["decision"] == "tictac" and d["chosen"] == "tic" and d["pairs"] == 3
    assert d["bounds"]["tic"]["verdict"] == "keep" and len(d["values"]["tic"]) == 3
    assert d["ratio_median"] == pytest.approx(2.0)
    assert d["workers"]["/w:0"]["default_median_step_time"] == pytest.approx(2.0)
    assert d["candidates"]["tic"]["ratio_min"] == pytest.approx(2.0)
    assert CheckResult.from_json(d) == result
    del d["rule"]
    with pytest.raises(RecordError, match="'rule'"):
        CheckResult.from_json(d)
