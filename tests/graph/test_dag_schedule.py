"""Graph and schedule files: validation, clear errors, round trips, the public format."""

import json

import pytest

from graph_builders import random_dag
from tictac_hooks.graph import Graph, GraphError, Op, Schedule, ScheduleError
from tictac_hooks.graph.algorithms import tic


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text if isinstance(text, str) else json.dumps(text))
    return p


def test_graph_json_round_trip(tmp_path):
    g = random_dag(3, n_recvs=6, n_compute=10, channels=2)
    p = tmp_path / "g.json"
    g.save(p)
    h = Graph.load(p)
    assert [(o.name, o.kind, o.inputs, o.time, o.channel) for o in h.ops] == \
           [(o.name, o.kind, o.inputs, o.time, o.channel) for o in g.ops]


def test_graph_json_round_trip_with_and_without_declared_positions(tmp_path):
    g = Graph([Op("w1", "recv", declared=1, param="w1"), Op("w2", "recv", declared=0),
               Op("x", "compute", ("w1", "w2"))])
    g.save(tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    assert [d.get("declared") for d in data["ops"]] == [1, 0, None]
    assert "declared" not in data["ops"][2]
    h = Graph.load(tmp_path / "g.json")
    assert [(o.name, o.declared, o.param) for o in h.ops] == \
           [("w1", 1, "w1"), ("w2", 0, None), ("x", None, None)]
    # without: no field written, None read back
    plain = random_dag(3, n_recvs=4, n_compute=6)
    plain.save(tmp_path / "p.json")
    assert "declared" not in (tmp_path / "p.json").read_text()
    assert all(o.declared is None for o in Graph.load(tmp_path / "p.json").ops)
    # a recv turned into a compute op drops its position
    assert g.with_recvs_only({"w2"})["w1"].declared is None


def test_topological_order_and_default_channel():
    g = Graph.from_json({"ops": [
        {"name": "b", "kind": "compute", "inputs": ["a", "w"]},
        {"name": "a", "kind": "compute", "inputs": ["w"]},
        {"name": "w", "kind": "recv", "bytes": 40}]})
    assert [o.name for o in g.ops] == ["w", "a", "b"]
    assert g["w"].channel == "ps:0" and g.summary()["param_bytes"] == 40


@pytest.mark.parametrize("data,message", [
    ({"ops": [{"name": "a", "kind": "compute", "inputs": ["nope"]}]},
     "op 'a' has unknown input 'nope'"),
    ({"ops": [{"name": "a", "kind": "compute", "inputs": ["b"]},
              {"name": "b", "kind": "compute", "inputs": ["a"]}]},
     "cycle: .*a.*b"),
    ({"ops": [{"name": "x", "kind": "compute", "param": "v"}]},
     "'param' is a recv's parameter name"),
    ({"ops": [{"name": "x", "kind": "compute", "declared": 0}]},
     r"'declared' is a recv's declaration position, an integer >= 0, got 0"),
    ({"ops": [{"name": "w", "kind": "recv", "declared": -1}]},
     r"ops\[0\] \('w'\): 'declared' is a recv's declaration position"),
    ({"ops": [{"name": "w", "kind": "recv", "declared": True}]},
     "'declared' is a recv's declaration position, an integer >= 0, got True"),
    ({"ops": [{"name": "w", "kind": "recv", "declared": "3"}]},
     "'declared' is a recv's declaration position"),
    ({"ops": [{"name": "a", "kind": "compute", "time": -1}]},
     "op 'a': time must be a finite number >= 0"),
    ({"ops": [{"name": "a", "kind": "send"}]}, "kind must be 'recv' or 'compute'"),
    ({"ops": [{"name": "a"}, {"name": "a"}]}, "duplicate op name 'a'"),
    ({"ops": [{"name": "a", "kind": "compute", "time": "fast"}]}, r"ops\[0\] \('a'\): 'time' must be a number"),
    ({"ops": [{"name": "a", "tiem": 1}]}, r"unknown field\(s\) \['tiem'\]"),
    ({"nodes": []}, "expected an object with an 'ops' list"),
    ({"ops": [{"kind": "recv"}]}, "missing field 'name'"),
])
def test_bad_graphs_name_the_op_or_field(data, message):
    with pytest.raises(GraphError, match=message):
        Graph.from_json(data)


def test_malformed_graph_file(tmp_path):
    with pytest.raises(GraphError, match="not valid JSON"):
        Graph.load(write(tmp_path, "g.json", "{ops: ["))
    with pytest.raises(GraphError, match="no such file"):
        Graph.load(tmp_path / "missing.json")


def test_schedule_json_and_public_tsv(tmp_path):
    g = random_dag(2, n_recvs=8, n_compute=12)
    s = tic(g)
    p = tmp_path / "o.json"
    s.save(p)
    assert Schedule.load(p) == s
    tsv = "".join(f"{n}\t{s.priority[n]}\n" for n in reversed(s.order))
    t = Schedule.load(write(tmp_path, "o.txt", tsv))
    assert dict(t.priority) == dict(s.priority)


@pytest.mark.parametrize("text,message", [
    ('{"order": ["a", "a"]}', "'a' more than once"),
    ('{"order": ["a", "b"], "priority": {"a": 0, "b": 5}}', r"integer in \[0, 2\)"),
    ('{"order": ["a", "b"], "priority": {"a": 1, "b": 0}}', "not sorted by priority"),
    ('{"order": ["a"], "priority": {"b": 0}}', "name different transfers"),
    ('{"priority": {}}', "missing field 'order'"),
    ('{"order": "a"}', "'order' must be a list"),
    ('{"order": [', "not valid JSON"),
    ("a\t0\nb 1\n", r":2: expected 'name<TAB>priority'"),
    ("a\tfirst\n", "priority must be an integer"),
])
def test_malformed_schedule_files(tmp_path, text, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule.load(write(tmp_path, "s", text))


def test_schedule_that_does_not_fit_the_graph():
    g = Graph([Op("w", "recv"), Op("c", "compute", ("w",))])
    with pytest.raises(ScheduleError, match="not recvs of the graph, e.g. 'c' .*compute op"):
        Schedule.from_order("x", ["w", "c"]).check_fits(g)


def test_per_channel_reranks_each_ps_from_zero():
    g = Graph([Op("a", "recv", channel="ps:0"), Op("b", "recv", channel="ps:1"),
               Op("c", "recv", channel="ps:0"), Op("d", "recv", channel="ps:1"),
               Op("x", "compute", ("a", "b", "c", "d"))])
    s = Schedule.from_order("tic", ["a", "b", "c", "d"], {"a": 0, "b": 0, "c": 2, "d": 3})
    per = s.per_channel(g)
    assert dict(per["ps:0"].priority) == {"a": 0, "c": 1}
    assert dict(per["ps:1"].priority) == {"b": 0, "d": 1}


def test_with_recvs_only_turns_unreceived_reads_into_free_compute():
    g = Graph([Op("a", "recv", time=1.0), Op("b", "recv", time=2.0),
               Op("x", "compute", ("a", "b"), time=1.0)])
    h = g.with_recvs_only({"a"})
    assert [o.name for o in h.recvs] == ["a"]
    assert h["b"].kind == "compute" and h["b"].time == 0.0 and h["b"].channel is None
    assert h["x"].inputs == ("a", "b")


def test_merged_keeps_each_destinations_own_ranks():
    a = Schedule.from_order("tic", ["a0", "b0", "c0"], {"a0": 0, "b0": 0, "c0": 2})
    b = Schedule.from_order("tic", ["b1", "a1"])
    m = Schedule.merged([a, b])
    assert dict(m.priority) == {"a0": 0, "b0": 0, "c0": 2, "b1": 0, "a1": 1}
    assert m.order == ("a0", "b0", "b1", "a1", "c0")
    assert m.restricted(["b1", "a1"]) == b.restricted(["b1", "a1"])
