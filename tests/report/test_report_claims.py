"""Reports that never overclaim and a dashboard that speaks of architectures
(part 3): the fit's status on every surface, the trivial baseline, ties within noise, figures,
file links, CSV input without --experiment, and architecture dimensions as Optuna params."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.report._figures import plot_loss_vs_params, plot_phase1_params, plot_val_curves
from archhpo.report._frame import trials_frame
from archhpo.report._page import budget_note, budget_summary, fit_line, write_report
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._space import PARAM_NAMES
from tests.report.test_report import _drive, _rows, _write

FLAT = {"200K": 2e5, "1M": 1e6, "5M": 5e6}


def _flat_rows(experiment: str = "flat") -> list[dict]:
    """Three budgets whose losses do not move with size: trial noise only."""
    rows = _rows(experiment, budgets=FLAT, per=8)
    rng = np.random.default_rng(3)
    for r in rows:
        r["val_loss"] = 0.4853 + float(rng.normal(0, 0.01))
        r["baseline_val_loss"] = 0.6931
    return rows


def _summary(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_a_flat_experiment_says_no_measurable_scaling_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _write(_flat_rows(), tmp_path / "flat.csv")
    out = tmp_path / "r"
    assert main(["report", "--csv", str(path), "--out", str(out)]) == 0  # no --experiment: one in the file
    fit = json.loads((out / "flat_scaling_fit.json").read_text())
    assert fit["status"] == "no_scaling" and "formula" not in fit
    lo, hi = fit["loss_ratio"]["ci95"]  # flat data: the ratio interval includes 1 or lies just above it
    assert hi >= 1 and ("includes 1" if lo <= 1 else "lies above 1") in fit["reason"]
    html = (out / "flat_report.html").read_text()
    assert "No measurable scaling over 3 budgets" in html and "L(N) = E + A·N^-alpha fitted" not in html
    assert "scaling: no measurable scaling (" in capsys.readouterr().err
    frame = trials_frame("flat", csv=path)
    summary = budget_summary(frame)
    note = budget_note("1M", summary.iloc[1], None, None, fit)
    assert "No measurable scaling" in note and "Answer for budget 1M" in note
    fig = plot_loss_vs_params(frame, fit)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "95% bootstrap band" not in labels and not any(t.startswith("L = ") for t in labels)
    assert fig.axes[0].get_title(loc="left") == "no measurable scaling: no law drawn (reason in the report)"


def test_a_real_trend_is_fitted_and_printed_as_a_law(tmp_path: Path) -> None:
    # six budgets: a law needs 2 residual degrees of freedom beyond its 3 parameters (issue 54)
    path = _write(_rows("law", budgets={"200K": 2e5, "1M": 1e6, "5M": 5e6, "25M": 2.5e7, "125M": 1.25e8, "625M": 6.25e8}), tmp_path / "law.csv")
    report = write_report(None, csv=path, out=tmp_path / "r", n_boot=200)
    assert report.fit["status"] == "fitted" and report.fit["reason"] is None
    e, a, alpha = (report.fit[k] for k in ("E", "A", "alpha"))
    assert fit_line(report.fit) == (
        f"scaling: L(N) = E + A*N^-alpha with E = {e['estimate']:.4g} [{e['ci95'][0]:.4g}, {e['ci95'][1]:.4g}], "
        f"A = {a['estimate']:.4g} [{a['ci95'][0]:.4g}, {a['ci95'][1]:.4g}], "
        f"alpha = {alpha['estimate']:.4g} [{alpha['ci95'][0]:.4g}, {alpha['ci95'][1]:.4g}] (95% intervals)")
    lo, hi = report.fit["loss_ratio"]["ci95"]
    assert lo < hi < 1  # resampled within each budget's twelve trials: a real interval
    html = report.html.read_text()
    assert "L(N) = E + A·N^-alpha fitted to the best trial of 6 budgets" in html
    frame = trials_frame("law", csv=path)
    fig = plot_loss_vs_params(frame, report.fit)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "95% bootstrap band" in labels and "extrapolation (to 2x the largest N)" in labels
    assert fig.axes[0].get_ylim() == plot_loss_vs_params(frame, None).axes[0].get_ylim(), "the band sets no axis"


def test_two_budgets_are_too_few(tmp_path: Path) -> None:
    path = _write(_rows("two", budgets={"1M": 1e6, "5M": 5e6}), tmp_path / "two.csv")
    report = write_report("two", csv=path, out=tmp_path / "r", n_boot=100)
    assert report.fit["status"] == "too_few_budgets" and "at least 3 budgets" in report.fit["reason"]
    assert fit_line(report.fit).startswith("scaling: no law fitted (")


def test_csv_with_two_experiments_needs_experiment_and_writes_nothing(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    path = _write(_rows("a") + _rows("b"), tmp_path / "ab.csv")
    assert main(["report", "--csv", str(path), "--out", str(tmp_path / "r")]) == 2
    assert "hold 2 experiments (a, b); pass --experiment NAME" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    assert main(["report", "--out", str(tmp_path / "r")]) == 2  # a database names no experiment of its own
    assert "Reading a database needs --experiment NAME" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    assert main(["report", "--csv", str(path), "--experiment", "b", "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "b_report.html").is_file()


def test_baseline_and_tie_within_noise_in_the_answer(tmp_path: Path) -> None:
    """1M: the winner (0.999) leads the runner-up (1.000) by 0.001, while the runner-up's
    configuration, run twice, spread 1.00 / 1.02 (std 0.0141): a tie within noise.  5M: a lead
    of 0.1 over the same noise is a win."""
    rows = _rows("tie", budgets={"1M": 1e6, "5M": 5e6}, per=3)
    for r in rows:
        r.update(d_model=64, n_layers=2, d_ff=256, baseline_val_loss=1.25)
    rows[0].update(d_model=128, d_ff=512, val_loss=0.999)
    rows[1]["val_loss"], rows[2]["val_loss"] = 1.0, 1.02
    rows[3].update(d_model=128, d_ff=512, val_loss=0.9)
    rows[4]["val_loss"], rows[5]["val_loss"] = 1.0, 1.02
    report = write_report("tie", csv=_write(rows, tmp_path / "t.csv"), out=tmp_path / "r", n_boot=100)
    by = {r["budget"]: r for r in _summary(tmp_path / "r" / "tie_summary.csv")}
    noise = math.sqrt(0.02**2 / 2)
    for budget, tie in (("1M", "True"), ("5M", "False")):
        assert float(by[budget]["noise_std"]) == pytest.approx(noise, rel=1e-12)
        assert by[budget]["tie_within_noise"] == tie and float(by[budget]["baseline_val_loss"]) == 1.25
        assert by[budget]["noise_source"] == "spread of repeated runs: 1 configuration run 2 times"
    html = report.html.read_text()
    assert "<th>trivial baseline</th>" in html and "<td class='n'>1.25</td>" in html
    assert html.count("tie within noise (noise 0.014") == 1


def test_a_budget_without_repeats_says_noise_is_not_measured(tmp_path: Path) -> None:
    rows = _rows("once", budgets={"1M": 1e6}, per=2)
    rows[0].update(d_model=64, n_layers=2)
    rows[1].update(d_model=128, n_layers=4)
    report = write_report("once", csv=_write(rows, tmp_path / "o.csv"), out=tmp_path / "r", n_boot=50)
    assert report.summary is not None and report.summary["tie_within_noise"].isna().all()
    assert "noise not measured (no repeated run: --paired-seeds or --confirm measure it)" in report.html.read_text()


def test_file_list_links_and_figure_axes(tmp_path: Path) -> None:
    path = _write(_rows("figs"), tmp_path / "f.csv")
    report = write_report("figs", csv=path, out=tmp_path / "r", n_boot=50)
    html = report.html.read_text()
    assert "<li><a href='figs_summary.csv'>figs_summary.csv</a></li>" in html
    assert "<li><a href='figs_figures/val_curves.png'>figs_figures/val_curves.png</a></li>" in html
    frame = trials_frame("figs", csv=path)
    curves = plot_val_curves(frame)
    for ax in curves.axes:
        if ax.get_visible() and ax.get_xlabel() == "epoch":
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks)  # no epoch 1.5
    assert sum(ax.get_visible() for ax in curves.axes) == len(curves.axes) == 4  # four budgets: 2 x 2
    params = plot_phase1_params(frame)
    batch = params.axes[2]
    assert [t.get_text() for t in batch.get_xticklabels()] == ["64"]
    lr = params.axes[0]
    assert all(t.get_text() == "" for t in lr.xaxis.get_minorticklabels())  # no overlapping minor labels


# ----------------------------------------------------------------------------- the dashboard
def test_trials_store_architecture_dimensions_and_choices_as_params(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    settings = prepare_settings("dims", None, family="signal", family_options={"encoder": ["sum", "linear"]},
                                pins={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}, paired_seeds=2,
                                quick=True, n_trials=4)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    while (claim := q.claim({"host": "test", "device": "cpu"})) is not None:
        assert set(claim.params) == set(PARAM_NAMES)  # the worker gets the design's parameters only
        q.finish(claim, TrialState.COMPLETE, 1.0 + 0.1 * claim.number, {"duration_s": 0.1})
    study = optuna.load_study(study_name=settings.study_name, storage=url)
    for t in study.trials:
        assert {k: t.params[k] for k in ("d_model", "n_layers", "n_heads", "d_ff")} == {
            "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}
        assert t.params["encoder"] in ("sum", "linear")
        assert t.distributions["encoder"] == optuna.distributions.CategoricalDistribution(["sum", "linear"])
        assert t.distributions["d_model"] == optuna.distributions.IntDistribution(32, 32, log=True)


def test_best_json_keeps_the_design_keys_and_csv_keeps_family_metrics(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    for budget in ("100K", "200K", "500K"):
        _drive(url, budget, np.random.default_rng(0))
    out = tmp_path / "x"
    assert main(["export", "--experiment", "e2e", "--storage", url, "--out", str(out)]) == 0
    best = json.loads((out / "e2e_200K_best.json").read_text())
    assert set(best["best_params"]) == set(PARAM_NAMES)
    trial = optuna.load_study(study_name="e2e_200K", storage=url).best_trial
    assert {"d_model", "n_layers", "n_heads", "d_ff"} <= set(trial.params)
    assert best["architecture"]["d_model"] == trial.params["d_model"]
    rows = _summary(out / "experiment_results.csv")
    assert {r["val_accuracy"] for r in rows} == {"0.6"}
    assert main(["report", "--csv", str(out / "experiment_results.csv"), "--out", str(tmp_path / "r")]) == 0
    summary = _summary(tmp_path / "r" / "e2e_summary.csv")
    assert [r["val_accuracy"] for r in summary] == ["0.6", "0.6", "0.6"]
    assert "Family metrics of each budget" in (tmp_path / "r" / "e2e_report.html").read_text()
