"""The scaling-law fit L(N) = E + A N^-alpha: truth inside the bootstrap interval on points drawn
from known laws, deterministic, no fit (with a reason) below three budgets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

from archhpo.report._fit import _bounds, _lm_batch, _objective, fit_json, fit_law, predict

LAWS = [(1.7, 400.0, 0.34), (0.25, 30.0, 0.28), (3.0, 2000.0, 0.5)]


def _points(law: tuple[float, float, float], seed: int, noise: float = 0.01, k: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = np.logspace(5, 9, k)
    e, a, alpha = law
    return n, (e + a * n**-alpha) * np.exp(rng.normal(0, noise, k))


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_truth_lies_inside_the_95_percent_intervals(law: tuple[float, float, float], seed: int) -> None:
    n, loss = _points(law, seed)
    fit = fit_law(n, loss, seed=seed)
    assert fit["method"]["bootstrap_resamples"] >= 1000
    for name, truth in zip(("E", "A", "alpha"), law, strict=True):
        lo, hi = fit[name]["ci95"]
        assert lo <= fit[name]["estimate"] <= hi
        assert lo <= truth <= hi, f"{name}={truth} outside [{lo}, {hi}]"


def test_exact_points_recover_the_law() -> None:
    n = np.array([2e5, 2e6, 2e7, 2e8])
    loss = 1.7 + 400 * n**-0.34
    fit = fit_law(n, loss, n_boot=200)
    assert fit["E"]["estimate"] == pytest.approx(1.7, rel=1e-3)
    assert fit["alpha"]["estimate"] == pytest.approx(0.34, rel=1e-3)
    assert predict(fit, n) == pytest.approx(loss, rel=1e-4)


def test_fit_is_deterministic_and_json_clean() -> None:
    n, loss = _points(LAWS[0], 5)
    a, b = fit_law(n, loss, n_boot=300), fit_law(n, loss, n_boot=300)
    assert fit_json(a) == fit_json(b)
    doc = fit_json(a)
    assert "samples" not in doc
    assert {"law", "n_budgets", "points", "E", "A", "alpha", "method"} <= set(doc)
    assert set(doc["E"]) == {"estimate", "ci95"} and doc["n_budgets"] == 7


@pytest.mark.parametrize("k", [0, 1, 2])
def test_fewer_than_three_budgets_give_no_fit_and_a_reason(k: int) -> None:
    n, loss = np.logspace(5, 7, 3)[:k], np.array([1.0, 0.9, 0.8])[:k]
    fit = fit_law(n, loss)
    assert fit["E"] is None and fit["A"] is None and fit["alpha"] is None
    assert "at least 3 budgets" in fit["reason"] and fit["n_budgets"] == k


def test_nan_and_nonpositive_losses_are_left_out_of_the_fit() -> None:
    n, loss = _points(LAWS[0], 3)
    loss[1], loss[2] = math.nan, -1.0
    fit = fit_law(n, loss, n_boot=200)
    assert fit["E"] is not None
    assert fit["alpha"]["ci95"][0] <= 0.34 <= fit["alpha"]["ci95"][1]
    assert fit_law(n[:4], loss[:4])["reason"]  # two usable points remain


def test_bootstrap_refits_reach_the_l_bfgs_b_optimum() -> None:
    """The vectorised refits minimise the same objective at least as well as L-BFGS-B."""
    n, loss = _points(LAWS[0], 4, k=6)
    logn, logl = np.log(n), np.log(loss)
    rng = np.random.default_rng(0)
    weights = np.array([np.bincount(rng.integers(0, 6, 6), minlength=6) for _ in range(15)], dtype=float)
    start = np.array([math.log(1.7), math.log(400.0), 0.34])
    _, f_lm = _lm_batch(logn, logl, weights, np.tile(start, (15, 1)), 1e-3)
    for j in range(15):
        idx = np.repeat(np.arange(6), weights[j].astype(int))
        res = minimize(_objective, start, args=(logn[idx], logl[idx], 1e-3), jac=True, method="L-BFGS-B",
                       bounds=_bounds(logn, logl))
        assert f_lm[j] <= res.fun + 1e-6
