"""The report's PNG plots: gain against comm/comp per order for every configuration run
at several ratios (a sweep), measured and simulated; the step-time CDF per schedule of
every run; throughput relative to TensorFlow's default per model. matplotlib is
imported only when they are drawn (the ``bench`` extra, :data:`BENCH_EXTRA`)."""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

from tictac_hooks.bench.accuracy import best_models, prediction_rows
from tictac_hooks.bench.gains import DEFAULT, SAME_PATH, same_path_gain
from tictac_hooks.records import BenchRun, RateRun


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


BENCH_EXTRA = "tictac-hooks[bench]"


def pyplot() -> Any:
    """matplotlib's pyplot (Agg), or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_plots(plt: Any, results: Sequence[BenchRun], out_dir: str) -> list[str]:
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
