"""Every figure the README states has its entry in benchmarks/RESULTS.md.

A figure is a number with a unit a claim is made in: a percentage (``+18.1 %``), a
ratio (``1.8x``) or a time in ms (``466-567, 464 ms``), with every number of a range or
list before the unit (``+12.3 to +25.2 %``). It matches when the same number (sign and
thousands separators aside) appears in RESULTS.md. Code blocks are skipped: they show
one run's output, not a claim. The paper's own figures are the one exception.
No TensorFlow; reads two files.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_SIGNED = rf"[+-]?(?:{_NUMBER})"
_SEPARATOR = r"\s*(?:to|-|,|/|and)\s*"
# A run of numbers joined by range / list separators, then its unit.
_FIGURE = re.compile(rf"(?<![\w.])((?:{_SIGNED}{_SEPARATOR})*{_SIGNED})(\s*%|x\b|\s*ms\b)")
_NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUMBER})")

# Hashemi, Jyothi, Campbell, SysML 2019: quoted, not measured here.
PAPER_FIGURES = {(Decimal("37.7"), "%"), (Decimal("19.2"), "%"), (Decimal("2.3"), "x")}


def _value(token: str) -> Decimal:
    return Decimal(token.lstrip("+-").replace(",", "")).normalize()


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced and indented code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith(("    ", "\t")):
            continue
        out.append((number, line))
    return out


def figures(text: str) -> list[tuple[int, str, Decimal, str]]:
    """(line, the figure as written, one of its numbers, unit) for every number of
    every figure in the prose of ``text``."""
    found = []
    for number, line in prose_lines(text):
        for match in _FIGURE.finditer(line):
            unit = match.group(2).strip()
            for token in _NUMBER_RE.findall(match.group(1)):
                found.append((number, match.group(0).strip(), _value(token), unit))
    return found


def numbers_in(text: str) -> set[Decimal]:
    return {_value(token) for token in _NUMBER_RE.findall(text)}


def unmatched(readme: str, results: str) -> list[str]:
    """One message per README figure number that RESULTS.md does not hold."""
    known = numbers_in(results)
    return [f"README.md line {line}: {figure!r} ({value}{unit}) has no entry in "
            f"benchmarks/RESULTS.md"
            for line, figure, value, unit in figures(readme)
            if value not in known and (value, unit) not in PAPER_FIGURES]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return heading.replace(" ", "-")


def broken_results_links(readme: str, results: str) -> list[str]:
    anchors = {_slug(line.lstrip("#")) for line in results.splitlines()
               if line.startswith("#")}
    return [f"README.md links to RESULTS.md#{anchor}, which no heading of RESULTS.md has"
            for anchor in re.findall(r"benchmarks/RESULTS\.md#([\w\-]+)", readme)
            if anchor not in anchors]


def test_every_readme_figure_has_a_results_entry() -> None:
    readme, results = README.read_text(), RESULTS.read_text()
    assert len(figures(readme)) > 50, "the README's figures were not found"
    problems = unmatched(readme, results)
    assert not problems, "\n".join(problems)


def test_every_readme_link_to_results_names_a_section() -> None:
    problems = broken_results_links(README.read_text(), RESULTS.read_text())
    assert not problems, "\n".join(problems)


def test_a_figure_without_evidence_fails() -> None:
    readme, results = README.read_text(), RESULTS.read_text()
    assert "99.7" not in results and "123.4" not in results
    changed = readme + "\nTicTac gives +7.0 to +99.7 % and 123.4 ms steps.\n"
    last = len(changed.splitlines())
    assert unmatched(changed, results) == [
        f"README.md line {last}: '+7.0 to +99.7 %' (99.7%) has no entry in "
        "benchmarks/RESULTS.md",
        f"README.md line {last}: '123.4 ms' (123.4ms) has no entry in "
        "benchmarks/RESULTS.md"]
    # A figure in a code block is output, not a claim; a broken anchor is caught.
    assert unmatched(readme + "\n    +99.7 %\n", results) == []
    assert broken_results_links("[x](benchmarks/RESULTS.md#no-such-section)", results)


def test_figures_read_ranges_lists_and_units() -> None:
    text = ("a +12.3 to +25.2 % gain, 466-567, 464 ms, 0.71-0.79x, 1,350 Mbit/s, "
            "ResNet-50 +16.8 %")
    assert [(str(v), u) for _, _, v, u in figures(text)] == [
        ("12.3", "%"), ("25.2", "%"), ("466", "ms"), ("567", "ms"), ("464", "ms"),
        ("0.71", "x"), ("0.79", "x"), ("16.8", "%")]
