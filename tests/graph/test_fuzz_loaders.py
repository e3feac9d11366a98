"""Fuzzing the loaders: any input loads or raises the project's own error, naming its
source; never a KeyError, TypeError, UnicodeDecodeError, RecursionError, ....

Covers Graph.from_json / Graph.load, Schedule.from_json / from_tsv (the public TicTac
code's ``name<TAB>priority`` file) / load, and the rendezvous-key parser; plus the
reported defects found next to them (binary files, ``--seed -5``, ``Infinity`` in
``tictac simulate``'s JSON).
"""

import json
import math
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tictac_hooks.cli import main
from tictac_hooks.graph import Graph, GraphError, Schedule, ScheduleError
from tictac_hooks.graph.tf.naming import parse_rendezvous_key

# database=None: no example database (Hypothesis still keeps its caches in ./.hypothesis,
# which carries its own .gitignore).
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SOURCE = "fuzz-source"

# --- strategies ---------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.text(max_size=8) | st.sampled_from([10**400, -(10**400), 2**63, -1, 0.5]))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)

NAMES = ["a", "b", "c", "d", "e"]
names = st.sampled_from(NAMES) | st.text(max_size=4)


def mostly(good, bad=json_values):
    """Usually a value of the right type, sometimes anything."""
    return st.one_of(good, good, good, bad)


op_fields = st.fixed_dictionaries({}, optional={
    "name": mostly(names),
    "kind": mostly(st.sampled_from(["recv", "compute"]), st.text(max_size=4) | json_values),
    "inputs": mostly(st.lists(names, max_size=4), st.lists(json_values, max_size=3) | json_values),
    "time": mostly(st.floats(0, 1e3) | st.integers(0, 1000),
                   st.sampled_from([-1, math.nan, math.inf, True, 10**400, "1"]) | json_values),
    "channel": mostly(st.sampled_from(["ps:0", "ps:1"]), json_values),
    "bytes": mostly(st.integers(0, 2**40), st.sampled_from([-5, 1.5, True, "8"]) | json_values),
    "declared": mostly(st.integers(0, 50), st.sampled_from([-1, 2.0, False, "3"]) | json_values),
})
op_dicts = st.builds(lambda d, extra: {**d, **extra}, op_fields,
                     st.dictionaries(st.sampled_from(["tiem", "op", ""]), json_values, max_size=1)
                     | st.just({}) | st.just({}))
graph_docs = (st.fixed_dictionaries({"ops": st.lists(mostly(op_dicts), max_size=8)})
              | st.fixed_dictionaries({"ops": json_values}) | json_values)

priorities = mostly(st.integers(0, 8), st.integers() | json_values)
schedule_docs = (
    st.fixed_dictionaries(
        {"order": mostly(st.lists(names, max_size=6), st.lists(json_values, max_size=3) | json_values)},
        optional={"priority": mostly(st.dictionaries(names, priorities, max_size=6)),
                  "algorithm": mostly(st.sampled_from(["tic", "file"]))})
    | json_values)

tsv_lines = st.one_of(
    st.tuples(names, st.sampled_from(["\t", " ", "\t\t", ""]),
              st.integers(-2, 8).map(str) | st.text(max_size=4) | st.just("9" * 5000))
    .map("".join),
    st.sampled_from(["", "# comment", "  ", "\t", "a\t0\tx"]),
    st.text(max_size=10))
tsv_texts = (st.tuples(st.lists(tsv_lines, max_size=8), st.sampled_from(["\n", "\r\n", "\r"]))
             .map(lambda t: t[1].join(t[0])) | st.text())


def _json_text(value) -> str:
    # json.dumps writes NaN/Infinity and huge integers, which json.loads reads back.
    return json.dumps(value)


def _mangled(text_strategy):
    """Text that is JSON, JSON cut short, deeply nested, or anything, as UTF-8 or not."""
    deep = st.integers(1, 60_000).map(lambda n: '{"ops": ' + "[" * n + "]" * n + "}")
    cut = st.tuples(text_strategy, st.floats(0, 1)).map(lambda t: t[0][: int(len(t[0]) * t[1])])
    texts = text_strategy | cut | deep | st.text()
    return (texts.map(lambda s: s.encode("utf-8", "surrogatepass"))
            | texts.map(lambda s: "\ufeff".join(["", s]).encode("utf-8"))
            | st.binary(max_size=64)
            | st.tuples(texts, st.binary(min_size=1, max_size=4))
            .map(lambda t: t[0].encode("utf-8", "surrogatepass") + t[1]))


graph_files = _mangled(graph_docs.map(_json_text))
schedule_files = _mangled(schedule_docs.map(_json_text) | tsv_texts)


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield os.path.join(d, "input.file")


def loads_or_own_error(load, error, source, *args):
    """load(*args); on ``error`` checks the message names ``source``; else re-raises."""
    try:
        return load(*args)
    except error as e:
        assert source in str(e), f"error does not name {source!r}: {e}"
        return None


# --- the loaders ----------------------------------------------------------------------

@FUZZ
@given(graph_docs)
def test_graph_from_json(data):
    g = loads_or_own_error(Graph.from_json, GraphError, SOURCE, data, SOURCE)
    if g is not None:
        assert Graph.from_json(g.to_json()).to_json() == g.to_json()


