"""run/phases.py: the run's phases and the moves between them."""

from __future__ import annotations

import itertools
import logging

import pytest

from tictac_hooks.run import phases
from tictac_hooks.run.phases import NEXT, Phases


def test_a_run_moves_through_its_phases_and_keeps_the_history():
    clock = itertools.count(100.0, 0.5)
    p = Phases(clock=lambda: next(clock))
    for phase in (phases.SWITCHING, phases.CHECKING, phases.DECIDED, phases.CHECKING,
                  phases.DECIDED, phases.ENDED):
        p.to(phase, "why")
    p.to(phases.ENDED)  # staying put is no move
    data = p.to_json()
    assert [h[0] for h in data["history"]] == ["profiling", "switching", "checking",
                                               "decided", "checking", "decided", "ended"]
    assert data["history"][0] == ["profiling", 0.0, "start"] and data["history"][2][1] == 1.0
    assert data["illegal"] == 0 and p.now == "ended"


def test_a_move_the_table_does_not_allow_is_logged_counted_and_taken(caplog):
    p = Phases()
    p.to(phases.CHECKING, "restored")  # profiling -> checking: a restored order
    with caplog.at_level(logging.ERROR, logger="tictac"):
        p.to(phases.SWITCHING, "a second switch")
    assert p.illegal == 1 and p.now == "switching"
    assert "from checking to switching" in caplog.text
    with pytest.raises(ValueError, match="unknown phase 'done'"):
        p.to("done")


def test_the_table_ends_every_phase_and_nothing_leaves_ended():
    assert all(phases.ENDED in NEXT[p] for p in NEXT if p != phases.ENDED)
    assert NEXT[phases.ENDED] == frozenset()
