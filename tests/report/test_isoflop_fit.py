"""Approach 2 on IsoFLOP tables (report/_isoflop.py), and Approach 3 (the L(N, D) fit) on the same.

Known truths: tables drawn from Chinchilla's fitted law (Hoffmann et al. 2022:
E 1.69, A 406.4, alpha 0.34, B 410.7, beta 0.28) with D = C/(6N), 5 compute budgets over 2
decades, 7 sizes log-spaced over 10x around the planner's prior centre sqrt(C/120) (13-41% above
the true N_opt: a realistic, not a perfect, centring), 0.3% Gaussian noise. The true a is
beta/(alpha+beta) = 0.4516.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from archhpo.budgets._isoflop import log_sizes, prior_centre
from archhpo.report._frame import trials_frame
from archhpo.report._isoflop import agreement, collinear, fit_isoflops, fit_profile, isoflop_fit
from archhpo.report._ndfit import allocation, fit_nd_law
from tests.report.test_isoflop_figures import isoflop_rows
from tests.report.test_report import _write

TRUTH = {"E": 1.69, "A": 406.4, "alpha": 0.34, "B": 410.7, "beta": 0.28}
A_TRUE = TRUTH["beta"] / (TRUTH["alpha"] + TRUTH["beta"])
G_TRUE = (TRUTH["alpha"] * TRUTH["A"] / (TRUTH["beta"] * TRUTH["B"])) ** (1 / (TRUTH["alpha"] + TRUTH["beta"]))
COMPUTES = 1e18 * 10 ** np.linspace(0, 2, 5)


def n_opt(c: float) -> float:
    return G_TRUE * (c / 6) ** A_TRUE


def _law(n: np.ndarray, d: np.ndarray) -> np.ndarray:
    return TRUTH["E"] + TRUTH["A"] * n ** -TRUTH["alpha"] + TRUTH["B"] * d ** -TRUTH["beta"]


def table(seed: int, centre=prior_centre, noise: float = 0.003) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C, N, L) of 5 budgets x 7 sizes over 10x around centre(C)."""
    rng = np.random.default_rng(seed)
    c = np.repeat(COMPUTES, 7)
    n = np.concatenate([log_sizes(centre(x), 7, 10.0) for x in COMPUTES])
    return c, n, _law(n, c / (6 * n)) * (1 + rng.normal(0, noise, len(n)))


def test_the_vertex_of_a_noiseless_parabola_in_log_n_is_exact() -> None:
    n = np.geomspace(1e6, 1e7, 7)
    profile = fit_profile(n, 2.0 + 0.1 * (np.log(n) - math.log(3e6)) ** 2, n_boot=50)
    assert profile["n_opt"]["estimate"] == pytest.approx(3e6, rel=1e-9)
    assert profile["loss_opt"] == pytest.approx(2.0) and not profile["edge"]


def test_one_bad_trial_does_not_move_the_robust_vertex() -> None:
    n = np.geomspace(1e6, 1e7, 7)
    loss = 2.0 + 0.1 * (np.log(n) - math.log(3e6)) ** 2 + np.random.default_rng(1).normal(0, 1e-3, 7)
    loss[5] += 0.2  # one trial diverged
    robust = fit_profile(n, loss, n_boot=50)["n_opt"]["estimate"]
    plain = np.polyfit(np.log(n), loss, 2)
    assert abs(math.log(robust / 3e6)) < 0.05 < abs(-plain[1] / (2 * plain[0]) - math.log(3e6))


def test_approach_2_recovers_a_within_005_with_the_truth_inside_its_interval_over_50_tables() -> None:
    errors, covered = [], 0
    for seed in range(50):
        fit = fit_isoflops(*table(seed), k=6.0, n_boot=200, seed=seed)
        assert fit["status"] == "fitted" and not any(v["edge"] for v in fit["vertices"]), fit["reason"]
        lo, hi = fit["a"]["ci95"]
        errors.append(fit["a"]["estimate"] - A_TRUE)
        covered += lo <= A_TRUE <= hi
    assert max(abs(e) for e in errors) <= 0.05
    assert covered >= 45, f"the truth inside {covered} of 50 intervals"
    first = fit_isoflops(*table(0), k=6.0, n_boot=200, seed=0)
    assert first["a"]["ci95"][0] <= A_TRUE <= first["a"]["ci95"][1]


