"""How much of what the PSes serve an order lists: its coverage, in transfers and in
bytes, per PS, measured from the gates' records of the profiled steps (what the PSes
really served the workers, in TensorFlow's order), never from the traced graph alone.

An order that lists 3 small transfers while two embedding gathers of 3-4 MB pass
unlisted is "followed" in every step and orders 1.8 % of the bytes: the coverage says
so, and names the largest unlisted transfers and why they are unlisted.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

from tictac_hooks.records import GateStep

# Below this share of the served bytes, one warning line names what is not ordered.
WARN_BELOW = 0.95


@dataclasses.dataclass(frozen=True)
class PSCoverage:
    """One PS's share: transfers (distinct names per worker step) and bytes, summed
    over the profiled worker steps at that PS."""

    transfers_listed: int
    transfers: int
    bytes_listed: int
    bytes: int

    @property
    def bytes_share(self) -> float | None:
        return self.bytes_listed / self.bytes if self.bytes else None

    def to_json(self) -> dict[str, Any]:
        return {"transfers_listed": self.transfers_listed, "transfers": self.transfers,
                "bytes_listed": self.bytes_listed, "bytes": self.bytes,
                "bytes_share": self.bytes_share}


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The order's coverage over every PS, per PS, and the largest unlisted transfers
    (name -> median bytes per step), largest first."""

    per_ps: Mapping[str, PSCoverage]
    unlisted: tuple[tuple[str, float], ...]
    steps: int  # profiled worker steps (records) it was measured on

    @property
    def total(self) -> PSCoverage:
        return PSCoverage(*(sum(getattr(c, f) for c in self.per_ps.values())
                            for f in ("transfers_listed", "transfers", "bytes_listed",
                                      "bytes")))

    @property
    def bytes_share(self) -> float | None:
        return self.total.bytes_share

    def to_json(self) -> dict[str, Any]:
        return {**self.total.to_json(), "steps": self.steps,
                "per_ps": {ps: c.to_json() for ps, c in sorted(self.per_ps.items())},
                "largest_unlisted": [{"name": n, "bytes": b} for n, b in self.unlisted]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Coverage":
        """Reads :meth:`to_json` back (an order saved across a restart)."""
        fields = ("transfers_listed", "transfers", "bytes_listed", "bytes")
        return cls({ps: PSCoverage(*(int(c[f]) for f in fields))
                    for ps, c in d["per_ps"].items()},
                   tuple((u["name"], float(u["bytes"])) for u in d["largest_unlisted"]),
                   int(d["steps"]))

    def phrase(self) -> str:
        """E.g. ``100 % of the bytes the PSes served, 14 of 14 transfers``."""
        t = self.total
        if not t.bytes:
            return "no served transfer recorded while profiling"
        per_step = max(self.steps, 1)
        return (f"{100 * t.bytes_listed / t.bytes:.1f} % of the bytes the PSes served "
                f"({_size(t.bytes / per_step)} per worker step), "
                f"{t.transfers_listed / per_step:.0f} of {t.transfers / per_step:.0f} "
                "transfers")


def measure(records: Iterable[GateStep], listed: set[str], largest: int = 3) -> Coverage:
    """Coverage of an order listing ``listed`` over the profiled ``records`` (one per
    PS, worker step; dead loop-exit records left out). A transfer counts as listed when
    its name, or its edge's full tensor name, is in ``listed``."""
    per_ps: dict[str, list[int]] = {}
    unlisted_bytes: dict[str, list[int]] = {}
    steps = set()
    for rec in records:
        if rec.dead or not rec.transfers:
            continue
        steps.add((rec.step_id, rec.iteration, rec.worker))
        acc = per_ps.setdefault(rec.ps, [0, 0, 0, 0])
        for t in rec.transfers:
            if t.error:
                continue
            is_listed = t.name in listed or (t.tensor and t.tensor in listed)
            acc[1] += 1
            acc[3] += t.bytes
            if is_listed:
                acc[0] += 1
                acc[2] += t.bytes
            else:
                unlisted_bytes.setdefault(t.name, []).append(t.bytes)
    n = max(len(steps), 1)
    top = sorted(((name, sum(b) / n) for name, b in unlisted_bytes.items()),
                 key=lambda kv: -kv[1])[:largest]
    return Coverage({ps: PSCoverage(*acc) for ps, acc in per_ps.items()}, tuple(top),
                    len(steps))


def warning(coverage: Coverage, why: Callable[[str], str]) -> str | None:
    """One line when the order lists less than 95 % of the served bytes: the largest
    unlisted transfers and why each is unlisted (``why(name)``); None otherwise."""
    share = coverage.bytes_share
    if share is None or share >= WARN_BELOW:
        return None
    parts = [f"{name} ({_size(b)} per step: {why(name)})" for name, b in coverage.unlisted]
    return (f"the order lists only {100 * share:.1f} % of the bytes the PSes serve; "
            f"largest unlisted: {'; '.join(parts)}")


def _size(nbytes: float) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"
