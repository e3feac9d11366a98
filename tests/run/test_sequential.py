"""The order check's decision rule (run/sequential.py): Student's t quantiles, the
verdicts at each look, and its error rates on independent rounds."""

import math
import random

import pytest

from tictac_hooks.run import sequential
from tictac_hooks.run.sequential import DROP, GO_ON, KEEP, Rule, t_cdf, t_quantile


@pytest.mark.parametrize("p,df,table", [
    (0.99, 2, 6.965), (0.99, 7, 2.998), (0.90, 2, 1.886), (0.90, 7, 1.415),
    (0.995, 3, 5.841), (0.95, 1, 6.314), (0.975, 10, 2.228), (0.95, 30, 1.697)])
def test_t_quantiles_match_the_printed_table(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=5e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)
    assert t_cdf(-t_quantile(p, df), df) == pytest.approx(1 - p, abs=1e-9)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="df"):
        t_cdf(1.0, 0)
    with pytest.raises(ValueError, match="p must be"):
        t_quantile(0.3, 4)
    with pytest.raises(ValueError, match="min_rounds"):
        Rule(min_rounds=4, max_rounds=3)
    with pytest.raises(ValueError, match="alpha"):
        Rule(alpha=0.7)


def test_verdicts_keep_drop_and_go_on():
    rule = Rule()
    assert rule.bounds([0.10, 0.11]).verdict == GO_ON          # before round 3
    steady = rule.bounds([0.10, 0.11, 0.09])
    assert steady.verdict == KEEP and 0 < steady.lower < steady.mean < steady.upper
    assert steady.gain == pytest.approx(math.expm1(0.10))
    assert rule.bounds([-0.05, -0.04, -0.06]).verdict == DROP  # slower
    assert rule.bounds([0.0, 0.005, -0.005]).verdict == DROP   # not 3 % faster
    noisy = [0.2, -0.15, 0.1]
    assert rule.bounds(noisy).verdict == GO_ON
    assert rule.bounds((noisy * 3)[:8]).verdict == DROP        # round 8: not shown
    kept, over, standing = rule.look({"tic": [0.05, 0.06, 0.05], "tac": [0.1, 0.11, 0.1]})
    assert kept == "tac" and over and standing["tic"].verdict == KEEP
    kept, over, _ = rule.look({"tic": [0.2, -0.15, 0.1], "tac": [-0.1, -0.1, -0.11]})
    assert kept is None and not over


def test_the_split_over_candidates_widens_the_bound():
    one, two = Rule(candidates=1), Rule(candidates=2)
    values = [0.05, 0.08, 0.03, 0.06]
    assert two.bounds(values).lower < one.bounds(values).lower


def _simulate(rule: Rule, gain: float, sd: float, runs: int, seed: int) -> tuple[float, float]:
    """Kept share and mean rounds over ``runs`` checks whose rounds are independent
    normal values of mean log(1 + gain) and standard deviation ``sd``."""
    rng = random.Random(seed)
    kept = rounds = 0
    for _ in range(runs):
        values = []
        while True:
            values.append(rng.gauss(math.log1p(gain), sd))
            b = rule.bounds(values)
            if b.verdict != GO_ON:
                kept += b.verdict == KEEP
                rounds += len(values)
                break
    return kept / runs, rounds / runs


def test_error_rates_on_independent_rounds():
    """With rounds independent (ABBA balances the drift), an order no faster than
    TensorFlow's is kept in at most 5 % of checks (alpha 1 % per look, six looks), and
    a true +10 % gain is kept in at least 90 % where a round's value varies by 4 %."""
    rule = Rule()
    aa, _ = _simulate(rule, 0.0, 0.04, 2000, seed=1)
    assert aa <= 0.05, aa
    plus10, rounds = _simulate(rule, 0.10, 0.04, 2000, seed=2)
    assert plus10 >= 0.90 and rounds < 5, (plus10, rounds)
    assert sequential.MAX_ROUNDS == rule.max_rounds == 8
