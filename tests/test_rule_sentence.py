"""The order check's rule is stated once, in docs/ALGORITHMS.md, from the code's own
constants (run/sequential.py); the other pages that say it in short give the same
numbers (issue #56: it was written three ways). Reads files; no TensorFlow."""

from __future__ import annotations

import math
import re
from pathlib import Path

from tictac_hooks import flags as tictac_flags
from tictac_hooks.run import sequential

ROOT = Path(__file__).resolve().parents[1]


def _paragraph(path: Path, start: str) -> str:
    text = path.read_text()
    i = text.index(start)
    return " ".join(text[i:text.index("\n\n", i)].split())


def test_the_rule_in_algorithms_md_is_the_codes():
    rule = _paragraph(ROOT / "docs" / "ALGORITHMS.md", "**The rule**")
    assert f"from round {sequential.MIN_ROUNDS} on" in rule, rule
    assert f"t(1 - {sequential.ALPHA:g}/k, n-1) se > 0" in rule, rule
    assert f"{100 * (1 - sequential.ALPHA):g} %" in rule, rule
    assert f"t(1 - {sequential.BETA:.2f}/k, n-1) se < log({1 + sequential.MARGIN:g})" in rule
    assert f"not {100 * sequential.MARGIN:g} % faster, at {100 * (1 - sequential.BETA):g} %" \
        in rule, rule
    assert f"`check_rounds` ({sequential.MAX_ROUNDS})" in rule, rule
    assert tictac_flags.DEFAULTS["check_rounds"] == sequential.MAX_ROUNDS


def test_the_short_statements_give_the_same_numbers():
    keep, margin = f"{100 * (1 - sequential.ALPHA):g} %", f"{100 * sequential.MARGIN:g} %"
    rounds = f"{sequential.MIN_ROUNDS}-{sequential.MAX_ROUNDS} rounds"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"one-sided t test over {rounds} shows it faster ({keep})" in readme
    using = _paragraph(ROOT / "docs" / "USING.md", "block median over the candidate's")
    assert f"from round {sequential.MIN_ROUNDS} on" in using and f"({keep}," in using
    assert f"not {margin} faster" in " ".join(using.split()), using
    help_text = " ".join(tictac_flags.flags.FLAGS["tictac_check_rounds"].help.split())
    assert f"({keep}, kept)" in help_text and f"not {margin} faster" in help_text
    assert math.isclose(sequential.MARGIN, 0.03)  # the pages' "3 %" is this constant


def test_no_page_states_a_rule_the_code_left():
    """The median-of-pair-ratios rule (>= 1.05) is gone from the code; no page may give
    it as the rule."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            assert not re.search(r"keeps? .* (?:>=|at least) 1\.05", line), (page, line)
