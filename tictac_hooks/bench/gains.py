"""The gains a benchmark run measured, and where they come from.

The schedules the report counts as baselines and as TicTac's; a schedule's throughput
gain over the gate with no order (:func:`same_path_gain`) and over the fastest baseline
(:func:`smallest_gain`); and TicTac's gain split in two at the paced random order
(:func:`decompose`, :func:`decomposition_section`): the gate serving a step's transfers
paced, the workers of a training step one after the other, in an order that knows
nothing of the DAG ("random") is *the service*; TIC/TAC over that is *the order*.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from tictac_hooks.bench.orders import DIRECT as DEFAULT  # TensorFlow's default, twin PS
from tictac_hooks.bench.orders import PASSTHROUGH as SAME_PATH  # the gate with no order
from tictac_hooks.bench.orders import STOCK  # the gate bypassed: the same PS and workers
from tictac_hooks.records import BenchRun, RateRun

BASELINES = (DEFAULT, SAME_PATH, STOCK)
TICTAC = ("tic", "tac")
# The paced random order: the gate's service (pacing, in training the workers of a step
# served one after the other) with an order that knows nothing of the DAG.
RANDOM = "random"
# The peers' orders (graph/algorithms.py PEER_LABELS) and the names a result may hold
# them under (first-use was "layer" before the rename).
PEERS = (("first-use", ("first-use", "layer")), ("declared", ("declared",)))


def fmt(value: Any, spec: str, empty: str = "-") -> str:
    """``value`` formatted by ``spec``, or ``empty`` where it is None."""
    return empty if value is None else format(value, spec)


def same_path_gain(run: RateRun, name: str) -> float | None:
    """Throughput gain (%) of ``name`` over the gate with no order installed, measured in
    the same run: the ordering's own effect, with the gate's cost on both sides (the
    direct baseline runs through a twin PS and other worker tasks)."""
    sched = run.schedules
    if SAME_PATH not in sched or name not in sched or not sched[SAME_PATH].throughput:
        return None
    return 100.0 * (sched[name].throughput / sched[SAME_PATH].throughput - 1.0)


def smallest_gain(run: RateRun, name: str) -> float | None:
    """Throughput gain (%) of ``name`` over the fastest baseline of the run (TensorFlow's
    default through the twin PS, the gate with no order, stock): an odd baseline cannot
    make a gain."""
    sched = run.schedules
    base = [sched[b].throughput for b in BASELINES if b in sched and sched[b].throughput]
    if name not in sched or not base:
        return None
    return 100.0 * (sched[name].throughput / max(base) - 1.0)


def _over(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0)


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """TicTac's throughput gain in one run, split at the paced random order. With
    throughputs T: ``1 + total/100 = (1 + service/100) * (1 + order/100)``."""

    baseline: str           # the fastest baseline (TensorFlow's default, the gate with
                            # no order, stock; :func:`smallest_gain`'s)
    best: str               # the faster of TIC and TAC
    total_pct: float        # T(best) over T(baseline)
    service_pct: float      # T(random, paced) over T(baseline): the gain from the service
    order_pct: float        # T(best) over T(random, paced): the gain from the order
    peers_pct: Mapping[str, float]  # each peer order run (first-use, declared) over
                                    # T(random, paced): what the peers' order buys

    @property
    def service_share(self) -> float | None:
        """The service's share of the total gain, on the scale where the two parts add
        (``ln(1 + service) / ln(1 + total)``); None unless both parts are gains (a
        negative part has no share of a gain)."""
        if self.total_pct <= 0.0 or self.service_pct < 0.0 or self.order_pct < 0.0:
            return None
        return math.log1p(self.service_pct / 100.0) / math.log1p(self.total_pct / 100.0)


def decompose(run: RateRun) -> Decomposition | None:
    """The decomposition of ``run``'s best TIC/TAC gain, or None where the run lacks
    the paced random order, TIC/TAC or a baseline."""
    sched = run.schedules
    through = {n: s.throughput for n, s in sched.items() if s.throughput}
    base = [b for b in BASELINES if b in through]
    tictac = [n for n in TICTAC if n in through]
    if RANDOM not in through or not base or not tictac:
        return None
    baseline = max(base, key=through.get)
    best = max(tictac, key=through.get)
    peers = {}
    for peer, names in PEERS:
        name = next((n for n in names if n in through), None)
        if name is not None:
            peers[peer] = _over(through[name], through[RANDOM])
    return Decomposition(baseline=baseline, best=best,
                         total_pct=_over(through[best], through[baseline]),
                         service_pct=_over(through[RANDOM], through[baseline]),
                         order_pct=_over(through[best], through[RANDOM]), peers_pct=peers)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100.0 * share:.0f} %"


def decomposition_section(results: Sequence[BenchRun]) -> list[str]:
    """A table with a row per run (configuration and link rate) and a line per run:
    TicTac's gain over the fastest baseline, the part the paced random order already
    has (the service) and the rest (the order); the peers' orders over the paced random
    one where they ran. Empty where no run has the paced random order."""
    rows, lines, without = [], [], []
    peers = [p for p, _ in PEERS]
    for result in results:
        for run in result.runs:
            label = f"{result.config.label} @ {run.rate}"
            d = decompose(run)
            if d is None:
                without.append(label)
                continue
            rows.append(f"| {result.config.label} | {run.rate} | {run.comm_comp_ratio:.2f} "
                        f"| {d.baseline} | {d.best} {d.total_pct:+.1f} % "
                        f"| {d.service_pct:+.1f} % | {d.order_pct:+.1f} % "
                        f"| {_pct(d.service_share)} | "
                        + " | ".join(fmt(d.peers_pct.get(p), '+.1f') + (" %" if p in d.peers_pct else "")
                                     for p in peers) + " |")
            share = d.service_share
            lines.append(
                f"- {label}: {d.best.upper()} {d.total_pct:+.1f} % over {d.baseline} = "
                f"{d.service_pct:+.1f} % from the service (the paced random order over "
                f"{d.baseline}) and {d.order_pct:+.1f} % from the order ({d.best.upper()} "
                f"over the paced random order)"
                + (f"; {_pct(share)} of the gain from the service" if share is not None
                   else "")
                + "".join(f"; {p} order {v:+.1f} % over the paced random order"
                          for p, v in d.peers_pct.items()))
    if not rows:
        return []
    out = ["Throughput gains, each over the schedule named: *service* is the paced random "
           f"order ({RANDOM!r}: the gate's pacing and, in training, the workers of a step "
           "served one after the other, in an order that knows nothing of the DAG) over "
           "the fastest baseline; *order* is the faster of TIC/TAC over the paced random "
           "order; (1 + total) = (1 + service) (1 + order); the service's share is "
           "ln(1 + service) / ln(1 + total), where both parts are gains.", "",
           "| config | link | comm/comp | fastest baseline | TIC/TAC over it | service "
           "| order | service's share | "
           + " | ".join(f"{p} over random paced" for p in peers) + " |",
           "|---|---|---|---|---|---|---|---|" + "---|" * len(peers)] + rows + [""]
    out += lines
    if without:
        out.append(f"- without the paced random order, TIC/TAC or a baseline (no "
                   f"decomposition): {', '.join(without)}")
    return out
