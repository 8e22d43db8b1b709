"""The L(N, D) law, the compute-optimal allocation and the answer for a compute budget.

A table drawn from a known law (E 1.7, A 400, alpha 0.34, B 1200, beta 0.28, 0.3% noise, 4 N x 3 D)
must give back alpha and beta within ±0.05 with the truth inside the 95% intervals; the report of
a tokens-per-param experiment writes `nd_fit` and the compute answer into the scaling-fit JSON, the
page, and an IsoFLOP figure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from archhpo.report._answer import compute_answer, nd_points
from archhpo.report._frame import trials_frame
from archhpo.report._ndfit import allocation, enough_data, fit_nd_law
from tests.report.test_report import _rows, _write

TRUTH = {"E": 1.7, "A": 400.0, "alpha": 0.34, "B": 1200.0, "beta": 0.28}
N = np.array([1e6, 4e6, 1.6e7, 6.4e7])
R = np.array([5.0, 20.0, 80.0])


def _law(n: np.ndarray, d: np.ndarray) -> np.ndarray:
    return TRUTH["E"] + TRUTH["A"] * n ** -TRUTH["alpha"] + TRUTH["B"] * d ** -TRUTH["beta"]


def _table(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, r = (a.ravel() for a in np.meshgrid(N, R))
    d = r * n
    return n, d, _law(n, d) * (1 + np.random.default_rng(seed).normal(0, 0.003, len(n)))


def test_a_known_law_is_recovered_with_the_truth_inside_its_intervals() -> None:
    n, d, loss = _table()
    fit = fit_nd_law(n, d, loss, 6 * n * d, budgets=list(n), n_boot=400)
    assert fit["status"] == "fitted", fit["reason"]
    for name in ("alpha", "beta"):
        assert abs(fit[name]["estimate"] - TRUTH[name]) <= 0.05, name
    for name, true in TRUTH.items():
        lo, hi = fit[name]["ci95"]
        assert lo <= true <= hi, f"{name}: {true} outside [{lo}, {hi}]"
    assert fit["flops_per_param_token"] == pytest.approx(6.0)


def test_the_compute_optimal_exponents_follow_from_alpha_and_beta() -> None:
    n, d, loss = _table()
    fit = fit_nd_law(n, d, loss, 6 * n * d, budgets=list(n), n_boot=200)
    alloc = allocation(fit["samples"], 6.0, 1e20)
    alpha, beta = fit["alpha"]["estimate"], fit["beta"]["estimate"]
    assert alloc["a"]["estimate"] == pytest.approx(beta / (alpha + beta))
    assert alloc["a"]["estimate"] + alloc["b"]["estimate"] == pytest.approx(1.0)
    n_star, d_star = alloc["N"]["estimate"], alloc["D"]["estimate"]
    assert 6 * n_star * d_star == pytest.approx(1e20)
    # N* minimises the law along N*D = C/6: a step either way costs loss
    law = lambda x: fit["E"]["estimate"] + fit["A"]["estimate"] * x ** -alpha + fit["B"]["estimate"] * (1e20 / 6 / x) ** -beta  # noqa: E731
    assert law(n_star) < law(n_star * 1.2) and law(n_star) < law(n_star / 1.2)
    assert alloc["N"]["ci95"][0] < n_star < alloc["N"]["ci95"][1]


def test_one_token_count_per_budget_over_three_points_is_too_few() -> None:
    n = np.array([1e6, 4e6, 1.6e7])
    assert "at least two token counts D at one budget" in enough_data(n, 20 * n, list(n))
    fit = fit_nd_law(n, 20 * n, _law(n, 20 * n), 120 * n * n, budgets=list(n), n_boot=50)
    assert fit["status"] == "too_few_points" and fit["E"] is None


def test_five_points_for_five_parameters_are_an_interpolation() -> None:
    n = np.array([1e6, 1e6, 4e6, 4e6, 1.6e7])
    d = np.array([5e6, 2e7, 2e7, 8e7, 3.2e8])
    fit = fit_nd_law(n, d, _law(n, d), 6 * n * d, budgets=list(n), n_boot=100)
    assert fit["status"] == "interpolation" and "5 points for 5 free parameters" in fit["reason"]


def _nd_rows(experiment: str = "nd") -> list[dict]:
    """A tokens-per-param experiment: 4 budgets x 3 ratios, 4 trials each, losses from TRUTH."""
    rows = []
    rng = np.random.default_rng(5)
    for i, (nominal, ratio) in enumerate((b, r) for b in N for r in R):
        label = f"{int(nominal / 1e6)}M-t{ratio:g}"
        for row in _rows(experiment, {label: nominal}, per=4, seed=i):
            tokens = int(ratio * nominal)
            row.update(tokens_per_param=ratio, train_tokens=tokens, train_flops=6.0 * row["param_count"] * tokens,
                       val_loss=float(_law(np.array(row["param_count"]), np.array(tokens))) * (1 + rng.exponential(0.003)),
                       data_passes=1.0)
            rows.append(row)
    return rows


def test_the_report_writes_nd_fit_and_the_compute_answer(tmp_path: Path) -> None:
    from archhpo.cli import main

    path = _write(_nd_rows(), tmp_path / "nd.csv")
    out = tmp_path / "r"
    assert main(["report", "--csv", str(path), "--out", str(out), "--compute", "1e19"]) == 0
    fit = json.loads((out / "nd_scaling_fit.json").read_text())
    assert {"E", "A", "alpha", "law", "points"} <= set(fit), "L(N)'s keys are kept"
    nd = fit["nd_fit"]
    assert nd["status"] == "fitted" and nd["n_points"] == 12 and "samples" not in nd
    for name in ("alpha", "beta"):
        assert abs(nd[name]["estimate"] - TRUTH[name]) <= 0.05
    answer = nd["compute_optimal"]
    assert answer["compute"] == 1e19 and answer["status"] == "fitted"
    assert answer["extrapolation"] == pytest.approx(1e19 / max(r["train_flops"] for r in _nd_rows()))
    assert answer["N"]["ci95"][0] < answer["N"]["estimate"] < answer["N"]["ci95"][1]
    html = (out / "nd_report.html").read_text()
    assert "Compute-optimal answer." in html and "For C = 1e+19 FLOPs: N* = " in html
    assert (out / "nd_figures" / "isoflops.png").is_file()


def test_the_default_compute_is_the_largest_budgets() -> None:
    frame = trials_frame(None, csv=_write(_nd_rows(), Path(__import__("tempfile").mkdtemp()) / "nd.csv"))
    pts = nd_points(frame)
    assert len(pts) == 12
    fit = fit_nd_law(pts["param_count"], pts["train_tokens"], pts["val_loss"], pts["train_flops"],
                     budgets=list(pts["budget_value"]), n_boot=100)
    answer = compute_answer(frame, fit)
    top = pts[pts["budget_value"] == pts["budget_value"].max()].iloc[0]
    assert answer["compute"] == float(top["train_flops"]) and answer["extrapolation"] <= 1.0
    assert "within the compute trained" in answer["sentence"]
    assert math.isfinite(answer["N"]["estimate"]) and answer["nearest_budget"].endswith(("t5", "t20", "t80"))


def test_the_example_study_on_the_synthetic_language_puts_e_around_its_entropy_rate(tmp_path: Path) -> None:
    """docs/reports.md's example: lm on the synthetic language at 75K-200K x 10 and 20 tokens per
    parameter (its database is committed). L(N, D)'s E interval holds the language's exact entropy
    rate and the loss floor; alpha is not resolved over this 2.7x range, so no compute answer."""
    import shutil

    from archhpo.report._page import write_report
    from tests.conftest import REPO

    db = tmp_path / "cs.db"
    shutil.copy(REPO / "docs" / "examples" / "compute_optimal.db", db)  # the report writes notes into it
    nd = write_report("cs", storage=f"sqlite:///{db}", out=tmp_path / "r").fit["nd_fit"]
    lo, hi = nd["E"]["ci95"]
    assert nd["n_points"] == 8 and lo <= nd["entropy_rate"] <= hi and lo <= nd["loss_floor"] <= hi
    assert nd["status"] == "unresolved" and "alpha's 95% interval" in nd["reason"]
    assert nd["compute_optimal"]["sentence"].startswith("No compute-optimal answer for C = ")


def test_a_law_without_an_irreducible_loss_is_unresolved() -> None:
    """The known table with E = 0: E's interval reaches 0, so L(N, D) is not claimed; the same table
    with the truth's E = 1.7 is fitted (test above)."""
    n, r = (a.ravel() for a in np.meshgrid(N, R))
    d = r * n
    loss = (_law(n, d) - TRUTH["E"]) * (1 + np.random.default_rng(0).normal(0, 0.003, len(n)))
    fit = fit_nd_law(n, d, loss, 6 * n * d, budgets=list(n), n_boot=400)
    assert fit["status"] == "unresolved"
    assert fit["reason"].startswith("E's 95% interval [9.36e-14, ") and "reaches 0" in fit["reason"]


