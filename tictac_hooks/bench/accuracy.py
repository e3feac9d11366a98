"""The simulator against the measurement: its step time per order beside the measured
median, the error per model of the untraced compute (bench/predict.py), how well each
model ranks the orders, and the compute it was given."""

from __future__ import annotations

from typing import Any, Sequence

from tictac_hooks.bench import metrics
from tictac_hooks.bench.gains import DEFAULT, SAME_PATH, same_path_gain
from tictac_hooks.bench.gains import fmt as _fmt
from tictac_hooks.records import BenchRun


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
    medians in that run's rounds (bench/orders.py CALIBRATION), against the profiling
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
