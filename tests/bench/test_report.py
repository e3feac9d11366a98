"""bench/report.py and bench/plots.py: the Markdown tables, the report's file and its
plots, from BenchRun records (the sections: test_expected.py, test_accuracy.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import pytest

from tictac_hooks.records.files import json_paths

from .results import result as _result, with_run


def test_report_markdown_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from tictac_hooks.bench.report import text_table, write_report
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_result().to_json()))
    md = write_report([str(path)], str(tmp_path / "out"))
    text = open(md).read()
    assert "| resnet50/training/W2/P1 b2 | 100mbit |" in text
    assert "best training gain: tic" in text
    assert os.path.exists(tmp_path / "out" / "throughput.png")
    assert any(p.startswith("cdf-") for p in os.listdir(tmp_path / "out"))
    assert "LOOPBACK FALLBACK" in text_table([_result(shaped=False)])


def test_table_gives_the_wire_time_over_the_compute_reference():
    from tictac_hooks.bench.report import text_table, wire_compute
    result = _result()
    run = result.runs[0]
    assert wire_compute(run) is None  # a result from before the compute reference
    assert "| 100mbit | 1.00 | - | none |" in text_table([result])
    result = with_run(result, 0, comm_s=0.5, compute_s=0.2)
    run = result.runs[0]
    assert wire_compute(run) == pytest.approx(2.5)
    assert "| 100mbit | 1.00 | 2.50 | none |" in text_table([result])


def test_without_matplotlib_the_report_is_written_and_names_the_extra(tmp_path, monkeypatch):
    from tictac_hooks.bench.report import write_report
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_result().to_json()))
    said = []
    md = write_report([str(path)], str(tmp_path / "out"), say=said.append)
    assert said == ["no plots: matplotlib is not installed "
                    "(pip install 'tictac-hooks[bench]')"]
    text = open(md).read()
    assert "| resnet50/training/W2/P1 b2 | 100mbit |" in text  # the tables all the same
    assert "best training gain: tic" in text
    assert "## Plots" not in text and os.listdir(tmp_path / "out") == ["report.md"]


def test_without_matplotlib_the_cli_prints_one_line_and_the_report(tmp_path, monkeypatch,
                                                                     capsys):
    from tictac_hooks.bench import cli
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(_result().to_json()))
    args = argparse.Namespace(inputs=[str(path)], out=str(tmp_path / "out"), repredict=False)
    assert cli._report(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["no plots: matplotlib is not installed (pip install 'tictac-hooks[bench]')",
                   f"wrote {tmp_path / 'out' / 'report.md'}"]


def test_report_header_gives_each_results_commit_and_command(tmp_path):
    pytest.importorskip("matplotlib")
    from tictac_hooks.bench.report import source_line, write_report
    recorded = dataclasses.replace(_result(), commit="0123456789abcdef" * 2 + "01234567",
                                   dirty=True, command="tictac bench --quick")
    assert source_line(recorded) == ("commit 0123456789ab with uncommitted changes, "
                                     "command `tictac bench --quick`")
    assert source_line(dataclasses.replace(recorded, dirty=False)) == \
        "commit 0123456789ab, command `tictac bench --quick`"
    assert source_line(dataclasses.replace(recorded, commit="")) == \
        "commit unknown (not a git checkout), command `tictac bench --quick`"
    assert source_line(_result()) == "commit unknown, command unknown"  # an older result
    for name, res in (("new.json", recorded), ("old.json", _result())):
        (tmp_path / name).write_text(json.dumps(res.to_json()))
    text = open(write_report([str(tmp_path / "new.json"), str(tmp_path / "old.json")],
                             str(tmp_path / "out"))).read()
    (new, old) = [line for line in text.splitlines() if line.startswith("- `")]
    assert new.startswith("- `new.json`: resnet50/training/W2/P1, batch 2/worker")
    assert new.endswith("10 s; commit 0123456789ab with uncommitted changes, command "
                        "`tictac bench --quick`")
    assert old.endswith("10 s; commit unknown, command unknown")


RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks", "results")


def test_the_results_kept_in_the_repository_still_make_a_report(tmp_path, monkeypatch):
    from tictac_hooks.bench.report import load_results, write_report
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the tables only: fast
    paths = json_paths(os.path.join(RESULTS, "sweep", "*.json"))
    if not paths:
        pytest.skip("no sweep results in this checkout")
    results = load_results(paths)
    assert all(r.commit == "" and r.command == "" for r in results)  # written before both
    text = open(write_report(paths, str(tmp_path), say=lambda m: None)).read()
    assert "## Simulated against measured step time" in text
    assert text.count("commit unknown, command unknown") == len(paths)
