"""The three frontends (TicTac, TicTacLoop, TicTacHook) driven through their own hook
methods against Python gates in this process, behind the client interface: no cluster,
no network, seconds.

What a worker would do at the PS, the test does on the gate: each step, every transfer
of the DAG is requested in a random order (as TensorFlow's) and handed back when the
gate lets it go. Only where each framework keeps the PS addresses and the step's DAG is
replaced (``_ps_addresses``, ``_find_dag``); the step counting, the switch, the order
check, the polls, the pause marking and the summary are the frontends' own code. The
cluster tests (test_keras_callback.py, test_cluster_graph.py, test_examples.py) run the
same frontends end to end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import types

import pytest

from tictac_hooks.run import order_check
from tictac_hooks.run.driver import StepDAG
from tictac_hooks.enforce import inprocess
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.dag import Graph, Op
from tictac_hooks.graph.tf.naming import sending_node_name

PS = "127.0.0.1:61001"
WORKER = "/job:worker/replica:0/task:0/device:CPU:0"
TASK = "/job:worker/replica:0/task:0"  # what the gates name it: one worker is one task
PROFILE_STEPS = 4
ROUNDS, BLOCK = 2, 3
AFTER_CHECK = 5


def _dag() -> Graph:
    """Six parameter reads, two layers deep, on ps:0."""
    recvs = [Op(f"p{i}/read", "recv", channel="ps:0", bytes=1000 * (i + 1)) for i in range(6)]
    compute = [Op("l0", "compute", ("p0/read", "p1/read", "p2/read")),
               Op("l1", "compute", ("l0", "p3/read", "p4/read")),
               Op("l2", "compute", ("l1", "p5/read"))]
    return Graph(recvs + compute)


class Workers:
    """The worker side at the PS: one step = every transfer requested, in a random
    order, and handed back when the gate releases it."""

    def __init__(self, gate: Gate, graph: Graph, seed: int = 0) -> None:
        self.gate, self.names = gate, [op.name for op in graph.recvs]
        self.worker = WORKER
        self.sizes = {op.name: op.bytes for op in graph.recvs}
        # A recv named by its edge (edge_<n>_<node>) arrives as TensorFlow sends it:
        # under the sending node's name, with the full tensor name beside it.
        self.keys = {n: (sending_node_name(n), n) if n != sending_node_name(n) else (n, "")
                     for n in self.names}
        self.rng = random.Random(seed)
        self.ids = itertools.count(1000)
        self.loop = asyncio.new_event_loop()

    def step(self, worker: str | None = None) -> None:
        """One step of ``worker`` (default: WORKER), holding the gate's lock as a PS's
        event loop would (TicTac reads records on a thread of its own)."""
        worker = worker or self.worker
        step_id = next(self.ids)
        order = self.names[:]
        self.rng.shuffle(order)

        async def one(name: str) -> None:
            ticket = self.gate.arrive(step_id, worker, *self.keys[name])
            turn = self.gate.request(ticket)
            if turn is not None:
                await turn
            ticket.nbytes = self.sizes[name]
            self.gate.completed(ticket)
            self.gate.handed_back(ticket)

        async def all_of_them() -> None:
            await asyncio.gather(*(one(n) for n in order))
        with inprocess.gate_lock(PS):
            self.loop.run_until_complete(all_of_them())

    def close(self) -> None:
        self.loop.close()


def _keras(settings: dict, dag: StepDAG, monkeypatch):
    from tictac_hooks import TicTac
    cb = TicTac(measure_compute=False, **settings)
    cb.background_switch = False  # the switch at exactly step N (tested apart below)
    monkeypatch.setattr(cb, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(cb, "_find_dag", lambda mode, times=True: dag)
    monkeypatch.setattr(cb, "_compute_times", lambda mode, d: d.compute_times)
    monkeypatch.setattr(cb, "_join", lambda: JOINS.append(1))
    epochs = {"n": 0}

    def begin():
        cb.on_train_begin()

    def step(i):
        cb.on_train_batch_end(i)
        if (i + 1) % 5 == 0:  # an epoch of 5 steps
            cb.on_epoch_end(epochs["n"])
            epochs["n"] += 1

    def end():
        cb.on_train_end()
        return cb.summary
    return cb, begin, step, end


def _loop(settings: dict, dag: StepDAG, monkeypatch):
    import tensorflow as tf
    from tictac_hooks import TicTacLoop
    coordinator = types.SimpleNamespace(join=lambda: JOINS.append(1), strategy=None)
    loop = TicTacLoop(coordinator, tf.function(lambda: tf.constant(0)), **settings)
    monkeypatch.setattr(loop, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(loop, "_find_dag", lambda: dag)
    return loop, loop.start, lambda i: loop.step(), loop.finish


def _hook(settings: dict, dag: StepDAG, monkeypatch):
    from tictac_hooks import TicTacHook
    hook = TicTacHook(cluster_spec={"ps": [PS], "worker": ["127.0.0.1:61002"]},
                      poll_every=5, **settings)
    monkeypatch.setattr(hook, "_find_dag", lambda: dag)
    values = types.SimpleNamespace(run_metadata=None)

    def step(i):
        hook.before_run(None)
        hook.after_run(None, values)

    def end():
        hook.end(None)
        return hook.summary
    return hook, hook.begin, step, end


JOINS: list[int] = []  # one entry per coordinator join the keras and loop adapters make

ADAPTERS = {"keras": _keras, "loop": _loop, "hook": _hook}


@pytest.fixture
def gate():
    g = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, g):
        yield g


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_switch_check_and_summary(adapter, gate, tmp_path, monkeypatch):
    graph = _dag()
    # window_bytes=0: the Python gate hands back strictly one at a time (no look-ahead).
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, log_dir=str(tmp_path),
                    window_bytes=0,
                    check_rounds=ROUNDS, check_block_steps=BLOCK)
    frontend, begin, step, end = ADAPTERS[adapter](settings, StepDAG(graph), monkeypatch)
    workers = Workers(gate, graph)
    JOINS.clear()
    begin()
    calls = inprocess.calls(PS)
    assert calls["ping"] == 1 and calls["clear"] == 1 and gate.schedule_version is None

    versions = []  # the schedule each step ran under, as the gate bound it
    total = PROFILE_STEPS + 2 * ROUNDS * BLOCK + 1 + AFTER_CHECK
    for i in range(total):
        workers.step()
        versions.append(gate.records()[-1]["schedule_version"])
        step(i)
        if i + 1 < PROFILE_STEPS:
            assert gate.schedule_version is None, f"installed before step {PROFILE_STEPS}"
    summary = end()
    workers.close()

    # Profiling in TensorFlow's order, then the check's blocks: T (installed), D
    # (cleared), T, D; then the decision holds for every later step. A frontend sets
    # the state for the steps after the one it was told of, so the first block also
    # holds the step right after the switch.

    plan = frontend.controller.runner.plan  # (its seed drawn at the check's start)
    assert versions[:PROFILE_STEPS] == [None] * PROFILE_STEPS
    during = versions[PROFILE_STEPS:PROFILE_STEPS + plan.total_steps + 1]
    expected = [True] + [plan.scheduled_block(n) for n in range(plan.total_steps)]
    assert [v is not None for v in during] == expected, versions
    decision = summary["check"]["decision"]
    # Every block leaves a measured step, so each round gives one pair and the check
    # decides (None would mean a block measured nothing).
    assert decision in (order_check.TICTAC, order_check.DEFAULT), summary["check"]
    assert summary["check"]["pairs"] == ROUNDS, summary["check"]
    kept = decision != order_check.DEFAULT
    assert all((v is not None) == kept for v in versions[-AFTER_CHECK:]), versions

    # Every step the gate ran under TicTac's order handed its transfers back in it
    # (priorities non-decreasing; transfers of one tie group in any order).
    schedule = frontend.controller.schedule
    assert sorted(schedule.order) == sorted(op.name for op in graph.recvs)
    scheduled = [r for r in gate.records() if r["schedule_version"] is not None]
    assert len(scheduled) == sum(v is not None for v in versions)
    for rec in scheduled:
        priorities = [t["priority"] for t in rec["transfers"]]
        assert [t["state"] for t in rec["transfers"]] == ["listed"] * len(graph.recvs)
        assert priorities == sorted(priorities) and rec["skips"] == 0, rec["order"]

    # One install at the switch, one more for each T block after a D block, and one
    # when the decision keeps TicTac's order; a clear for each D block and for "default".
    calls = inprocess.calls(PS)
    assert calls["install"] == ROUNDS + (1 if kept else 0)
    assert calls["clear"] == 1 + ROUNDS

    # Joins (PSS frontends; graph-mode steps run synchronously): at the switch, at each
    # of the check's block boundaries (so each block's steps run in its order), at the
    # check's end and at the finish.
    if adapter != "hook":
        assert len(JOINS) == 1 + (2 * ROUNDS - 1) + 1 + 1, (adapter, len(JOINS))

    # Reads: the cursor's start, the switch, the check's end and the finish on the
    # loop's thread (the transfer timeline is written from those reads, not fetched
    # again); the reading thread's own, woken by the steps dispatched and by time,
    # beside them.
    assert calls["stats"] >= 1 + 3, (adapter, calls)
    records = summary["records"]
    assert records["dispatched"] == total and records["worker_steps"] == total, records
    assert records["dropped"] == 0 and records["missing"] == 0, records
    assert summary["hook"]["steps"] + summary["hook"].get("check_steps", 0) + 1 == total

    # The summary and the logs: the worker's steps in both orders, the pause of the
    # switch kept out of the medians, the decision with its rule.
    worker = summary["workers"][TASK] if "workers" in summary else summary[TASK]
    assert worker["steps"] == total
    assert sum(worker["excluded"].values()) >= 2  # first step, the switch's pause, ...
    assert worker["excluded"].get("paused", 0) >= 1
    on_disk = json.loads((tmp_path / "tictac_summary.json").read_text())
    assert on_disk["check"]["decision"] == decision
    assert (tmp_path / "tictac_transfers.trace.json").exists()


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_check_off_keeps_the_order_from_the_switch_on(adapter, gate, monkeypatch):
    graph = _dag()
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, check_rounds=0)
    frontend, begin, step, end = ADAPTERS[adapter](settings, StepDAG(graph), monkeypatch)
    workers = Workers(gate, graph, seed=1)
    begin()
    versions = []
    for i in range(PROFILE_STEPS + 8):
        workers.step()
        versions.append(gate.records()[-1]["schedule_version"])
        step(i)
    summary = end()
    workers.close()
    assert versions[:PROFILE_STEPS] == [None] * PROFILE_STEPS
    assert all(v is not None for v in versions[PROFILE_STEPS:])
    assert "check" not in summary
    assert inprocess.calls(PS)["install"] == 1


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_algorithm_none_installs_nothing(adapter, gate, monkeypatch):
    graph = _dag()
    settings = dict(algorithm="none", profile_steps=PROFILE_STEPS)
    _, begin, step, end = ADAPTERS[adapter](settings, StepDAG(graph), monkeypatch)
    workers = Workers(gate, graph, seed=2)
    begin()
    for i in range(PROFILE_STEPS + 6):
        workers.step()
        step(i)
    end()
    workers.close()
    assert inprocess.calls(PS)["install"] == 0
    assert all(r["schedule_version"] is None for r in gate.records())


def _run(adapter, gate, graph, settings, monkeypatch, steps, dag=None, seed=3):
    """Drives ``adapter`` for ``steps`` steps; returns (frontend, summary, the algorithm
    each step ran under as the gate recorded it, None for TensorFlow's order)."""
    frontend, begin, step, end = ADAPTERS[adapter](settings, dag or StepDAG(graph),
                                                   monkeypatch)
    workers = Workers(gate, graph, seed=seed)
    begin()
    ran = []
    for i in range(steps):
        workers.step()
        ran.append(gate.records()[-1]["algorithm"])
        step(i)
    summary = end()
    workers.close()
    return frontend, summary, ran


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_check_tries_tac_too_where_compute_times_are_known(adapter, gate, monkeypatch):
    graph = _dag()
    compute = {op.name: 0.001 * (i + 1) for i, op in enumerate(graph.compute_ops)}
    dag = StepDAG(graph, compute_times=compute)
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, window_bytes=0,
                    check_rounds=ROUNDS, check_block_steps=BLOCK, recheck_every=0,
                    bandwidth=1e6)
    plan = order_check.CheckPlan(ROUNDS, BLOCK, ("tic", "tac"))
    total = PROFILE_STEPS + plan.total_steps + 1 + AFTER_CHECK
    frontend, summary, ran = _run(adapter, gate, graph, settings, monkeypatch, total, dag)
    # TAC's order of this DAG is TIC's: the check runs it once, under both names.
    plan = frontend.controller.runner.plan
    during = ran[PROFILE_STEPS:PROFILE_STEPS + plan.total_steps + 1]
    assert during == ["tic"] + [plan.block(n) for n in range(plan.total_steps)], ran
    check = summary["check"]
    assert set(check["candidates"]) | set(check.get("same_as", {})) == {"tic", "tac"}
    assert all(c["pairs"] == ROUNDS for c in check["candidates"].values())
    kept = check["chosen"] if check["decision"] == order_check.TICTAC else None
    assert kept in ("tic", "tac", None)
    assert ran[-AFTER_CHECK:] == [kept] * AFTER_CHECK
    if kept:  # the frontend's schedule is the kept one
        assert frontend.controller.schedule.algorithm == kept


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_the_check_runs_again_every_recheck_every_steps(adapter, gate, monkeypatch):
    graph = _dag()
    recheck = 7
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, window_bytes=0,
                    check_rounds=1, check_block_steps=BLOCK, recheck_every=recheck)
    plan = order_check.CheckPlan(1, BLOCK, ("tic",))
    first_end = PROFILE_STEPS + plan.total_steps + 1  # the step whose dispatch decides
    second_start = first_end + recheck
    total = second_start + plan.total_steps + 1 + AFTER_CHECK
    _, summary, ran = _run(adapter, gate, graph, settings, monkeypatch, total)
    assert len(summary["checks"]) == 2 and summary["check"] == summary["checks"][-1]
    # After the re-check starts: a T block, then a D block, whatever the first decided
    # (the state set at a dispatch holds from the next step on, as after the switch).
    again = ran[second_start:second_start + plan.total_steps + 1]
    blocks = [plan.block(0)] + [plan.block(n) for n in range(plan.total_steps)]
    assert again == blocks, ran


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_tensor_sent_twice_is_scheduled_under_both_edge_names(adapter, gate, monkeypatch):
    """Training graphs send some weights twice (forward pass and gradient): two recvs,
    named by their edges. The PSes report them by the sending node while profiling;
    the order must still name, and the gate match, both copies."""
    recvs = [Op("edge_11_p0/read", "recv", channel="ps:0", bytes=4000),
             Op("edge_12_p0/read", "recv", channel="ps:0", bytes=4000),
             Op("p1/read", "recv", channel="ps:0", bytes=1000)]
    compute = [Op("fwd", "compute", ("edge_11_p0/read", "p1/read")),
               Op("grad", "compute", ("fwd", "edge_12_p0/read"))]
    graph = Graph(recvs + compute)
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, window_bytes=0,
                    check_rounds=0)
    frontend, summary, ran = _run(adapter, gate, graph, settings, monkeypatch,
                                  PROFILE_STEPS + 6)
    assert sorted(frontend.controller.schedule.order) == sorted(op.name for op in recvs)
    scheduled = [r for r in gate.records() if r["schedule_version"] is not None]
    assert len(scheduled) == 6
    for rec in scheduled:
        assert rec["unlisted"] == [] and rec["violations"] == 0, rec
        assert sorted(rec["order"]) == sorted(op.name for op in recvs)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
