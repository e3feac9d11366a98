"""The order check's decision rule: a sequential one-sided t test on per-round values.

Each round of the check gives one value per candidate order,
``d = log(median D / median T)``: the median step time of the round's block in
TensorFlow's order (D) over that of the block with the candidate installed (T), every
worker's steps of a block pooled (the workers of one block share one machine state, so
a round, not a worker, is the unit of the sample). ``d > 0``: the candidate is faster.

From round ``min_rounds`` on, after each round, with n values of mean m and standard
error se = s / sqrt(n), for each candidate still in the check:

- keep it when the one-sided lower bound ``m - t(1 - alpha/k, n - 1) se > 0``
  (it is faster than TensorFlow's order, at error rate alpha split over k candidates);
- drop it when the one-sided upper bound ``m + t(1 - beta/k, n - 1) se < log(1 + margin)``
  (it is not ``margin`` faster, at confidence 1 - beta);
- otherwise run another round, up to ``max_rounds``; a candidate neither kept nor
  dropped by then is not kept (nothing showed it faster).

Several candidates kept at one look: the one with the largest mean. The rates this rule
gives on recorded step times (A/A: a candidate that is TensorFlow's own order; +10 %)
are measured by benchmarks/check_error_rates.py and in docs/ALGORITHMS.md, "The order
check".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

ALPHA = 0.01      # keep: one-sided 99 % lower bound above 0
BETA = 0.10       # drop: one-sided 90 % upper bound below log(1 + MARGIN)
MARGIN = 0.03     # the gain below which an order is not worth keeping
MIN_ROUNDS = 3
MAX_ROUNDS = 8

KEEP, DROP, GO_ON = "keep", "drop", "continue"


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer ``df`` >= 1 (the closed form in
    theta = atan(t / sqrt(df)); Abramowitz & Stegun 26.7.3-4)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"t_cdf: df must be an integer >= 1, got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2.4/3.5 cos^4 ...))
        total, term = 0.0, 1.0
        if df > 1:
            total = term = c
            for j in range(1, (df - 3) // 2 + 1):
                term *= c * c * (2 * j) / (2 * j + 1)
                total += term
        a = 2 / math.pi * (theta + s * total)
    else:       # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 ...)
        total = term = 1.0
        for j in range(1, (df - 2) // 2 + 1):
            term *= c * c * (2 * j - 1) / (2 * j)
            total += term
        a = s * total
    return 0.5 + (a / 2 if t >= 0 else -a / 2)


def t_quantile(p: float, df: int) -> float:
    """The t such that P(T <= t) = ``p`` (0.5 < p < 1), by bisection on :func:`t_cdf`."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile: p must be in (0.5, 1), got {p!r}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


@dataclasses.dataclass(frozen=True)
class Bounds:
    """One candidate's standing after n rounds: its mean d, the one-sided bounds (None
    below two rounds) and the verdict (KEEP, DROP or GO_ON)."""

    n: int
    mean: float
    lower: float | None
    upper: float | None
    verdict: str

    @property
    def gain(self) -> float:
        """The mean as a throughput gain: exp(mean) - 1."""
        return math.expm1(self.mean)

    @property
    def gain_lower(self) -> float | None:
        """The lower bound as a gain (the "at least" of the summary)."""
        return None if self.lower is None else math.expm1(self.lower)


@dataclasses.dataclass(frozen=True)
class Rule:
    """The decision rule (module docstring); ``candidates``: k, over which alpha and
    beta are split."""

    alpha: float = ALPHA
    beta: float = BETA
    margin: float = MARGIN
    min_rounds: int = MIN_ROUNDS
    max_rounds: int = MAX_ROUNDS
    candidates: int = 1

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 0.5 and 0 < self.beta < 0.5):
            raise ValueError(f"alpha and beta must be in (0, 0.5), got {self.alpha}, "
                             f"{self.beta}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"need 1 <= min_rounds <= max_rounds, got {self.min_rounds}, "
                             f"{self.max_rounds}")
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {self.candidates}")

    def describe(self) -> str:
        split = f" / {self.candidates}" if self.candidates > 1 else ""
        return (f"one value per round, d = log(median TF-order step / median candidate "
                f"step); from round {self.min_rounds} on keep when the one-sided "
                f"{100 * (1 - self.alpha):g} %{split} lower bound of mean d (t) is above 0, "
                f"drop when the {100 * (1 - self.beta):g} %{split} upper bound is below "
                f"log(1 + {self.margin:g}); at most {self.max_rounds} rounds, then "
                f"TensorFlow's order")

    def bounds(self, values: Sequence[float]) -> Bounds:
        """The standing of one candidate with per-round ``values``."""
        n = len(values)
        if n == 0:
            return Bounds(0, 0.0, None, None, GO_ON)
        mean = math.fsum(values) / n
        if n < 2:
            return Bounds(n, mean, None, None, GO_ON if n < self.max_rounds else DROP)
        var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
        se = math.sqrt(var / n)
        lower = mean - t_quantile(1 - self.alpha / self.candidates, n - 1) * se
        upper = mean + t_quantile(1 - self.beta / self.candidates, n - 1) * se
        if n < self.min_rounds:
            verdict = GO_ON
        elif lower > 0:
            verdict = KEEP
        elif upper < math.log1p(self.margin) or n >= self.max_rounds:
            verdict = DROP
        else:
            verdict = GO_ON
        return Bounds(n, mean, lower, upper, verdict)

    def look(self, values: Mapping[str, Sequence[float]]) -> tuple[str | None, bool,
                                                                     dict[str, Bounds]]:
        """One look after a round: (the kept candidate or None, whether the check is
        over, every candidate's bounds). Over when one is kept or none goes on."""
        standing = {c: self.bounds(v) for c, v in values.items()}
        kept = [c for c, b in standing.items() if b.verdict == KEEP]
        if kept:
            return max(kept, key=lambda c: standing[c].mean), True, standing
        over = all(b.verdict == DROP for b in standing.values())
        return None, over, standing
