"""Every long-lived structure of a run is bounded, and docs/ALGORITHMS.md ("What a run
keeps") states each bound as the code has it (issue 54)."""

from __future__ import annotations

import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUNDS = [
    ("tictac_hooks.enforce.gate_state", "RECORDS_PER_WORKER"),
    ("tictac_hooks.enforce.gate_state", "DEFAULT_WORKERS"),
    ("tictac_hooks.enforce.gate_state", "LIVE_STEPS_PER_WORKER"),
    ("tictac_hooks.run.steplog", "_KEEP_STEP_TIMES"),
    ("tictac_hooks.run.steplog", "_KEEP_FINALIZED_IDS"),
    ("tictac_hooks.run.steplog", "_KEEP_RECEIVED"),
    ("tictac_hooks.run.steplog", "_KEEP_PROFILED"),
    ("tictac_hooks.run.steplog", "_KEEP_INTERVALS"),
    ("tictac_hooks.run.steplog", "_KEEP_PAUSES"),
    ("tictac_hooks.run.check_runner", "_KEEP_CHECK_RECORDS"),
    ("tictac_hooks.run.check_runner", "_KEEP_PROFILED_TIMES"),
    ("tictac_hooks.run.reading", "TIMELINE_RECORDS"),
    ("tictac_hooks.run.driver", "_KEEP_COSTS"),
]


def _doc() -> str:
    with open(os.path.join(ROOT, "docs", "ALGORITHMS.md"), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("module, name", BOUNDS, ids=[n for _, n in BOUNDS])
def test_the_docs_state_each_bound_as_the_code_has_it(module, name):
    value = getattr(importlib.import_module(module), name)
    lines = [line for line in _doc().splitlines() if f"`{name}` = " in line]
    assert lines, f"docs/ALGORITHMS.md does not state {name}"
    stated = re.search(rf"`{name}` = ([\d,]+)", lines[0]).group(1)
    assert int(stated.replace(",", "")) == value, (name, stated, value)


def test_every_keep_constant_of_the_run_is_listed():
    """A new _KEEP_ bound in run/ must be listed (and so documented)."""
    listed = {n for _, n in BOUNDS}
    found = set()
    for fname in os.listdir(os.path.join(ROOT, "tictac_hooks", "run")):
        if fname.endswith(".py"):
            with open(os.path.join(ROOT, "tictac_hooks", "run", fname), encoding="utf-8") as f:
                found |= set(re.findall(r"^(_KEEP_[A-Z_]+) = ", f.read(), re.M))
    assert found <= listed, sorted(found - listed)
