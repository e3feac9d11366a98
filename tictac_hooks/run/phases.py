"""The phases of a run, as one small state machine (docs/LAYOUT.md draws it).

    profiling -> switching -> checking -> decided -> (checking again, every
    recheck_every steps) ... -> ended

with the shortcuts a run takes: an order restored after a restart goes from profiling
straight to checking (or decided, when the saved decision was TensorFlow's order); a
switch that fails, or a run without an order check, is decided at once. Training may
end in any phase. The :class:`Controller` moves it (nothing else does), under one lock;
the summary carries its history. A move the table does not allow is a bug: it is
logged, counted (``illegal``) and taken anyway, since it must never stop training; the
tests hold ``illegal`` at 0 on every frontend.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("tictac")

PROFILING, SWITCHING, CHECKING, DECIDED, ENDED = (
    "profiling", "switching", "checking", "decided", "ended")

# phase -> the phases it may move to
NEXT: dict[str, frozenset[str]] = {
    PROFILING: frozenset({SWITCHING, CHECKING, DECIDED, ENDED}),
    SWITCHING: frozenset({CHECKING, DECIDED, ENDED}),
    CHECKING: frozenset({DECIDED, ENDED}),
    DECIDED: frozenset({CHECKING, ENDED}),
    ENDED: frozenset(),
}


class Phases:
    """Where a run is, and how it got there: ``history`` holds (phase, wall time,
    why) for every move, the first being profiling at the run's start."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.history: list[tuple[str, float, str]] = [(PROFILING, clock(), "start")]
        self.illegal = 0

    @property
    def now(self) -> str:
        return self.history[-1][0]

    def to(self, phase: str, why: str = "") -> None:
        """Moves to ``phase`` (staying put is no move)."""
        if phase not in NEXT:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(NEXT)}")
        with self._lock:
            here = self.history[-1][0]
            if phase == here:
                return
            if phase not in NEXT[here]:
                self.illegal += 1
                log.error("TicTac: the run moved from %s to %s (%s), which its phases do "
                          "not allow; please report it", here, phase, why)
            self.history.append((phase, self._clock(), why))

    def to_json(self) -> dict:
        t0 = self.history[0][1]
        return {"history": [[p, round(t - t0, 3), why] for p, t, why in self.history],
                "illegal": self.illegal}
