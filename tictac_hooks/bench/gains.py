"""The gains a benchmark run measured.

The schedules the report counts as baselines and as TicTac's; a schedule's throughput
gain over the gate with no order (:func:`same_path_gain`) and over the fastest baseline
(:func:`smallest_gain`).
"""

from __future__ import annotations

from typing import Any

from tictac_hooks.bench.orders import DIRECT as DEFAULT  # TensorFlow's default, twin PS
from tictac_hooks.bench.orders import PASSTHROUGH as SAME_PATH  # the gate with no order
from tictac_hooks.bench.orders import STOCK  # the gate bypassed: the same PS and workers
from tictac_hooks.records import RateRun

BASELINES = (DEFAULT, SAME_PATH, STOCK)
TICTAC = ("tic", "tac")


def fmt(value: Any, spec: str, empty: str = "-") -> str:
    """``value`` formatted by ``spec``, or ``empty`` where it is None."""
    return empty if value is None else format(value, spec)


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
