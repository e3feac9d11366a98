"""The generic, timing-independent oracle of TIC (paper Eq. 5)."""

from __future__ import annotations

from tictac_hooks.graph.dag import RECV, Graph


def generic_times(graph: Graph) -> dict[str, float]:
    """Eq. 5: Time(op) = 1 for a recv, 0 for every other op."""
    return {op.name: 1.0 if op.kind == RECV else 0.0 for op in graph.ops}
