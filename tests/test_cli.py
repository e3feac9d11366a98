"""`tictac order` and `tictac simulate` end to end (in-process and via the entry point)."""

import json
import subprocess
import sys

import pytest

from graph_builders import random_dag
from tictac_hooks.cli import main
from tictac_hooks.graph.cli import parse_rate


def test_order_then_simulate(tmp_path, capsys):
    g = random_dag(5, n_recvs=6, n_compute=12, channels=2)
    gp = tmp_path / "g.json"
    g.save(gp)
    assert main(["order", "--algorithm", "tac", str(gp), "-o", str(tmp_path / "o.json")]) == 0
    order = json.loads((tmp_path / "o.json").read_text())
    assert order["algorithm"] == "tac" and sorted(order["order"]) == sorted(o.name for o in g.recvs)
    assert main(["simulate", str(gp), "--order", str(tmp_path / "o.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"makespan", "upper", "lower", "efficiency", "speedup"} <= set(out)
    assert out["lower"] <= out["makespan"] <= out["upper"]
    assert main(["simulate", str(gp), "--algorithm", "random", "--seed", "3"]) == 0


def test_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    gp = tmp_path / "g.json"
    gp.write_text('{"ops": [{"name": "a", "inputs": ["b"]}]}')
    assert main(["order", str(gp)]) == 2
    err = capsys.readouterr().err
    assert "tictac order: error:" in err and "unknown input 'b'" in err
    random_dag(0, timed=False).save(gp)
    assert main(["simulate", str(gp), "--algorithm", "tic"]) == 2
    assert "no time" in capsys.readouterr().err


def test_unknown_algorithm_is_rejected_by_argparse(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["order", "--algorithm", "fifo", "g.json"])
    assert "invalid choice: 'fifo'" in capsys.readouterr().err


def test_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "tictac_hooks.cli", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for command in ("order", "simulate", "analyze"):
        assert command in out


@pytest.mark.parametrize("text,value", [("1Gbit", 125e6), ("100Mbit", 12.5e6), ("125MB", 125e6),
                                        ("10gbps", 1.25e9), ("2.5 GB/s", 2.5e9)])
def test_parse_rate(text, value):
    assert parse_rate(text) == pytest.approx(value)


def test_parse_rate_rejects_nonsense():
    with pytest.raises(ValueError, match="bad rate 'fast'"):
        parse_rate("fast")