@pytest.mark.parametrize("failure", ["no_read_matches", "find_dag_raises"])
def test_a_switch_that_cannot_order_says_why_and_training_goes_on(
        adapter, failure, gate, monkeypatch, capsys):
    """Never kill training: a DAG whose reads match none of the served transfers, or an
    error while finding the DAG, leaves TensorFlow's order, in one line saying why."""
    graph = _dag()
    if failure == "no_read_matches":
        traced = Graph([Op(f"other/{op.name}", op.kind, tuple(f"other/{i}" for i in op.inputs),
                           channel=op.channel, bytes=op.bytes) for op in graph.ops])
        dag = StepDAG(traced)
    else:
        class Unreadable(StepDAG):
            @property
            def graphs(self):
                raise RuntimeError("a graph shape the extraction does not know")

            @graphs.setter
            def graphs(self, value):
                pass
        dag = Unreadable(graph)
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, check_rounds=1,
                    check_block_steps=BLOCK)
    frontend, summary, ran = _run(adapter, gate, graph, settings, monkeypatch,
                                  PROFILE_STEPS + 2 * BLOCK + 4, dag=dag)
    assert ran == [None] * len(ran)  # every step in TensorFlow's order, to the end
    assert inprocess.calls(PS)["install"] == 0
    why = summary["not_ordered"]
    assert ("cannot tell which transfer" in why if failure == "no_read_matches"
            else "does not know" in why), why
    lines = [line for line in capsys.readouterr().out.splitlines()
             if "own transfer order kept" in line]
    assert len(lines) == 1 and "training goes on" in lines[0], lines
    assert "not the one being trained" not in why
    worker = summary["workers"][TASK] if "workers" in summary else summary[TASK]
    assert worker["steps"] == len(ran)


