"""Markdown tables and PNG plots from `tictac bench` result JSON files.

``tictac bench-report A.json B.json ... --output-dir DIR`` writes ``DIR/report.md`` with one
results table (one row per configuration, bandwidth and schedule), where TicTac's gain
comes from (the paced service against the order), each run's distance to the link's
limit, the runs against the expected figures (the README's "What to expect"), the
simulator's step time per order beside the measured one, and three kinds of plot: gain
against comm/comp per order, measured and simulated, for every configuration run at
several ratios (a sweep); the step-time CDF per schedule of every configuration; and
throughput relative to TensorFlow's default per model. The plots need matplotlib (the
``bench`` extra: ``pip install tictac-hooks[bench]``); without it the Markdown is
written alone.

This module writes the tables and the file; the decomposition is
:mod:`~tictac_hooks.bench.gains`'s, the distance :mod:`~tictac_hooks.bench.limit`'s,
the lines against the expected figures :mod:`~tictac_hooks.bench.expected`'s, the
simulator's section :mod:`~tictac_hooks.bench.accuracy`'s, the plots
:mod:`~tictac_hooks.bench.plots`'s.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

from tictac_hooks.bench.accuracy import prediction_section
from tictac_hooks.bench.expected import targets
from tictac_hooks.bench.gains import decomposition_section, same_path_gain
from tictac_hooks.bench.gains import fmt as _fmt
from tictac_hooks.bench.limit import limit_section
from tictac_hooks.bench.plots import BENCH_EXTRA, pyplot, write_plots
from tictac_hooks.records import BenchRun, Comparison, RateRun, ScheduleSummary
from tictac_hooks.records.files import load_json


def wire_compute(run: RateRun) -> float | None:
    """The run's wire time over the compute reference's step (no transfer; E's comp).
    comm/comp, the ratio the link rate was chosen by, divides by the step over the fast
    profiling link, which also holds the transfers' CPU and, in training, the pushes
    and the PS's update."""
    return run.comm_s / run.compute_s if run.compute_s else None


def _rows(results: Sequence[BenchRun]
          ) -> list[tuple[BenchRun, RateRun, str, ScheduleSummary, Comparison | None]]:
    rows = []
    for result in results:
        for run in result.runs:
            for name, summary in run.schedules.items():
                rows.append((result, run, name, summary, run.vs_default.get(name)))
    return rows


def text_table(results: Sequence[BenchRun]) -> str:
    """The results as one Markdown table."""
    lines = []
    for result in results:
        if not result.shaped:
            lines.append(f"**LOOPBACK FALLBACK, NOT A SHAPED NETWORK** "
                         f"({result.config.label}: {result.network_reason})\n")
        if result.incomplete:
            lines.append(f"**INCOMPLETE** ({result.config.label}: "
                         f"{result.incomplete}; only the bandwidths below were measured)\n")
    lines += ["| config | link | comm/comp | wire/compute | schedule | samples/s | vs default "
              "| vs gate, no order | median ms | p95 ms | CV | straggler % | E median "
              "| violations | matched |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for result, run, name, m, vs in _rows(results):
        gain = vs.throughput_gain_pct if vs else None
        same = same_path_gain(run, name)
        viol = (f"{m.gate.violations} ({m.gate.violation_pct:.2f} %)"
                if m.gate and m.gate.violation_pct is not None else "-")
        lines.append(
            f"| {result.config.label} b{result.config.batch} | {run.rate} "
            f"| {run.comm_comp_ratio:.2f} | {_fmt(wire_compute(run), '.2f')} "
            f"| {name} | {m.throughput:.1f} "
            f"| {_fmt(gain, '+.1f')}{' %' if gain is not None else ''} "
            f"| {_fmt(same, '+.1f')}{' %' if same is not None else ''} "
            f"| {m.step_time_median * 1e3:.0f} | {m.step_time_p95 * 1e3:.0f} "
            f"| {m.step_time_cv:.3f} | {m.straggler_pct:.1f} "
            f"| {_fmt(m.efficiency_median, '.2f')} | {viol} "
            f"| {_fmt(m.gate.matched if m.gate else None, '.3f')} |")
    return "\n".join(lines)


def unscheduled_section(results: Sequence[BenchRun], schedule: str = "tic",
                        most: int = 8) -> list[str]:
    """Per configuration, the transfers ``schedule``'s order left out (matched < 1):
    how many, their bytes, the largest of them with the reason."""
    out = []
    for result in results:
        for run in result.runs:
            summary = run.schedules.get(schedule)
            listed = summary.unscheduled if summary else None
            if not listed:
                continue
            total = sum(e.bytes for e in listed)
            reasons: dict[str, int] = {}
            for e in listed:
                reasons[e.reason] = reasons.get(e.reason, 0) + 1
            why = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            out += [f"- {result.config.label} @ {run.rate}: {len(listed)} transfers "
                    f"not in the {schedule.upper()} order, {total / 2**20:.1f} MiB per step "
                    f"({why}); the largest:"]
            out += [f"  - `{e.name}`: {e.bytes / 2**10:.0f} KiB, {e.reason}"
                    for e in listed[:most]]
    return out


def load_results(paths: Sequence[str], repredict: bool = False) -> list[BenchRun]:
    """The result JSONs; ``repredict``: each run's ``predicted_step_s`` recomputed by
    the current simulator from the inputs saved beside its result, the inputs kept on
    the run (``sim_inputs``: the distance to the limit reads the traced pushes there;
    a result without them keeps the predictions it was written with)."""
    from tictac_hooks.bench.predict import load_inputs, repredict as predict_again
    results = []
    for path in paths:
        result = BenchRun.from_json(load_json(path))
        inputs = load_inputs(path) if repredict else None
        if inputs is not None:
            if len(inputs) != len(result.runs):
                raise ValueError(f"{path}: {len(result.runs)} runs but simulator inputs "
                                 f"for {len(inputs)}")
            result = dataclasses.replace(result, runs=tuple(
                run if data is None else
                dataclasses.replace(run, predicted_step_s=predict_again(data),
                                    sim_inputs=data)
                for run, data in zip(result.runs, inputs)))
        results.append(result)
    return results


def source_line(result: BenchRun) -> str:
    """Where a result came from: its commit (and whether the checkout had changes) and
    the command that ran it; "unknown" for what it does not record (older results)."""
    commit = (result.commit[:12] + (" with uncommitted changes" if result.dirty else "")
              if result.commit else
              "unknown (not a git checkout)" if result.command else "unknown")
    command = f"`{result.command}`" if result.command else "unknown"
    return f"commit {commit}, command {command}"


def write_report(paths: Sequence[str], out_dir: str, repredict: bool = False,
                 say: Callable[[str], None] = print) -> str:
    """Writes ``out_dir/report.md`` and its PNG plots; returns the Markdown path.
    ``repredict``: see :func:`load_results`. Without matplotlib (the ``bench`` extra)
    it writes the Markdown alone and says in one line (``say``) what to install."""
    results = load_results(paths, repredict)
    os.makedirs(out_dir, exist_ok=True)
    md = ["# TicTac benchmark: TensorFlow's default vs TicTac on a shaped network", ""]
    for path, result in zip(paths, results):
        c, before, after = result.config, result.machine_before, result.machine_after
        md.append(f"- `{os.path.basename(path)}`: {c.label}, batch "
                  f"{c.batch}/worker, {c.steps} steps per schedule in blocks of "
                  f"{c.block_steps}, network "
                  f"{'shaped (netns + tc)' if result.shaped else 'LOOPBACK FALLBACK'}"
                  f", load avg {before.loadavg_1m:.2f} before / "
                  f"{after.loadavg_1m:.2f} after on {before.cpus} CPUs, "
                  f"{result.wall_s:.0f} s; {source_line(result)}")
    md += ["", text_table(results)]
    decomposition = decomposition_section(results)
    if decomposition:
        md += ["", "## Where the gain comes from: the service and the order", ""] + \
            decomposition
    distance = limit_section(results)
    if distance:
        md += ["", "## Distance to the link's limit", ""] + distance
    md += ["", "## Against the expected figures", ""]
    md += targets(results)
    unscheduled = unscheduled_section(results)
    if unscheduled:
        md += ["", "## Transfers the order leaves out", ""] + unscheduled
    predicted = prediction_section(results)
    if predicted:
        md += ["", "## Simulated against measured step time", ""] + predicted
    plt = pyplot()
    if plt is None:
        say(f"no plots: matplotlib is not installed (pip install '{BENCH_EXTRA}')")
    else:
        md += ["", "## Plots", ""] + write_plots(plt, results, out_dir)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    return path
