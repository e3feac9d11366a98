"""bench/predict.py: the simulator's prediction of a benchmark step, and its saved
inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from .results import sweep_result


def test_prediction_times_each_recv_by_its_own_served_bytes():
    from tictac_hooks.bench.predict import predictions, timed
    from tictac_hooks.graph import Graph, Op, Schedule
    # a tensor over two edges: the trace gives both 300 B; the PS serves one 300 B, the
    # other (feeding only z, the backward) 0 B
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100),
               Op("e1", "recv", channel="ps:0", bytes=300),
               Op("e2", "recv", channel="ps:0", bytes=300),
               Op("x", "compute", ("a", "e1")), Op("z", "compute", ("x", "e2"))])
    compute = {"x": 1.0, "z": 1.0}
    known = {"e1": 300.0, "e2": 0.0}
    # served 400 B: e1 and e2 take what they were served, a the rest (100 B)
    t = timed(g, compute, 1.0, 100.0, served={"ps:0": 400.0}, transfer_bytes=known)
    assert [t[n].time for n in ("a", "e1", "e2")] == pytest.approx([1.0, 3.0, 0.0])
    # without them the channel's 700 traced bytes are scaled to 400 (4/7 each)
    t = timed(g, compute, 1.0, 100.0, served={"ps:0": 400.0})
    assert [t[n].time for n in ("a", "e1", "e2")] == pytest.approx([4 / 7, 12 / 7, 12 / 7])
    # the channel left short: the unknown recvs get nothing, never a negative time
    t = timed(g, compute, 1.0, 100.0, served={"ps:0": 250.0}, transfer_bytes=known)
    assert t["a"].time == 0.0
    # an order that sends the empty copy last: the forward waits for a and e1 only
    order = Schedule.from_order("tic", ["a", "e1", "e2"])
    step = predictions({"tic": [(g, order)]}, compute, 2.0, 8 * 100.0, 1, 1,
                       served={"ps:0": 400.0}, transfer_bytes=known)["tic"]
    assert step == pytest.approx(1.0 + 3.0 + 1.0 + 1.0)  # a, e1, then x, z


def test_prediction_uses_the_bytes_the_ps_served_and_the_fair_share_of_the_link():
    from tictac_hooks.bench.predict import OVERHEAD, SCALED, predictions, timed
    from tictac_hooks.graph import Graph, Op, Schedule
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100), Op("b", "recv", channel="ps:0",
                                                               bytes=300),
               Op("x", "compute", ("a",)), Op("y", "compute", ("x", "b"))])
    compute = {"x": 1.0, "y": 1.0}
    t = timed(g, compute, 2.0, 100.0, served={"ps:0": 200.0})  # traced 400 B, served 200
    assert [op.time for op in t.ops] == [0.5, 1.5, 2.0, 2.0]
    order = Schedule.from_order("tic", ["a", "b"])
    # 2 workers share the link: 800 B/s -> 400 B/s each; a 0.25 s, b 0.75 s after it.
    steps = predictions({"tic": [(g, order)] * 2}, compute, 4.0, 8 * 800.0, workers=2, ps=1,
                        served={"ps:0": 400.0})
    # compute scaled to 4 s (2 s per op): x [0.25, 2.25], y [2.25, 4.25]
    assert steps["tic"] == pytest.approx(4.25)
    overhead = predictions({"tic": [(g, order)]}, compute, 4.0, 8 * 800.0, workers=2, ps=1,
                           model=OVERHEAD, served={"ps:0": 400.0})
    # ops at their traced 1 s (x [0.25, 1.25], y [1.25, 2.25]) + the 2 s untraced after
    assert overhead["tic"] == pytest.approx(4.25)
    with pytest.raises(ValueError, match="model must be"):
        predictions({"tic": [(g, order)]}, compute, 4.0, 800.0, 1, 1, model="x")
    assert SCALED != OVERHEAD
    # TensorFlow's order (no schedule): SHARED, a and b sent at once on 400 B/s, a done
    # at 0.5 s, b at 1.0 s; SERIAL, a random order per seed: a then b (a 0.25, b 1.0),
    # or b then a (b 0.75, a 1.0), so x starts at 0.25 or 1.0 s.
    none = {"none": [(g, None)]}
    shared = predictions(none, compute, 4.0, 8 * 800.0, 2, 1, served={"ps:0": 400.0})
    assert shared["none"] == pytest.approx(0.5 + 4.0)
    serial = predictions(none, compute, 4.0, 8 * 800.0, 2, 1, model="scaled-serial",
                         served={"ps:0": 400.0}, seeds=64)
    assert 4.25 + 0.1 < serial["none"] < 5.0 - 0.1  # between the two orders' 4.25 / 5.0
    # an installed order is modelled the same either way
    assert predictions({"tic": [(g, order)]}, compute, 4.0, 8 * 800.0, 2, 1,
                       model="scaled-serial", served={"ps:0": 400.0}) == pytest.approx(
        predictions({"tic": [(g, order)]}, compute, 4.0, 8 * 800.0, 2, 1,
                    served={"ps:0": 400.0}))


def test_cpu_model_puts_the_transfers_cpu_after_each_pull_and_before_each_push():
    from tictac_hooks.bench.predict import CPU, predictions, with_transfer_cpu
    from tictac_hooks.graph import Graph, Op, Schedule
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100), Op("b", "recv", channel="ps:0",
                                                               bytes=300),
               Op("x", "compute", ("a",)), Op("y", "compute", ("x", "b"))])
    timed_g = g.with_times({"a": 1.0, "b": 3.0, "x": 1.0, "y": 1.0})  # 100 B/s
    cpu_g, pushes = with_transfer_cpu(timed_g, {"y": ("ps:0", 2.0), "gone": ("ps:0", 1.0)},
                                      100.0, 0.01)
    assert cpu_g["x"].inputs == ("a/cpu",) and cpu_g["y"].inputs == ("x", "b/cpu")
    assert cpu_g["a/cpu"].time == pytest.approx(1.0)   # 100 B x 0.01 s/B
    assert cpu_g["b/cpu"].time == pytest.approx(3.0)
    assert cpu_g["y/send_cpu"].time == pytest.approx(2.0) and cpu_g["y/send_cpu"].inputs == ("y",)
    assert pushes == {"y/send_cpu": ("ps:0", 2.0), "gone": ("ps:0", 1.0)}  # a node it lacks
    # One worker, 800 bit/s = 100 B/s; reference 2 s (x, y 1 s each), fast-link step 6 s:
    # 4 s of transfer CPU over the 400 B pulled, 0.01 s/B. a [0, 1], a/cpu [1, 2],
    # x [2, 3], b [1, 4], b/cpu [4, 7], y [7, 8].
    order = Schedule.from_order("tic", ["a", "b"])
    compute = {"x": 1.0, "y": 1.0}
    steps = predictions({"tic": [(g, order)]}, compute, 6.0, 800.0, 1, 1, model=CPU,
                        reference_s=2.0)
    assert steps["tic"] == pytest.approx(8.0)
    # at a link 10x faster the wire hides nothing: 2 s compute + 4 s CPU + a's 0.1 s wait
    fast = predictions({"tic": [(g, order)]}, compute, 6.0, 8000.0, 1, 1, model=CPU,
                       reference_s=2.0)
    assert fast["tic"] == pytest.approx(6.1)
    with pytest.raises(ValueError, match="needs reference_s"):
        predictions({"tic": [(g, order)]}, compute, 6.0, 800.0, 1, 1, model=CPU)


def test_saved_simulator_inputs_repredict_the_same_steps_and_rebuild_the_report(tmp_path):
    from tictac_hooks.bench.predict import (MODELS, inputs_to_json, load_inputs, predictions,
                                            repredict, save_inputs)
    from tictac_hooks.bench.report import load_results
    from tictac_hooks.graph import Graph, Op, Schedule
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100), Op("b", "recv", channel="ps:0",
                                                               bytes=300),
               Op("x", "compute", ("a",)), Op("y", "compute", ("x", "b"))])
    h = g.with_recvs_only({"b"})
    orders = {"tic": [(g, Schedule.from_order("tic", ["a", "b"]))] * 2,
              "none": [(g, None), (h, None)]}
    compute, pushes = {"x": 1.0, "y": 1.0, "unused": 9.0}, [{"y": ("ps:0", 50)}] * 2
    align = {"tic": False, "none": True}
    sizes = {"a": 50.0}
    data = inputs_to_json(orders, compute, 6.0, 800.0, 2, 1, {"ps:0": 400.0}, pushes,
                          align, 2.0, sizes)
    assert len(data["graphs"]) == 2 and "unused" not in data["compute"]  # each DAG once
    data = json.loads(json.dumps(data))
    again = repredict(data)
    assert set(again) == set(MODELS)
    for model in MODELS:
        direct = predictions(orders, compute, 6.0, 800.0, 2, 1, model=model,
                             served={"ps:0": 400.0}, pushes=pushes, align=align,
                             reference_s=2.0, transfer_bytes=sizes)
        assert again[model] == pytest.approx(direct), model
    # inputs saved before the per-transfer bytes (version 1) still re-predict
    old = dict(data, version=1)
    del old["transfer_bytes"]
    assert repredict(old)["scaled"] == pytest.approx(predictions(
        orders, compute, 6.0, 800.0, 2, 1, served={"ps:0": 400.0}, pushes=pushes,
        align=align))
    assert "cpu" not in repredict(dict(data, reference_s=None))
    with pytest.raises(ValueError, match="version"):
        repredict(dict(data, version=0))
    # a result with its inputs saved beside it: --repredict replaces its predictions
    result = sweep_result()
    result = dataclasses.replace(result, runs=result.runs[:1])
    path = str(tmp_path / "r.json")
    with open(path, "w") as f:
        json.dump(result.to_json(), f)
    assert load_inputs(path) is None
    assert load_results([path], repredict=True)[0] == result  # nothing saved: unchanged
    save_inputs(path, [data])
    assert load_inputs(path) == [data]
    (run,) = load_results([path], repredict=True)[0].runs
    assert run.predicted_step_s == again
    # the inputs stay on the run: the distance to the limit reads the traced pushes
    # (50 bytes from each of the 2 workers into ps:0) from them
    from tictac_hooks.bench.limit import TRACED, link_limit
    assert run.sim_inputs == data
    limit = link_limit(result, run)
    assert limit.push_source == TRACED
    assert limit.push_s == pytest.approx(2 * 50 * 8 / run.rate_bits)
    assert load_results([path])[0].runs[0].predicted_step_s == \
        result.runs[0].predicted_step_s
    save_inputs(path, [data, data])
    with pytest.raises(ValueError, match="1 runs but simulator inputs for 2"):
        load_results([path], repredict=True)


def test_pushes_end_the_step_when_the_last_has_crossed():
    from tictac_hooks.bench.predict import assign_pushes, predictions, pushed_makespan
    from tictac_hooks.graph import Graph, Op, Schedule
    from tictac_hooks.graph.simulate import simulate
    g = Graph([Op("a", "recv", channel="ps:0", bytes=100, time=1.0),
               Op("x", "compute", ("a",), time=1.0), Op("y", "compute", ("x",), time=1.0)])
    sim = simulate(g)  # a [0, 1], x [1, 2], y [2, 3]
    assert sim.finish == {"a": 1.0, "x": 2.0, "y": 3.0}
    assert pushed_makespan(sim, {}) == 3.0
    # x's gradient leaves at 2 s and takes 0.5 s: inside the compute, no tail
    assert pushed_makespan(sim, {"x": ("ps:0", 0.5)}) == 3.0
    # two pushes on one channel go one after the other: x at 2 -> 3.5, y at 3 -> 4.5
    assert pushed_makespan(sim, {"x": ("ps:0", 1.5), "y": ("ps:0", 1.0)}) == 4.5
    # on two channels they overlap; a node the DAG lacks leaves at the compute's end
    assert pushed_makespan(sim, {"x": ("ps:0", 1.5), "y": ("ps:1", 1.0)}) == 4.0
    assert pushed_makespan(sim, {"gone": ("ps:0", 1.0)}) == 4.0
    # each DAG gets the pushes that leave its own nodes
    h = Graph([Op("b", "recv", channel="ps:0", bytes=100), Op("z", "compute", ("b",))])
    mine, theirs = {"z": ("ps:0", 7)}, {"y": ("ps:0", 5)}
    assert assign_pushes([g, h], [mine, theirs]) == [theirs, mine]
    assert assign_pushes([g, h], [{"q": ("ps:0", 1)}, {}]) == [{"q": ("ps:0", 1)}, {}]
    with pytest.raises(ValueError, match="pushes of 1 workers for 2"):
        assign_pushes([g, h], [mine])
    # in a prediction, on the worker's fair share: 100 B at 100 B/s is 1 s after y
    order = Schedule.from_order("tic", ["a"])
    compute = {"x": 1.0, "y": 1.0}
    plain = predictions({"tic": [(g, order)]}, compute, 2.0, 8 * 100.0, 1, 1)
    pushed = predictions({"tic": [(g, order)]}, compute, 2.0, 8 * 100.0, 1, 1,
                         pushes=[{"y": ("ps:0", 100)}])
    assert pushed["tic"] == pytest.approx(plain["tic"] + 1.0)


def test_joint_model_serves_the_workers_of_a_step_on_one_channel():
    from tictac_hooks.bench.predict import joint, joint_step
    from tictac_hooks.graph import Graph, Op, Schedule
    # per worker: a 1 s and a 1 s pull, compute 1 s after each; one PS channel for both
    g = Graph([Op("a", "recv", channel="ps:0", time=1.0), Op("b", "recv", channel="ps:0", time=1.0),
               Op("x", "compute", ("a",), time=1.0), Op("y", "compute", ("x", "b"), time=1.0)])
    order = Schedule.from_order("tic", ["a", "b"])
    graph, schedule, resources = joint([(g, order), (g, order)], align=True)
    assert len(graph) == 8 and resources["w1/x"] == "w1" and "w0/a" not in resources
    assert list(schedule.order) == ["w0/a", "w1/a", "w0/b", "w1/b"]
    _, staggered, _ = joint([(g, order), (g, order)], align=False)
    assert list(staggered.order) == ["w0/a", "w0/b", "w1/a", "w1/b"]
    # aligned: a's at 1, 2, b's at 3, 4: w0's y 3-4, w1's y 4-5
    assert joint_step([(g, order)] * 2, None, align=True, seeds=1) == 5.0
    # staggered: w0's a, b at 1, 2 (y 2-3), w1's at 3, 4 (x 3-4, y 4-5)
    assert joint_step([(g, order)] * 2, None, align=False, seeds=1) == 5.0
    # each worker computes on its own processor: one worker alone ends at 3
    assert joint_step([(g, order)], None, align=True, seeds=1) == 3.0
    # the pushes of both workers share the PS's ingress, 2 s each after its y: served
    # one after the other, w0 pushes while w1 still pulls (3-5, 5-7); aligned, both
    # wait to the end (4-6, 6-8). This is what makes the staggered service faster.
    pushes = [{"y": ("ps:0", 2.0)}, {"y": ("ps:0", 2.0)}]
    assert joint_step([(g, order)] * 2, pushes, align=False, seeds=1) == 7.0
    assert joint_step([(g, order)] * 2, pushes, align=True, seeds=1) == 8.0