class LoopWorkers(Workers):
    """A worker under ``steps_per_execution = k``: one step id per call, each training
    step an iteration of the loop (the key's frame:iter); the exit iteration sends
    every read once more as a dead tensor, and what runs once per call outside the loop
    (frame 0:0) comes too. Names are as the PS serves them: the lowered loop body's."""

    FRAME = 77

    def __init__(self, gate: Gate, graph: Graph, k: int, seed: int = 0) -> None:
        super().__init__(gate, graph, seed)
        self.k = k
        self.served = {n: n.replace("while/body/", "while/body/_1/", 1) for n in self.names}

    def call(self, iterations: int | None = None) -> None:
        step_id = next(self.ids)
        iterations = self.k if iterations is None else iterations

        async def one(name: str, it: int, dead: bool) -> None:
            ticket = self.gate.arrive(step_id, WORKER, self.served[name], "",
                                      self.FRAME, it)
            turn = self.gate.request(ticket)
            if turn is not None:
                await turn
            ticket.nbytes, ticket.dead = (23 if dead else self.sizes[name]), dead
            self.gate.completed(ticket)
            self.gate.handed_back(ticket)

        async def once_per_call() -> None:
            ticket = self.gate.arrive(step_id, WORKER, "while/exit/_41", "")
            ticket.nbytes = 21
            self.gate.handed_back(ticket)

        async def the_call() -> None:
            await once_per_call()
            for it in range(iterations + 1):  # the last: the dead exit iteration
                order = self.names[:]
                self.rng.shuffle(order)
                await asyncio.gather(*(one(n, it, it == iterations) for n in order))
        self.loop.run_until_complete(the_call())


