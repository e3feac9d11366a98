"""records.BenchRun and its parts: the result file's format, read back whole, and the
results kept in the repository read with the fields they lack defaulted."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re

import pytest

from tictac_hooks.records import (BenchRun, CheckSummary, GateCounts, InRunCompute,
                                  ProfiledCompute, RecordError, UnscheduledTransfer)
from tictac_hooks.records.files import json_paths, load_json

from .results import sweep_result, with_run

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks", "results")


def _full() -> BenchRun:
    """A run with every optional part set."""
    res = sweep_result()
    tic = res.runs[0].schedules["tic"]
    tic = dataclasses.replace(
        tic, gate=GateCounts(transfers=40, violations=1, violation_pct=2.5, skips=0,
                             matched=0.9, reordered=2, bytes_per_worker_step=1e6),
        unscheduled=(UnscheduledTransfer("w", 400, 2, "late"),),
        check=CheckSummary("tictac", "tic", 61.5, 240, {"tic": 0.95, "tac": None}))
    res = with_run(res, 0, schedules={"tic": tic}, compute_s=0.2,
                   in_run=InRunCompute(0.31, 0.15, [0.3, 0.31, 0.32], [0.15, 0.15]))
    return dataclasses.replace(
        res, compute=ProfiledCompute(0.5, 0.2, 0.5, 0.4), incomplete="cut short",
        commit="a" * 40, dirty=True, command="tictac bench --quick", network_reason="x",
        queues={"ps0": {"out": {"bytes": 9, "packets": 3, "drops": 1, "overlimits": 2},
                        "in": {"bytes": 4, "packets": 1, "drops": 0, "overlimits": 0}}})


def test_a_bench_run_reads_back_as_written():
    res = _full()
    data = json.loads(json.dumps(res.to_json()))
    assert BenchRun.from_json(data) == res
    assert data["commit"] == "a" * 40 and data["dirty"] is True
    assert data["command"] == "tictac bench --quick"
    assert data["network"]["queues"]["ps0"]["out"]["drops"] == 1
    assert data["schedules"] == data["runs"][0]["schedules"]  # the first rate's, on top
    assert res.schedules == res.runs[0].schedules
    tic = data["runs"][0]["schedules"]["tic"]
    # the gate's counts sit beside the step times, as every result has written them
    assert (tic["transfers"], tic["violations"], tic["matched"]) == (40, 1, 0.9)
    assert data["runs"][0]["schedules"]["none"]["transfers"] is None
    assert data["runs"][0]["rate"] == "200mbit" and res.runs[1].rate == "50mbit"
    plain = sweep_result()
    assert BenchRun.from_json(json.loads(json.dumps(plain.to_json()))) == plain


def test_the_simulator_inputs_travel_with_a_rate_but_not_into_the_result():
    res = with_run(sweep_result(), 0, sim_inputs={"version": 3})
    assert res.runs[0].sim_inputs == {"version": 3}
    assert "sim_inputs" not in res.to_json()["runs"][0]
    assert BenchRun.from_json(res.to_json()) == res  # not part of the record's value


@pytest.mark.parametrize("path, key", [
    (("runs",), "runs"), (("config", "label"), "label"), (("network", "shaped"), "shaped"),
    (("runs", 0, "comm_s"), "comm_s"),
    (("runs", 0, "schedules", "tic", "throughput"), "throughput"),
    (("runs", 0, "schedules", "tic", "violations"), "violations"),
    (("runs", 0, "vs_default", "tic", "cv_cut"), "cv_cut"),
    (("runs", 0, "in_run", "compute_steps"), "compute_steps"),
    (("runs", 0, "schedules", "tic", "check", "decision"), "decision"),
    (("runs", 0, "schedules", "tic", "unscheduled", 0, "reason"), "reason"),
    (("machine", "after"), "after"), (("compute", "trace_op_sum_s"), "trace_op_sum_s")])
def test_a_record_without_a_field_every_version_wrote_is_refused(path, key):
    data = copy.deepcopy(_full().to_json())
    holder = data
    for step in path[:-1]:
        holder = holder[step]
    del holder[path[-1]]
    with pytest.raises(RecordError, match=repr(key)):
        BenchRun.from_json(data)


def test_fields_added_later_default_where_a_result_lacks_them():
    data = _full().to_json()
    for key in ("commit", "dirty", "command", "compute", "incomplete"):
        del data[key]
    del data["network"]["queues"]
    run = data["runs"][0]
    for key in ("compute_s", "in_run", "predicted_step_s"):
        del run[key]
    for key in ("reordered", "bytes_per_worker_step", "efficiency_steps", "efficiency_note",
                "unscheduled", "check"):
        del run["schedules"]["tic"][key]
    for key in ("backend", "pin_workers", "check_rounds", "check_block_steps",
                "conserve_after_s", "calibrate"):
        del data["config"][key]
    res = BenchRun.from_json(data)
    assert (res.commit, res.dirty, res.command, res.incomplete) == ("", False, "", "")
    assert res.compute is None and res.config.backend is None and res.queues is None
    first = res.runs[0]
    assert first.compute_s is None and first.in_run is None and first.predicted_step_s is None
    tic = first.schedules["tic"]
    assert tic.gate.reordered is None and tic.gate.bytes_per_worker_step is None
    assert tic.unscheduled is None and tic.check is None and tic.efficiency_steps is None


def test_every_result_kept_in_the_repository_reads_and_writes_back_its_values():
    paths = json_paths(os.path.join(RESULTS, "**", "*.json"), recursive=True)
    runs = 0
    for path in paths:
        data = load_json(path)
        if not (isinstance(data, dict) and "runs" in data and "config" in data):
            continue  # another benchmark's output (overhead, probes)
        res = BenchRun.from_json(data)
        if "commit" in data:  # written since results record where they came from
            assert re.fullmatch(r"[0-9a-f]{40}", res.commit), path
            assert res.command.startswith("tictac bench "), path
        else:  # written before: read with the fields' defaults
            assert res.commit == "" and res.command == "", path
        written = json.loads(json.dumps(res.to_json()))
        assert BenchRun.from_json(written) == res, path
        _assert_holds(data, written, path)
        runs += 1
    if not runs:
        pytest.skip("no bench results in this checkout")


def _assert_holds(old, new, where):
    """Every key and value of ``old`` is in ``new`` (which may hold more)."""
    if isinstance(old, dict):
        for key, value in old.items():
            assert key in new, f"{where}: {key} lost"
            _assert_holds(value, new[key], f"{where}/{key}")
    elif isinstance(old, list):
        assert len(old) == len(new), where
        for i, (a, b) in enumerate(zip(old, new)):
            _assert_holds(a, b, f"{where}[{i}]")
    else:
        assert old == new, f"{where}: {old!r} became {new!r}"
