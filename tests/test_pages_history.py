"""The pages describe the product as it is (issue 56): no history wording in the README,
docs/, benchmarks/RESULTS.md or deploy/ (what changed since an earlier version, what was
superseded, which rule came first); history lives in the git log. Code blocks and
`code spans` are not read (identifiers such as `superseded_steps`, sample output)."""

from __future__ import annotations

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "benchmarks/RESULTS.md", *sorted(
    os.path.relpath(p, ROOT) for pattern in ("docs/*.md", "deploy/*.md")
    for p in glob.glob(os.path.join(ROOT, pattern)))]

HISTORY = re.compile("|".join([
    r"\bsupersed\w*", r"\bpreviously\b", r"\bformerly\b", r"\bno longer\b",
    r"\b(?:is|are) now\b", r"\bnow (?:runs|reads|says|does|keeps|uses)\b",
    r"\bearlier (?:versions?|code|commits?|rules?|sessions?)\b",
    r"\b(?:before|after) (?:the|this) (?:fix|change)\b",
    r"\bthe (?:first|old|previous) (?:order check )?rule\b",
    r"\b(?:was|were|has been|have been) (?:fixed|changed|replaced|renamed|removed)\b",
    r"\bto 20\d\d-\d\d-\d\d\b",
]), re.IGNORECASE)
# a commit named as the start or end of how things were (read with its code span)
SINCE_COMMIT = re.compile(r"\b(?:since|until|before) `[0-9a-f]{7,}`", re.IGNORECASE)


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the page's prose: fenced and indented code blocks left
    out."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            continue
        out.append((n, line))
    return out


def history_lines(text: str) -> list[str]:
    return [f"{n}: {m.group(0)!r} in {line.strip()[:100]}" for n, line in prose(text)
            for m in [HISTORY.search(re.sub(r"`[^`]*`", "``", line))
                      or SINCE_COMMIT.search(line)] if m]


def test_no_page_tells_history():
    found = {}
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            hits = history_lines(f.read())
        if hits:
            found[page] = hits
    assert not found, "history wording in the pages (it belongs in the git log):\n" + \
        "\n".join(f"{p}:{h}" for p, hits in found.items() for h in hits)


def test_the_check_finds_history_and_spares_code_and_identifiers():
    page = ("The rule was changed in May.\nThis order is now the default.\n"
            "Superseded runs are in git.\nMeasured since `24dcfab`.\n"
            "    the gate counts superseded steps\n```\nformerly layer\n```\n"
            "Its totals count `superseded_steps`.\nThe link rate used to pace.\n")
    hits = history_lines(page)
    assert [h.split(":")[0] for h in hits] == ["1", "2", "3", "4"], hits
