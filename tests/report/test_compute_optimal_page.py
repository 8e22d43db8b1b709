"""The page of a compute-optimal study: it leads with the answer for a compute budget (N*, D*,
tokens per parameter, the predicted loss with its interval, the best shape at N*, the extrapolation),
L(N) is fitted per tokens-per-parameter ratio, never pooled, a falling loss is never called "no
measurable scaling", tokens per parameter are stated as trained beside the nominal, and an IsoFLOP
study's trials (one budget per C, several sizes each) feed L(N, D) and its figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from archhpo.report._answer import compute_answer, nd_fit, nd_points, trained_ratios
from archhpo.report._frame import trials_frame
from archhpo.report._law import fit_line, law_text
from archhpo.report._page import report_frame
from tests.report.test_nd_fit import _nd_rows
from tests.report.test_report import _rows, _write

CHINCHILLA = {"E": 1.69, "A": 406.4, "alpha": 0.34, "B": 410.7, "beta": 0.28}


def _frame(rows: list[dict], tmp_path: Path, name: str = "t.csv"):  # noqa: ANN202 - a trials frame
    return trials_frame(None, csv=_write(rows, tmp_path / name))


def test_the_page_leads_with_the_compute_optimal_answer(tmp_path: Path) -> None:
    frame = _frame(_nd_rows(), tmp_path)
    report = report_frame(frame, tmp_path / "r", n_boot=200, compute=1e19)
    answer = report.fit["nd_fit"]["compute_optimal"]
    assert answer["status"] == "fitted"
    html = report.html.read_text()
    lead, first_budget = html.index("Compute-optimal answer."), html.index("<li><b>1M-t5</b>")
    assert lead < first_budget, "the answer comes before the per-budget winners"
    head = html[lead:first_budget]
    for said in ("N* = ", "D* = ", "tokens per parameter", "predicted loss", "the best shape at N*",
                 "x the largest compute trained", "archhpo report --compute C"):
        assert said in head, said
    assert html.count("Compute-optimal answer.") == 1
    assert answer["tokens_per_param"]["estimate"] == pytest.approx(answer["D"]["estimate"] / answer["N"]["estimate"])
    loss = answer["loss"]
    assert loss["ci95"][0] < loss["estimate"] < loss["ci95"][1]
    assert loss["run_ci95"][0] <= loss["ci95"][0] and loss["ci95"][1] <= loss["run_ci95"][1], \
        "one run's interval adds the noise to the law's"
    law = CHINCHILLA | {"B": 1200.0, "E": 1.7, "A": 400.0}  # test_nd_fit's truth
    n, d = answer["N"]["estimate"], answer["D"]["estimate"]
    assert loss["estimate"] == pytest.approx(law["E"] + law["A"] * n ** -law["alpha"] + law["B"] * d ** -law["beta"],
                                             rel=0.01)
    saved = json.loads((tmp_path / "r" / "nd_scaling_fit.json").read_text())
    assert set(saved["nd_fit"]["compute_optimal"]["loss"]) == {"estimate", "ci95", "run_ci95"}


def test_l_of_n_is_fitted_per_ratio_never_pooled(tmp_path: Path) -> None:
    """4 budgets x 3 ratios: three L(N) fits of 4 budgets each, every one on its own ratio's studies;
    the top level is the largest ratio's (all tie on budgets), and the page says so."""
    frame = _frame(_nd_rows(), tmp_path)
    report = report_frame(frame, tmp_path / "r", n_boot=100)
    fit = report.fit
    assert list(fit["per_ratio"]) == ["5 tokens/param", "20 tokens/param", "80 tokens/param"]
    for label, sub in fit["per_ratio"].items():
        suffix = "-t" + label.split()[0]
        assert sub["n_budgets"] == 4 and all(p["budget"].endswith(suffix) for p in sub["points"]), label
    assert fit["ratio"] == "80 tokens/param" and fit["points"] == fit["per_ratio"]["80 tokens/param"]["points"]
    assert "not pooled" in law_text(fit) and len(fit_line(fit).splitlines()) == 3


def test_a_falling_loss_is_never_called_no_measurable_scaling() -> None:
    """The loss ratio's interval below 1: the sentence says the loss falls; including 1: no scaling."""
    base = {"status": "no_scaling", "n_budgets": 8, "E": {"estimate": 1.0, "ci95": [0.9, 1.1]},
            "reason": "A is not distinguishable from 0"}
    falls = {**base, "loss_ratio": {"estimate": 0.88, "ci95": [0.86, 0.9]}}
    flat = {**base, "loss_ratio": {"estimate": 0.99, "ci95": [0.97, 1.01]}}
    assert "No measurable scaling" not in law_text(falls) and law_text(falls).startswith("The loss falls, but no law is resolved over 8 budgets")
    assert "no measurable scaling" not in fit_line(falls)
    assert law_text(flat).startswith("No measurable scaling over 8 budgets")


