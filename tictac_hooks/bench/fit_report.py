"""The results of `tictac bench --frontend fit` (bench/fit_mode.py): each order's step
times and ratios to TensorFlow's order from the order check's result, what TicTac with
its own check gives (the kept order in fresh blocks, the check's cost), and the short
table the command prints."""

from __future__ import annotations

import statistics
from typing import Any, Mapping

# The baselines the check measures beside TicTac's own TIC and TAC. TIC and TAC are
# always measured (the callback's own candidates; TAC where its compute profile and
# transfer times exist), TensorFlow's order too (the check's D blocks); ``orders``
# (--schedules) picks the baselines.
# "tf-again": TensorFlow's order as a candidate (algorithm "none"), an A/A check of the
# decision rule
TF_AGAIN = "tf-again"
BASELINES = ("declared", "first-use", "random", TF_AGAIN)
TICTAC_ORDERS = ("tic", "tac")
ORDERS = BASELINES + TICTAC_ORDERS
DEFAULT = "default"
STRAGGLERS = ("do not apply: fit under ParameterServerStrategy trains asynchronously, "
              "each worker runs its own steps and none waits for another")


def label_of(order: str) -> str:
    """What an order stands for (graph/algorithms.py PEER_LABELS; "random" paced as
    TicTac's orders are, "default" TensorFlow's order)."""
    from tictac_hooks.graph.algorithms import PEER_LABELS, canonical_algorithm
    if order == DEFAULT:
        return "TensorFlow's order (no schedule)"
    label = PEER_LABELS.get(canonical_algorithm(order, quiet=True), order)
    return label + (", paced as TicTac's" if order == "random" else "")


def product_choice(check: Any) -> str | None:
    """What TicTac's own check would have kept from ``check`` (a CheckResult whose
    candidates include the bench's baselines): its rule applied to TIC and TAC alone,
    the orders TicTac installs; None: TensorFlow's order."""
    from tictac_hooks.run.order_check import CheckPlan
    values = {c: list(v) for c, v in check.values.items() if c in TICTAC_ORDERS and v}
    if not values:
        return None
    kept, _, _ = CheckPlan(check.rounds, check.block_steps).rule(len(values)).look(values)
    return kept


def check_cost_steps(check: Any) -> float | None:
    """What TicTac's own check costs, in steps of TensorFlow's order: each of TIC and
    TAC runs ``rounds`` blocks of ``block_steps`` steps, each step 1 / ratio of a
    TensorFlow-order step (negative: the check's blocks gained); None where neither
    was measured."""
    spreads = [s for c, s in check.candidates.items()
               if c in TICTAC_ORDERS and s.pairs and s.median]
    if not spreads:
        return None
    return sum(check.rounds * check.block_steps * (1.0 / s.median - 1.0) for s in spreads)


def with_check(check: Any, verify: Any, verify_rounds: int) -> dict[str, Any]:
    """What TicTac with its order check gives, against TensorFlow's order: the decision
    TicTac's check would take on ``check`` (a CheckResult; :func:`product_choice`);
    where it keeps TIC or TAC, that order's ratio to TensorFlow's in the held-out
    blocks (``verify``: the second check, that order alone; None where it did not run)
    per worker and over the workers (median, range, pairs), and whether that check kept
    it; where it keeps TensorFlow's order, TicTac runs TensorFlow's order from then on
    (ratio 1 by construction)."""
    kept = product_choice(check)
    out: dict[str, Any] = {"decision": "tictac" if kept else "default", "kept": kept,
                           "bench_check_kept": check.chosen if check.decision == "tictac"
                           else None, "verify_rounds": verify_rounds,
                           "check_cost_steps": check_cost_steps(check)}
    if kept is None:
        out["note"] = ("TicTac's check (TIC and TAC against TensorFlow's order) keeps "
                       "TensorFlow's order: TicTac runs it from then on, ratio 1 by "
                       "construction")
        return out
    if verify is None:
        out["note"] = "not measured (no held-out check ran)"
        return out
    spread = verify.candidates.get(kept)
    out.update(ratio_median=spread.median if spread else None,
               ratio_min=spread.low if spread else None,
               ratio_max=spread.high if spread else None,
               pairs=spread.pairs if spread else 0,
               kept_after=verify.chosen if verify.decision == "tictac" else None,
               workers=order_results(verify.to_json(), {}).get(kept, {}).get("workers", {}))
    return out


