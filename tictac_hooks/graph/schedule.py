"""A transfer schedule: the recv order an algorithm computed, as priorities.

Priorities are integers in [0, n): a transfer's number is how many transfers must be
handed to the transport before it (paper section 5). Ties are allowed (TIC gives a tie
group the rank of its first member), so a schedule is an ``order`` (every named
transfer, first first) plus the ``priority`` of each.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from tictac_hooks.graph.dag import Graph, GraphError, parse_json, read_text, short_repr


class ScheduleError(ValueError):
    """A malformed schedule, or one that does not fit the graph it is applied to."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Attributes:
      algorithm: what produced it ("tic", "tac", "random", "first-use", "declared", "file", ...).
      order: transfer names, first first.
      priority: transfer name -> priority (non-decreasing along ``order``).
    """

    algorithm: str
    order: tuple[str, ...]
    priority: Mapping[str, int]

    def __post_init__(self) -> None:
        if len(set(self.order)) != len(self.order):
            dup = next(n for n in self.order if self.order.count(n) > 1)
            raise ScheduleError(f"schedule names transfer {dup!r} more than once")
        if set(self.order) != set(self.priority):
            missing = sorted(set(self.order) ^ set(self.priority))[:3]
            raise ScheduleError(
                f"'order' and 'priority' name different transfers, e.g. {missing}")
        n = len(self.order)
        last = -1
        for name in self.order:
            p = self.priority[name]
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < max(n, 1):
                raise ScheduleError(
                    f"priority of {name!r} must be an integer in [0, {n}), got {short_repr(p)}")
            if p < last:
                raise ScheduleError(
                    f"'order' is not sorted by priority at {name!r} ({p} after {last})")
            last = p

    @classmethod
    def from_order(cls, algorithm: str, order: Sequence[str],
                   priority: Mapping[str, int] | None = None) -> "Schedule":
        """Sequential priorities 0..n-1 unless ``priority`` is given."""
        if priority is None:
            priority = {name: i for i, name in enumerate(order)}
        return cls(algorithm, tuple(order), dict(priority))

    def __len__(self) -> int:
        return len(self.order)

    def restricted(self, names: "set[str] | Sequence[str]") -> "Schedule":
        """The schedule of the transfers in ``names`` alone, priorities re-ranked.

        Each PS counts only its own hand-backs (one counter per step and destination),
        so a PS must get the priorities of its transfers renumbered from 0; ties stay
        ties, and a tie group keeps the rank of its first member.
        """
        keep = set(names)
        order = [n for n in self.order if n in keep]
        priority: dict[str, int] = {}
        for rank, name in enumerate(order):
            if rank and self.priority[name] == self.priority[order[rank - 1]]:
                priority[name] = priority[order[rank - 1]]
            else:
                priority[name] = rank
        return Schedule(self.algorithm, tuple(order), priority)

    @classmethod
    def merged(cls, schedules: "Sequence[Schedule]") -> "Schedule":
        """One schedule enforcing each of ``schedules`` for its own destination.

        Used when destinations receive differently named transfers (in-graph
        replication: each tower reads through its own ops). The rendezvous counts per
        destination, so a name keeps the priority it has in its own schedule; a name in
        several keeps the smallest.
        """
        if not schedules:
            raise ScheduleError("nothing to merge")
        priority: dict[str, int] = {}
        first_seen: dict[str, int] = {}
        for s in schedules:
            for name in s.order:
                first_seen.setdefault(name, len(first_seen))
                priority[name] = min(priority.get(name, s.priority[name]), s.priority[name])
        order = sorted(priority, key=lambda n: (priority[n], first_seen[n]))
        algorithms = sorted({s.algorithm for s in schedules})
        return cls("+".join(algorithms), tuple(order), priority)

    def per_channel(self, graph: Graph) -> "dict[str, Schedule]":
        """channel (PS task) -> the restricted schedule that PS enforces."""
        self.check_fits(graph)
        channels: dict[str, list[str]] = {}
        for op in graph.recvs:
            channels.setdefault(op.channel, []).append(op.name)  # type: ignore[arg-type]
        return {ch: self.restricted(names) for ch, names in sorted(channels.items())}

    def check_fits(self, graph: Graph) -> None:
        """Raises ScheduleError unless every scheduled transfer is a recv of ``graph``."""
        recv_names = {op.name for op in graph.recvs}
        extra = [n for n in self.order if n not in recv_names]
        if extra:
            hint = ""
            if extra[0] in graph:
                hint = " (it is a compute op, not a recv)"
            raise ScheduleError(
                f"schedule does not fit the graph: {len(extra)} of {len(self.order)} "
                f"scheduled transfers are not recvs of the graph, e.g. {extra[0]!r}{hint}; "
                "was the schedule computed for another model or graph?")

    def to_json(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "order": list(self.order),
                "priority": dict(self.priority)}

    @classmethod
    def from_json(cls, data: Any, source: str = "schedule") -> "Schedule":
        if not isinstance(data, dict):
            raise ScheduleError(f"{source}: expected a JSON object with 'order'")
        if "order" not in data:
            raise ScheduleError(f"{source}: missing field 'order'")
        order = data["order"]
        if not isinstance(order, list) or not all(isinstance(x, str) for x in order):
            raise ScheduleError(f"{source}: 'order' must be a list of transfer names, "
                                f"got {short_repr(order)}")
        priority = data.get("priority")
        if priority is not None and not isinstance(priority, dict):
            raise ScheduleError(f"{source}: 'priority' must be an object name -> integer, "
                                f"got {short_repr(priority)}")
        algorithm = data.get("algorithm", "file")
        if not isinstance(algorithm, str):
            raise ScheduleError(f"{source}: 'algorithm' must be a string, "
                                f"got {short_repr(algorithm)}")
        try:
            return cls.from_order(algorithm, order, priority)
        except ScheduleError as e:
            raise ScheduleError(f"{source}: {e}") from None

    @classmethod
    def from_tsv(cls, text: str, source: str = "schedule") -> "Schedule":
        """Reads the public TicTac code's priority file: ``name<TAB>priority`` lines."""
        pairs = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 2:
                raise ScheduleError(
                    f"{source}:{lineno}: expected 'name<TAB>priority', got {short_repr(line)}")
            name = parts[0].strip()
            if not name:
                raise ScheduleError(f"{source}:{lineno}: empty transfer name before the tab")
            try:
                pairs.append((name, int(parts[1])))
            except ValueError:  # not a number, or over sys.get_int_max_str_digits() digits
                raise ScheduleError(f"{source}:{lineno}: priority must be an integer, "
                                    f"got {short_repr(parts[1])}") from None
        pairs.sort(key=lambda p: p[1])
        try:
            return cls.from_order("file", [n for n, _ in pairs], dict(pairs))
        except ScheduleError as e:
            raise ScheduleError(f"{source}: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Schedule":
        """Reads a schedule file: the JSON order format, or ``name<TAB>priority`` lines."""
        text = read_text(path, ScheduleError, "schedule file",
                         "order JSON or name<TAB>priority lines")
        if text.lstrip().startswith("{"):
            return cls.from_json(parse_json(text, str(path), ScheduleError), source=str(path))
        return cls.from_tsv(text, source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)


__all__ = ["Schedule", "ScheduleError", "GraphError"]