def test_tokens_per_parameter_are_stated_as_trained_beside_the_nominal(tmp_path: Path) -> None:
    rows = _nd_rows()
    frame = _frame(rows, tmp_path)
    found = {t["budget"]: t for t in trained_ratios(frame)}
    best = {}
    for r in rows:
        if r["budget"] not in best or r["val_loss"] < best[r["budget"]]["val_loss"]:
            best[r["budget"]] = r
    assert set(found) == set(best)
    for budget, r in best.items():
        assert found[budget]["nominal"] == r["tokens_per_param"]
        assert found[budget]["trained"] == pytest.approx(r["train_tokens"] / r["param_count"], rel=1e-12)
        assert found[budget]["trained"] != found[budget]["nominal"]


def isoflop_study_rows(computes: tuple[float, ...] = (1e16, 1e17, 1e18, 1e19), sizes: int = 7) -> list[dict]:
    """An IsoFLOP study as the database exports it: one budget (study) per C, named C1e16, whose
    trials are its sizes, each trained on D = C/(6N) and scored by Chinchilla's law (0.3% noise)."""
    rows, rng = [], np.random.default_rng(3)
    for ci, c in enumerate(computes):
        centre = 1.345 * (c / 6) ** 0.4516
        label = f"C{c:.0e}".replace("+", "")
        for si in range(sizes):
            n = centre * 10 ** (si / (sizes - 1) - 0.5)
            row = _rows("iso", {label: n}, per=1, seed=ci * sizes + si)[0]
            d = c / (6 * row["param_count"])
            law = CHINCHILLA["E"] + CHINCHILLA["A"] * row["param_count"] ** -CHINCHILLA["alpha"] \
                + CHINCHILLA["B"] * d ** -CHINCHILLA["beta"]
            row.update(trial=si, plan_slot=si, train_tokens=int(d), train_flops=c, compute_budget=c, isoflop_size=si,
                       data_passes=1.0, val_loss=law * (1 + rng.normal(0, 0.003)))
            rows.append(row)
    return rows


def test_an_isoflop_studys_trials_feed_l_of_n_d_and_its_answer(tmp_path: Path) -> None:
    """Each C is one budget of 7 sizes (no tokens per parameter stated): every size is a point of
    L(N, D), the default C is the largest, and the best shape at N* is a trained size nearest N*."""
    frame = _frame(isoflop_study_rows(), tmp_path)
    pts = nd_points(frame)
    assert len(pts) == 28 and sorted(set(pts["budget"])) == ["C1e16", "C1e17", "C1e18", "C1e19"]
    assert (pts["tokens_per_param"] == pts["train_tokens"] / pts["param_count"]).all()
    nd = nd_fit(frame, n_boot=200)
    assert nd["status"] == "fitted", nd["reason"]
    answer = compute_answer(frame, nd)
    assert answer["compute"] == 1e19 and answer["extrapolation"] == pytest.approx(1.0)
    at = pts[pts["compute_budget"] == 1e19]["param_count"].astype(float)
    nearest = float(at.iloc[int(np.argmin(np.abs(np.log(at) - math.log(answer["N"]["estimate"]))))])
    assert answer["best_shape_params"] == int(nearest) and answer["nearest_budget"] == "C1e19"
    assert abs(answer["a"]["estimate"] - 0.4516) < 0.05


def test_the_isoflop_figure_draws_one_curve_per_compute_budget(tmp_path: Path) -> None:
    """Several trials per C, each a hair off it in FLOPs (the 1% rule): one curve per C, not per trial."""
    from archhpo.report._isoflop_figures import plot_isoflops

    rows = isoflop_study_rows()
    for i, r in enumerate(rows):
        r["train_flops"] = r["compute_budget"] * (1 + 0.001 * (i % 5))
    frame = _frame(rows, tmp_path)
    fig = plot_isoflops(frame, nd_fit(frame, n_boot=50))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert [lb.split(" (")[0] for lb in labels if lb.startswith("C = ")] == ["C = 1e+16", "C = 1e+17", "C = 1e+18",
                                                                            "C = 1e+19"]


def test_a_retried_trial_without_its_planned_attributes_still_counts_at_its_compute_budget(tmp_path: Path) -> None:
    """A retry of a failed IsoFLOP trial may lack compute_budget and isoflop_size: it is its study's
    C (one C per study) and its size's, so the profile keeps all 7 sizes and L(N, D) all 28 points."""
    from archhpo.report._isoflop import isoflop_points

    rows = isoflop_study_rows()
    rows.append({**rows[10], "trial": 99, "state": "FAIL", "val_loss": ""})  # the attempt that failed
    rows[10].update(compute_budget="", isoflop_size="")  # its retry, which finished
    frame = _frame(rows, tmp_path)
    assert frame["compute_budget"].isna().sum() == 1
    pts = isoflop_points(frame)
    assert len(pts[pts["compute_budget"] == rows[10 - 3]["compute_budget"]]) == 7
    assert int(pts.loc[pts["param_count"] == rows[10]["param_count"], "isoflop_size"].iloc[0]) == 3
    assert len(nd_points(frame)) == 28