def test_the_vertices_and_d_opt_follow_the_true_optimum() -> None:
    fit = fit_isoflops(*table(0), k=6.0, n_boot=200)
    for v in fit["vertices"]:
        c = v["compute_budget"]
        assert abs(math.log(v["n_opt"]["estimate"] / n_opt(c))) < 0.25
        assert v["d_opt"] == pytest.approx(c / (6.0 * v["n_opt"]["estimate"]))
        lo, hi = v["n_opt"]["ci95"]
        assert lo < v["n_opt"]["estimate"] < hi
    assert fit["recentre"] == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_approach_3_on_the_same_tables_recovers_a_within_003_with_the_truth_inside(seed: int) -> None:
    c, n, loss = table(seed)
    nd = fit_nd_law(n, c / (6 * n), loss, c, budgets=list(c), n_boot=200, seed=seed)
    assert nd["status"] == "fitted", nd["reason"]
    a = allocation(nd["samples"], nd["flops_per_param_token"], 1e19)["a"]
    assert abs(a["estimate"] - A_TRUE) <= 0.03
    assert a["ci95"][0] <= A_TRUE <= a["ci95"][1]


@pytest.mark.parametrize("factor", [10.0, 0.1])
def test_a_grid_whose_optima_all_lie_beyond_its_sizes_is_flagged_at_the_edge(factor: float) -> None:
    fit = fit_isoflops(*table(0, centre=lambda c: factor * n_opt(c)), k=6.0, n_boot=200)
    assert fit["status"] == "unresolved"
    assert "0 of 5 compute budgets have their vertex inside the sizes" in fit["reason"]
    assert all(v["edge"] for v in fit["vertices"])
    assert [r["compute_budget"] for r in fit["recentre"]] == list(COMPUTES)
    for r in fit["recentre"]:
        assert min(r["sizes"]) <= n_opt(r["compute_budget"]) <= max(r["sizes"]), "the new sizes bracket N_opt"
        assert r["command"] == f"--isoflop {r['compute_budget']:.3g} --centre {r['centre']:.3g} --sizes 7 --span 10"
        assert (r["centre"] < factor * n_opt(r["compute_budget"])) == (factor > 1), "moved towards the optimum"


def test_a_profile_still_falling_at_the_largest_size_is_an_edge() -> None:
    n = np.geomspace(1e6, 1e7, 5)
    profile = fit_profile(n, 3.0 - 0.1 * np.log(n / 1e6) - 0.01 * np.log(n / 1e6) ** 2, n_boot=50)
    assert profile["edge"] and profile["opens_downward"]
    fit = fit_isoflops([1e18] * 5, n, 3.0 - 0.1 * np.log(n / 1e6) - 0.01 * np.log(n / 1e6) ** 2, n_boot=50)
    assert fit["recentre"][0]["centre"] == pytest.approx(1e7) and "lower-loss edge" in fit["recentre"][0]["why"]


def test_a_vertex_inside_the_sizes_with_the_lowest_loss_at_an_end_is_an_edge() -> None:
    # The parabola's vertex (about 1.5e5) lies inside 1e5-1e6, but the smallest size has the lowest
    # loss: the data have no minimum inside the grid, so the vertex is the curvature's guess.
    n = np.geomspace(1e5, 1e6, 7)
    loss = np.array([1.930, 1.931, 1.936, 1.945, 1.960, 1.985, 2.030])
    profile = fit_profile(n, loss, n_boot=50)
    assert 1e5 < profile["n_opt"]["estimate"] < 1e6 and not profile["opens_downward"]
    assert profile["edge"] and profile["lowest_at"] == "smallest"
    fit = fit_isoflops([1e13] * 7, n, loss, n_boot=50)
    (r,) = fit["recentre"]
    assert r["centre"] == pytest.approx(1e5) and "the lowest loss at the smallest size" in r["why"]
    assert r["command"] == "--isoflop 1e+13 --centre 1e+05 --sizes 7 --span 10"
    # The same profile with its minimum one size in is bracketed.
    inner = fit_profile(n, np.array([1.933, 1.930, 1.936, 1.945, 1.960, 1.985, 2.030]), n_boot=50)
    assert not inner["edge"] and inner["lowest_at"] is None


