"""The ladder's learning-rate exponent (search/_lrfit.py): fitted on the ladder's own smaller budgets
when at least three give a narrow, plausible interval, else Step Law's prior for the study's data
regime; each budget's best rate from a convex parabola's vertex within the rates tried, else its
best trial's."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pytest
from scipy import stats

from archhpo.search._lrfit import (
    PRIOR_DATA_GROWS,
    PRIOR_FIXED_DATA,
    BestRate,
    LrFit,
    at_width,
    best_rate,
    budget_rates,
    carried_rate,
    fit_lr_exponent,
    locate_rate,
    prior_exponent,
)

N = (100_000, 200_000, 400_000, 800_000)


def _budget(n: int, lr: float) -> tuple[int, list[tuple[float, float]]]:
    """One budget that located its best rate `lr`: one architecture at 4 rates around it, on a
    parabola in log lr whose vertex is `lr`."""
    return n, [(lr * f, 1.0 + math.log(f) ** 2) for f in (0.25, 0.5, 2.0, 4.0)]


def _flat(rates: Sequence[tuple[int, float]]) -> list[float]:
    return [v for pair in rates for v in pair]


def _best_trial(n: int, lr: float) -> tuple[int, list[tuple[float, float]]]:
    """One budget whose best trial (value 1.0) used `lr`; a worse one used ten times it: too few
    rates to locate the best one."""
    return n, [(lr, 1.0), (10 * lr, 2.0)]


def test_the_prior_is_step_laws_exponent_of_n_in_the_studys_data_regime() -> None:
    assert PRIOR_DATA_GROWS == pytest.approx(-0.406, abs=1e-12) and PRIOR_FIXED_DATA == -0.713
    assert prior_exponent(True) == PRIOR_DATA_GROWS and prior_exponent(False) == PRIOR_FIXED_DATA


def test_the_exact_slope_is_recovered_from_three_budgets() -> None:
    fit = fit_lr_exponent([_budget(n, 0.3 * n**-0.5) for n in N[:3]], data_grows=True)
    assert fit.source == "fitted" and fit.n_budgets == 3
    assert fit.exponent == pytest.approx(-0.5, abs=1e-9) and fit.slope == fit.exponent
    assert fit.low == pytest.approx(-0.5, abs=1e-6) and fit.high == pytest.approx(-0.5, abs=1e-6)
    assert fit.describe().startswith("N^-0.500 (fitted on 3 budgets, 90% interval -0.500 to -0.500)")


def test_two_budgets_fit_exactly_but_without_an_interval_so_the_prior_is_used() -> None:
    fit = fit_lr_exponent([_budget(n, 0.3 * n**-0.5) for n in N[:2]], data_grows=False)
    assert (fit.exponent, fit.low, fit.high, fit.n_budgets, fit.source) == (PRIOR_FIXED_DATA, None, None, 2, "prior")
    assert fit.slope == pytest.approx(-0.5, abs=1e-9)
    assert fit.reason == "2 budgets fit b = -0.500 exactly, with no interval; Step Law with fixed data"
    assert fit.describe() == f"N^-0.713 (prior: {fit.reason})"


def test_one_budget_or_none_with_trials_is_the_prior() -> None:
    fit = fit_lr_exponent([_budget(N[0], 1e-3), (N[1], [])], data_grows=True)
    assert (fit.exponent, fit.n_budgets, fit.source, fit.slope) == (PRIOR_DATA_GROWS, 1, "prior", None)
    assert fit.reason == "1 budget to fit, Step Law with data growing with N"
    assert fit_lr_exponent([], data_grows=False).reason == "0 budgets to fit, Step Law with fixed data"


def test_budgets_that_did_not_locate_their_best_rate_place_the_line_but_do_not_fit_its_slope() -> None:
    """T1's learning-rate run: a located 100K, and a 200K and 400K whose best rates were one trial's
    (rising slightly by which architecture was sampled where) fitted N^+0.064 on a narrow interval.
    Such budgets are not evidence of a slope: the prior is used and the slope is only recorded."""
    rates = ((100_000, 4.287e-3), (200_000, 4.523e-3), (400_000, 4.681e-3))  # the run's, at d_model 128
    slope = float(np.polyfit(np.log([n for n, _ in rates]), np.log([lr for _, lr in rates]), 1)[0])
    budgets = [_budget(*rates[0]), _best_trial(*rates[1]), _best_trial(*rates[2])]
    fit = fit_lr_exponent(budgets, data_grows=True)
    assert (fit.source, fit.exponent, fit.n_budgets) == ("prior", PRIOR_DATA_GROWS, 3)
    assert fit.slope == pytest.approx(slope, rel=1e-6) and 0.06 < slope < 0.07
    x, y = np.log([n for n, _ in rates]), np.log([lr for _, lr in rates])
    residual = y - np.polyval(np.polyfit(x, y, 1), x)
    half = stats.t.ppf(0.95, 1) * math.sqrt(float((residual**2).sum()) / ((x - x.mean()) ** 2).sum())
    assert (fit.low, fit.high) == (pytest.approx(slope - half, rel=1e-6), pytest.approx(slope + half, rel=1e-6))
    assert 0.0 < fit.low < fit.high < 0.12, "narrow: the interval rule alone would have used it (the run did)"
    assert fit.reason == (f"1 of 3 budgets located their best rate (200K: 2 rate(s) tried, a parabola needs 4; "
                          f"400K: 2 rate(s) tried, a parabola needs 4), so b = {slope:.3f} (90% interval "
                          f"{fit.low:.3f} to {fit.high:.3f}) through them is not used; Step Law with data growing with N")
    assert _flat(budget_rates(budgets)) == pytest.approx(_flat(rates)), "every budget's best rate still places the line"
    located = fit_lr_exponent([_budget(n, lr) for n, lr in rates], data_grows=True)
    assert located.source == "fitted" and located.exponent == pytest.approx(slope, rel=1e-6), "the same rates, located"
    four = fit_lr_exponent([*budgets, _budget(800_000, 2e-3), _budget(1_600_000, 1.5e-3)], data_grows=True)
    assert four.n_budgets == 3 and four.describe().startswith("N^"), "the interval is over the 3 that located theirs"
    assert four.exponent == pytest.approx(float(np.polyfit(np.log([1e5, 8e5, 1.6e6]),
                                                           np.log([4.287e-3, 2e-3, 1.5e-3]), 1)[0]), rel=1e-6)


def test_a_rate_is_located_only_where_the_architectures_effect_is_told_apart() -> None:
    def loss(lr: float, arch: str) -> float:
        return 1.0 + math.log(lr / 3e-4) ** 2 - (0.5 if arch == "A" else 0.0)

    rates = (1e-4, 2e-4, 5e-4, 1e-3)
    assert locate_rate([(lr, loss(lr, "B")) for lr in rates]) == BestRate(pytest.approx(3e-4), True), "no names"
    assert locate_rate([(lr, loss(lr, "B"), "B") for lr in rates]).located, "one architecture"
    both = [(lr, loss(lr, a), a) for lr in rates for a in "AB"]
    assert locate_rate(both).located and locate_rate(both).rate == pytest.approx(3e-4, rel=1e-9), "intercepts"
    once = [(lr, loss(lr, a), a) for lr, a in zip(rates, "BCAD", strict=True)]
    assert locate_rate(once).why == ("each architecture ran at one rate, so the rate's effect is not told apart "
                                     "from the architectures'"), "a shared parabola mixes them"
    assert not locate_rate(once).located
    assert locate_rate([(lr, loss(lr, "B")) for lr in rates[:3]]) == BestRate(
        2e-4, False, "3 rate(s) tried, a parabola needs 4"), "three rates: the best trial's"
    outside = [(lr, 1.0 + math.log(lr / 3e-3) ** 2) for lr in rates]
    assert locate_rate(outside) == BestRate(1e-3, False, "the best lies above the highest rate tried")
    below = [(lr, 1.0 + math.log(lr / 3e-5) ** 2) for lr in rates]
    assert locate_rate(below) == BestRate(1e-4, False, "the best lies below the lowest rate tried")
    concave = [(lr, 1.0 - math.log(lr / 3e-4) ** 2) for lr in rates]
    assert locate_rate(concave).why == "the losses do not curve up around a best rate"


def test_a_wide_interval_falls_back_to_the_prior_and_says_so() -> None:
    fit = fit_lr_exponent([_budget(N[0], 1e-3), _budget(N[1], 1e-4), _budget(N[2], 1e-3)], data_grows=True)
    assert fit.source == "prior" and fit.exponent == PRIOR_DATA_GROWS and fit.n_budgets == 3
    assert fit.low is not None and fit.high is not None and fit.high - fit.low > 1.0
    assert fit.slope == pytest.approx(0.0, abs=1e-9) and "is wider than 1; Step Law" in fit.reason


def test_a_narrow_interval_outside_the_plausible_range_falls_back_to_the_prior() -> None:
    fit = fit_lr_exponent([_budget(n, 1e-9 * n) for n in N], data_grows=False)  # lr grows as N^+1
    assert fit.source == "prior" and fit.exponent == PRIOR_FIXED_DATA and fit.slope == pytest.approx(1.0)
    assert "leaves the plausible -1.5 to 0.5" in fit.reason


def test_a_noisy_but_narrow_fit_uses_its_own_slope_and_interval() -> None:
    wobble = (1.0, 1.1, 0.9, 1.0)
    budgets = [_budget(n, w * 0.3 * n**-0.6) for n, w in zip(N, wobble, strict=True)]
    fit = fit_lr_exponent(budgets, data_grows=True)
    assert fit.source == "fitted" and fit.low is not None and fit.high is not None
    assert fit.low < fit.exponent < fit.high and fit.high - fit.low < 1.0
    assert fit.exponent == pytest.approx(-0.6 + _ols_slope(wobble), abs=1e-9)


def _ols_slope(wobble: tuple[float, ...]) -> float:
    """The least-squares slope of log(wobble) against log N (what the wobble adds to -0.6)."""
    x = [math.log(n) for n in N]
    y = [math.log(w) for w in wobble]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)


def test_the_best_rate_is_a_convex_parabolas_vertex_within_the_rates_tried() -> None:
    rates = (1e-4, 2e-4, 5e-4, 1e-3)
    parabola = [(lr, 1.0 + math.log(lr / 3e-4) ** 2) for lr in rates]
    assert best_rate(parabola) == pytest.approx(3e-4, rel=1e-9)
    assert best_rate(parabola[:3]) == 2e-4, "three rates: the best trial's"
    concave = [(lr, 1.0 - math.log(lr / 3e-4) ** 2) for lr in rates]
    assert best_rate(concave) == 1e-3, "no minimum: the best trial's (the farthest from 3e-4)"
    outside = [(lr, 1.0 + math.log(lr / 3e-3) ** 2) for lr in rates]
    assert best_rate(outside) == 1e-3, "a vertex beyond the rates tried: the best trial's"
    with pytest.raises(ValueError):
        best_rate([])


def test_a_fit_is_stored_as_json_and_read_back() -> None:
    fit = fit_lr_exponent([_budget(n, 0.3 * n**-0.5) for n in N[:3]], data_grows=True)
    stored = json.loads(json.dumps(fit.as_dict()))
    assert set(stored) == {"exponent", "low", "high", "n_budgets", "source", "reason", "slope"}
    assert LrFit.from_dict(stored) == fit


def test_mups_width_rule_moves_a_rate_as_one_over_d_model() -> None:
    assert at_width(1e-2, 64, 128) == 5e-3 and at_width(5e-3, 128, 64) == 1e-2 and at_width(3e-3, 96, 96) == 3e-3


def test_the_carried_rate_lies_on_the_line_of_the_exponent_through_every_budgets_best_rate() -> None:
    rates = [(100_000, 4e-3), (400_000, 1e-3)]
    # slope -0.5 through the two (which lie on slope -1): their mean point is 2e-3 at N = 200K; at 800K,
    # 2e-3 * 4^-0.5, where the next smaller budget's 1e-3 scaled alone would give 1e-3 * 2^-0.5
    assert carried_rate(rates, 800_000, -0.5) == pytest.approx(1e-3, rel=1e-12)
    assert carried_rate(rates[:1], 800_000, -0.5) == pytest.approx(4e-3 * 8**-0.5, rel=1e-12), "one budget: scaled"
    noisy = [(n, 0.3 * n**-0.5 * w) for n, w in zip(N[:3], (1.02, 0.99, 1.01), strict=True)]
    fit = fit_lr_exponent([_budget(n, lr) for n, lr in noisy], data_grows=True)
    slope, intercept = np.polyfit(np.log([n for n, _ in noisy]), np.log([lr for _, lr in noisy]), 1)
    assert fit.source == "fitted" and _flat(budget_rates([_budget(n, lr) for n, lr in noisy])) == pytest.approx(_flat(noisy))
    assert carried_rate(noisy, N[3], fit.exponent) == pytest.approx(math.exp(intercept + slope * math.log(N[3])),
                                                                     rel=1e-9), "the least-squares prediction"
    with pytest.raises(ValueError):
        carried_rate([], N[0], -0.5)


def test_an_intercept_per_architecture_keeps_a_better_architecture_from_moving_the_vertex() -> None:
    """Architecture A is 0.5 better than B at every rate and was sampled at the higher rates: one
    shared parabola reads A's advantage as the rate's and puts the vertex too high; an intercept
    per architecture recovers the true 3e-4 exactly."""
    def loss(lr: float, arch: str) -> float:
        return 1.0 + math.log(lr / 3e-4) ** 2 - (0.5 if arch == "A" else 0.0)

    points = [(lr, loss(lr, a), a) for lr, a in ((1e-4, "B"), (2e-4, "B"), (3e-4, "B"), (4e-4, "A"), (6e-4, "A"),
                                                  (1e-3, "A"))]
    assert best_rate(points) == pytest.approx(3e-4, rel=1e-9)
    pooled = best_rate([(lr, value) for lr, value, _ in points])
    assert pooled > 3.3e-4, "without the architectures the better one drags the vertex up"
    once = [(lr, loss(lr, a), a) for lr, a in ((1e-4, "B"), (2e-4, "C"), (4e-4, "A"), (1e-3, "D"))]
    assert best_rate(once) == best_rate([(lr, v) for lr, v, _ in once]), "one rate each: no intercept is identified"
