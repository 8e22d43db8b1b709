"""Rungs only where trusted (--ladder): a rung's agreement with full-length results is measured at
the smallest budget (pairwise, ties within seed noise, a bootstrap interval over architectures), a
larger budget prunes only at rungs whose interval clears the threshold, and its cuts keep the
scores tied within noise with the worst promoted one."""

from __future__ import annotations

import math

import pytest

from archhpo.search._halving import promotions
from archhpo.search._trust import (
    EVERY_RUNG,
    N_BOOT,
    TRUST_THRESHOLD,
    ArchRuns,
    RungTrust,
    pairwise_agreement,
    rung_trust,
    seed_noise,
    soft_promotions,
    spearman,
)


def _arch(i: int, rungs: list[float], finals: list[float]) -> ArchRuns:
    """An architecture whose every trial scored `rungs` (one per rung) and ended at one of `finals`."""
    return ArchRuns((i,), [list(rungs) for _ in finals], list(finals))


def test_seed_noise_pools_the_within_architecture_spread_of_the_finals() -> None:
    archs = [_arch(0, [], [1.0, 3.0]), _arch(1, [], [2.0, 2.0, 5.0]), _arch(2, [], [7.0])]
    # squares: (1-2)^2 + (3-2)^2 = 2 and 1 + 1 + 4 = 6 over 1 + 2 degrees of freedom
    assert seed_noise(archs) == pytest.approx(math.sqrt(8 / 3))
    assert math.isnan(seed_noise([_arch(0, [], [1.0]), _arch(1, [], [2.0])])), "no architecture trained twice"


def test_agreement_is_one_for_the_right_order_and_zero_for_the_reversed() -> None:
    finals = [1.0, 2.0, 3.0, 4.0]
    assert pairwise_agreement([10.0, 20.0, 30.0, 40.0], finals, 0.1) == 1.0
    assert pairwise_agreement([40.0, 30.0, 20.0, 10.0], finals, 0.1) == 0.0
    assert pairwise_agreement([10.0, 30.0, 20.0, 40.0], finals, 0.1) == 5 / 6, "one pair of six swapped"


def test_rung_scores_within_noise_are_half_right_and_finals_within_noise_say_nothing() -> None:
    # rung: 1.0 and 1.05 tie (noise 0.1): half; the other two pairs agree
    assert pairwise_agreement([1.0, 1.05, 2.0], [1.0, 2.0, 3.0], 0.1) == (0.5 + 1 + 1) / 3
    # finals 1.0 and 1.05 are indistinguishable: only the two pairs with the third count, both reversed
    assert pairwise_agreement([3.0, 2.0, 1.0], [1.0, 1.05, 2.0], 0.1) == 0.0
    assert math.isnan(pairwise_agreement([1.0, 2.0], [1.0, 1.05], 0.1)), "no distinguishable pair"
    assert pairwise_agreement([1.0, 1.0, 2.0], [1.0, 2.0, 3.0], math.nan) == (0.5 + 1 + 1) / 3, "nan: exact ties"
    assert pairwise_agreement([1.0, math.nan, 2.0], [1.0, 2.0, 3.0], 0.0) == 1.0, "a missing score is left out"


def test_spearman_for_the_record() -> None:
    assert spearman([1.0, 2.0, 3.0], [2.0, 4.0, 9.0]) == pytest.approx(1.0)
    assert spearman([3.0, 2.0, 1.0], [2.0, 4.0, 9.0]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1.0, 2.0], [1.0, 2.0]))


def _ladder_archs(order: list[int], n: int = 8) -> list[ArchRuns]:
    """n architectures 0.1 apart at full length (two seeds 0.01 apart); rung 0 in the right order,
    rung 1 in `order`'s (a permutation of 0..n-1 giving each one's rung-1 rank)."""
    return [ArchRuns((i,), [[1.0 + 0.1 * i, 5.0 + 0.1 * order[i]], [1.0 + 0.1 * i, 5.0 + 0.1 * order[i]]],
                     [2.0 + 0.1 * i, 2.01 + 0.1 * i]) for i in range(n)]