def test_fewer_than_five_sizes_at_every_budget_fit_nothing() -> None:
    fit = fit_isoflops([1e18] * 4, [1e6, 2e6, 4e6, 8e6], [2.1, 2.0, 2.0, 2.1])
    assert fit["status"] == "too_few_points" and "5 sizes or more" in fit["reason"]


def test_the_two_as_agree_when_their_intervals_overlap() -> None:
    iso = {"status": "fitted", "a": {"estimate": 0.45, "ci95": [0.40, 0.50]}}
    nd = {"status": "fitted", "compute_optimal": {"a": {"estimate": 0.48, "ci95": [0.47, 0.49]}}}
    said = agreement(iso, nd)
    assert said["agree"] is True and said["sentence"].endswith("agree (their 95% intervals overlap).")
    nd["compute_optimal"]["a"] = {"estimate": 0.60, "ci95": [0.55, 0.65]}
    assert agreement(iso, nd)["agree"] is False
    assert agreement(iso, {"status": "unresolved"})["sentence"] == (
        "The two estimates of a cannot be compared: Approach 3 is not fitted.")


def test_a_single_tokens_per_parameter_ratio_is_flagged_collinear() -> None:
    assert "D is collinear with N" in collinear([20.0, 20.0, 20.0])
    assert collinear([10.0, 20.0, 20.0]) is None


def test_the_fit_reads_a_trials_frame_with_a_compute_budget_column(tmp_path: Path) -> None:
    frame = trials_frame(None, csv=_write(isoflop_rows(), tmp_path / "iso.csv"))
    fit = isoflop_fit(frame, n_boot=100)
    assert [v["compute_budget"] for v in fit["vertices"]] == [1e13, 1e14, 1e15]
    assert fit["k"] == pytest.approx(6.0, rel=1e-3)
    assert set(fit) >= {"status", "reason", "a", "vertices", "recentre", "agreement"}
    del frame["compute_budget"]
    assert isoflop_fit(frame)["status"] == "none"


def test_the_fit_in_words_names_the_law_the_edges_and_the_recentring_command() -> None:
    from archhpo.report._isoflop import isoflop_lines

    fitted = fit_isoflops(*table(0), k=6.0, n_boot=100)
    fitted["agreement"] = agreement(fitted, None)
    lines = isoflop_lines(fitted)
    assert lines[0].startswith("IsoFLOP (Approach 2): N_opt = ") and "over 5 compute budgets" in lines[0]
    assert len(lines) == 1 + 5 + 1 and lines[-1].startswith("The two estimates of a cannot be compared")
    edge = fit_isoflops(*table(0, centre=lambda c: 10 * n_opt(c)), k=6.0, n_boot=100)
    lines = isoflop_lines(edge)
    assert lines[0].startswith("IsoFLOP (Approach 2): no law: 0 of 5 compute budgets")
    assert sum("(edge: the optimum is not inside the sizes)" in x for x in lines) == 5
    assert sum(x.startswith("re-centre C = ") and "--isoflop " in x for x in lines) == 5


def test_with_several_shapes_per_size_the_fit_takes_each_sizes_best(tmp_path: Path) -> None:
    """--shapes 2: a worse shape (+0.05 loss) beside each size's best, both recorded with the
    planned size; the vertices are those of the best shapes alone."""
    rows = isoflop_rows()
    worse = [{**r, "trial": r["trial"] + 100, "d_model": 2 * r["d_model"], "val_loss": r["val_loss"] + 0.05,
              "param_count": r["param_count"] + 1} for r in rows]
    for r in rows + worse:
        r["isoflop_size"] = r["budget"]
    both = isoflop_fit(trials_frame(None, csv=_write(rows + worse, tmp_path / "both.csv")), n_boot=100)
    best = isoflop_fit(trials_frame(None, csv=_write(rows, tmp_path / "best.csv")), n_boot=100)
    assert [v["n_opt"]["estimate"] for v in both["vertices"]] == [v["n_opt"]["estimate"] for v in best["vertices"]]


