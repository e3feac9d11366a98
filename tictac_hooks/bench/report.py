"""Markdown tables and PNG plots from `tictac bench` result JSON files.

``tictac bench-report A.json B.json ... --out DIR`` writes ``DIR/report.md`` with one
results table (one row per configuration, bandwidth and schedule), the runs against the
expected figures (the README's "What to expect"), the simulator's step time per order
beside the measured one, and three kinds of plot: gain against comm/comp per order,
measured and simulated, for every configuration run at several ratios (a sweep); the
step-time CDF per schedule of every configuration; and throughput relative to
TensorFlow's default per model. The plots need matplotlib (the ``bench`` extra:
``pip install tictac-hooks[bench]``); without it the Markdown is written alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
from typing import Any, Callable, Iterable, Sequence

from tictac_hooks.bench import metrics
from tictac_hooks.records import BenchRun, CheckSummary, Comparison, RateRun, ScheduleSummary
from tictac_hooks.bench.client import DIRECT as DEFAULT  # TensorFlow's default, twin PS
from tictac_hooks.bench.client import PASSTHROUGH as SAME_PATH  # the gate with no order
from tictac_hooks.bench.client import STOCK  # the gate bypassed: the same PS and workers
from tictac_hooks.bench.client import CHECKED  # TicTac's order check, then what it kept
from tictac_hooks.graph.algorithms import peer_label

BASELINES = (DEFAULT, SAME_PATH, STOCK)
TICTAC = ("tic", "tac")


CV_FLOOR = 0.03  # the CV figure is expected only where the default's CV is above this


def same_path_gain(run: RateRun, name: str) -> float | None:
    """Throughput gain (%) of ``name`` over the gate with no order installed, measured in
    the same run: the ordering's own effect, with the gate's cost on both sides (the
    direct baseline runs through a twin PS and other worker tasks)."""
    sched = run.schedules
    if SAME_PATH not in sched or name not in sched or not sched[SAME_PATH].throughput:
        return None
    return 100.0 * (sched[name].throughput / sched[SAME_PATH].throughput - 1.0)


def smallest_gain(run: RateRun, name: str) -> float | None:
    """Throughput gain (%) of ``name`` over the fastest baseline of the run (TensorFlow's
    default through the twin PS, the gate with no order, stock): an odd baseline cannot
    make a gain."""
    sched = run.schedules
    base = [sched[b].throughput for b in BASELINES if b in sched and sched[b].throughput]
    if name not in sched or not base:
        return None
    return 100.0 * (sched[name].throughput / max(base) - 1.0)


def wire_compute(run: RateRun) -> float | None:
    """The run's wire time over the compute reference's step (no transfer; E's comp).
    comm/comp, the ratio the link rate was chosen by, divides by the step over the fast
    profiling link, which also holds the transfers' CPU and, in training, the pushes
    and the PS's update."""
    return run.comm_s / run.compute_s if run.compute_s else None


def _fmt(value: Any, spec: str, empty: str = "-") -> str:
    return empty if value is None else format(value, spec)


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


def _largest(values: Iterable[float | None]) -> float | None:
    """The largest of the values that are known (None: none is)."""
    return max((v for v in values if v is not None), default=None)


def targets(results: Sequence[BenchRun]) -> list[str]:
    """The expected figures (the README's "What to expect": gains, CV and straggler cuts,
    E), checked on these results (best of TIC/TAC per run)."""
    out = []
    best_gain = {"training": None, "inference": None}
    worst_slowdown = None
    tally: dict[str, list[tuple[float | None, str]]] = {"cv": [], "straggler": [], "e": []}
    for result in results:
        mode = result.config.mode
        for run in result.runs:
            vs, sched = run.vs_default, run.schedules
            if DEFAULT not in sched:
                continue
            label = f"{result.config.label} @ {run.rate}"
            tictac = [n for n in TICTAC if n in sched]
            if not tictac:
                continue
            gains = {n: smallest_gain(run, n) for n in tictac}
            best = max(gains, key=gains.get)
            if best_gain[mode] is None or gains[best] > best_gain[mode][0]:
                best_gain[mode] = (gains[best], label, best)
            for n in tictac:
                if worst_slowdown is None or gains[n] < worst_slowdown[0]:
                    worst_slowdown = (gains[n], label, n)
            cv = {n: vs[n].cv_cut for n in tictac}
            st = {n: vs[n].straggler_cut for n in tictac}
            eff = {n: sched[n].efficiency_median for n in tictac}
            def join(values: dict, spec: str, unit: str = "") -> str:
                return ", ".join(f"{n} {_fmt(v, spec)}{unit}" for n, v in values.items())
            base_cv = sched[DEFAULT].step_time_cv
            line = (f"- {label}: throughput {join(gains, '+.1f', ' %')} (over the fastest "
                    f"of {', '.join(b for b in BASELINES if b in sched)}); "
                    f"CV cut {join(cv, '.2f', 'x')} ")
            if base_cv is not None and base_cv > CV_FLOOR:
                line += f"(default's CV {base_cv:.3f}; target >= 3x); "
                tally["cv"].append((_largest(cv.values()), label))
            else:
                line += (f"(default's CV {_fmt(base_cv, '.3f')} <= {CV_FLOOR}: "
                         f"no target); ")
            if result.config.workers > 1:
                line += f"straggler cut {join(st, '.2f', 'x')} (target >= 2.3x); "
                tally["straggler"].append((_largest(st.values()), label))
            tally["e"].append((_largest(eff.values()), label))
            out.append(line + f"E {join(eff, '.2f')} (target >= 0.9)")
    head = []
    # The peers' orders (graph/algorithms.py, PEER_LABELS); results from before the
    # rename name first-use "layer".
    for baseline, names in (("first-use", ("first-use", "layer")), ("declared", ("declared",))):
        versus = []  # (best of TIC/TAC over the baseline in %, run)
        for result in results:
            for run in result.runs:
                sched = run.schedules
                tictac = [sched[n].throughput for n in TICTAC if n in sched]
                base = next((sched[n] for n in names if n in sched), None)
                if tictac and base is not None and base.throughput:
                    versus.append((100.0 * (max(tictac) / base.throughput - 1),
                                   f"{result.config.label} @ {run.rate}"))
        if versus:
            ahead = [f"{label} {g:+.1f} %" for g, label in versus if g >= 3.0]
            behind = [f"{label} {g:+.1f} %" for g, label in versus if g < 0.0]
            head.append(f"- TIC/TAC (the faster) against {peer_label(baseline)} order: at "
                        f"least as fast on {len(versus) - len(behind)} of {len(versus)} runs"
                        f"{' (behind: ' + ', '.join(behind) + ')' if behind else ''}; "
                        f">= 3 % faster on {len(ahead)}"
                        f"{' (' + ', '.join(ahead) + ')' if ahead else ''}")
    for mode, want in (("training", 20.0), ("inference", 40.0)):  # the expected gains
        if best_gain[mode]:
            g, label, n = best_gain[mode]
            head.append(f"- best {mode} gain: {n} {g:+.1f} % on {label} (target >= +{want:.0f} %): "
                        f"{'met' if g >= want else 'MISSED'}")
    if worst_slowdown:
        g, label, n = worst_slowdown
        head.append(f"- worst TIC/TAC result vs default with the order check off: {n} "
                    f"{g:+.1f} % on {label}")
    for key, want, what in (("cv", 3.0, "step-time CV cut >= 3x where the default's CV is "
                                          f"above {CV_FLOOR}"),
                            ("straggler", 2.3, "straggler share cut >= 2.3x (2+ workers)"),
                            ("e", 0.9, "median E >= 0.9")):
        runs = tally[key]
        if not runs:
            continue
        met = [label for v, label in runs if v is not None and v >= want]
        head.append(f"- {what} (the better of TIC/TAC): met on {len(met)} of {len(runs)} "
                    f"runs{' (' + ', '.join(met) + ')' if met else ''}; best "
                    f"{_fmt(_largest(v for v, _ in runs), '.2f')}")
    head += checked_targets(results)
    return head + out


RECHECK_EVERY = 5000  # --tictac_recheck_every's default


def check_cost_pct(check: CheckSummary | None, recheck_every: int = RECHECK_EVERY
                   ) -> float | None:
    """The order check's own cost, in % of the run's time at TensorFlow's step time,
    when it repeats every ``recheck_every`` steps: each candidate's T blocks take
    1/ratio - 1 more time per step than TensorFlow's (ratio: its median paired ratio;
    a faster candidate gives a negative cost), and the check adds its steps to the
    period."""
    if check is None:
        return None
    ratios = [r for r in check.candidates.values() if r]
    steps = check.steps
    if not ratios or not steps:
        return None
    per_candidate = steps / (2 * len(ratios))  # each candidate's T steps
    extra = sum(per_candidate * (1.0 / r - 1.0) for r in ratios)
    return 100.0 * extra / (recheck_every + steps)


def round_gains(run: RateRun, name: str, base: str, block_steps: int) -> list[float]:
    """Per round, the throughput gain (%) of ``name``'s block over ``base``'s block of
    the same round (block medians; each schedule runs one block per round, so the
    pairs are neighbours in time)."""
    a, b = run.step_times.get(name), run.step_times.get(base)
    if not a or not b or block_steps < 1:
        return []
    blocks = lambda ts: [ts[i:i + block_steps] for i in range(0, len(ts), block_steps)]
    return [100.0 * (statistics.median(y) / statistics.median(x) - 1.0)
            for x, y in zip(blocks(a), blocks(b)) if x and y]


def checked_targets(results: Sequence[BenchRun]) -> list[str]:
    """Schedule "checked" (TicTac's order check, then what it kept) against the
    baselines: the target is never more than 1 % slower than TensorFlow's default."""
    rows = []
    for result in results:
        for run in result.runs:
            sched = run.schedules
            if CHECKED not in sched:
                continue
            check = sched[CHECKED].check
            stock = sched[STOCK].throughput if STOCK in sched else None
            base = [b for b in BASELINES if b in sched and sched[b].throughput]
            fastest = max(base, key=lambda b: sched[b].throughput) if base else None
            pairs = round_gains(run, CHECKED, fastest, result.config.block_steps) \
                if fastest else []
            rows.append((smallest_gain(run, CHECKED),
                         100.0 * (sched[CHECKED].throughput / stock - 1) if stock else None,
                         f"{result.config.label} @ {run.rate}",
                         (check.kept if check else None) or "TensorFlow's order",
                         check_cost_pct(check),
                         (fastest, pairs)))
    if not rows:
        return []
    worst = min(rows, key=lambda r: r[0])
    def per_round(fastest: str | None, pairs: list[float]) -> str:
        if len(pairs) < 2:
            return ""
        return (f" (per round against {fastest}: median {statistics.median(pairs):+.1f} %, "
                f"{min(pairs):+.1f} to {max(pairs):+.1f} % over {len(pairs)} rounds)")
    each = "; ".join(f"{label}: kept {kept}, {g:+.1f} % over the fastest baseline"
                     + per_round(*rounds)
                     + (f", {s:+.1f} % over stock" if s is not None else "")
                     + (f", the check itself {c:+.2f} % of the time over "
                        f"{RECHECK_EVERY} steps" if c is not None else "")
                     for g, s, label, kept, c, rounds in rows)
    return [f"- with TicTac's order check on (schedule {CHECKED}): worst {worst[0]:+.1f} % on "
            f"{worst[2]} (target: never more than 1 % slower than the default): "
            f"{'met' if worst[0] >= -1.0 else 'MISSED'} ({each})"]


def prediction_rows(results: Sequence[BenchRun]) -> list[dict[str, Any]]:
    """Per run and order: measured median step seconds and the simulator's prediction
    under each model of the untraced compute (bench/predict.py), with relative errors."""
    rows = []
    for result in results:
        for run in result.runs:
            predicted = run.predicted_step_s or {}
            for name, m in run.schedules.items():
                row = {"label": result.config.label, "rate": run.rate,
                       "ratio": run.comm_comp_ratio, "order": name,
                       "measured": m.step_time_median,
                       "interval": metrics.median_interval(
                           run.step_times.get(name, ()))}
                for model, steps in predicted.items():
                    if name in steps:
                        row[model] = steps[name]
                        row[model + "_error"] = steps[name] / m.step_time_median - 1.0
                rows.append(row)
    return rows


def _models(rows: Sequence[dict]) -> list[str]:
    return sorted({k[:-6] for r in rows for k in r if k.endswith("_error")})


def _abs_errors(rows: Sequence[dict], model: str) -> list[float]:
    """|relative error| of ``model``'s predictions over ``rows``, ascending."""
    return sorted(abs(r[model + "_error"]) for r in rows if model + "_error" in r)


def _beyond_interval(rows: Sequence[dict], model: str) -> list[float]:
    """How far (relative) ``model``'s prediction lies outside the 95 % interval of each
    measured median (:func:`metrics.median_interval`; 0 inside it), ascending, over the
    rows that have one: the part of the error the measurement's own spread cannot hold."""
    out = []
    for r in rows:
        if model not in r or not r.get("interval"):
            continue
        lo, hi = r["interval"]
        p = r[model]
        out.append((lo - p) / lo if p < lo else (p - hi) / hi if p > hi else 0.0)
    return sorted(out)


def _beyond_text(rows: Sequence[dict], model: str) -> str:
    beyond = _beyond_interval(rows, model)
    if not beyond:
        return ""
    return (f"; outside the measured median's 95 % interval by at most {beyond[-1]:.1%} "
            f"over {len(beyond)} points (within 10 % of the interval: "
            f"{'met' if beyond[-1] <= 0.10 else 'MISSED'})")


def best_model(rows: Sequence[dict]) -> str | None:
    """The model of the untraced compute whose largest |error| over ``rows`` is the
    smallest (the target bounds every point), the smaller median breaking a tie."""
    def worst_then_median(model: str) -> tuple[float, float]:
        errors = _abs_errors(rows, model)
        return round(errors[-1], 4), errors[len(errors) // 2]
    models = _models(rows)
    return min(models, key=worst_then_median) if models else None


def best_models(rows: Sequence[dict]) -> dict[str, str | None]:
    """Configuration label -> :func:`best_model` over that configuration's rows."""
    return {label: best_model([r for r in rows if r["label"] == label])
            for label in sorted({r["label"] for r in rows})}


def ranking_agreement(rows: Sequence[dict], model: str) -> tuple[int, int]:
    """(order pairs the model ranks as measured, order pairs) over every run; pairs
    whose measured medians are within 1 % of each other are ties and not counted."""
    agree = total = 0
    by_run: dict[tuple, list[dict]] = {}
    for r in rows:
        if model in r:
            by_run.setdefault((r["label"], r["rate"]), []).append(r)
    for run_rows in by_run.values():
        for i, a in enumerate(run_rows):
            for b in run_rows[i + 1:]:
                if abs(a["measured"] / b["measured"] - 1.0) < 0.01:
                    continue
                total += 1
                agree += (a["measured"] < b["measured"]) == (a[model] < b[model])
    return agree, total


def gain_errors(results: Sequence[BenchRun], model: str) -> list[tuple[str, float, float]]:
    """(order, measured gain %, simulated gain %) over the gate with no order, per run
    and order with a prediction: the simulator's view of what ordering buys."""
    out = []
    for result in results:
        for run in result.runs:
            sim = (run.predicted_step_s or {}).get(model, {})
            if SAME_PATH not in sim:
                continue
            for name in sim:
                measured = same_path_gain(run, name)
                if name in (DEFAULT, SAME_PATH) or measured is None or not sim[name]:
                    continue
                out.append((name, measured, 100.0 * (sim[SAME_PATH] / sim[name] - 1.0)))
    return out


def simulator_compute_lines(results: Sequence[BenchRun]) -> list[str]:
    """A table of the compute the simulator was given per run: the calibration blocks'
    medians in that run's rounds (bench/client.py CALIBRATION), against the profiling
    phase's."""
    rows = []
    for result in results:
        profiled = result.compute
        for run in result.runs:
            in_run = run.in_run
            if in_run:
                cells = [f"{s * 1e3:.0f}" if s else "-" for s in (
                    in_run.fast_link_s, profiled.fast_link_s if profiled else None,
                    in_run.compute_s, profiled.compute_s if profiled else None)]
                rows.append(f"| {result.config.label} | {run.rate} | "
                            + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["The simulator's compute: the medians of the calibration blocks in each "
            "rate's rounds (the gate with no order over the fast profiling link; the "
            "compute reference, no transfer), against the profiling phase's values taken "
            "before the rounds:", "",
            "| config | link | fast link ms | profiled | no transfer ms | profiled |",
            "|---|---|---|---|---|---|"] + rows + [""]


def prediction_section(results: Sequence[BenchRun]) -> list[str]:
    """The simulator's step time per order against the measured one, and how well each
    model of the untraced compute predicts the measured ranking of the orders."""
    rows = prediction_rows(results)
    models = _models(rows)
    if not models:
        return []
    out = ["| config | link | comm/comp | order | measured ms | "
           + " | ".join(f"simulated ms ({m}) | error ({m})" for m in models) + " |",
           "|---|---|---|---|---|" + "---|---|" * len(models)]
    for r in rows:
        cells = [f"{_fmt(r[m] * 1e3 if m in r else None, '.0f')} | "
                 f"{_fmt(r.get(m + '_error'), '+.1%')}" for m in models]
        out.append(f"| {r['label']} | {r['rate']} | {r['ratio']:.2f} | {r['order']} | "
                   f"{r['measured'] * 1e3:.0f} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Models (bench/predict.py): *scaled* puts the compute the trace misses into "
               "the traced ops, *overhead* after the step; *cpu* scales the ops to the "
               "step with no transfer and makes the rest of the fast-link step CPU work per "
               "byte pulled or pushed, on the worker as the data arrives or leaves; "
               "*-serial* models TensorFlow's "
               "order as back-to-back transfers in a random order, else as every transfer "
               "sharing the link at once; *-joint* simulates the workers of a step together "
               "(one DAG, a processor per worker, their pulls on each PS's one channel and "
               "their pushes on its ingress), else each worker alone on its share of the "
               "link.")
    out.append("")
    out += simulator_compute_lines(results)
    for m in models:
        errors = _abs_errors(rows, m)
        agree, total = ranking_agreement(rows, m)
        gains = gain_errors(results, m)
        off = sorted(abs(s - g) for _, g, s in gains)
        out.append(f"- model {m}: median |error| {errors[len(errors) // 2]:.1%}, largest "
                   f"{errors[-1]:.1%} (target <= 10 %: "
                   f"{'met' if errors[-1] <= 0.10 else 'MISSED'})"
                   f"{_beyond_text(rows, m)}; ranks "
                   f"{agree} of {total} order pairs as measured (pairs within 1 % not counted)"
                   + (f"; gain over the gate with no order off by a median "
                      f"{off[len(off) // 2]:.1f} points (largest {off[-1]:.1f}) over "
                      f"{len(off)} order x ratio points" if off else ""))
    per_label = []
    for label, model in best_models(rows).items():
        if model is None:  # a configuration run without the simulator
            continue
        own = [r for r in rows if r["label"] == label]
        errors = _abs_errors(own, model)
        per_label.append(f"{label}: {model}, median |error| {errors[len(errors) // 2]:.1%}, "
                         f"largest {errors[-1]:.1%}{_beyond_text(own, model)}")
    out.append(f"- the sweep plots use, per configuration, the model whose largest "
               f"|error| on it is the smallest ({'; '.join(per_label)})")
    return out


def sweep_groups(results: Sequence[BenchRun]) -> dict[str, list[RateRun]]:
    """Configuration label -> its runs at two or more comm/comp ratios, in ratio order
    (from one or several result files)."""
    groups: dict[str, list[RateRun]] = {}
    for result in results:
        for run in result.runs:
            if DEFAULT in run.schedules:
                groups.setdefault(result.config.label, []).append(run)
    return {label: sorted(runs, key=lambda r: r.comm_comp_ratio)
            for label, runs in groups.items()
            if len({round(r.comm_comp_ratio, 2) for r in runs}) >= 2}


def _sweep_plot(plt: Any, label: str, runs: Sequence[RateRun], model: str | None,
                path: str) -> None:
    # Gains over the gate with no order where it ran (the ordering's own effect, which
    # is what the simulator predicts), else over TensorFlow's default.
    base = SAME_PATH if all(SAME_PATH in r.schedules for r in runs) else DEFAULT
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    names = [n for n in runs[0].schedules if n not in (DEFAULT, SAME_PATH)]
    xs = [r.comm_comp_ratio for r in runs]
    for k, name in enumerate(names):
        color = f"C{k}"
        ax.plot(xs, [same_path_gain(r, name) if base == SAME_PATH
                     else r.vs_default[name].throughput_gain_pct for r in runs], "o-",
                color=color, label=f"{name} measured")
        sims = [(r.predicted_step_s or {}).get(model, {}) if model else {} for r in runs]
        if all(name in s and DEFAULT in s for s in sims):
            ax.plot(xs, [100.0 * (s[DEFAULT] / s[name] - 1.0) for s in sims], "x--",
                    color=color, alpha=0.7, label=f"{name} simulated")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:.2g}" for x in xs])
    ax.set(xlabel="comm / comp",
           ylabel="throughput gain (%) over " + ("the gate with no order" if base == SAME_PATH
                                                 else "TensorFlow's default"),
           title=f"{label}: gain against comm/comp")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def load_results(paths: Sequence[str], repredict: bool = False) -> list[BenchRun]:
    """The result JSONs; ``repredict``: each run's ``predicted_step_s`` recomputed by
    the current simulator from the inputs saved beside its result (a result without
    them keeps the predictions it was written with)."""
    from tictac_hooks.bench.predict import load_inputs, repredict as predict_again
    results = []
    for path in paths:
        with open(path) as f:
            result = BenchRun.from_json(json.load(f))
        inputs = load_inputs(path) if repredict else None
        if inputs is not None:
            if len(inputs) != len(result.runs):
                raise ValueError(f"{path}: {len(result.runs)} runs but simulator inputs "
                                 f"for {len(inputs)}")
            result = dataclasses.replace(result, runs=tuple(
                run if data is None else
                dataclasses.replace(run, predicted_step_s=predict_again(data))
                for run, data in zip(result.runs, inputs)))
        results.append(result)
    return results


BENCH_EXTRA = "tictac-hooks[bench]"


def _pyplot() -> Any:
    """matplotlib's pyplot (Agg), or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


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
    md += ["", text_table(results), "", "## Against the expected figures", ""]
    md += targets(results)
    unscheduled = unscheduled_section(results)
    if unscheduled:
        md += ["", "## Transfers the order leaves out", ""] + unscheduled
    predicted = prediction_section(results)
    if predicted:
        md += ["", "## Simulated against measured step time", ""] + predicted
    plt = _pyplot()
    if plt is None:
        say(f"no plots: matplotlib is not installed (pip install '{BENCH_EXTRA}')")
    else:
        md += ["", "## Plots", ""] + _plots(plt, results, out_dir)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    return path


def _plots(plt: Any, results: Sequence[BenchRun], out_dir: str) -> list[str]:
    """Writes the sweep, CDF and throughput plots into ``out_dir``; returns their
    Markdown lines."""
    md = []
    models = best_models(prediction_rows(results))  # each plot with its best fit
    for label, runs in sweep_groups(results).items():
        name = f"sweep-{_slug(label)}.png"
        _sweep_plot(plt, label, runs, models.get(label), os.path.join(out_dir, name))
        md.append(f"![{label}: gain against comm/comp]({name})")
    for result in results:
        for run in result.runs:
            fig, ax = plt.subplots(figsize=(6, 4))
            for name, times in run.step_times.items():
                xs = sorted(t * 1e3 for t in times)
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                        label=name)
            title = f"{result.config.label} @ {run.rate}"
            ax.set(title=f"step time CDF, {title}", xlabel="step time (ms)", ylabel="CDF")
            ax.grid(alpha=0.3)
            ax.legend()
            name = f"cdf-{_slug(title)}.png"
            fig.tight_layout()
            fig.savefig(os.path.join(out_dir, name), dpi=90)
            plt.close(fig)
            md.append(f"![{title}]({name})")
    bars = [(f"{r.config.label}\n{run.rate}", run) for r in results for run in r.runs
            if DEFAULT in run.schedules]
    if bars:
        names = [n for n in results[0].runs[0].schedules if n != DEFAULT]
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(bars)), 4))
        width = 0.8 / max(1, len(names))
        for k, name in enumerate(names):
            ax.bar([i + k * width for i in range(len(bars))],
                   [run.schedules[name].throughput / run.schedules[DEFAULT].throughput
                    if name in run.schedules else 0 for _, run in bars],
                   width, label=name)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(bars))])
        ax.set_xticklabels([b for b, _ in bars], fontsize=7)
        ax.set(ylabel="throughput / TensorFlow default", title="throughput per model")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "throughput.png"), dpi=90)
        plt.close(fig)
        md.append("![throughput per model](throughput.png)")
    return md
