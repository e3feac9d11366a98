"""The benchmark client: runs in its own host (network namespace) of the shaped network.

``python -m tictac_hooks.bench.client CONFIG.json`` builds the workload graph, drives
two sets of identical worker tasks (one reaching the PS tasks through the TicTac
rendezvous, one directly, for TensorFlow's default path), profiles, computes every
schedule with the code TicTacHook uses, and then runs the schedules interleaved in
rotating blocks. It talks to the runner on stdout/stdin: one JSON line per request
(``{"event": "reshape", "rate_bits": N}``, answered by one line), and ends with
``{"event": "done"}``. Progress goes to stderr; the result to ``config["out"]``: the
profiled compute and one :class:`~tictac_hooks.records.RateRun` per rate, each with its
simulator inputs (``sim_inputs``), which the runner reads into a
:class:`~tictac_hooks.records.BenchRun`. The schedules' names, the controllers that
install them and what the simulator is given are :mod:`~tictac_hooks.bench.orders`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

from tictac_hooks.bench import metrics
from tictac_hooks.bench.cpu_guard import CpuMeter, CpuUse, emulated_lines
from tictac_hooks.bench.limit import traced_push_bytes
from tictac_hooks.bench.orders import (ALGORITHMS, CALIBRATION, CHECKED, DIRECT, FAST_LINK,
                                       NO_TRANSFER, OPTIONAL, STOCK, WC, make_controllers,
                                       median, predict_orders, progress, run_order_check,
                                       served_bytes_per_ps, settled_makespans,
                                       traced_oracle, traced_pushes)
from tictac_hooks.records import (ClientStep, GateStep, InRunCompute, ProfiledCompute, RateRun,
                                  ScheduleSummary, bytes_per_transfer)


def _ask(event: dict) -> str:
    print(json.dumps(event), flush=True)
    return sys.stdin.readline().strip()

# A step of any run of this bench takes seconds (the longest, VGG-16 16 x 4 emulated,
# about 5 s): one that has not finished in this long waits for something lost.
STEP_TIMEOUT_S = 120


class StepHung(RuntimeError):
    """A step did not finish within STEP_TIMEOUT_S."""


class Runner:
    def __init__(self, cfg: dict) -> None:
        import tensorflow as tf
        from tictac_hooks.bench import workloads
        self.tf, self.cfg = tf, cfg
        sets = [cfg["interposed_tasks"]] + ([cfg["direct_tasks"]] if cfg["direct_tasks"] else [])
        self.replay = None
        if cfg.get("emulate"):  # --emulate-gpu: the profile replayed (bench/replay.py)
            from tictac_hooks.bench import replay
            from tictac_hooks.bench.runner import bench_replay
            e = cfg["emulate"]
            self.replay = bench_replay(e["model"], cfg["ps"], e["compute_ms"], e["max_ops"],
                                       training=cfg["mode"] == "training",
                                       byte_scale=e["byte_scale"])
            progress(cfg, self.replay.describe())
            self.work = replay.build(self.replay, sets, compute_workers=cfg["interposed_tasks"])
        else:
            self.work = workloads.build(cfg["model"], cfg["mode"], sets, cfg["ps"],
                                        cfg["batch"], compute_workers=cfg["interposed_tasks"])
        self.sessions = [tf.compat.v1.Session("grpc://" + cfg["masters"][i],
                                              graph=self.work.graph)
                         for i in range(len(sets))]
        for session in self.sessions:  # a native PS's direct twin holds its own copy
            session.run(self.work.init)

    def step(self, which: int) -> ClientStep | None:
        return self._run(self.work.sets[which], self.sessions[which])

    def compute_spans(self, steps: int = 5) -> list[float]:
        """--emulate-gpu: per step, the median over the workers of each one's compute,
        from its first delay's start to its last one's end on its own clock (the
        session's dispatch to W workers left out)."""
        tower_set = self.work.compute
        n = tower_set.num_timestamps
        out = []
        for _ in range(steps):
            values = self._session_run(self.sessions[0], tower_set.fetches)
            spans = [float(e) - float(s) for s, e in zip(values[-2 * n:-n], values[-n:])]
            out.append(median(spans))
        return out

    def compute_step(self) -> ClientStep:
        """A step of the compute reference: the interposed workers' towers on their own
        copies of the model, no transfer (workloads.build's ``compute_workers``)."""
        return self._run(self.work.compute, self.sessions[0])

    def _session_run(self, session: Any, fetches: Any, trace: Any = None) -> Any:
        """One step, ended after STEP_TIMEOUT_S with StepHung (``trace``: a RunMetadata
        to fill with a full trace and the partition graphs)."""
        tf = self.tf
        options = tf.compat.v1.RunOptions(timeout_in_ms=STEP_TIMEOUT_S * 1000)
        if trace is not None:
            options.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
            options.output_partition_graphs = True
        try:
            return session.run(fetches, options=options, run_metadata=trace)
        except tf.errors.DeadlineExceededError as e:
            raise StepHung(f"a step did not finish within {STEP_TIMEOUT_S} s: a transfer or "
                           "a worker is lost (no run of this bench takes a tenth of "
                           f"that); the run stops here rather than hang ({e.message[:300]})"
                           ) from None

    def _run(self, tower_set: Any, session: Any) -> ClientStep:
        t0 = time.time()
        out = self._session_run(session, tower_set.fetches)
        t1 = time.time()
        stamps = out[-tower_set.num_timestamps:]
        return ClientStep("", t1 - t0, tuple(float(s) - t0 for s in stamps))

    def profile(self) -> tuple[dict, dict, set, list]:
        """Traced steps on the interposed set, no schedule: DAG per worker etc."""
        from tictac_hooks.graph.tf.traced import traced_worker_graphs
        tf = self.tf
        traced = []
        for _ in range(self.cfg["profile_steps"]):
            md = tf.compat.v1.RunMetadata()
            self._session_run(self.sessions[0], self.work.sets[0].fetches, trace=md)
            traced.append(md)
        workers = [f"worker:{w}" for w in self.cfg["interposed_tasks"]]
        graphs, compute, late = traced_worker_graphs(
            traced, workers, declared=(self.work.graph, self.work.declared))
        return {w: self._sized(g) for w, g in graphs.items()}, compute, late, traced

    def _sized(self, graph: Any) -> Any:
        """Recvs the trace gave no size (RPC records miss some) get the size of the
        sending node's output in the client's graph (a variable read: its shape)."""
        from tictac_hooks.graph.tf.naming import sending_node_name
        from tictac_hooks.graph.tf.partition import with_recv_bytes
        sizes = {}
        for op in graph.recvs:
            if op.bytes is None:
                size = self.output_bytes(sending_node_name(op.name))
                if size is not None:
                    sizes[op.name] = size
        return with_recv_bytes(graph, sizes) if sizes else graph

    def output_bytes(self, node: str) -> int | None:
        """Bytes of ``node``'s first output in the client's graph, where its shape is
        fully known."""
        try:
            out = self.work.graph.get_operation_by_name(node).outputs[0]
        except (KeyError, ValueError, IndexError):
            return None
        if out.shape.is_fully_defined() and out.dtype.size:
            return out.shape.num_elements() * out.dtype.size
        return None

    def variable_bytes_per_ps(self) -> list[float]:
        """Bytes of the variables each PS holds that a tower reads."""
        out = [0.0] * self.cfg["ps"]
        trainable = self.cfg["mode"] == "training"
        variables = self.work.variables if trainable else self.work.all_variables
        for v in variables:
            task = v.device.split("/task:")[1].split("/")[0] if "/task:" in v.device else "0"
            out[int(task) % len(out)] += v.shape.num_elements() * v.dtype.size
        return out

    def close(self) -> None:
        for s in self.sessions:
            s.close()


def _calibration_block(cfg: dict, r: Runner, name: str, rate_bits: float) -> list[float]:
    """One calibration block's step times: FAST_LINK, the gate with no order (every
    controller is suspended between blocks) over the fast profiling link, the link
    reshaped back to ``rate_bits`` after it; NO_TRANSFER, the compute reference."""
    fast = name == FAST_LINK
    step = (lambda: r.step(0)) if fast else r.compute_step
    reshape = fast and cfg["shaped"] and cfg.get("profile_rate_bits")
    if reshape:
        _ask({"event": "reshape", "rate_bits": cfg["profile_rate_bits"]})
    try:
        for _ in range(cfg["settle_steps"]):
            step()
        return [step().step_time for _ in range(cfg["block_steps"])]
    finally:
        if reshape:
            _ask({"event": "reshape", "rate_bits": rate_bits})


def in_run_compute(calibration: dict[str, list[float]]) -> InRunCompute | None:
    """The medians of the calibration blocks' steps (with the steps), or None where a
    kind has none (calibration off)."""
    if not all(calibration.get(n) for n in CALIBRATION):
        return None
    return InRunCompute(fast_link_s=median(calibration[FAST_LINK]),
                        compute_s=median(calibration[NO_TRANSFER]),
                        fast_link_steps=calibration[FAST_LINK],
                        compute_steps=calibration[NO_TRANSFER])


def _rotation(names: list[str], round_index: int) -> list[str]:
    """Round r starts at schedule r mod k, and odd rounds run backwards (balances drift
    and the position inside a round)."""
    k = len(names)
    order = names[round_index % k:] + names[:round_index % k]
    return order[::-1] if round_index % 2 else order


def _call_every(addresses: list[str], verb: str, arg: str) -> None:
    """Sends one control verb to the native gate of every PS."""
    from tictac_hooks.enforce.client import connect
    for address in addresses:
        with connect(address, backend="native") as gate:
            gate.call(verb, arg)


def _bypass(addresses: list[str], on: bool) -> None:
    """Bypasses (or restores) the native gate of every PS (schedule "stock")."""
    _call_every(addresses, "bypass", "1" if on else "0")


def _conserve(addresses: list[str], after_s: float | None) -> None:
    """Turns the native gate's work conservation on (``after_s`` seconds) or off (None)
    on every PS (the "-wc" schedules)."""
    value = "off" if after_s is None else repr(float(after_s))
    _call_every(addresses, "configure", f"conserve_after_s\t{value}\n")


def emulated_compute_line(cfg: dict, cpu: CpuUse, spans: list[float],
                          reference_steps: list[float]) -> float:
    """Prints the emulated compute measured after this rate's rounds (each worker's
    delays from the first one's start to the last one's end, no transfer: the median
    over workers and steps) against the requested, the compute reference's whole step
    (the session's dispatch to every worker included), the workers' CPU over the rounds
    and the guard's verdict; returns the measured ms."""
    measured = median(spans) * 1e3
    workers = cfg["interposed_tasks"]
    line, *bound = emulated_lines(measured, cfg["emulate"]["compute_ms"], workers, cpu)
    progress(cfg, line)
    if reference_steps:
        progress(cfg, f"  (the compute reference's whole step, the session's dispatch to "
                      f"{len(workers)} workers included: {median(reference_steps) * 1e3:.1f} "
                      "ms)")
    for text in bound:
        progress(cfg, text)
    return measured


def steps_in_one_turn(records: Any) -> tuple[int, int]:
    """(steps whose workers' records at a PS all have one turn, steps with two or more
    workers' records there): the in-graph bench runs every tower in one step id."""
    turns: dict[tuple[str, int], set[int]] = {}
    count: dict[tuple[str, int], int] = {}
    for rec in records:
        if rec.turn >= 0:
            key = (rec.ps, rec.step_id)
            turns.setdefault(key, set()).add(rec.turn)
            count[key] = count.get(key, 0) + 1
    shared = [k for k, n in count.items() if n > 1]
    return sum(1 for k in shared if len(turns[k]) == 1), len(shared)


def gate_totals(addresses: list[str]) -> dict[str, dict[str, int]] | None:
    """Each PS's gate totals by PS index (None where a PS's gate keeps none)."""
    from tictac_hooks.enforce.client import stats_everywhere
    out = {str(i): dict(s.totals) for i, s in enumerate(stats_everywhere(addresses))}
    return out or None


def run(cfg: dict) -> dict:
    from tictac_hooks.enforce.client import clear_everywhere, steps_everywhere
    r = Runner(cfg)
    names = [s for s in cfg["schedules"]]
    algos = [s for s in names if s in ALGORITHMS + OPTIONAL and s != STOCK]
    progress(cfg, f"graph built, parameters {r.work.param_bytes / 2**20:.1f} MiB; warm-up")
    for _ in range(cfg["warmup"]):
        for which in range(len(r.sessions)):
            r.step(which)
    clear_everywhere(cfg["ps_addresses"])
    # comp (the basis of the link rates and the simulator's compute): the slowest
    # tower's finish over the fast profiling link, once the step time has settled: the
    # per-op sums of a trace miss fused and renamed ops, and a traced step is slower
    # than a plain one. It holds more than computation: the transfers' CPU and, in
    # training, the pushes and the PS's update. compute_ref (E's comp, paper Eq. 4): the
    # compute reference's step, every worker on its own copy of the parameters, no
    # transfer (ResNet-50 training 207 ms against 521 ms over the fast link; VGG-16
    # inference 311 against 378 ms, and TIC's shaped step 334 ms).
    count = max(5, cfg["profile_steps"])
    profiled_since = time.time()  # the controllers read the PSes' records from here
    fast = settled_makespans(lambda: r.step(0).makespan, count)
    local = settled_makespans(lambda: r.compute_step().makespan, count)
    graphs, compute, late, traced = r.profile()
    pushes = traced_pushes(cfg, r, graphs, traced)
    recv_names = {op.name for g in graphs.values() for op in g.recvs}
    traced_comp, traced_bytes = traced_oracle(graphs, compute, late, cfg["ps"])
    comp = max(traced_comp, median(fast))
    compute_ref = median(local)
    compute_info = ProfiledCompute(comp_s=comp, compute_s=compute_ref,
                                   fast_link_s=median(fast), trace_op_sum_s=traced_comp)
    # bytes: what each PS really served a worker per step while profiling (the gates
    # count every response). The trace's recv sizes count a tensor read over two edges
    # twice (ResNet-50 training: 180 MiB per worker against 90 MiB served), which put
    # every training comm/comp at twice its real value.
    bytes_per_ps = served_bytes_per_ps(steps_everywhere(cfg["ps_addresses"]),
                                       cfg["ps_addresses"]) or \
        [max(a, b) for a, b in zip(traced_bytes, r.variable_bytes_per_ps())]
    progress(cfg, f"profiled: step over the fast link {comp * 1e3:.0f} ms (the rates' "
                  f"comp), compute with no transfer {compute_ref * 1e3:.0f} ms (E's comp), "
                  f"trace op sum {traced_comp * 1e3:.0f} ms; parameters pulled per worker "
                  f"{sum(bytes_per_ps) / 2**20:.1f} MiB over {cfg['ps']} PS")
    global_batch = cfg["batch"] * len(cfg["interposed_tasks"])
    runs: list[RateRun] = []
    for rate_spec in cfg["rates"]:
        if rate_spec["kind"] == "ratio":
            unit = metrics.comm_seconds(bytes_per_ps, len(cfg["interposed_tasks"]), 1.0)
            rate_bits = float(max(8000, round(unit / (rate_spec["value"] * comp), -5)))
        else:
            rate_bits = float(rate_spec["value"])
            if cfg.get("emulate"):  # the cluster's link, scaled with the bytes
                scale = cfg["emulate"]["byte_scale"]
                progress(cfg, f"link {rate_bits / 1e9:g} Gbit/s x {scale:.3g} (the byte "
                              f"scale): shaped at {rate_bits * scale / 1e6:.0f} Mbit/s")
                rate_bits = float(max(8000, round(rate_bits * scale, -5)))
        answer = _ask({"event": "reshape", "rate_bits": rate_bits}) if cfg["shaped"] else "unshaped"
        comm = metrics.comm_seconds(bytes_per_ps, len(cfg["interposed_tasks"]), rate_bits)
        progress(cfg, f"link {rate_bits / 1e6:.0f} Mbit/s ({answer}): comm {comm * 1e3:.0f} ms, "
                      f"comm/comp {comm / comp:.2f}")
        controllers = make_controllers(cfg, algos, graphs, compute, late, rate_bits,
                                       profiled_since)
        check = run_order_check(cfg, r, controllers[CHECKED]) if CHECKED in controllers else None
        for which in range(len(r.sessions)):  # settle at the new rate
            r.step(which)
        steps: dict[str, list[ClientStep]] = {n: [] for n in names}
        calibration: dict[str, list[float]] = {n: [] for n in CALIBRATION}
        blocks: list[tuple[str, float, float]] = []
        rv_records: dict[tuple, GateStep] = {}
        rounds = math.ceil(cfg["steps"] / cfg["block_steps"])
        t_start = time.time()
        meter = CpuMeter(cfg.get("task_groups") or {}).start()
        rotated = names + (list(CALIBRATION) if cfg.get("calibrate", True) else [])
        for round_index in range(rounds):
            for name in _rotation(rotated, round_index):
                if name in CALIBRATION:
                    calibration[name] += _calibration_block(cfg, r, name, rate_bits)
                    continue
                which = 1 if name == DIRECT else 0
                if name in controllers:
                    controllers[name].resume()
                if name == STOCK:
                    _bypass(cfg["ps_addresses"], True)
                if name.endswith(WC):
                    _conserve(cfg["ps_addresses"], cfg["conserve_after_s"])
                for _ in range(cfg["settle_steps"]):
                    r.step(which)
                b0 = time.time()
                for _ in range(cfg["block_steps"]):
                    rec = r.step(which)
                    steps[name].append(ClientStep(name, rec.step_time, rec.finishes))
                blocks.append((name, b0, time.time()))
                if name in controllers:
                    controllers[name].suspend()
                if name == STOCK:
                    _bypass(cfg["ps_addresses"], False)
                if name.endswith(WC):
                    _conserve(cfg["ps_addresses"], None)
            for s in steps_everywhere(cfg["ps_addresses"]):
                rv_records[(s.ps, s.step_id, s.worker)] = s
            line = ", ".join(f"{n} {median([s.step_time for s in steps[n]]):.3f}"
                             for n in names)
            progress(cfg, f"{rate_bits / 1e6:.0f} Mbit/s round {round_index + 1}/{rounds} "
                          f"({time.time() - t_start:.0f} s): median step s: {line}")
        cpu = meter.stop()
        emulated_ms = None
        if cfg.get("emulate"):
            emulated_ms = emulated_compute_line(cfg, cpu, r.compute_spans(),
                                                calibration.get(NO_TRANSFER) or [])
        by_schedule: dict[str, list[GateStep]] = {n: [] for n in names}
        for rec in rv_records.values():
            for name, b0, b1 in blocks:
                if b0 <= rec.start <= b1:
                    by_schedule[name].append(rec)
                    break
        # the simulator runs after the blocks: it times each recv by the bytes the PS
        # served it with, which an installed order's records give edge by edge
        sizes = bytes_per_transfer(rv_records.values(), recv_names)
        progress(cfg, f"served bytes known for {len(sizes)} of {len(recv_names)} recvs "
                      f"({sum(sizes.values()) / 2**20:.1f} MiB)")
        in_run = in_run_compute(calibration)
        if in_run:
            progress(cfg, f"in this rate's rounds: step over the fast link "
                          f"{in_run.fast_link_s * 1e3:.0f} ms (profiled {comp * 1e3:.0f}), "
                          f"with no transfer {in_run.compute_s * 1e3:.0f} ms "
                          f"(profiled {compute_ref * 1e3:.0f}): the simulator's compute")
        predicted, sim_inputs = predict_orders(
            cfg, names, controllers, compute, in_run.fast_link_s if in_run else comp,
            rate_bits, {f"ps:{i}": b for i, b in enumerate(bytes_per_ps)}, pushes,
            in_run.compute_s if in_run else compute_ref, sizes)
        results: dict[str, ScheduleSummary] = {}
        for name in names:
            summary = metrics.summarize(steps[name], global_batch, compute_ref, comm)
            if name not in (DIRECT, STOCK):  # (a bypassed gate records no step)
                summary = dataclasses.replace(
                    summary, gate=metrics.rendezvous_counts(by_schedule[name]),
                    unscheduled=metrics.unscheduled_transfers(
                        by_schedule[name], late, recv_names) if name in controllers
                    else None,
                    check=check if name == CHECKED else None)
            results[name] = summary
        runs.append(RateRun(
            rate_bits=rate_bits, comp_s=comp, compute_s=compute_ref, comm_s=comm,
            comm_comp_ratio=comm / comp, bytes_per_ps=bytes_per_ps,
            schedules=results,
            # TensorFlow's default: the plain PS's workers, else the same workers with
            # the gate bypassed (--emulate-gpu runs one worker set)
            vs_default=(metrics.compare(results, DIRECT) if DIRECT in results else
                        metrics.compare(results, STOCK) if STOCK in results else {}),
            step_times={n: [s.step_time for s in steps[n]] for n in names},
            schedule_lengths={n: len(c.schedule) if c.schedule else 0
                              for n, c in controllers.items()},
            # the simulator's step time per order (bench/predict.py), beside the measured
            predicted_step_s=predicted,
            # its inputs: the CLI writes them to <result>.sim.json.gz (predict.save_inputs)
            sim_inputs=sim_inputs,
            # the calibration blocks' medians and steps (None: not run); the simulator's
            # compute where present
            in_run=in_run,
            # the gradients each PS takes in per step (the limit's pushes)
            push_bytes_per_ps=(traced_push_bytes(pushes, cfg["ps"])
                               if cfg["mode"] == "training" and any(pushes) else None),
            gate_totals=gate_totals(cfg["ps_addresses"]),
            cpu=cpu.to_json() if cfg.get("emulate") else None,
            emulated_compute_ms=emulated_ms,
        ))
        totals = runs[-1].gate_totals or {}
        together, steps = steps_in_one_turn(rv_records.values())
        if steps:
            progress(cfg, f"turns: {together} of {steps} steps had all their workers in one "
                          "turn at each PS (the paced service aligns them within a turn)")
        progress(cfg, "gate totals: workers back after a pause "
                      f"{sum(t.get('returned', 0) for t in totals.values())}, levelled "
                      f"{sum(t.get('rejoined', 0) for t in totals.values())} (over "
                      f"{len(totals)} PS)")
        clear_everywhere(cfg["ps_addresses"])
        # each finished bandwidth is kept: a run cut short by --timeout keeps these
        save_result(cfg["out"], _output(r.work.param_bytes, global_batch, compute_info,
                                        runs))
    r.close()
    return _output(r.work.param_bytes, global_batch, compute_info, runs)


def _output(param_bytes: int, global_batch: int, compute: ProfiledCompute,
            runs: list[RateRun]) -> dict[str, Any]:
    """What the client hands the runner (through ``config["out"]``): the parts of a
    BenchRun it measured, each rate with its simulator inputs."""
    return {"param_bytes": param_bytes, "global_batch": global_batch,
            "compute": compute.to_json(),
            "runs": [dict(run.to_json(), sim_inputs=run.sim_inputs) for run in runs]}


def save_result(path: str, result: dict) -> None:
    """Writes ``result`` to ``path`` whole or not at all (a reader never sees half)."""
    tmp = f"{path}.part"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with open(argv[0]) as f:
        cfg = json.load(f)
    save_result(cfg["out"], run(cfg))
    print(json.dumps({"event": "done"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))