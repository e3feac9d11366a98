"""Result files on disk: JSON, plain or gzip-compressed (benchmarks/results/ keeps its
results as ``.json.gz``; a fresh run writes ``.json``). Standard library only."""

from __future__ import annotations

import glob
import gzip
import json
import os
from typing import Any

SIMULATOR_INPUTS = ".sim.json.gz"  # beside a result: not a result of its own


def load_json(path: str) -> Any:
    """The JSON at ``path``; a ``.gz`` name, or a ``.json`` that is kept compressed
    (``path`` + ``.gz`` exists and ``path`` does not), is read through gzip."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def json_paths(pattern: str, recursive: bool = False) -> list[str]:
    """The result files a ``*.json`` glob names, compressed ones included (each once:
    ``x.json`` where both it and ``x.json.gz`` exist), simulator inputs left out."""
    found = set(glob.glob(pattern, recursive=recursive))
    if pattern.endswith(".json"):
        found |= {p for p in glob.glob(pattern + ".gz", recursive=recursive)
                  if p[:-3] not in found}
    return sorted(p for p in found if not p.endswith(SIMULATOR_INPUTS))
