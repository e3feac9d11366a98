"""The order kept across a job restart.

A PS's loss restarts a ParameterServerStrategy job, which resumes from its
``BackupAndRestore`` directory (TensorFlow's PS tutorial). TicTac writes its orders
there (else to ``log_dir``) at the switch and after each order-check decision, with a
fingerprint of the step function's DAG and the cluster's shape. A restarted job that
traces the same step function on a cluster of the same shape installs the saved order
at its first step, without profiling, and checks it as usual; a different fingerprint
profiles again. Either way one line says which.

The file (``tictac_order.json``) holds every candidate order the switch computed, each
as its worker DAGs and schedules (the install plan is made from them again), the order
the last decision kept, the coverage measured while profiling, and the compute time
and link rate the switch used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Mapping

from tictac_hooks.run.planner import Parts
from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.schedule import Schedule

FILE = "tictac_order.json"
FORMAT = 1


class SavedOrderError(ValueError):
    """A saved order that cannot be read (the message names the file and what)."""


def _version() -> str:
    """The installed package's version (a source tree not installed: "source")."""
    from importlib import metadata
    try:
        return metadata.version("tictac-hooks")
    except metadata.PackageNotFoundError:
        return "source"


def fingerprint(graphs: Mapping[str, Graph], ps: int, workers: int) -> str:
    """What a saved order is valid for: the traced step function's DAG (every op's
    name, kind, inputs and, for a recv, its PS and bytes: a changed shape or dtype is
    another DAG), the numbers of PS and workers, and the package's version (another
    version may compute another order)."""
    h = hashlib.sha256(json.dumps({"ps": ps, "workers": workers,
                                   "version": _version()}).encode())
    for key in sorted(graphs):
        h.update(key.encode())
        for op in sorted(graphs[key].ops, key=lambda o: o.name):
            h.update(json.dumps([op.name, op.kind, sorted(op.inputs), op.channel,
                                 int(getattr(op, "bytes", 0) or 0)]).encode())
    return h.hexdigest()[:16]


@dataclasses.dataclass
class SavedOrder:
    fingerprint: str
    ps: int
    workers: int
    candidates: dict[str, Parts]     # algorithm -> per worker DAG and its schedule
    kept: str | None                 # the order the last decision kept (None: TF's)
    coverage: dict[str, Any] | None = None  # coverage.Coverage.to_json
    compute_seconds: float | None = None
    link_rate: float | None = None
    saved_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "fingerprint": self.fingerprint, "ps": self.ps,
                "workers": self.workers, "kept": self.kept, "saved_at": self.saved_at,
                "coverage": self.coverage, "compute_seconds": self.compute_seconds,
                "link_rate": self.link_rate,
                "candidates": {a: [{"graph": g.to_json(), "schedule": s.to_json()}
                                   for g, s in parts]
                               for a, parts in self.candidates.items()}}

    @classmethod
    def from_json(cls, d: Any, source: str) -> "SavedOrder":
        try:
            if d.get("format") != FORMAT:
                raise SavedOrderError(f"{source}: format {d.get('format')!r}, this "
                                      f"TicTac reads format {FORMAT}")
            candidates = {
                a: [(Graph.from_json(p["graph"], f"{source}: {a} graph"),
                     Schedule.from_json(p["schedule"], f"{source}: {a} schedule"))
                    for p in parts]
                for a, parts in d["candidates"].items()}
            kept = d["kept"]
            if kept is not None and kept not in candidates:
                raise SavedOrderError(f"{source}: kept order {kept!r} is not among its "
                                      f"candidates {sorted(candidates)}")
            return cls(str(d["fingerprint"]), int(d["ps"]), int(d["workers"]), candidates,
                       kept, d.get("coverage"), d.get("compute_seconds"),
                       d.get("link_rate"), float(d.get("saved_at", 0.0)))
        except SavedOrderError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SavedOrderError(f"{source}: not a saved TicTac order "
                                  f"({type(e).__name__}: {e})") from None


def path_in(directory: str) -> str:
    return os.path.join(directory, FILE)


def save(directory: str, order: SavedOrder) -> str:
    """Writes ``order`` to ``directory`` (made if missing) in one step: a job killed
    while writing leaves the previous file whole. Returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = path_in(directory)
    order = dataclasses.replace(order, saved_at=time.time())
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        json.dump(order.to_json(), f)
    os.replace(partial, path)
    return path


def load(directory: str) -> SavedOrder | None:
    """The order saved in ``directory`` (None: none saved there); SavedOrderError for
    a file that is not one."""
    path = path_in(directory)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SavedOrderError(f"{path}: cannot be read ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SavedOrderError(f"{path}: not JSON ({e})") from None
    return SavedOrder.from_json(data, path)