def test_steps_per_execution_counts_training_steps_and_orders_every_iteration(
        gate, monkeypatch):
    """Keras with steps_per_execution = 4: each dispatched call runs 4 training steps
    (fit reports the call's last step index). profile_steps counts training steps, the
    order is installed from the next call on, and every iteration of every later call
    follows it as its own step; the step counts add up to the training steps."""
    k, steps_per_epoch, epochs = 4, 10, 3  # calls of 4, 4, 2 steps per epoch
    body = Graph([Op(f"while/body/while/{op.name}", op.kind,
                     tuple(f"while/body/while/{i}" for i in op.inputs),
                     channel=op.channel, bytes=op.bytes) for op in _dag().ops])
    settings = dict(algorithm="tic", profile_steps=8, check_rounds=0, window_bytes=0)
    cb, _, _, end = _keras(settings, StepDAG(body), monkeypatch)
    workers = LoopWorkers(gate, body, k)
    cb.on_train_begin()
    installed_after = []
    for epoch in range(epochs):
        cb.on_epoch_begin(epoch)
        done = 0
        while done < steps_per_epoch:
            n = min(k, steps_per_epoch - done)
            workers.call(n)
            done += n
            cb.on_train_batch_end(done - 1)  # the index of the call's last step
            installed_after.append(gate.schedule_version is not None)
        cb.on_epoch_end(epoch)
    summary = end()
    workers.close()
    assert cb._driver is None and summary is not None
    assert installed_after[:2] == [False, True]  # 8 training steps = 2 calls
    assert sorted(cb.controller.schedule.order) == sorted(workers.served.values())
    records = gate.records()
    loop_records = [r for r in records if r.get("frame") == LoopWorkers.FRAME]
    live = [r for r in loop_records if not any(t.get("dead") for t in r["transfers"])]
    scheduled = [r for r in live if r["schedule_version"] is not None]
    assert len(live) == epochs * steps_per_epoch
    assert len(scheduled) == epochs * steps_per_epoch - 8
    for rec in scheduled:  # each iteration in the order, as a step of its own
        assert [t["state"] for t in rec["transfers"]] == ["listed"] * len(body.recvs)
        priorities = [t["priority"] for t in rec["transfers"]]
        assert priorities == sorted(priorities) and rec["skips"] == 0, rec
    worker = summary["workers"][TASK]
    assert worker["steps"] == epochs * steps_per_epoch  # dead exits and per-call not steps
    assert summary["order"]["scheduled_steps"] == summary["order"]["followed"]
    assert summary["order"]["scheduled_steps"] >= len(scheduled) - 1


