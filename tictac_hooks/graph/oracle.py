"""Time oracles: Time(op) for every op of an iteration DAG (docs/ALGORITHMS.md, "TAC").

* :func:`generic_times` -- the timing-independent oracle of TIC (paper Eq. 5).
* :func:`recv_times_from_bandwidth` -- transfer time = latency + bytes / bandwidth.
* :func:`recv_times_from_transfers`, :func:`recv_bytes_from_transfers` -- recv times
  and sizes from transfer records (:class:`TransferRecord`).

Framework-free. The oracles that read TensorFlow's measurements (graph-mode
``step_stats``, the TF2 profiler) are in :mod:`tictac_hooks.graph.tf.profiler`, which
also says why the median is the default statistic.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable, Iterable, Mapping, Sequence

from tictac_hooks.graph.dag import RECV, Graph, GraphError

STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "median": statistics.median,
    "min": min,
    "mean": statistics.fmean,
}


def generic_times(graph: Graph) -> dict[str, float]:
    """Eq. 5: Time(op) = 1 for a recv, 0 for every other op."""
    return {op.name: 1.0 if op.kind == RECV else 0.0 for op in graph.ops}


def recv_times_from_bandwidth(graph: Graph, bytes_per_second: float,
                              latency: float = 0.0) -> dict[str, float]:
    """Time(recv) = latency + bytes / bytes_per_second, for every recv.

    Raises:
      GraphError: a non-positive bandwidth, a negative latency, or a recv whose size
        is unknown (``bytes`` is None).
    """
    if not bytes_per_second > 0:
        raise GraphError(f"bytes_per_second must be > 0, got {bytes_per_second!r}")
    if latency < 0:
        raise GraphError(f"latency must be >= 0 seconds, got {latency!r}")
    unknown = [op.name for op in graph.recvs if op.bytes is None]
    if unknown:
        raise GraphError(f"{len(unknown)} recv(s) have no size, e.g. {unknown[0]!r}: "
                         "give their bytes or time them from transfer records")
    return {op.name: latency + op.bytes / bytes_per_second for op in graph.recvs}


def _reduce(samples: Mapping[str, list[float]], statistic: str) -> dict[str, float]:
    if statistic not in STATISTICS:
        raise GraphError(f"statistic must be one of {sorted(STATISTICS)}, got {statistic!r}")
    fn = STATISTICS[statistic]
    return {name: float(fn(values)) for name, values in samples.items() if values}


@dataclasses.dataclass(frozen=True)
class TransferRecord:
    """One RPC-level transfer: the recv's name (sending node), bytes and seconds, and
    the sending and receiving tasks (``"ps:0"``, ``"worker:0"``) where known.
    Unpacks as ``(name, bytes, seconds)``."""

    name: str
    bytes: int | None
    seconds: float
    source: str | None = None
    destination: str | None = None

    def __iter__(self):
        return iter((self.name, self.bytes, self.seconds))


def recv_times_from_transfers(records: Iterable[Any], statistic: str = "median"
                              ) -> dict[str, float]:
    """Recv time per name from transfer records ``(name, bytes, seconds)``: the median
    (or ``statistic``) over the records of each name."""
    samples: dict[str, list[float]] = {}
    for rec in records:
        try:
            name, _nbytes, seconds = rec
        except (TypeError, ValueError):
            name, seconds = getattr(rec, "name", None), getattr(rec, "seconds", None)
        if not isinstance(name, str) or seconds is None or seconds < 0:
            raise GraphError(f"bad transfer record {rec!r}: expected (name, bytes, seconds)")
        samples.setdefault(name, []).append(float(seconds))
    return _reduce(samples, statistic)


def recv_bytes_from_transfers(records: Iterable[TransferRecord]) -> dict[str, int]:
    """Recv name -> bytes, from transfer records that carry a size."""
    return {r.name: r.bytes for r in records if r.bytes is not None}
