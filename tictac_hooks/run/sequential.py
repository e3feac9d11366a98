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
import statistics
from typing import Mapping, Sequence

ALPHA = 0.01      # keep: one-sided 99 % lower bound above 0
BETA = 0.10       # drop: one-sided 90 % upper bound below log(1 + MARGIN)
MARGIN = 0.03     # the gain below which an order is not worth keeping
MIN_ROUNDS = 3
MAX_ROUNDS = 8

KEEP, DROP, GO_ON = "keep", "drop", "continue"

# Choosing the block length (check_block_steps 0, "auto"): the shortest block with which
# the rule would keep a true POWER_GAIN with probability POWER_TARGET in max_rounds
# rounds, given the profiled steps' spread, within [MIN_AUTO_BLOCK, MAX_AUTO_BLOCK] and
# so that the longest check costs at most CHECK_SHARE of a recheck period.
POWER_GAIN = 0.10
POWER_TARGET = 0.90
MIN_AUTO_BLOCK = 10
MAX_AUTO_BLOCK = 60
CHECK_SHARE = 0.10


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


def normal_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def round_sd(step_sd: float, block_steps: int) -> float:
    """The spread of one round's value d from the steps' spread ``step_sd`` (of log step
    time) when every step is independent: the median of L steps varies as
    sqrt(pi / 2) step_sd / sqrt(L), and d is the difference of two medians. The
    machine's slower swings between blocks add to it, so this is a lower bound."""
    return step_sd * math.sqrt(math.pi / block_steps)


def power(gain: float, sd: float, rule: Rule) -> float:
    """The probability that ``rule`` keeps a candidate of true ``gain`` by its last
    round, when each round's d has spread ``sd`` (a fixed-sample normal approximation:
    P(mean - t se > 0) with n = max_rounds; the earlier looks add to it, the machine's
    swings between blocks take from it: an estimate)."""
    n = rule.max_rounds
    if n < 2 or sd <= 0:
        return 1.0 if gain > 0 else 0.0
    t = t_quantile(1 - rule.alpha / rule.candidates, n - 1)
    return normal_cdf(math.log1p(gain) * math.sqrt(n) / sd - t)


def block_steps_for(step_sd: float, rule: Rule, recheck_every: int = 0,
                    gain: float = POWER_GAIN, target: float = POWER_TARGET
                    ) -> tuple[int, float, float | None]:
    """The check's block length from the profiled steps' spread: the shortest L in
    [MIN_AUTO_BLOCK, longest] with :func:`power` >= ``target`` for ``gain``, where the
    longest is MAX_AUTO_BLOCK and, with rechecks, the L whose longest check (every
    round, every candidate, both sides) is CHECK_SHARE of ``recheck_every`` steps.
    Returns (L, the power at L, the longest check's share of a recheck period or None
    without rechecks)."""
    if not step_sd >= 0:
        raise ValueError(f"step_sd must be >= 0, got {step_sd!r}")
    per_block = 2 * rule.max_rounds * rule.candidates   # blocks of the longest check
    longest = MAX_AUTO_BLOCK
    if recheck_every:
        longest = min(longest, int(CHECK_SHARE * recheck_every / per_block))
    longest = max(MIN_AUTO_BLOCK, longest)
    block = longest
    for length in range(MIN_AUTO_BLOCK, longest + 1):
        if power(gain, round_sd(step_sd, length), rule) >= target:
            block = length
            break
    share = per_block * block / recheck_every if recheck_every else None
    return block, power(gain, round_sd(step_sd, block), rule), share


def log_spread(step_times: Mapping[str, Sequence[float]]) -> float | None:
    """The spread of log step time within each worker, pooled: 1.4826 x the median
    absolute deviation from each worker's median (robust to the odd stalled step);
    None with fewer than 5 steps in all."""
    deviations: list[float] = []
    for times in step_times.values():
        logs = [math.log(t) for t in times if t > 0]
        if not logs:
            continue
        mid = statistics.median(logs)
        deviations += [abs(v - mid) for v in logs]
    if len(deviations) < 5:
        return None
    return 1.4826 * statistics.median(deviations)