@pytest.mark.parametrize("adapter", ["keras", "loop"])
def test_a_failed_compute_profile_turns_tac_off_in_one_line_and_training_goes_on(
        adapter, gate, monkeypatch, caplog, capsys):
    """algorithm="tac" whose profile fails: one warning line (no traceback), TIC from
    the switch on, and the order check says it tries TIC only, and why."""
    import logging
    from tictac_hooks.run import compute_profile
    from tictac_hooks.callbacks.step_function import profile_for

    def fails(*args, **kwargs):
        raise compute_profile.ComputeProfileError(
            "InvalidArgumentError: indices[10,0] = -1 is not in [0, 8)")
    monkeypatch.setattr(compute_profile, "profile_step", fails)
    graph = _dag()
    settings = dict(algorithm="tac", profile_steps=PROFILE_STEPS, window_bytes=0,
                    check_rounds=ROUNDS, check_block_steps=BLOCK, recheck_every=0,
                    bandwidth=1e6)
    frontend, begin, step, end = ADAPTERS[adapter](settings, StepDAG(graph), monkeypatch)

    def find_dag(*mode, **times):
        dag = StepDAG(graph)
        dag.compute_times = profile_for(frontend.controller, None, dag, 32)
        return dag
    monkeypatch.setattr(frontend, "_find_dag", find_dag)
    workers = Workers(gate, graph, seed=4)
    plan = order_check.CheckPlan(ROUNDS, BLOCK, ("tic",))
    with caplog.at_level(logging.INFO, logger="tictac"):
        begin()
        ran = []
        for i in range(PROFILE_STEPS + plan.total_steps + 3):
            workers.step()
            ran.append(gate.records()[-1]["algorithm"])
            step(i)
        summary = end()
    workers.close()
    assert set(ran[PROFILE_STEPS:]) <= {"tic", None} and "tic" in ran, ran
    assert frontend.controller.settings.algorithm == "tic"
    assert summary["tac_off"].startswith("TAC needs measured compute times: no compute "
                                         "profile (InvalidArgumentError: indices"), summary
    assert set(summary["check"]["candidates"]) == {"tic"}
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.exc_info is None and warning.getMessage() == (
        "TicTac: no compute profile (InvalidArgumentError: indices[10,0] = -1 is not in "
        "[0, 8)); TAC is off for this run, TIC instead")
    out = capsys.readouterr().out
    assert "[tictac] the order check tries TIC only: TAC is off (TAC needs measured " \
           "compute times: no compute profile (InvalidArgumentError" in out, out
    assert "Traceback" not in out


# -- records: the cursor, gaps, lost workers -------------------------------------------

W1 = "/job:worker/replica:0/task:1/device:CPU:0"
TASK1 = "/job:worker/replica:0/task:1"


def test_the_cursor_reads_each_record_once_and_reports_what_the_history_dropped():
    from tictac_hooks.enforce.cursor import RecordCursor

    gate = Gate(window_bytes=0, max_active_steps=1, history=8)
    with inprocess.serve_in_process(PS, gate):
        workers = Workers(gate, _dag())
        workers.step()
        workers.step()                      # an earlier run's step finished (seq 1)
        cursor = RecordCursor([PS])
        cursor.start()
        for _ in range(5):
            workers.step()
        first = cursor.read()               # one step at a time: each finishes the last
        assert first.dropped == {PS: 0}
        assert [r.seq for r in first.steps] == [2, 3, 4, 5, 6]
        for _ in range(20):                 # 20 more finish, 8 are held
            workers.step()
        second = cursor.read(include_active=True)
        finished = [r for r in second.steps if r.seq]
        assert second.dropped == {PS: 12} and len(finished) == 8
        assert [r.worker_seq for r in finished] == list(range(19, 27))
        assert cursor.read().steps == []    # each record once
        assert (cursor.read_records[PS], cursor.dropped[PS]) == (13, 12)
        cursor.close()
        workers.close()


