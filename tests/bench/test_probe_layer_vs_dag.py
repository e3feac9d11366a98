"""benchmarks/probe_layer_vs_dag.py on the workloads `tictac bench --model` takes: the
built-in dlrm and a PATH.py:FUNCTION file, traced on a tiny batch (seconds)."""

from __future__ import annotations

import importlib.util
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MY_MODEL = "examples/my_model.py:make"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location(
        "probe_layer_vs_dag", os.path.join(ROOT, "benchmarks", "probe_layer_vs_dag.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batch_defaults_follow_the_fit_bench(probe):
    assert probe.batch_for("ResNet50", None) == 8
    assert probe.batch_for("dlrm", None) == 256
    assert probe.batch_for("transformer", None) == 16
    assert probe.batch_for(MY_MODEL, None) == 64
    assert probe.batch_for("dlrm", 4) == 4


@pytest.mark.slow
def test_the_probe_runs_dlrm_and_a_model_file(probe, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    out = tmp_path / "rows.json"
    probe.main(["--models", f"dlrm,{MY_MODEL}", "--modes", "inference,training",
                "--ratios", "1", "--batch-size", "4", "--search-evals", "5",
                "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["mode"]) for r in rows] == [
        ("dlrm", "inference"), ("dlrm", "training"),
        (MY_MODEL, "inference"), (MY_MODEL, "training")]
    for r in rows:
        assert r["batch"] == 4 and r["recvs"] > 0
        assert set(r["sim_s"]) == set(probe.ALGORITHMS)
        assert all(t > 0 for t in r["sim_s"].values())
        assert r["lower_dependency_s"] <= min(r["sim_s"].values()) + 1e-12
    # dlrm: 6 tables + 2 x 5 dense layers' kernels and biases, read once each
    assert rows[0]["recvs"] == 16
    table = capsys.readouterr().out
    assert "| dlrm | inference | 16 |" in table and f"| {MY_MODEL} | training |" in table


def test_a_bad_model_spec_or_keras3_is_refused_before_tracing(probe, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit):
        probe.main(["--models", "examples/my_model.py:nope"])
    assert "has no function 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        probe.main(["--models", "dlrm", "--keras", "keras3"])
    assert "tf_keras models" in capsys.readouterr().err