def test_a_rung_is_trusted_when_its_intervals_low_end_clears_the_threshold() -> None:
    archs = _ladder_archs(order=[7, 6, 5, 4, 3, 2, 1, 0])
    record = rung_trust(archs)
    assert (record["measure"], record["threshold"], record["n_archs"]) == ("pairwise agreement", TRUST_THRESHOLD, 8)
    assert record["noise"] == pytest.approx(0.01 / math.sqrt(2)), "two seeds 0.01 apart: a std of 0.01/sqrt 2"
    right, reversed_ = record["rungs"]
    assert (right["rung"], right["agreement"], right["low"], right["high"], right["trusted"]) == (0, 1.0, 1.0, 1.0, True)
    assert (reversed_["agreement"], reversed_["high"], reversed_["trusted"]) == (0.0, 0.0, False)
    assert right["spearman"] == pytest.approx(1.0) and reversed_["spearman"] == pytest.approx(-1.0)
    assert record["trusted"] == [0] and "reason" not in record


def test_the_interval_is_deterministic_for_a_seed_and_holds_the_point_estimate() -> None:
    archs = _ladder_archs(order=[1, 0, 2, 3, 5, 4, 6, 7])  # two swapped pairs: agreement 26/28
    a, b, c = rung_trust(archs, seed=3), rung_trust(archs, seed=3), rung_trust(archs, seed=4)
    assert a == b and a != c
    shaky = a["rungs"][1]
    assert shaky["agreement"] == pytest.approx(26 / 28)
    assert shaky["low"] < shaky["agreement"] <= shaky["high"] == 1.0
    # the same rung at a threshold just below and just above its interval's low end
    assert rung_trust(archs, threshold=shaky["low"], seed=3)["trusted"] == [0, 1]
    assert rung_trust(archs, threshold=shaky["low"] + 1e-9, seed=3)["trusted"] == [0]
    assert N_BOOT == a["n_boot"] == 1000


def test_too_few_architectures_or_none_distinguishable_trusts_nothing_with_a_reason() -> None:
    two = rung_trust(_ladder_archs(order=[0, 1], n=2))
    assert two["trusted"] == [] and two["rungs"] == [] and "at least 3" in two["reason"]
    same = [_arch(i, [1.0 + i, 2.0], [3.0, 3.01]) for i in range(4)]  # all finals within noise
    record = rung_trust(same)
    assert record["trusted"] == [] and "distinguishable" in record["reason"]
    assert [r["agreement"] for r in record["rungs"]] == [None, None], "JSON: no NaN"


def test_soft_promotions_keep_a_tie_at_the_cut_and_are_promotions_without_noise() -> None:
    scores = {0: 1.0, 1: 2.0, 2: 2.05, 3: 3.0, 4: 2.2, 5: math.inf}
    assert promotions(scores, 3) == [0, 1]
    assert soft_promotions(scores, 3, 0.1) == [0, 1, 2], "2.05 is within 0.1 of the worst promoted 2.0"
    assert soft_promotions(scores, 3, 0.3) == [0, 1, 2, 4], "never the failed slot"
    for noise in (0.0, math.nan):
        assert soft_promotions(scores, 3, noise) == promotions(scores, 3)
    assert soft_promotions({0: math.inf}, 3, 0.5) == []


def test_a_study_judges_every_rung_off_the_ladder_and_only_the_trusted_on_it() -> None:
    assert EVERY_RUNG.judges(0) and EVERY_RUNG.judges(5) and EVERY_RUNG.noise == 0.0
    assert RungTrust.from_record(None) == RungTrust(frozenset(), 0.0), "no record: nothing judged"
    assert not RungTrust.from_record({"from": "x"}).judges_any, "a record from before trust"
    trust = RungTrust.from_record({"trust": rung_trust(_ladder_archs(order=[7, 6, 5, 4, 3, 2, 1, 0]))})
    assert trust.judges(0) and not trust.judges(1) and trust.noise == pytest.approx(0.01 / math.sqrt(2))
    assert trust.ties([0], {0: 1.0, 1: 1.004, 2: 1.2}) == [0, 1]