def _drive(cb, gate, steps, worker_of=lambda i: WORKER, epoch=None, rerun_at=None):
    """Runs the Keras callback's hooks over ``steps`` steps, each on ``worker_of(i)``;
    at step ``rerun_at`` that step's worker first runs a closure again (what
    ParameterServerStrategy does with a dead worker's step: a record, no dispatch)."""
    workers = Workers(gate, _dag())
    cb.on_train_begin()
    for i in range(steps):
        if i == rerun_at:
            workers.step(worker_of(i))
        workers.step(worker_of(i))
        cb.on_train_batch_end(i)
        if epoch and (i + 1) % epoch == 0:
            cb.on_epoch_end(i // epoch)
    cb.on_train_end()
    workers.close()
    return cb.summary


def _callback(monkeypatch, **settings):
    from tictac_hooks import TicTac
    cb = TicTac(measure_compute=False, algorithm="tic", check_rounds=0, window_bytes=0,
                **settings)
    monkeypatch.setattr(cb, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(cb, "_find_dag", lambda mode, times=True: StepDAG(_dag()))
    monkeypatch.setattr(cb, "_compute_times", lambda mode, d: d.compute_times)
    monkeypatch.setattr(cb, "_join", lambda: None)
    return cb


def test_a_long_epoch_loses_no_step(monkeypatch, tmp_path):
    """600 steps in one epoch at a gate that keeps 256 records: read on the reading
    thread as steps are dispatched, every step is recorded and none is dropped."""
    gate = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, gate):
        cb = _callback(monkeypatch, profile_steps=PROFILE_STEPS, log_dir=str(tmp_path))
        summary = _drive(cb, gate, 600, worker_of=lambda i: (WORKER, W1)[i % 2])
    records = summary["records"]
    assert records["dropped"] == 0 and records["missing"] == 0, records
    assert records["worker_steps"] == records["dispatched"] == 600, records
    assert all(w["steps"] == 300 for w in summary["workers"].values()), summary["workers"]
    from tictac_hooks.run.tensorboard import read_scalars
    scalars = read_scalars(str(tmp_path))
    for run in ("worker_0", "worker_1"):
        assert [s for s, _ in sorted(scalars[run]["tictac/phase"])] == list(range(300))


def test_lost_records_are_gaps_not_steps_and_the_steps_keep_their_numbers(monkeypatch,
                                                                            tmp_path):
    """A gate that keeps only 4 records, read every 20 steps: most records are lost.
    The summary says how many; no interval across a gap becomes a step time, and every
    step written keeps its own number."""
    gate = Gate(skip_after_s=5.0, window_bytes=0, max_active_steps=1, history=4)
    with inprocess.serve_in_process(PS, gate):
        from tictac_hooks import TicTac
        monkeypatch.setattr("tictac_hooks.run.reading.READ_EVERY_S", 3600.0)
        monkeypatch.setattr("tictac_hooks.run.reading.READ_EVERY_STEPS", 20)
        # the reads paced as if the gate kept 80 (it keeps 4)
        monkeypatch.setattr("tictac_hooks.enforce.cursor.RecordCursor.smallest_history",
                            lambda self: 80)
        cb = _callback(monkeypatch, profile_steps=PROFILE_STEPS, log_dir=str(tmp_path))
        summary = _drive(cb, gate, 100)
    records = summary["records"]
    worker = summary["workers"][TASK]
    assert records["dropped"] > 0 and worker["missing"] > 0, records
    # Every dispatched step is either recorded or missing (counted in a gap).
    assert worker["steps"] + worker["missing"] == 100, worker
    assert worker["excluded"].get("before_gap", 0) > 0, worker
    from tictac_hooks.run.tensorboard import read_scalars
    scalars = read_scalars(str(tmp_path))
    numbers = sorted(s for s, _ in scalars["worker_0"]["tictac/phase"])
    assert numbers[-1] == 99 and len(numbers) == worker["steps"], numbers
    times = [v for r in ("tensorflow_order", "tictac_order")
             for _, v in scalars.get(r, {}).get("tictac/step_time/worker_0", [])]
    assert times and max(times) < 1.0, times  # in-process steps take milliseconds


def test_a_worker_that_stops_is_reported_once_and_its_last_step_is_unfinished(
        monkeypatch, capsys):
    gate = Gate(skip_after_s=5.0, window_bytes=0)
    with inprocess.serve_in_process(PS, gate):
        cb = _callback(monkeypatch, profile_steps=PROFILE_STEPS)
        # Both workers by turns for 40 steps, then worker 1 is gone: worker 0 runs its
        # last closure again, and the 160 steps dispatched after (80 of worker 1's own
        # step intervals: no address to ask, so lost only past LOST_AFTER_STEPS, 64).
        summary = _drive(cb, gate, 200, worker_of=lambda i: W1 if i < 40 and i % 2 else
                         WORKER, rerun_at=40)
    out = capsys.readouterr().out
    lost_lines = [line for line in out.splitlines() if " lost: " in line]
    assert len(lost_lines) == 1 and "worker_1" in lost_lines[0], out
    w1 = summary["workers"][TASK1]
    assert w1["lost"]["detected"] > w1["lost"]["last_step_start"], w1
    assert w1["unfinished"] == 1 and w1["steps"] == 19, w1
    assert summary["workers"][TASK]["steps"] == 181
    # The counts add up: 200 dispatched = 200 steps recorded where they finished (the
    # unfinished one's closure ran again on worker 0, where it counts once).
    records = summary["records"]
    assert records["worker_steps"] == records["dispatched"] == 200, records
    assert records["unfinished"] == 1 and records["missing"] == 0, records
    assert summary["order"]["scheduled_steps"] <= 199 - PROFILE_STEPS + 1


def test_fits_switch_runs_off_the_dispatch_thread(gate, monkeypatch):
    """The Keras callback's default: the switch (here a DAG that takes 0.6 s to find)
    runs on a thread of its own; fit's dispatch goes on in TensorFlow's order
    meanwhile, each batch hook returning at once, and the order is installed when the
    switch is done. The summary says what the switch took."""
    import time

    graph = _dag()

    def slow_dag(mode, times=True):
        time.sleep(0.6)
        return StepDAG(graph)
    from tictac_hooks import TicTac
    cb = TicTac(measure_compute=False, algorithm="tic", profile_steps=PROFILE_STEPS,
                check_rounds=0, window_bytes=0)
    assert cb.background_switch
    monkeypatch.setattr(cb, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(cb, "_find_dag", slow_dag)
    monkeypatch.setattr(cb, "_compute_times", lambda mode, d: None)
    joins = []  # the switch does not join the dispatched steps; the end of fit does
    monkeypatch.setattr(cb, "_join", lambda: joins.append(len(versions)))
    workers = Workers(gate, graph, seed=5)
    cb.on_train_begin()
    hook_s, versions = [], []
    for i in range(PROFILE_STEPS + 40):
        workers.step()
        versions.append(gate.records()[-1]["schedule_version"])
        t0 = time.perf_counter()
        cb.on_train_batch_end(i)
        hook_s.append(time.perf_counter() - t0)
        time.sleep(0.03)  # a step's time: the switch's 0.6 s spans about 20 of them
    assert joins == []
    cb.on_train_end()
    summary = cb.summary
    workers.close()
    assert max(hook_s) < 0.1, max(hook_s)  # the switch's 0.6 s is not on this thread
    first = next(i for i, v in enumerate(versions) if v is not None)
    assert first > PROFILE_STEPS + 5, versions  # TensorFlow's order while switching
    assert all(v is not None for v in versions[first:]), versions
    assert summary["hook"]["switch_in_background_ms"] >= 600, summary["hook"]
    worker = summary["workers"][TASK]
    assert worker["steps"] == len(versions)
    assert summary["order"]["followed"] == summary["order"]["scheduled_steps"] > 0


def test_tic_goes_in_before_the_compute_profile_and_the_check_waits_for_it(gate,
                                                                          monkeypatch):
    """TIC needs no compute times: its order is in place as soon as the DAG is found,
    while the compute profile (here 0.8 s) runs after it; the order check, whose TAC
    candidate needs the profile, starts once it is there."""
    import time

    graph = _dag()
    from tictac_hooks import TicTac
    cb = TicTac(algorithm="tic", profile_steps=PROFILE_STEPS, check_rounds=1,
                check_block_steps=3, recheck_every=0, window_bytes=0, bandwidth=1e6)
    monkeypatch.setattr(cb, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(cb, "_find_dag", lambda mode, times=True: StepDAG(graph))

    def slow_times(mode, dag):
        time.sleep(0.8)
        return {op.name: 0.001 for op in graph.compute_ops}
    monkeypatch.setattr(cb, "_compute_times", slow_times)
    monkeypatch.setattr(cb, "_join", lambda: None)
    workers = Workers(gate, graph, seed=6)
    cb.on_train_begin()
    ran = []
    for i in range(PROFILE_STEPS + 70):
        workers.step()
        ran.append(gate.records()[-1]["algorithm"])
        cb.on_train_batch_end(i)
        time.sleep(0.03)  # the profile's 0.8 s spans about 25 steps
    cb.on_train_end()
    summary = cb.summary
    workers.close()
    first = next(i for i, v in enumerate(ran) if v is not None)
    assert first - PROFILE_STEPS < 12, ran  # in place before the profile ended
    assert summary["hook"]["switch_in_background_ms"] < 800, summary["hook"]
    check = summary["check"]
    assert set(check["candidates"]) | set(check.get("same_as", {})) == {"tic", "tac"}, check


def test_a_run_that_ends_before_the_switch_says_so(gate, monkeypatch, capsys):
    """Too few steps to profile: one line, and the summary's ``not_ordered`` says
    every step ran in TensorFlow's order."""
    graph = _dag()
    from tictac_hooks import TicTac
    cb = TicTac(algorithm="tic", profile_steps=PROFILE_STEPS, check_rounds=0,
                window_bytes=0)
    monkeypatch.setattr(cb, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(cb, "_join", lambda: None)
    workers = Workers(gate, graph, seed=7)
    cb.on_train_begin()
    for i in range(PROFILE_STEPS - 2):
        workers.step()
        cb.on_train_batch_end(i)
    cb.on_train_end()
    workers.close()
    reason = (f"the run ended after {PROFILE_STEPS - 2} steps, before the switch at "
              f"{PROFILE_STEPS} (profile_steps): every step ran in TensorFlow's order")
    assert cb.summary["not_ordered"].startswith(reason), cb.summary["not_ordered"]
    assert f"[tictac] {reason}" in capsys.readouterr().out


def test_the_hook_reads_the_declaration_order_of_the_graph_it_runs():
    """TicTacHook.begin takes the graph's variables in declaration order (trainable,
    then the other globals) for the DAGs' "declared" positions; none without any."""
    import tensorflow as tf
    from tictac_hooks.callbacks.session_hook import _declared_variables
    g = tf.Graph()
    with g.as_default():
        b = tf.compat.v1.get_variable("b", [2])
        step = tf.compat.v1.get_variable("step", [], trainable=False)
        a = tf.compat.v1.get_variable("a", [3])
        graph, declared = _declared_variables()
    assert graph is g and declared == [b, a, step]
    with tf.Graph().as_default():
        assert _declared_variables() is None


def test_every_frontend_builds_one_run_config_from_the_same_arguments(tmp_path, monkeypatch):
    """Issue #55: TicTac, TicTacLoop and TicTacHook given the same arguments build the
    same RunConfig field by field (the pacing rate and alignment included); they differ
    only where the frontends do, each named here with why."""
    from tictac_hooks import TicTac, TicTacHook, TicTacLoop
    import tensorflow as tf
    args = dict(algorithm="tac", profile_steps=7, log_dir=str(tmp_path), skip_timeout=2.5,
                window_bytes=0, check_rounds=4, check_block_steps=12, recheck_every=0,
                align="on", bandwidth=125e6)
    workers = {"worker:0": "127.0.0.1:61002", "worker:1": "127.0.0.1:61003"}
    keras = TicTac(**args)
    monkeypatch.setattr(keras, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(keras, "_worker_addresses", lambda: workers)
    coordinator = types.SimpleNamespace(join=lambda: None, strategy=None)
    loop = TicTacLoop(coordinator, tf.function(lambda: tf.constant(0)), **args)
    monkeypatch.setattr(loop, "_ps_addresses", lambda: [PS])
    monkeypatch.setattr(loop, "_worker_addresses", lambda: workers)
    hook = TicTacHook(cluster_spec={"ps": [PS], "worker": list(workers.values())},
                      poll_every=5, **args)
    configs = {"keras": keras.run_config("train").fields(), "loop": loop.run_config().fields(),
               "hook": hook.run_config().fields()}
    expected_differences = {
        "background_switch": {"keras": True, "loop": False, "hook": False},  # fit's dispatch
        "poll_every": {"keras": None, "loop": 50, "hook": 5},  # each loop's own cadence
        # a session's steps are its own process's (between-graph): no spread, no probes
        "worker_addresses": {"keras": tuple(sorted(workers.items())),
                             "loop": tuple(sorted(workers.items())), "hook": ()},
        "spread_over": {"keras": 2, "loop": 2, "hook": 1},
    }
    for name, by_frontend in expected_differences.items():
        assert {f: configs[f].pop(name) for f in configs} == by_frontend, name
    assert configs["keras"] == configs["loop"] == configs["hook"], configs
    keras_config = configs["keras"]
    assert (keras_config["bandwidth"], keras_config["pace_rate"], keras_config["align"]) == \
        (125e6, 125e6, True)
    assert keras_config["settings.algorithm"] == "tac" and keras_config["training"] is True
    assert keras.run_config("test").settings.log_dir == str(tmp_path / "test")
    predict = keras.run_config("predict")
    assert (predict.destination_jobs, predict.spread_over, predict.training) == \
        (("chief",), 1, False)


def test_a_restored_order_is_paced_at_the_frontends_bandwidth(gate, monkeypatch, tmp_path):
    """A job restarted with fit finds its saved order and installs it paced at the rate
    TicTac(bandwidth=...) was given, as the switch would (the restore used to read a
    bandwidth the run did not carry, and ran the order unpaced)."""
    from tictac_hooks.run import planner, saved_order
    graph = _dag()
    parts = planner.parts_for("tic", {"worker": graph}, None,
                              {op.name for op in graph.recvs}, set())
    saved_order.save(str(tmp_path), saved_order.SavedOrder(
        saved_order.fingerprint({"worker": graph}, 1, 1), 1, 1, {"tic": parts}, "tic",
        link_rate=125e6))
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, window_bytes=0,
                    check_rounds=0, recheck_every=0, bandwidth=125e6)
    cb, begin, step, end = _keras(settings, StepDAG(graph), monkeypatch)
    monkeypatch.setattr(cb, "_order_dir", lambda log_dir: str(tmp_path))
    lines = []
    begin()
    monkeypatch.setattr(cb.controller, "say", lines.append)
    workers = Workers(gate, graph, seed=8)
    ran = []
    for i in range(PROFILE_STEPS + 6):
        workers.step()
        ran.append(gate.records()[-1]["algorithm"])
        step(i)
    summary = end()
    workers.close()
    restored = [line for line in lines if line.startswith("order restored from")]
    assert restored and "paced at 1 Gbit/s" in restored[0], lines
    assert summary["restored_from"] == saved_order.path_in(str(tmp_path))
    assert cb.controller.pace_rate == 125e6 and "tic" in ran, ran


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_run_talks_to_each_ps_through_one_client(adapter, gate, monkeypatch):
    """Issue #55: the connect check, the switch's install, the order check's installs
    and clears, the record reads and the end share one client per PS (enforce/pool.py);
    each used to open its own, per call."""
    from tictac_hooks.enforce import client as client_mod
    made = []
    real = client_mod.connect

    def counting(address, timeout_s=10.0, backend="auto"):
        made.append(address)
        return real(address, timeout_s, backend)
    monkeypatch.setattr(client_mod, "connect", counting)
    graph = _dag()
    settings = dict(algorithm="tic", profile_steps=PROFILE_STEPS, window_bytes=0,
                    check_rounds=ROUNDS, check_block_steps=BLOCK, recheck_every=0)
    plan = order_check.CheckPlan(ROUNDS, BLOCK, ("tic",))
    frontend, summary, ran = _run(adapter, gate, graph, settings, monkeypatch,
                                  PROFILE_STEPS + plan.total_steps + 1 + AFTER_CHECK,
                                  StepDAG(graph))
    assert summary["check"]["candidates"] and None in ran and "tic" in ran, ran
    assert made == [PS], made
    # the run's phases, in order, none of them an illegal move
    moves = [h[0] for h in summary["phases"]["history"]]
    assert moves == ["profiling", "switching", "checking", "decided", "ended"], moves
    assert summary["phases"]["illegal"] == 0


def test_the_bandwidth_flag_paces_every_frontend_and_the_argument_wins(monkeypatch):
    """--tictac_bandwidth=25gbit gives each frontend's run the link rate (bytes/s) the
    bandwidth= argument would; the argument wins over the flag; a bad rate is refused
    when the flags are parsed."""
    from absl import flags
    from tictac_hooks import TicTac, TicTacHook
    from tictac_hooks import flags as tictac_flags
    assert tictac_flags.bandwidth(None) is None  # flags not parsed: not paced
    flags.FLAGS(["prog", "--tictac_bandwidth=25gbit"])
    try:
        assert tictac_flags.bandwidth(None) == 25e9 / 8
        assert tictac_flags.bandwidth(1e6) == 1e6  # the argument wins
        keras = TicTac()
        monkeypatch.setattr(keras, "_ps_addresses", lambda: [PS])
        monkeypatch.setattr(keras, "_worker_addresses", lambda: {})
        hook = TicTacHook(cluster_spec={"ps": [PS], "worker": ["127.0.0.1:61002"]})
        for config in (keras.run_config("train"), hook.run_config()):
            assert config.bandwidth == config.pace_rate == 25e9 / 8, config
    finally:
        flags.FLAGS.unparse_flags()
    with pytest.raises(flags.IllegalFlagValueError, match="must be a rate"):
        flags.FLAGS(["prog", "--tictac_bandwidth=fast"])
    flags.FLAGS.unparse_flags()
