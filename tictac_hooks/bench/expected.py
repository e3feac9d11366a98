"""The runs against the expected figures (the README's "What to expect"): the gains,
the CV and straggler cuts, E, TicTac's orders against the peers', and the order check's
schedule held to never more than 1 % slower than TensorFlow's default."""

from __future__ import annotations

import statistics
from typing import Iterable, Sequence

from tictac_hooks.bench.gains import BASELINES, DEFAULT, STOCK, TICTAC, smallest_gain
from tictac_hooks.bench.gains import fmt as _fmt
from tictac_hooks.bench.orders import CHECKED  # TicTac's order check, then what it kept
from tictac_hooks.graph.algorithms import peer_label
from tictac_hooks.records import BenchRun, CheckSummary, RateRun

CV_FLOOR = 0.03  # the CV figure is expected only where the default's CV is above this


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
