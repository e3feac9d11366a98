"""benchmarks/results/ stays small and readable (issue #55): compact_results.py finds
nothing left to compact and the folder is under 2 MB; records/files.py reads a result
plain or gzip-compressed, and a glob for ``*.json`` finds both."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

from tictac_hooks.records.files import json_paths, load_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "compact_results.py")


def test_the_results_in_git_are_compact_and_under_two_megabytes():
    out = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 to delete, 0 to compress, 0 to reports" in out.stdout, out.stdout


def test_compaction_compresses_drops_raw_traces_and_renames_links(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import compact_results
    results, docs = tmp_path / "benchmarks" / "results" / "run", tmp_path / "docs"
    results.mkdir(parents=True)
    docs.mkdir()
    (results / "a.json").write_text(json.dumps(
        {"orders": {"tic": {"traced": [1, 2, 3], "median_ms": 5}}}, indent=2))
    (results / "a.sim.json.gz").write_bytes(gzip.compress(b"{}"))
    (results / "plot.png").write_bytes(b"png")   # no page links it
    (results / "kept.png").write_bytes(b"png")   # RESULTS.md shows it
    (results / "bench.log").write_text("line\n")
    (results / "report.md").write_text("![gain](plot.png)\n![kept](kept.png)\n")
    (tmp_path / "README.md").write_text("")
    (tmp_path / "benchmarks" / "RESULTS.md").write_text(
        "[a](results/run/a.json) ![k](results/run/kept.png)\n")
    monkeypatch.setattr(compact_results, "ROOT", str(tmp_path))
    monkeypatch.setattr(compact_results, "HERE", str(tmp_path / "benchmarks"))
    monkeypatch.setattr(compact_results, "RESULTS", str(tmp_path / "benchmarks" / "results"))
    assert compact_results.main(["--check"]) == 1
    assert compact_results.main([]) == 0
    assert sorted(os.listdir(results)) == ["a.json.gz", "bench.log.gz", "kept.png", "report.md"]
    assert load_json(str(results / "a.json")) == {"orders": {"tic": {"median_ms": 5}}}
    assert gzip.decompress((results / "bench.log.gz").read_bytes()) == b"line\n"
    report = (results / "report.md").read_text()
    assert "plot.png" not in report and "bench-report" in report and "kept.png" in report
    assert "(results/run/a.json.gz)" in (tmp_path / "benchmarks" / "RESULTS.md").read_text()
    assert compact_results.main(["--check"]) == 0  # nothing left to do
    first = (results / "a.json.gz").read_bytes()
    (results / "a.json").write_text(json.dumps({"orders": {"tic": {"median_ms": 5}}}))
    (results / "a.json.gz").unlink()
    compact_results.main([])
    assert (results / "a.json.gz").read_bytes() == first  # same content, same bytes


def test_a_json_glob_finds_plain_and_compressed_results_once(tmp_path):
    (tmp_path / "a.json").write_text('{"x": 1}')
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(b'{"x": 2}'))
    (tmp_path / "c.json").write_text('{"x": 3}')
    (tmp_path / "c.json.gz").write_bytes(gzip.compress(b'{"x": 30}'))
    (tmp_path / "c.sim.json.gz").write_bytes(gzip.compress(b"{}"))
    paths = json_paths(str(tmp_path / "*.json"))
    assert [os.path.basename(p) for p in paths] == ["a.json", "b.json.gz", "c.json"]
    assert [load_json(p)["x"] for p in paths] == [1, 2, 3]
    assert load_json(str(tmp_path / "b.json")) == {"x": 2}  # kept compressed: found