def test_six_points_leave_one_residual_degree_of_freedom_and_no_law() -> None:
    """L(N, D) needs 2 residual degrees of freedom beyond its 5 parameters."""
    n, r = (a.ravel() for a in np.meshgrid(N[:3], R[:2]))
    d = r * n
    loss = _law(n, d) * (1 + np.random.default_rng(0).normal(0, 0.003, len(n)))
    fit = fit_nd_law(n, d, loss, 6 * n * d, budgets=list(n), n_boot=200)
    assert fit["status"] == "unresolved" and fit["residual_dof"] == 1
    assert "1 residual degree of freedom (needs 2: at least 7 points for 5 free parameters)" in fit["reason"]


@pytest.mark.parametrize(("floor", "status"), [(1.9, "unresolved"), (1.5, "fitted")])
def test_an_e_below_the_known_floor_is_no_l_n_d_law(floor: float, status: str) -> None:
    n, d, loss = _table()
    fit = fit_nd_law(n, d, loss, 6 * n * d, budgets=list(n), n_boot=200, floor=floor)
    assert fit["status"] == status, fit["reason"]
    assert fit["noise"]["source"] == "residuals" and fit["noise"]["dof"] == 7
    below = f"E {fit['E']['estimate']:.4g} lies below the known floor {floor:.4g}"
    assert (below in (fit["reason"] or "")) is (status == "unresolved")
