"""`tictac whatif`: profiles, placement, the cluster simulator and the CLI (pure Python)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tictac_hooks.cli import main
from tictac_hooks.graph import profile as profiles
from tictac_hooks.graph.cluster_sim import Links, Prepared, shared_with_releases, worker_step
from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.graph.whatif import Cluster, WhatIfError, predict

MB = 1_000_000


def _profile(min_shard: int | None = 250_000) -> profiles.Profile:
    """big (1 MB, first used last) and small (0.1 MB, first used first), each feeding
    0.1 s of compute; the pushes are the parameters' sizes."""
    ops = [Op("read_big", "recv", bytes=MB, param="big", declared=0),
           Op("read_small", "recv", bytes=MB // 10, param="small", declared=1),
           Op("first", "compute", ("read_small",), time=0.1),
           Op("second", "compute", ("first", "read_big"), time=0.1)]
    params = (profiles.Parameter("big", MB, MB), profiles.Parameter("small", MB // 10, MB // 10))
    return profiles.Profile(model="toy", training=True, batch=10, graph=Graph(ops),
                            parameters=params, min_shard_bytes=min_shard)


def test_placement_shards_and_round_robin() -> None:
    placed = profiles.placed(_profile(), 3)
    # big: min(3, 1 MB // 250 kB) = 3 shards on PS 0, 1, 2; small then takes PS 0.
    assert profiles.shard_count(MB, 3, 250_000) == 3
    assert placed.pull_bytes == (MB // 3 + MB // 10, MB // 3, MB // 3)
    parts = [op for op in placed.graph.recvs if op.name.startswith("read_big/part_")]
    assert [op.channel for op in parts] == ["ps:0", "ps:1", "ps:2"]
    assert set(placed.graph["second"].inputs) == {"first"} | {op.name for op in parts}
    assert profiles.placed(_profile(None), 3).pull_bytes == (MB, MB // 10, 0)


def test_profile_round_trip_and_errors(tmp_path) -> None:
    path = _profile().save(str(tmp_path))
    back = profiles.load(str(tmp_path))
    assert back.to_json() == _profile().to_json() and path.endswith(profiles.FILE)
    with pytest.raises(profiles.ProfileError, match="no profile at"):
        profiles.load(str(tmp_path / "missing"))
    data = _profile().to_json() | {"version": 99}
    with pytest.raises(profiles.ProfileError, match="version 1"):
        profiles.Profile.from_json(data, "x")


def test_processor_sharing_with_releases() -> None:
    # Two 1-byte transfers at rate 1 from t=0 share: both end at 2. A third released at
    # 2 runs alone. One released later than the other finishes by its own share.
    assert shared_with_releases([(0, 1), (0, 1), (2, 1)], 1.0) == pytest.approx([2, 2, 3])
    assert shared_with_releases([(0, 2), (1, 1)], 1.0) == pytest.approx([3, 3])


def test_worker_step_orders_and_links() -> None:
    graph = profiles.placed(_profile(None), 1).graph
    dag = Prepared.of(graph)
    links = Links(pull_rate=[MB], turn_start=[0.0], push_rate=[MB], ingress=MB, egress=MB)
    small_first = {"ps:0": [graph.index("read_small"), graph.index("read_big")]}
    big_first = {"ps:0": [graph.index("read_big"), graph.index("read_small")]}
    fast = worker_step(dag, small_first, links, [0])
    slow = worker_step(dag, big_first, links, [0])
    # small first: 0.1 s, compute "first" overlaps big's 1 s; "second" ends at 1.2 s.
    assert fast.step == pytest.approx(1.2) and slow.step == pytest.approx(1.3)
    # Pushes leave at the compute's end through the worker's egress.
    assert worker_step(dag, small_first, links, [MB]).step == pytest.approx(2.2)
    later = Links(pull_rate=[MB], turn_start=[0.5], push_rate=[MB], ingress=MB, egress=MB)
    assert worker_step(dag, small_first, later, [0]).step == pytest.approx(1.7)


def test_prediction_orders_bounds_and_scale() -> None:
    profile = _profile(None)
    one = predict(profile, Cluster(1, 1, MB))
    # TAC serves small first (pulls and compute end at 1.2 s, then 1.1 s of pushes);
    # declared serves big (declared first) first: 0.1 s later.
    assert one.row("tac").step_s == pytest.approx(1.2 + 1.1)
    assert one.row("declared").step_s == pytest.approx(1.3 + 1.1)
    assert one.row("tac").throughput == pytest.approx(10 / one.row("tac").step_s)
    many = predict(profile, Cluster(64, 1, MB))
    # 64 workers' pulls (1.1 MB each) on one PS link: every order at the link bound.
    assert many.bounds.link == pytest.approx(64 * 1.1)
    for row in many.rows:
        assert row.step_s == pytest.approx(many.bounds.link, rel=0.02)
    cpu = predict(profile, Cluster(8, 1, 100 * MB, cpus=1.0))
    assert cpu.bounds.cpu == pytest.approx(8 * 0.2)
    assert min(r.step_s for r in cpu.rows) >= cpu.bounds.cpu


def test_synchronous_barrier_waits_for_the_earlier_turns() -> None:
    profile = _profile(None)
    sync = predict(profile, Cluster(4, 1, MB, synchronous=True))
    # The last worker's turn starts after 3 turns of 1.1 s; then its own step.
    assert sync.row("tac").step_s == pytest.approx(3 * 1.1 + 2.3)
    assert sync.bounds.barrier >= 4 * 1.1


def test_bad_cluster_is_refused() -> None:
    with pytest.raises(WhatIfError, match="--workers must be >= 1, got 0"):
        predict(_profile(), Cluster(0, 1, MB))
    with pytest.raises(WhatIfError, match="unknown order"):
        predict(_profile(), Cluster(1, 1, MB), orders=("fastest",))


def test_cli_sweeps_a_built_in_profile(tmp_path, capsys) -> None:
    out = tmp_path / "w.json"
    assert main(["whatif", "--model", "dlrm", "--workers", "1,8", "--ps", "2",
                 "--bandwidth", "1gbit", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TIC" in text and "paced random" in text
    data = json.loads(out.read_text())
    assert [p["workers"] for p in data["predictions"]] == [1, 8]
    assert set(data["predictions"][0]["orders"]) == {
        "default", "random", "declared", "first-use", "tic", "tac"}


def test_cli_cpu_bound_from_the_step_cpu(tmp_path) -> None:
    out = tmp_path / "w.json"
    assert main(["whatif", "--model", "dlrm", "--workers", "16", "--ps", "4", "--bandwidth",
                 "200mbit", "--cpus", "2", "--step-cpu-ms", "50", "--json", str(out)]) == 0
    (prediction,) = json.loads(out.read_text())["predictions"]
    assert prediction["bounds_s"]["cpu"] == pytest.approx(16 * 0.050 / 2)
    assert prediction["orders"]["default"]["step_s"] >= 0.4


@pytest.mark.parametrize("argv, message", [
    (["--model", "dlrm", "--workers", "0", "--ps", "1", "--bandwidth", "1gbit"],
     "--workers takes whole numbers >= 1"),
    (["--model", "dlrm", "--workers", "1", "--ps", "1", "--bandwidth", "fast"],
     "bad rate 'fast'"),
])
def test_cli_refuses_bad_arguments(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["whatif"] + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_names_a_missing_profile(tmp_path, capsys) -> None:
    assert main(["whatif", "--profile", str(tmp_path), "--workers", "1", "--ps", "1",
                 "--bandwidth", "1gbit"]) == 2
    assert "no profile at" in capsys.readouterr().err
    assert main(["whatif", "--model", "alexnet", "--workers", "1", "--ps", "1",
                 "--bandwidth", "1gbit"]) == 2
    assert "no built-in profile 'alexnet'" in capsys.readouterr().err


def test_profile_from_a_run_keeps_its_shards() -> None:
    ops = [Op("t/part_0", "recv", bytes=10, param="t", channel="ps:0", declared=0),
           Op("t/part_1", "recv", bytes=10, param="t", channel="ps:1", declared=0),
           Op("b", "recv", bytes=10, param="b", channel="ps:0", declared=1),
           Op("use", "compute", ("t/part_0", "t/part_1", "b"))]
    profile = profiles.from_run(Graph(ops), {"use": 0.5}, {"b": 400})
    assert [p.name for p in profile.parameters] == ["t@ps:0", "t@ps:1", "b"]
    assert profile.graph["b"].bytes == 400 and profile.compute_s == 0.5
    placed = profiles.placed(profile, 2)  # each shard its own parameter, round-robin
    assert placed.pull_bytes == (10 + 400, 10)
    assert profiles.from_run(Graph(ops), None, {}).compute_s == 0.0


def test_a_profile_without_declaration_order_predicts_the_others(capsys, tmp_path) -> None:
    ops = [dataclasses.replace(op, declared=None) for op in _profile().graph.ops]
    profile = dataclasses.replace(_profile(), graph=Graph(ops))
    prediction = predict(profile, Cluster(2, 1, MB))
    assert "declared" not in prediction.orders and "tic" in prediction.orders
    with pytest.raises(WhatIfError, match="'declared' was not predicted"):
        prediction.row("declared")
    profile.save(str(tmp_path))
    assert main(["whatif", "--profile", str(tmp_path), "--workers", "2", "--ps", "1",
                 "--bandwidth", "8mbit"]) == 0
    assert "n/a" in capsys.readouterr().out


def test_the_users_step_time_scales_the_compute_and_keeps_its_shape(capsys) -> None:
    cpu = profiles.builtin("resnet50")
    gpu = profiles.at_step(cpu, 120.0)
    assert gpu.compute_s == pytest.approx(0.120)
    assert gpu.cpu_s is None and "scaled to 120 ms" in gpu.source["compute"]
    ratio = {op.name: op.time / cpu.graph[op.name].time
             for op in gpu.graph.compute_ops if cpu.graph[op.name].time}
    assert max(ratio.values()) == pytest.approx(min(ratio.values()))  # one factor
    assert [op.inputs for op in gpu.graph.ops] == [op.inputs for op in cpu.graph.ops]
    with pytest.raises(profiles.ProfileError, match="--compute-ms must be > 0"):
        profiles.at_step(cpu, 0)
    # less compute per step, the same bytes: the link bound decides sooner
    fast = predict(gpu, Cluster(16, 4, 10e9))
    slow = predict(cpu, Cluster(16, 4, 10e9))
    assert fast.row("default").step_s < slow.row("default").step_s
    assert main(["whatif", "--model", "resnet50", "--workers", "8", "--ps", "4",
                 "--bandwidth", "10gbit", "--compute-ms", "120"]) == 0
    assert "compute 120 ms per step as given" in capsys.readouterr().out
