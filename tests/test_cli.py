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


def test_declared_and_first_use_orders_and_the_layer_alias(tmp_path, capsys, monkeypatch):
    from tictac_hooks.graph import Graph, Op
    from tictac_hooks.graph import algorithms
    monkeypatch.setattr(algorithms, "_aliases_said", set())
    ops = [Op("w1", "recv", time=1.0, declared=1), Op("w2", "recv", time=1.0, declared=0),
           Op("l1", "compute", ("w1",), time=1.0), Op("l2", "compute", ("l1", "w2"), time=1.0)]
    gp = tmp_path / "g.json"
    Graph(ops).save(gp)
    assert main(["order", "--algorithm", "declared", str(gp)]) == 0
    assert json.loads(capsys.readouterr().out)["order"] == ["w2", "w1"]
    for name in ("first-use", "layer"):
        assert main(["order", "--algorithm", name, str(gp)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["algorithm"] == "first-use" and out["order"] == ["w1", "w2"]
    for name in ("declared", "first-use", "layer"):
        assert main(["simulate", str(gp), "--algorithm", name]) == 0
        # declared: w2 first, l1 waits for w1 (1 s), then l1, l2: 4 s; first-use 3 s
        assert json.loads(capsys.readouterr().out)["makespan"] == \
            pytest.approx(4.0 if name == "declared" else 3.0)
    Graph(ops[:1] + [Op("w2", "recv", time=1.0)] + ops[2:]).save(gp)
    assert main(["order", "--algorithm", "declared", str(gp)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tictac order: error: algorithm 'declared' needs each recv's "
                          "declaration position")
    assert "1 of 2 recvs lack it: 'w2'" in err and "Extract the graph again" in err


def test_unknown_algorithm_is_rejected_by_argparse(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["order", "--algorithm", "fifo", "g.json"])
    assert "invalid choice: 'fifo'" in capsys.readouterr().err


def test_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "tictac_hooks.cli", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for command in ("order", "simulate", "analyze"):
        assert command in out
    # The deployment commands come first, the research tools last.
    listed = [line.split()[0] for line in out.splitlines()
              if line.startswith("    ") and line.split()[0].isidentifier()]
    assert listed.index("ps") < listed.index("bench") < listed.index("order"), listed
    assert "Deploying: ps, server, schedule, build" in " ".join(out.split())


@pytest.mark.parametrize("args,old,new,dest,value", [
    (["ps", "--cluster-spec", "{}"], "--skip-after", "--skip-timeout", "skip_after", 3.0),
    (["schedule", "install", "--ps", "127.0.0.1:1", "o.json"], "--skip-after",
     "--skip-timeout", "skip_after", 3.0),
    (["bench"], "--batch", "--batch-size", "batch", 3),
    (["bench-report", "r.json"], "--out", "--output-dir", "out", "3"),
])
def test_a_renamed_option_takes_its_old_name_with_one_deprecation_line(
        args, old, new, dest, value, capsys):
    from tictac_hooks.cli import build_parser
    parser = build_parser()
    assert getattr(parser.parse_args(args + [new, "3"]), dest) == value
    assert capsys.readouterr().err == ""
    assert getattr(parser.parse_args(args + [old, "3"]), dest) == value
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"{old} is deprecated; use {new}" in lines[0], lines


@pytest.mark.parametrize("command,shown,hidden", [
    ("ps", ["--skip-timeout", "--tf-config", "--bind-host", "--resolve-timeout"],
     ["--skip-after"]),
    ("bench", ["--batch-size", "training: forward, backward"], ["--batch "]),
    ("order", ["docs/OFFLINE.md"], ["see README"]),
    ("bench-report", ["--output-dir"], ["--out "]),
])
def test_help_shows_the_current_names(command, shown, hidden):
    """The current name in --help, the old one hidden (it still parses)."""
    out = subprocess.run([sys.executable, "-m", "tictac_hooks.cli", command, "--help"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    text = " ".join(out.split())
    for name in shown:
        assert name in text, name
    for name in hidden:
        assert name not in text, name


@pytest.mark.parametrize("text,value", [("1Gbit", 125e6), ("100Mbit", 12.5e6), ("125MB", 125e6),
                                        ("10gbps", 1.25e9), ("2.5 GB/s", 2.5e9)])
def test_parse_rate(text, value):
    assert parse_rate(text) == pytest.approx(value)


def test_parse_rate_rejects_nonsense():
    with pytest.raises(ValueError, match="bad rate 'fast'"):
        parse_rate("fast")


# -- parse-time checks of the enforce and analyze options (issue #14.5, #14.9) ---------

@pytest.mark.parametrize("args,message", [
    (["schedule", "stats", "--ps", "127.0.0.1:99999"],
     "tictac schedule stats: error: argument --ps: must be HOST:PORT with a port in "
     "1..65535, got '127.0.0.1:99999'"),
    (["schedule", "install", "--ps", "127.0.0.1:0", "o.json"],
     "argument --ps: must be HOST:PORT with a port in 1..65535, got '127.0.0.1:0'"),
    (["schedule", "clear", "--ps", "localhost"],
     "argument --ps: must be HOST:PORT with a port in 1..65535, got 'localhost'"),
    (["schedule", "stats", "--ps", "127.0.0.1:1", "--timeout", "0"],
     "argument --timeout: must be a finite number of seconds > 0, got '0'"),
    (["schedule", "stats", "--ps", "127.0.0.1:1", "--timeout", "nan"],
     "argument --timeout: must be a finite number of seconds > 0, got 'nan'"),
    (["schedule", "stats", "--ps", "127.0.0.1:1", "--timeout", "-2"],
     "argument --timeout: must be a finite number of seconds > 0, got '-2'"),
    (["schedule", "install", "--ps", "127.0.0.1:1", "--skip-after", "inf", "o.json"],
     "argument --skip-after: must be a finite number of seconds > 0, got 'inf'"),
    (["ps", "--cluster-spec", "{}", "--private-port", "70000"],
     "argument --private-port: must be a port number in 0..65535 (0: pick a free one), "
     "got '70000'"),
    (["ps", "--cluster-spec", "{}", "--private-port", "-1"],
     "argument --private-port: must be a port number in 0..65535"),
    (["ps", "--cluster-spec", "{}", "--skip-after", "nan"],
     "argument --skip-after: must be a finite number of seconds > 0, got 'nan'"),
    (["ps", "--cluster-spec", "{}", "--task-index", "-1"],
     "argument --task-index: must be a whole number >= 0, got '-1'"),
    (["analyze", "--model", "MobileNetV2", "--ps", "0"],
     "tictac analyze: error: argument --ps: must be a whole number >= 1, got '0'"),
    (["analyze", "--model", "MobileNetV2", "--batch-size", "0"],
     "argument --batch-size: must be a whole number >= 1, got '0'"),
    (["analyze", "--model", "MobileNetV2", "--seeds", "-1"],
     "argument --seeds: must be a whole number >= 1, got '-1'"),
    (["analyze", "--model", "MobileNetV2", "--bandwidth", "fast"],
     "argument --bandwidth: bad rate 'fast'"),
])
def test_bad_option_values_are_rejected_at_parse_time(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


@pytest.mark.parametrize("spec,message", [
    ("[]", "--cluster-spec must be a JSON object {job: [addresses]}, e.g. "
           '{"ps": ["host:2222"], "worker": ["host:2223"]}, or a path to a file holding '
           "one; --cluster-spec holds a JSON list: []"),
    ('"ps"', "or a path to a file holding one; --cluster-spec holds a JSON str: 'ps'"),
    ("no-such-cluster.json", "or a path to a file holding one; 'no-such-cluster.json' is "
                             "not JSON, and no such file exists"),
    ('{"ps": "127.0.0.1:2222"}', "or a path to a file holding one; job 'ps' is "
                                 "'127.0.0.1:2222'"),
    ('{"ps": ["127.0.0.1:99999"]}', "the cluster spec's address of ps:0 must be HOST:PORT "
                                    "with a port in 1..65535, got '127.0.0.1:99999'"),
    ('{"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1"]}',
     "the cluster spec's address of worker:0 must be HOST:PORT with a port in 1..65535, "
     "got '127.0.0.1'"),
])
def test_a_wrong_cluster_spec_is_a_one_line_error_before_tensorflow(spec, message, capsys):
    assert main(["ps", "--cluster-spec", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tictac ps: error: ") and message in err, err
    assert err.count("\n") == 1, err


def test_a_cluster_spec_file_holding_a_list_names_the_file(tmp_path, capsys):
    path = tmp_path / "cluster.json"
    path.write_text("[]")
    assert main(["ps", "--cluster-spec", str(path)]) == 2
    assert f"--cluster-spec file {str(path)!r} holds a JSON list" in capsys.readouterr().err


# -- `tictac ... | head` (issue #14.9) --------------------------------------------------

@pytest.mark.parametrize("recvs", [3, 3000], ids=["fits-the-buffer", "larger-than-a-pipe"])
def test_a_closed_stdout_pipe_ends_the_command_quietly(tmp_path, recvs):
    """The reader of stdout is gone (`tictac ... | head`): no "[Errno 32] Broken pipe",
    no "Exception ignored" at exit, no traceback."""
    import os
    g = random_dag(1, n_recvs=recvs, n_compute=4, channels=1)
    g.save(tmp_path / "g.json")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: every write gets EPIPE
    try:
        out = subprocess.run([sys.executable, "-m", "tictac_hooks.cli", "order",
                              str(tmp_path / "g.json")], stdout=write_end,
                             stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert out.stderr == "", out.stderr
    assert out.returncode == 1


def test_schedule_stats_into_a_closed_pipe_is_quiet():
    import os

    from tictac_hooks.enforce.proxy import Rendezvous, RendezvousThread
    rv = RendezvousThread(Rendezvous("127.0.0.1:0", "127.0.0.1:1",
                                     request_parser=lambda b: (0, ""))).start()
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", "tictac_hooks.cli", "schedule", "stats",
                              "--ps", rv.address], stdout=write_end, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    finally:
        os.close(write_end)
        rv.stop()
    assert "Broken pipe" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
    assert out.returncode == 1
