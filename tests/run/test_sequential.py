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



def test_a_rounds_spread_is_the_difference_of_two_block_medians():
    """round_sd against simulation: d = log median of L steps - log median of L others,
    each log step time normal with spread s, within 8 % at L = 10 to 40."""
    import random
    import statistics
    rng = random.Random(3)
    for length in (10, 20, 40):
        ds = []
        for _ in range(3000):
            a = statistics.median(rng.gauss(0, 0.2) for _ in range(length))
            b = statistics.median(rng.gauss(0, 0.2) for _ in range(length))
            ds.append(a - b)
        assert statistics.stdev(ds) == pytest.approx(sequential.round_sd(0.2, length),
                                                     rel=0.08), length


def test_the_block_is_the_shortest_with_the_power_within_its_bounds():
    rule = sequential.Rule()
    powers = [sequential.power(0.10, sequential.round_sd(0.2, n), rule) for n in (10, 20, 40)]
    assert powers == sorted(powers) and powers[0] < 0.9 < powers[-1]
    block, power, share = sequential.block_steps_for(0.2, rule, recheck_every=0)
    assert 20 < block < 60 and power >= 0.9 and share is None
    assert sequential.power(0.10, sequential.round_sd(0.2, block - 1), rule) < 0.9
    # a steady machine: the minimum; a noisy one: the cap, and the power it has
    assert sequential.block_steps_for(0.01, rule)[0] == sequential.MIN_AUTO_BLOCK
    capped, p, share = sequential.block_steps_for(0.5, rule, recheck_every=5000)
    assert capped == int(0.10 * 5000 / 16) == 31 and p < 0.9 and share <= 0.10
    # the simulated rule keeps a true +10 % at least as often as the bound says
    kept, _ = _simulate(rule, 0.10, sequential.round_sd(0.2, block), 2000, seed=4)
    assert kept >= 0.9 - 0.03, kept
    with pytest.raises(ValueError):
        sequential.block_steps_for(float("nan"), rule)


def test_the_spread_is_robust_to_a_stalled_step_and_needs_five_steps():
    steady = {"w0": [0.1, 0.11, 0.1, 0.09, 0.1, 0.105, 0.095] * 3}
    stalled = {"w0": steady["w0"] + [5.0]}
    a, b = sequential.log_spread(steady), sequential.log_spread(stalled)
    assert a == pytest.approx(b, rel=0.25) and a < 0.1
    # each worker around its own median: a slower worker adds no spread
    assert sequential.log_spread({"w0": steady["w0"], "w1": [3 * t for t in steady["w0"]]}) \
        == pytest.approx(a)
    assert sequential.log_spread({"w0": [0.1] * 4}) is None
