"""Benchmark results to test the report and the records with (no TensorFlow)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tictac_hooks.bench import metrics
from tictac_hooks.records import (BenchConfigRecord, BenchRun, ClientStep, GateCounts,
                                  GateStep, MachineLoad, RateRun, ScheduleSummary)

LABEL = "resnet50/training/W2/P1"


def gate_step(order, violations, skips, version, unlisted=()) -> GateStep:
    return GateStep(step_id=1, worker="/job:worker/replica:0/task:0/device:CPU:0",
                    schedule_version=version, algorithm=None, complete=True,
                    order=tuple(order), transfers=(), bytes=0, start=0.0, end=0.0,
                    skipped=(), skips=skips, violations=violations, reordered=0,
                    unlisted=tuple(unlisted))


def config(**changes: Any) -> BenchConfigRecord:
    return dataclasses.replace(BenchConfigRecord(
        label=LABEL, model="resnet50", mode="training", workers=2, ps=1, batch=2,
        bandwidth=("auto",), schedules=("none", "tic"), steps=4, block_steps=2,
        settle_steps=1, warmup=2, profile_steps=3, skip_timeout=5.0, window_bytes=1 << 20,
        timeout_s=1800.0, loopback=False), **changes)


def summary(name: str, times, finishes=lambda t: (t, t), comp=0.5, comm=0.5
            ) -> ScheduleSummary:
    """``metrics.summarize`` of steps of ``times``, 4 samples each."""
    return metrics.summarize([ClientStep(name, t, finishes(t)) for t in times], 4, comp, comm)


def rate_run(steps: dict[str, list[float]], ratio: float = 1.0, rate_bits: float = 1e8,
             schedules: dict[str, ScheduleSummary] | None = None, **changes: Any) -> RateRun:
    sched = schedules or {n: summary(n, ts) for n, ts in steps.items()}
    return RateRun(rate_bits=rate_bits, comp_s=0.5, comm_s=0.5 * ratio, comm_comp_ratio=ratio,
                   bytes_per_ps=(1e6,), schedules=sched, vs_default=metrics.compare(sched),
                   step_times=steps, schedule_lengths={n: 3 for n in sched if n != "none"},
                   **changes)


def result(shaped: bool = True) -> BenchRun:
    """One rate: TensorFlow's default ("none") and TIC, through the gate without a
    violation."""
    steps = {"none": [1.0, 1.2, 1.4, 1.1], "tic": [0.8, 0.8, 0.81, 0.8]}
    sched = {}
    for name, times in steps.items():
        sched[name] = summary(name, times, lambda t: (t * 0.7, t * 0.9))
        if name == "tic":
            sched[name] = dataclasses.replace(sched[name], gate=GateCounts(
                transfers=12, violations=0, violation_pct=0.0, skips=0, matched=1.0))
    return BenchRun(config=config(), shaped=shaped,
                    network_reason="" if shaped else "not root",
                    machine_before=MachineLoad(0.5, 0.4, 2),
                    machine_after=MachineLoad(1.0, 0.6, 2), wall_s=10.0,
                    param_bytes=1 << 20, global_batch=4,
                    runs=(rate_run(steps, schedules=sched),))


def sweep_result() -> BenchRun:
    """One configuration at comm/comp 0.5 and 2 with the simulator's predictions."""
    runs = []
    for ratio, (none, tic), (sim_none, sim_tic) in ((0.5, (1.0, 0.9), (1.0, 0.92)),
                                                    (2.0, (2.0, 1.6), (2.1, 1.2))):
        runs.append(rate_run(
            {"none": [none] * 4, "tic": [tic] * 4}, ratio, 1e8 / ratio,
            predicted_step_s={"scaled": {"none": sim_none, "tic": sim_tic},
                              "overhead": {"none": none * 1.3, "tic": tic * 1.3}}))
    return dataclasses.replace(result(), runs=tuple(runs))


def with_run(res: BenchRun, index: int, **changes: Any) -> BenchRun:
    """``res`` with its run ``index`` changed (``schedules``: added to the run's)."""
    runs = list(res.runs)
    if "schedules" in changes:
        changes["schedules"] = {**runs[index].schedules, **changes["schedules"]}
    runs[index] = dataclasses.replace(runs[index], **changes)
    return dataclasses.replace(res, runs=tuple(runs))
