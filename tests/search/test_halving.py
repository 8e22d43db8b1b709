"""Successive halving's rung arithmetic: which epochs are rungs and who is promoted, decided the
same way by whichever worker (or rerun) computes it."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from archhpo.errors import StudyError
from archhpo.search._halving import parse_fraction, promotions, rung_epochs


def test_rungs_are_min_fraction_times_powers_of_eta_up_to_the_full_length() -> None:
    assert rung_epochs(27, 3, Fraction(1, 9)) == [3, 9, 27]
    assert rung_epochs(90, 3, Fraction(1, 9)) == [10, 30, 90]
    assert rung_epochs(100, 2, Fraction(1, 4)) == [25, 50, 100]


def test_every_trial_has_the_same_rungs_a_short_one_scored_again_at_one_epoch() -> None:
    # rung k means the same thing for every trial of a study, so a rung's members are comparable
    assert rung_epochs(4, 3, Fraction(1, 9)) == [1, 1, 4]
    assert rung_epochs(1, 3, Fraction(1, 9)) == [1, 1, 1]
    assert rung_epochs(9, 3, Fraction(1)) == [9]


def test_the_best_one_in_eta_are_promoted_ties_to_the_lower_slot() -> None:
    scores = {4: 0.5, 1: 0.3, 7: 0.3, 2: 0.9, 5: 0.1, 3: 0.3, 6: 0.8, 0: 0.7, 8: 0.6}
    assert promotions(scores, 3) == [1, 3, 5]  # 0.1, then the 0.3 tie by slot: 1 and 3 (not 7)
    assert promotions({3: 0.2, 9: 0.1}, 3) == [9], "at least one goes on"


def test_a_decision_does_not_depend_on_the_order_the_scores_arrived_in() -> None:
    scores = {slot: round(random.Random(slot).random(), 1) for slot in range(30)}
    items = list(scores.items())
    expected = promotions(scores, 3)
    for seed in range(5):
        random.Random(seed).shuffle(items)
        assert promotions(dict(items), 3) == expected
    assert len(expected) == 10


def test_failed_trials_are_never_promoted() -> None:
    assert promotions({0: math.nan, 1: math.inf, 2: 0.4}, 3) == [2]
    assert promotions({0: math.nan, 1: math.nan}, 2) == []


@pytest.mark.parametrize(("text", "value"), [("1/9", Fraction(1, 9)), ("0.25", Fraction(1, 4)), ("1", Fraction(1))])
def test_min_fraction_reads_a_fraction_or_a_decimal(text: str, value: Fraction) -> None:
    assert parse_fraction(text) == value


@pytest.mark.parametrize("text", ["0", "2", "1/0", "a third"])
def test_a_bad_min_fraction_is_one_sentence(text: str) -> None:
    with pytest.raises(StudyError, match="such as 1/9"):
        parse_fraction(text)


def test_eta_below_two_is_refused() -> None:
    with pytest.raises(StudyError, match="at least 2"):
        rung_epochs(27, 1, Fraction(1, 9))
