"""Keeps benchmarks/results/ small (issue #55: at most 2 MB in git): the results the
documents cite, as compact JSON; raw traces and files that a command regenerates go.

    python3 benchmarks/compact_results.py          # compacts in place, prints the sizes
    python3 benchmarks/compact_results.py --check  # exit 1 if anything would change,
                                                   # or the folder is over the limit

What goes, and how to get it back:

- ``RESULT.sim.json.gz``, the simulator's inputs beside a result (the traced pushes of
  every step): run the result's own command again (its JSON's ``command``) with
  ``--json``; ``tictac bench-report --repredict`` reads them.
- PNG plots no document links to: ``tictac bench-report DIR/*.json --out DIR`` draws
  them (and the report.md beside them) from the JSON; an image line of a kept report
  that named one becomes a note saying so.
- The raw per-order traces of the step-timeline probe (``orders.<order>.traced``):
  ``python3 benchmarks/probe_step_timeline.py`` with the file's ``command``; the
  per-order summaries stay.
- Size: every result ``X.json`` is kept as ``X.json.gz`` (one line, gzip, content
  unchanged); ``tictac_hooks.records.files`` reads either, so every reader of the
  results (``tictac bench-report``, bench_table.py, whatif_validate.py, ...) takes
  ``X.json`` or ``X.json.gz``. Links in the documents are renamed with their files.
  A run's console log ``X.log`` is kept as ``X.log.gz`` (``zcat`` reads it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
LIMIT_BYTES = 2 * 1000 * 1000
DOCUMENTS = ("README.md", "benchmarks/RESULTS.md", "docs")
RAW_KEYS = ("traced",)  # under orders.<name> of the probes' files
PLOT_NOTE = ("(plot not kept in git: `tictac bench-report` on this folder's JSON "
             "draws it; benchmarks/compact_results.py)")


def documents() -> list[str]:
    """The pages that cite results: the README, RESULTS.md and docs/*.md."""
    out = []
    for doc in DOCUMENTS:
        path = os.path.join(ROOT, doc)
        out += ([os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".md")]
                if os.path.isdir(path) else [path])
    return out


def cited_paths() -> set[str]:
    """Every ``results/...`` path the documents name (relative to benchmarks/)."""
    texts = []
    for name in documents():
        with open(name) as f:
            texts.append(f.read())
    return {m.rstrip(".,)") for text in texts
            for m in re.findall(r"results/[A-Za-z0-9_./*-]+", text)}


def plan(results: str | None = None) -> dict[str, list[str]]:
    """What compaction does: {"delete": [...], "compress": [...], "reports": [...]},
    absolute paths."""
    results = results or RESULTS
    cited = cited_paths()
    out: dict[str, list[str]] = {"delete": [], "compress": [], "reports": []}
    for folder, _, names in os.walk(results):
        for name in sorted(names):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, HERE)
            if name.endswith(".sim.json.gz"):
                out["delete"].append(path)
            elif name.endswith(".png") and rel not in cited:
                out["delete"].append(path)
            elif name.endswith((".json", ".log")):
                out["compress"].append(path)
    deleted = {os.path.basename(p) for p in out["delete"] if p.endswith(".png")}
    for folder, _, names in os.walk(results):
        for name in names:
            if name.endswith(".md"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    if _strip_images(f.read(), deleted, folder)[1]:
                        out["reports"].append(path)
    return out


def _compact(data: object) -> str:
    if isinstance(data, dict) and isinstance(data.get("orders"), dict):
        for order in data["orders"].values():
            if isinstance(order, dict):
                for key in RAW_KEYS:
                    order.pop(key, None)
    return json.dumps(data, separators=(",", ":")) + "\n"


def _strip_images(text: str, deleted: set[str], folder: str) -> tuple[str, int]:
    """``text`` with each image line naming a deleted PNG (that is not on disk) turned
    into one note; the number changed."""
    changed = 0

    def note(m: re.Match) -> str:
        nonlocal changed
        target = m.group(1)
        if os.path.basename(target) in deleted or not os.path.exists(
                os.path.join(folder, target)):
            changed += 1
            return PLOT_NOTE
        return m.group(0)
    text = re.sub(r"!\[[^\]]*\]\(([^)]+\.png)\)", note, text)
    return text, changed


def apply(steps: dict[str, list[str]]) -> None:
    deleted = {os.path.basename(p) for p in steps["delete"]}
    for path in steps["delete"]:
        os.remove(path)
    for path in steps["compress"]:
        with open(path, "rb") as f:
            content = f.read()
        if path.endswith(".json"):
            content = _compact(json.loads(content)).encode()
        # mtime 0: the same content gives the same bytes (git sees no change)
        with open(path + ".gz", "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write(content)
        os.remove(path)
    renamed = {os.path.relpath(p, HERE): os.path.relpath(p, HERE) + ".gz"
               for p in steps["compress"]}
    _rename_links(renamed)
    for path in steps["reports"]:
        with open(path) as f:
            text, _ = _strip_images(f.read(), deleted, os.path.dirname(path))
        with open(path, "w") as f:
            f.write(text)


def _rename_links(renamed: dict[str, str]) -> None:
    """Links and read globs in the documents follow their files to ``.json.gz``."""
    if not renamed:
        return
    for name in documents():
        with open(name) as f:
            text = f.read()
        new = re.sub(r"(results/[A-Za-z0-9_./-]+\.(?:json|log))(?=\))",
                     lambda m: m.group(1) + ".gz" if m.group(1) in renamed else m.group(1),
                     text)
        if new != text:
            with open(name, "w") as f:
                f.write(new)


def size(results: str | None = None) -> int:
    results = results or RESULTS
    return sum(os.path.getsize(os.path.join(folder, n))
               for folder, _, names in os.walk(results) for n in names)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if compaction would, or if over the limit")
    args = p.parse_args(argv)
    before = size()
    steps = plan()
    counts = ", ".join(f"{len(v)} to {k}" for k, v in steps.items())
    if args.check:
        over = before > LIMIT_BYTES
        print(f"benchmarks/results: {before / 1e6:.2f} MB (limit {LIMIT_BYTES / 1e6:.0f} MB"
              f"{', OVER' if over else ''}); {counts}")
        return 1 if over or any(steps.values()) else 0
    apply(steps)
    print(f"benchmarks/results: {before / 1e6:.2f} MB -> {size() / 1e6:.2f} MB ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