@FUZZ
@given(graph_files)
def test_graph_load(scratch, raw):
    with open(scratch, "wb") as f:
        f.write(raw)
    loads_or_own_error(Graph.load, GraphError, scratch, scratch)


@FUZZ
@given(schedule_docs)
def test_schedule_from_json(data):
    s = loads_or_own_error(Schedule.from_json, ScheduleError, SOURCE, data, SOURCE)
    if s is not None:
        assert Schedule.from_json(s.to_json()) == s


@FUZZ
@given(tsv_texts)
def test_schedule_from_tsv(text):
    s = loads_or_own_error(Schedule.from_tsv, ScheduleError, SOURCE, text, SOURCE)
    if s is not None:
        assert all(s.order) and list(s.priority.values()) == sorted(s.priority.values())


@FUZZ
@given(schedule_files)
def test_schedule_load(scratch, raw):
    with open(scratch, "wb") as f:
        f.write(raw)
    loads_or_own_error(Schedule.load, ScheduleError, scratch, scratch)


key_parts = st.text(st.characters(blacklist_characters=";"), max_size=12)


@FUZZ
@given(st.text() | st.lists(key_parts, max_size=7).map(";".join))
def test_parse_rendezvous_key_any_text(key):
    out = parse_rendezvous_key(key)
    assert isinstance(out, tuple) and len(out) == 3 and all(isinstance(x, str) for x in out)


@FUZZ
@given(key_parts, key_parts, st.integers(0, 10**6), key_parts.filter(lambda s: not s.startswith("edge_")))
def test_parse_rendezvous_key_well_formed(src, dst, n, name):
    key = f"{src};0000000000000001;{dst};edge_{n}_{name};0:0"
    assert parse_rendezvous_key(key) == (name, dst, f"edge_{n}_{name}")


# --- specific inputs the fuzz found, and reported defects ---------------------------------

@pytest.mark.parametrize("raw,message", [
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b'{"ops": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"ops": [{"name": "a", "bytes": ' + b"1" * 5000 + b"}]}", "not valid JSON"),
    (b'{"ops": [{"name": "a", "time": 1' + b"0" * 400 + b"}]}", "'time' must be a finite number"),
    (b'{"ops": [{"name": "a", "inputs": ["a"]}]}', "cycle"),
    (b'{"ops": [{"name": 5}]}', "non-empty string"),
])
def test_graph_load_errors_name_the_file(tmp_path, raw, message):
    p = tmp_path / "bad-graph.json"
    p.write_bytes(raw)
    with pytest.raises(GraphError, match=message) as e:
        Graph.load(p)
    assert str(p) in str(e.value)


def test_graph_load_of_a_directory_names_it(tmp_path):
    with pytest.raises(GraphError, match="cannot read") as e:
        Graph.load(tmp_path)
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("raw,message", [
    (b"a\t0\n\xff\n", "not UTF-8 text"),
    (b'{"order": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"order": ["a"], "priority": {"a": ' + b"1" * 5000 + b"}}", "not valid JSON"),
    (b"\t0\n", "empty transfer name"),
    (b"a\t" + b"9" * 5000 + b"\n", "priority must be an integer"),
])
def test_schedule_load_errors_name_the_file(tmp_path, raw, message):
    p = tmp_path / "bad-order.txt"
    p.write_bytes(raw)
    with pytest.raises(ScheduleError, match=message) as e:
        Schedule.load(p)
    assert str(p) in str(e.value)
    assert len(str(e.value)) < 400  # offending values are shortened, not echoed whole


def test_schedule_load_reads_a_utf8_bom(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b'\xef\xbb\xbf{"order": ["a", "b"]}')
    assert Schedule.load(p).order == ("a", "b")


def test_binary_graph_file_names_the_file(tmp_path, capsys):
    p = tmp_path / "weights.bin"
    p.write_bytes(bytes(range(256)))
    assert main(["simulate", str(p), "--algorithm", "random"]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and "utf-8' codec" not in err and "not UTF-8 text" in err


def test_negative_seed_names_the_flag_and_range(tmp_path, capsys):
    p = tmp_path / "g.json"
    p.write_text('{"ops": [{"name": "a", "kind": "recv", "time": 1}]}')
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(p), "--algorithm", "random", "--seed", "-5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--seed" in err and ">= 0" in err and "-5" in err


def _strict_json(text):
    def reject(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=reject)


@pytest.mark.parametrize("graph", [
    {"ops": []},
    {"ops": [{"name": "a", "kind": "recv", "time": 0}, {"name": "x", "inputs": ["a"], "time": 0}]},
])
def test_simulate_output_is_json_when_nothing_takes_time(tmp_path, capsys, graph):
    p = tmp_path / "g.json"
    p.write_text(json.dumps(graph))
    assert main(["simulate", str(p), "--algorithm", "tic"]) == 0
    out = _strict_json(capsys.readouterr().out)
    assert out["speedup"] is None and "L = 0" in out["speedup_reason"]
    assert out["efficiency"] is None and "U = L" in out["efficiency_reason"]