def test_the_planners_lm_grid_through_a_known_law_gives_back_a() -> None:
    """The planner's trials (5 budgets 1e13-1e15, the prior centre, the grid's exact N and whole
    windows of D) scored by the known law with 0.3% noise: a within 0.05, the truth inside every
    interval over 5 seeds."""
    from archhpo.budgets._isoflop import plan_isoflops
    from archhpo.models import get_family

    lm = get_family("lm")
    plans = plan_isoflops(lm, lm.data_info(lm.parse_data("synthetic", {}), {}), list(1e13 * 10 ** np.linspace(0, 2, 5)))
    trials = [t for p in plans for t in p.trials]
    c = np.array([t.compute_budget for t in trials])
    n = np.array([t.param_count for t in trials], dtype=float)
    d = np.array([t.train_tokens for t in trials], dtype=float)
    k = float(np.median([t.flops_per_param_token for t in trials]))
    for seed in range(5):
        loss = _law(n, d) * (1 + np.random.default_rng(seed).normal(0, 0.003, len(n)))
        fit = fit_isoflops(c, n, loss, k=k, n_boot=200, seed=seed)
        assert fit["status"] == "fitted", fit["reason"]
        assert abs(fit["a"]["estimate"] - A_TRUE) <= 0.05
        assert fit["a"]["ci95"][0] <= A_TRUE <= fit["a"]["ci95"][1]


def test_a_recentred_plan_of_the_same_compute_pools_with_the_first_from_their_csvs(tmp_path: Path) -> None:
    """A re-centred budget is a new experiment whose sizes are numbered afresh: pooled from both CSVs,
    every size is its own point (a size both trained counts once), as if one plan had trained them all."""
    rows = isoflop_rows()
    by_n = sorted({r["param_count"] for r in rows})
    first, second = by_n[:3], by_n[2:]  # the re-centred plan shares one size with the first
    a = [{**r, "isoflop_size": first.index(r["param_count"])} for r in rows if r["param_count"] in first]
    b = [{**r, "experiment": "iso_r", "isoflop_size": second.index(r["param_count"])}
         for r in rows if r["param_count"] in second]
    one = [{**r, "isoflop_size": by_n.index(r["param_count"])} for r in rows]
    pooled = isoflop_fit(trials_frame(None, csv=[_write(a, tmp_path / "a.csv"), _write(b, tmp_path / "b.csv")]),
                         n_boot=100)
    whole = isoflop_fit(trials_frame(None, csv=_write(one, tmp_path / "one.csv")), n_boot=100)
    assert [v["n_opt"]["estimate"] for v in pooled["vertices"]] == [v["n_opt"]["estimate"] for v in whole["vertices"]]
    assert all(math.isfinite(v["n_opt"]["estimate"]) for v in whole["vertices"])


def test_a_pooled_profile_is_fitted_on_one_plans_worth_of_sizes_around_its_minimum() -> None:
    """An off-centre first plan (7 sizes over 10x, from N_opt to 10 N_opt) pooled with a re-centred one
    (7 sizes over 10x around N_opt): the fit keeps the 7 sizes nearest the minimum and finds the
    vertex as the centred plan alone does; over all 13 sizes (100x) the parabola is biased."""
    from archhpo.report._isoflop import windowed

    c = 1e19
    first = np.array(log_sizes(math.sqrt(10) * n_opt(c), 7, 10.0))
    second = np.array(log_sizes(n_opt(c), 7, 10.0))
    n = np.concatenate([first, second[second < first.min() * 0.999]])
    loss = _law(n, c / (6 * n))
    cs = np.full(len(n), c)
    kept = windowed(cs, n, loss, {c: 7})[1]
    assert sorted(kept) == pytest.approx(sorted(second[np.argsort(np.abs(np.log(second / n_opt(c))))][:7]))
    alone = fit_profile(second, _law(second, c / (6 * second)), n_boot=50)["n_opt"]["estimate"]
    pooled = fit_isoflops(cs, n, loss, k=6.0, n_boot=50, windows={c: 7})["vertices"][0]["n_opt"]["estimate"]
    whole = fit_isoflops(cs, n, loss, k=6.0, n_boot=50)["vertices"][0]["n_opt"]["estimate"]
    assert pooled == pytest.approx(alone, rel=1e-9)
    assert abs(math.log(whole / n_opt(c))) > abs(math.log(pooled / n_opt(c)))
