"""Step records and block windows of an order check, built from a list of blocks as the
PS labels their steps (tests of the order check, its results and the fit bench)."""

from __future__ import annotations

from typing import Mapping, Sequence

from tictac_hooks.run.order_check import Window
from tictac_hooks.records import CHECK, SCHEDULED, WorkerStep


def build(blocks: Sequence[tuple[int, str, bool, Mapping[str, Sequence[float]]]],
          straddle: float = 9.0) -> tuple[list[WorkerStep], list[Window]]:
    """``blocks``: (round, candidate, T?, worker -> step times) in time order. Each
    worker's block opens with a step of ``straddle`` seconds (its first in the window,
    never measured); blocks are 1 s apart (the install between them)."""
    records: list[WorkerStep] = []
    windows: list[Window] = []
    index: dict[str, int] = {}
    t = 0.0
    for round_, candidate, tictac, times in blocks:
        start, end = t, t
        for worker, xs in times.items():
            clock = start
            for x in [straddle, *xs]:
                i = index.get(worker, 0)
                records.append(WorkerStep(worker, i, clock + 1e-6, x, 0.0,
                                          SCHEDULED if tictac else CHECK,
                                          order=candidate if tictac else None))
                index[worker] = i + 1
                clock += x
            end = max(end, clock)
        windows.append(Window(round_, candidate, tictac, start, end))
        t = end + 1.0
    return records, windows