def order_results(check: Mapping[str, Any], off: Mapping[str, str]) -> dict[str, Any]:
    """Per order, per worker (``worker:0``, ...), from an order check's result
    (``CheckResult.to_json()``): the median step time; for each order but TensorFlow's,
    its ratio to TensorFlow's order in each of its block pairs (median, range, pairs) and
    the median of the TensorFlow blocks it was paired with; for TensorFlow's order, the
    median of all its blocks' medians. Orders in ``off`` (label -> why) are listed off."""
    from tictac_hooks.graph.tf.naming import task_of
    from tictac_hooks.records import CHECK
    out: dict[str, Any] = {}
    for label, by_worker in sorted(check.get("candidate_workers", {}).items()):
        workers = {}
        for device, w in sorted(by_worker.items()):
            if not w.get("pairs"):
                continue
            workers[task_of(device) or device] = {
                "median_step_time_s": w["tictac_median_step_time"],
                "default_median_step_time_s": w["default_median_step_time"],
                "pairs": w["pairs"], "ratio_median": w["ratio_median"],
                "ratio_min": w["ratio_min"], "ratio_max": w["ratio_max"]}
        out[label] = {"label": label_of(label), "workers": workers,
                      **check.get("candidates", {}).get(label, {"pairs": 0})}
    default = {}
    for device, blocks in sorted(check.get("blocks", {}).items()):
        medians = [median for phase, median, _ in blocks if phase == CHECK]
        if medians:
            default[task_of(device) or device] = {
                "median_step_time_s": statistics.median(medians), "blocks": len(medians)}
    out[DEFAULT] = {"label": label_of(DEFAULT), "workers": default}
    for alias, same in check.get("same_as", {}).items():  # one order, checked once
        if same in out:
            out[alias] = {**out[same], "label": label_of(alias), "same_as": same}
    for label, why in off.items():
        out.setdefault(label, {"label": label_of(label), "workers": {}, "off": why})
    return out


def text_table(result: Mapping[str, Any]) -> str:
    """A short table: per order and worker, median step time and ratio to TF's order."""
    cfg, net = result["config"], result["network"]
    where = (f"shaped links at {net['rate']}" if net.get("shaped")
             else f"LOOPBACK, not shaped ({net.get('reason')})")
    model = result.get("model", {})
    lines = [f"tictac bench --frontend fit: {model.get('label', cfg['model'])}, "
             f"{cfg['workers']} workers, {cfg['ps']} PS, batch {cfg['batch']}, {where}",
             f"  model compiled with {model.get('compiled_by')}; "
             f"{cfg['rounds']} round(s) of block pairs of {cfg['block_steps']} steps per worker "
             "per order",
             f"  stragglers {result['stragglers']}",
             f"  ratio = TensorFlow's median / the order's median per block pair "
             f"(> 1: faster); range over pairs",
             f"  {'order':<10} {'worker':<9} {'median ms':>9}  ratio (range, pairs)"]
    orders = result["orders"]
    for label in (DEFAULT,) + ORDERS:
        entry = orders.get(label)
        if entry is None:
            continue
        if entry.get("off"):
            lines.append(f"  {label:<10} off: {entry['off']}")
            continue
        for worker, s in entry["workers"].items():
            line = f"  {label:<10} {worker:<9} {s['median_step_time_s'] * 1e3:>9.1f}"
            if "ratio_median" in s:
                line += (f"  {s['ratio_median']:.3f} ({s['ratio_min']:.3f}.."
                         f"{s['ratio_max']:.3f}, {s['pairs']})")
            lines.append(line)
    lines.append("  " + with_check_line(result.get("with_check")))
    return "\n".join(lines)


def with_check_line(w: Mapping[str, Any] | None) -> str:
    """One line: what TicTac with its order check gave (:func:`with_check`)."""
    if not w:
        return "with the order check: not recorded"
    cost = w.get("check_cost_steps")
    cost_text = ("" if cost is None else
                 f"; the check's TIC/TAC blocks cost {cost:+.1f} TensorFlow-order steps")
    if w.get("kept") is None or w.get("ratio_median") is None:
        return (f"with the order check: decision {w.get('decision')}; "
                f"{w.get('note', '')}{cost_text}")
    after = (f"{w['kept_after'].upper()} kept" if w.get("kept_after")
             else "TensorFlow's order kept after it")
    return (f"with the order check: TicTac's check keeps {w['kept'].upper()}; held out, "
            f"{w['pairs']} fresh block pairs: ratio {w['ratio_median']:.3f} "
            f"({w['ratio_min']:.3f}..{w['ratio_max']:.3f}) vs TensorFlow's order; {after}"
            f"{cost_text}")
