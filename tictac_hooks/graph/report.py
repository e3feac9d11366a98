"""`tictac analyze`: bounds, efficiency and simulated gains of TIC and TAC on a model."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from tictac_hooks.graph.algorithms import tac, tic
from tictac_hooks.graph.dag import RECV, Graph
from tictac_hooks.graph.simulate import Bounds, bounds, finite_or_none, simulate


def spread_over_ps(graph: Graph, num_ps: int) -> Graph:
    """Places recvs on ``num_ps`` PS tasks round-robin in graph order, as
    ``replica_device_setter`` places variables by creation order."""
    if num_ps < 1:
        raise ValueError(f"--ps must be >= 1, got {num_ps}")
    ops, k = [], 0
    for op in graph.ops:
        if op.kind == RECV:
            op = dataclasses.replace(op, channel=f"ps:{k % num_ps}")
            k += 1
        ops.append(op)
    return Graph(ops)


@dataclasses.dataclass
class Row:
    name: str
    makespan: float
    efficiency: float
    dependency_efficiency: float
    seconds: float | None = None  # time to compute the order


@dataclasses.dataclass
class AnalyzeReport:
    config: dict[str, Any]
    summary: dict[str, Any]
    bounds: Bounds
    rows: list[Row]

    def gain(self, row: Row) -> float:
        """Throughput gain over the mean random order: m_random / m - 1."""
        return self.rows[0].makespan / row.makespan - 1.0

    def table(self) -> str:
        c, s, b = self.config, self.summary, self.bounds
        mib = (s["param_bytes"] or 0) / 2**20
        lines = [
            f"{c['model']} ({'training' if c['training'] else 'inference'}, batch {c['batch_size']}, "
            f"{c['bandwidth_bytes_per_s'] * 8 / 1e9:g} Gbit/s, {c['ps']} PS)",
            f"  ops {s['ops']}, recvs {s['recvs']}, parameters {mib:.1f} MiB",
            f"  U {b.upper * 1e3:.1f} ms   L {b.lower * 1e3:.1f} ms   "
            f"L* {b.dependency_lower * 1e3:.1f} ms   S {b.speedup:.3f}",
            "",
            f"  {'order':<16}{'makespan ms':>12}{'E':>8}{'E*':>8}{'gain':>9}{'order s':>9}",
        ]
        for row in self.rows:
            secs = "" if row.seconds is None else f"{row.seconds:.3f}"
            lines.append(
                f"  {row.name:<16}{row.makespan * 1e3:>12.2f}{_fmt(row.efficiency):>8}"
                f"{_fmt(row.dependency_efficiency):>8}{self.gain(row) * 100:>8.1f}%{secs:>9}")
        lines.append("")
        lines.append("  E = (U - m) / (U - L) (paper Eq. 4); E* uses the dependency-aware "
                     "bound L*; gain = throughput over the mean random order.")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """As JSON: a figure that is undefined (inf or NaN, e.g. E where U = L) is null."""
        def finite(d: dict[str, Any]) -> dict[str, Any]:
            return {k: finite_or_none(v) if isinstance(v, float) else v for k, v in d.items()}
        return {"config": self.config, "summary": self.summary,
                "bounds": finite(dataclasses.asdict(self.bounds)),
                "rows": [finite(dict(dataclasses.asdict(r), gain=self.gain(r)))
                         for r in self.rows]}


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def analyze_graph(graph: Graph, seeds: int = 10) -> tuple[Bounds, list[Row]]:
    """Random order (mean and worst over ``seeds``), TIC and TAC on a timed graph."""
    b = bounds(graph)
    randoms = [simulate(graph, None, seed=s).makespan for s in range(seeds)]
    rows = []
    for label, m in (("random (mean)", float(np.mean(randoms))), ("random (worst)", max(randoms))):
        rows.append(Row(label, m, b.efficiency(m), b.dependency_efficiency(m)))
    for label, algorithm in (("TIC", tic), ("TAC", tac)):
        t0 = time.perf_counter()
        schedule = algorithm(graph)
        seconds = time.perf_counter() - t0
        m = simulate(graph, schedule).makespan
        rows.append(Row(label, m, b.efficiency(m), b.dependency_efficiency(m), seconds))
    return b, rows
