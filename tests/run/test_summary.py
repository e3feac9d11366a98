"""run/summary.py: the one RunSummary a run ends with, and its JSON (what
tictac_summary.json and the frontends' ``summary`` hold)."""

from __future__ import annotations

import json

import pytest

from tictac_hooks.run.config import RunConfig
from tictac_hooks.run.settings import Settings
from tictac_hooks.run.summary import ORDER_COUNTS, OrderCounts, RunSummary


def _summary(**kw) -> RunSummary:
    config = RunConfig.build(Settings.resolve(algorithm="tic"), ["127.0.0.1:1"],
                             bandwidth=125e6, worker_addresses={"worker:0": "h:1"})
    base = dict(config=config.fields(), workers={"w0": {"steps": 3}},
                order=OrderCounts.from_counts({"scheduled_steps": 2, "followed": 2}),
                records={"dispatched": 3})
    return RunSummary(**{**base, **kw})


def test_the_json_holds_every_order_count_the_config_and_only_fields_that_are_set():
    data = json.loads(json.dumps(_summary().to_json()))  # JSON all the way down
    assert data["order"] == {**dict.fromkeys(ORDER_COUNTS, 0), "scheduled_steps": 2,
                             "followed": 2}
    assert data["config"]["bandwidth"] == data["config"]["pace_rate"] == 125e6
    assert data["config"]["worker_addresses"] == [["worker:0", "h:1"]]
    assert data["config"]["settings.explicit"] == ["algorithm"]
    assert set(data) == {"workers", "order", "records", "config"}


def test_a_check_and_the_reasons_appear_when_set_and_checks_only_when_several():
    one = {"decision": "tictac", "chosen": "tic"}
    data = _summary(check=one, checks=(one,), not_ordered=None, tac_off="no profile",
                    restored_from="b/tictac_order.json").to_json()
    assert data["check"] == one and "checks" not in data
    assert (data["tac_off"], data["restored_from"]) == ("no profile", "b/tictac_order.json")
    assert "not_ordered" not in data
    assert len(_summary(check=one, checks=(one, one)).to_json()["checks"]) == 2


def test_an_unknown_order_count_is_refused():
    with pytest.raises(ValueError, match="unknown order counts: \\['folowed'\\]"):
        OrderCounts.from_counts({"folowed": 1})
