"""The replay builder (bench/replay.py): a profile's parameters placed and sized, its
compute cut into delay segments on its own dependencies, scaled to the requested step;
and the TensorFlow graph the bench runs from it (variables on the PS tasks with their
sizes, each tower's delays after exactly the reads they need)."""

import pytest

from tictac_hooks.bench import replay
from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.graph.profile import Parameter, Profile, ProfileError, builtin, placed


@pytest.fixture(scope="module")
def tf():
    """TensorFlow, where the native library (the delay ops) can be built: skips only
    where no C++ compiler is installed."""
    tf = pytest.importorskip("tensorflow")
    from tictac_hooks.enforce.native.build import NativeBuildError, compiler
    try:
        compiler()
    except NativeBuildError as e:
        pytest.skip(f"no C++ toolchain for the native library: {e}")
    return tf


def _profile(min_shard_bytes=None):
    """x -> a(w1) -> b(w2) -> loss(y) -> db(w2) -> da: forward a, b; backward db, da.
    w1 is read twice (forward and backward), w3 only by the backward."""
    ops = [
        Op("w1/read", "recv", (), None, None, 4000, "w1", 0),
        Op("w2/read", "recv", (), None, None, 800, "w2", 1),
        Op("w1/read_1", "recv", (), None, None, 4000, "w1", 0),
        Op("w3/read", "recv", (), None, None, 40, "w3", 2),
        Op("x", "compute", (), 0.0),
        Op("y", "compute", (), 0.0),
        Op("a", "compute", ("x", "w1/read"), 0.004),
        Op("b", "compute", ("a", "w2/read"), 0.002),
        Op("loss", "compute", ("b", "y"), 0.001),
        Op("db", "compute", ("loss", "w2/read", "w3/read"), 0.002),
        Op("da", "compute", ("db", "w1/read_1"), 0.001),
    ]
    params = (Parameter("w1", 4000, 4000), Parameter("w2", 800, 800),
              Parameter("w3", 40, 40))
    return Profile("toy", True, 8, Graph(ops), params, min_shard_bytes)


def test_training_segments_wait_for_the_reads_they_need_and_sum_to_the_step():
    r = replay.plan(_profile(), ps=2, compute_ms=100.0)
    names = [s.name for s in r.shards]
    assert names == ["w1", "w2", "w3"]  # one variable each, however often read
    assert [s.ps for s in r.shards] == [0, 1, 0]  # round-robin, in creation order
    assert [s.elements for s in r.shards] == [1000, 200, 10]
    assert [s.push_elements for s in r.shards] == [1000, 200, 10]
    # x, y (0 ms) and a start the first segment (w1); b opens the second (w2); loss
    # joins it; db opens the third (w3); da needs w1 again: already read, same segment
    assert [[names[i] for i in s.reads] for s in r.segments] == [["w1"], ["w2"], ["w3"]]
    assert [round(s.ms, 6) for s in r.segments] == [40.0, 30.0, 30.0]
    assert sum(s.ops for s in r.segments) == 7
    assert r.pull_bytes == 4840 and r.push_bytes == 4840


def test_inference_replays_the_forward_ops_alone():
    r = replay.plan(_profile(), ps=1, compute_ms=60.0, training=False)
    assert [s.name for s in r.shards] == ["w1", "w2"]  # w3: a backward-only read
    assert [round(s.ms, 6) for s in r.segments] == [40.0, 20.0]  # a 4 ms, b 2 ms
    assert all(s.push_elements == 0 for s in r.shards)


def test_bytes_scale_and_segments_merge_the_smallest_pair_first():
    r = replay.plan(_profile(), ps=1, compute_ms=100.0, byte_scale=0.5, max_ops=2)
    assert [s.elements for s in r.shards] == [500, 100, 5]
    assert [round(s.ms, 6) for s in r.segments] == [40.0, 60.0]  # (30 + 30) merged
    assert r.segments[1].reads == (1, 2)  # the merged segment waits for both reads


def test_a_sharded_parameter_is_one_variable_per_ps_with_its_share():
    r = replay.plan(_profile(min_shard_bytes=1000), ps=2, compute_ms=10.0)
    w1 = [s for s in r.shards if s.name.startswith("w1")]
    assert [(s.name, s.ps, s.elements) for s in w1] == [("w1/part_0", 0, 500),
                                                        ("w1/part_1", 1, 500)]
    assert r.segments[0].reads == (0, 1)  # a waits for both shards


def test_builtin_profiles_replay_with_their_placed_bytes():
    profile = builtin("resnet50")
    r = replay.plan(profile, ps=4, compute_ms=120.0)
    assert abs(sum(s.ms for s in r.segments) - 120.0) < 1e-6
    assert len(r.segments) == 64
    assert r.pull_bytes == pytest.approx(sum(placed(profile, 4).pull_bytes), rel=0.01)
    assert {s.ps for s in r.shards} == {0, 1, 2, 3}
    assert "64 delay ops" in r.describe()


