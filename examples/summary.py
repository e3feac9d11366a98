"""What every example prints after training: TicTac's summary per worker (step time in
TensorFlow's order and in TicTac's, the order check's decision) and where the logs are;
and the summary as JSON for the tests."""

from __future__ import annotations

import json
import os
from typing import Any


def print_summary(tictac: Any, log_dir: str) -> None:
    """Step time before and after the switch, per worker; where the logs are."""
    c = tictac.controller
    summary = tictac.summary or {}
    chosen = (summary.get("check") or {}).get("chosen")
    kept = f", {chosen.upper()} kept by the order check" if chosen and \
        chosen != c.settings.algorithm else ""
    hook = summary.get("hook") or {}
    switched = f"switched after {c.settings.profile_steps} steps"
    if "switch_in_background_ms" in hook:
        at = hook.get("installed_at_step")
        switched = (f"switch began after {c.settings.profile_steps} steps and took "
                    f"{hook['switch_in_background_ms'] / 1e3:.1f} s while fit went on "
                    "in TensorFlow's order"
                    + ("" if at is not None else "; fit ended before it was in place"))
    if summary.get("restored_from"):
        switched = (f"the order saved by an earlier run restored after "
                    f"{hook.get('restored_at_step')} steps, without profiling")
    transfers = len(c.schedule) if c.schedule else 0
    decision = (summary.get("check") or {}).get("decision")
    if decision == "default":
        ordered = (f"the order of {transfers} transfers was not shown faster than "
                   "TensorFlow's: TensorFlow's order runs")
    else:
        ordered = f"{transfers} transfers scheduled"
    print(f"\nTicTac ({c.settings.algorithm}{kept}): {switched}; {ordered}")
    if c.coverage is not None:
        print(f"  the order lists {c.coverage.phrase()}")
    if summary.get("not_ordered"):
        print(f"  not ordered: {summary['not_ordered']}")
    records = summary.get("records") or {}
    if "worker_steps" in records:
        line = (f"  worker steps recorded: {records['worker_steps']} of "
                f"{records['dispatched']} dispatched (step records read "
                f"{records['read']}, dropped {records['dropped']}; steps missing "
                f"{records['missing']}")
        if records.get("unfinished"):
            line += f", unfinished on a lost worker {records['unfinished']}"
        print(line + ")")
    hook = summary.get("hook") or {}
    if hook.get("steps"):
        print(f"  TicTac's cost per step on the training loop's thread: median "
              f"{hook['median_ms']:.3f} ms, worst {hook['worst_ms']:.2f} ms over "
              f"{hook['steps']} steps"
              + (f"; the switch {hook['switch_worst_ms']:.0f} ms"
                 if "switch_worst_ms" in hook else ""))
    order = summary.get("order", {})
    if order.get("scheduled_steps"):
        print(f"  scheduled steps following the order: {order.get('followed', 0)} of "
              f"{order['scheduled_steps']} (skips {order.get('skips', 0)}, "
              f"violations {order.get('violations', 0)}, transfers the PS let go out of "
              f"their order {order.get('early_released', 0)})")
    check = summary.get("check") or {}
    for worker, s in summary.get("workers", {}).items():
        before = s.get("profiling_median_step_time")
        after = s.get("scheduled_median_step_time")
        from tictac_hooks.run.tensorboard import worker_run_name
        line = f"  {worker_run_name(worker)}: {s['steps']} steps"
        if s.get("missing"):
            line += f" ({s['missing']} more not recorded)"
        if s.get("lost"):
            import time
            line += (f", lost at {time.strftime('%H:%M:%S', time.localtime(s['lost']['detected']))}"
                     f" with {s.get('unfinished', 0)} step unfinished")
        if before:
            line += f"; median step time before {before * 1e3:.1f} ms"
        if after:
            line += f", after {after * 1e3:.1f} ms"
        print(line)
        c = check.get("workers", {}).get(worker)
        if c and c.get("pairs"):
            print(f"    same run, interleaved blocks: TensorFlow's order "
                  f"{c['default_median_step_time'] * 1e3:.1f} ms, TicTac's "
                  f"{c['tictac_median_step_time'] * 1e3:.1f} ms per step: "
                  f"{(c['ratio_median'] - 1) * 100:+.1f} % throughput (median of "
                  f"{c['pairs']} rounds, range {(c['ratio_min'] - 1) * 100:+.1f} to "
                  f"{(c['ratio_max'] - 1) * 100:+.1f} %)")
    if check:
        from tictac_hooks.run.check_runner import verdict_line
        from tictac_hooks.records import CheckResult
        result = CheckResult.from_json(check | {"blocks": {}})
        print(f"  {verdict_line(result, check.get('same_as'))}")
        print(f"  the rule: {check['rule']}")
    print(f"\nTensorBoard: .venv/bin/python -m tensorboard.main --logdir {log_dir}\n"
          f"Transfer timeline (Perfetto / chrome://tracing): "
          f"{os.path.join(log_dir, 'tictac_transfers.trace.json')}")


def write_summary(tictac: Any, path: str | None) -> None:
    if not path:
        return
    c = tictac.controller
    with open(path, "w") as f:
        json.dump((tictac.summary or {}) | {"algorithm": c.settings.algorithm,
                                            "scheduled_transfers": len(c.schedule or ())}, f)