def test_bad_settings_are_refused_with_the_setting_named():
    for kwargs, word in ((dict(compute_ms=0), "compute_ms"), (dict(byte_scale=2), "byte_scale"),
                         (dict(max_ops=0), "max_ops")):
        args = dict(ps=1, compute_ms=10.0) | kwargs
        with pytest.raises(ValueError, match=word):
            replay.plan(_profile(), **args)
    untrained = Profile("fwd", False, 8, _profile().graph, _profile().parameters, None)
    with pytest.raises(ProfileError, match="inference"):
        replay.plan(untrained, ps=1, compute_ms=10.0, training=True)


def test_the_graph_places_variables_on_the_ps_and_delays_after_their_reads(tf):
    r = replay.plan(_profile(), ps=2, compute_ms=100.0)
    work = replay.build(r, [[0, 1]], compute_workers=[0])
    assert [(v.device, v.shape.as_list()) for v in work.variables] == [
        ("/job:ps/task:0", [1000]), ("/job:ps/task:1", [200]), ("/job:ps/task:0", [10])]
    g = work.graph
    tower = [op for op in g.get_operations()
             if op.type == "TictacDelay" and op.name.startswith("tower1/")]
    assert [round(op.get_attr("delay_ms"), 6) for op in tower] == [40.0, 30.0, 30.0]
    assert all(op.device == "/job:worker/task:1" for op in tower)
    # each delay takes the previous one's output and the reads first needed there
    def variable(t):  # a read: Identity <- ReadVariableOp <- VarHandleOp
        while t.op.type != "VarHandleOp":
            t = t.op.inputs[0]
        return t.op.name

    reads = [[variable(i) for i in op.inputs[1:]] for op in tower]
    assert reads == [["w1"], ["w2"], ["w3"]]
    assert [op.inputs[0].op.type for op in tower[1:]] == ["TictacDelay", "TictacDelay"]
    # training: each tower's gradients are payloads of the push size, applied on the PS
    payloads = [op for op in g.get_operations() if op.type == "TictacPayload"]
    assert sorted(op.get_attr("shape").dim[0].size for op in payloads) == [10, 10, 200, 200,
                                                                           1000, 1000]
    # the compute reference reads nothing from a PS
    ref = [op for op in g.get_operations()
           if op.type == "TictacDelay" and op.name.startswith("compute0/")]
    assert len(ref) == 3 and all(len(op.inputs) == 1 for op in ref)
    assert len(work.sets) == 1 and work.sets[0].num_timestamps == 2


def test_merged_reads_are_one_variable_per_segment_and_ps():
    r = replay.plan(_profile(min_shard_bytes=1000), ps=2, compute_ms=100.0,
                    merge_reads=True, max_ops=2)
    # segment 0 needs both w1 shards (one on each PS); segment 1 needs w2 (PS 0; w2 is
    # the third shard made, round-robin) and w3 (PS 1)
    assert [(s.name, s.ps, s.elements) for s in r.shards] == [
        ("segment_0/ps_0", 0, 500), ("segment_0/ps_1", 1, 500),
        ("segment_1/ps_0", 0, 200), ("segment_1/ps_1", 1, 10)]
    assert [s.reads for s in r.segments] == [(0, 1), (2, 3)]
    assert r.pull_bytes == replay.plan(_profile(min_shard_bytes=1000), ps=2,
                                       compute_ms=100.0).pull_bytes
    assert r.push_bytes == r.pull_bytes


def test_a_push_smaller_than_its_variable_updates_its_leading_elements(tf):
    r = replay.Replay("rows", True, 1, (replay.Shard("table", 0, 100, 30),),
                      (replay.Segment(5.0, (0,), 1),), 5.0, 1.0)
    work = replay.build(r, [[0]])
    from tictac_hooks.ports import free_port
    spec = tf.train.ClusterSpec({"ps": [f"localhost:{free_port()}"],
                                 "worker": [f"localhost:{free_port()}"]})
    servers = [tf.distribute.Server(spec, job_name=job, task_index=0)
               for job in ("ps", "worker")]  # both in this process
    with tf.compat.v1.Session(servers[1].target, graph=work.graph) as sess:
        sess.run(work.init)
        sess.run(work.sets[0].fetches)  # zeros pushed: the table stays as it was
        assert not sess.run(work.variables[0]).any()
    assert any(op.type == "ResourceScatterSub" for op in work.graph.get_operations())
    plan = replay.plan(_profile(), ps=1, compute_ms=10.0, byte_scale=0.3)
    assert all(s.push_elements <= s.elements for s in plan.shards)
