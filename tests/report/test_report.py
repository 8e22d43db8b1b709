"""`archhpo report`: the files it writes, from CSV files (old and new) and from a real SQLite study,
on awkward experiments (a budget whose trials all failed, NaN losses, one budget only, family
metrics, categorical choices crossed with paired seeds, confirmation seeds)."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.errors import StudyError
from archhpo.report._frame import trials_frame
from archhpo.report._page import SUMMARY_COLUMNS, choice_markdown, choice_table, write_report
from archhpo.search import TrialQueue, launch, prepare_settings
from tests.conftest import TINY_DATA

OLD_COLUMNS = (
    "experiment", "trial", "budget", "horizon", "d_model", "n_layers", "n_heads", "d_ff", "param_count",
    "learning_rate", "epochs", "batch_size", "weight_decay", "warmup_steps", "val_loss", "train_loss",
    "duration_s", "timestamp",
)
NEW_COLUMNS = (*OLD_COLUMNS, "state", "phase", "plan_slot", "seed", "family", "choices", "best_epoch",
               "flops_per_sample", "train_flops", "samples_per_s", "val_curve")
BUDGETS = {"200K": 2e5, "1M": 1e6, "5M": 5e6, "25M": 2.5e7}
FIG_NAMES = {"loss_vs_params", "arch_plane", "loss_vs_depth_width", "val_curves", "phase1_params", "loss_vs_compute"}
DRAWN = FIG_NAMES - {"phase1_params"}  # _rows trains every trial with the same parameters: nothing to compare


def _law(n: float) -> float:
    return 0.3 + 40 * n**-0.3


def _rows(experiment: str = "exp", budgets: dict[str, float] = BUDGETS, per: int = 12, seed: int = 0,
          **extra: object) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for b, value in budgets.items():
        for i in range(per):
            d, layers = int(rng.choice([64, 128, 256])), int(rng.choice([2, 4, 8]))
            count = int(value * rng.uniform(0.9, 1.1))
            loss = _law(count) * (1 + rng.exponential(0.05))
            rows.append({
                "experiment": experiment, "trial": i, "budget": b, "horizon": 1, "d_model": d, "n_layers": layers,
                "n_heads": 4, "d_ff": 4 * d, "param_count": count, "learning_rate": 3e-4, "epochs": 3,
                "batch_size": 64, "weight_decay": 1e-4, "warmup_steps": 10, "val_loss": loss, "train_loss": loss,
                "duration_s": 1.0, "timestamp": "2026-01-01T00:00:00+00:00", "state": "COMPLETE",
                "phase": 1 if i < per // 2 else 2, "plan_slot": i, "seed": "", "family": "patchtst", "choices": "{}",
                "best_epoch": 3, "flops_per_sample": 6 * count, "train_flops": 6 * count * 1000,
                "samples_per_s": 100.0, "val_curve": json.dumps([[1, loss * 1.5], [2, loss * 1.1], [3, loss]]),
                **extra,
            })
    return rows


def _write(rows: list[dict], path: Path, columns: tuple[str, ...] = NEW_COLUMNS) -> Path:
    cols = list(dict.fromkeys([*columns, *(k for r in rows for k in r if k not in columns and columns is NEW_COLUMNS)]))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def _check_files(out: Path, experiment: str, n_budgets: int, drawn: set[str] = DRAWN) -> tuple[dict, list[dict], str]:
    html = (out / f"{experiment}_report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*['"]?https?://""", html), "the page fetches nothing"
    assert "<script" not in html
    assert html.count("data:image/png;base64,") == len(drawn)
    figs = out / f"{experiment}_figures"
    assert {p.name for p in figs.iterdir()} == {f"{n}.{ext}" for n in drawn for ext in ("png", "pdf")}
    assert all((figs / f"{n}.png").read_bytes().startswith(b"\x89PNG") for n in drawn)
    assert all((figs / f"{n}.pdf").read_bytes().startswith(b"%PDF") for n in drawn)
    for name in FIG_NAMES - drawn:  # each figure left out says why, in one line
        assert re.search(rf"<li>{name}: [^<]+\.</li>", html), name
    fit = json.loads((out / f"{experiment}_scaling_fit.json").read_text())
    assert {"law", "n_budgets", "points", "E", "A", "alpha", "method"} <= set(fit)
    with open(out / f"{experiment}_summary.csv") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
        summary = list(reader)
    assert len(summary) == n_budgets
    return fit, summary, html


def test_report_from_csv_answers_fits_and_draws(tmp_path: Path) -> None:
    rows = _rows()
    rows[5]["val_loss"] = 0.01 + _law(rows[5]["param_count"]) * 0.5  # a clear winner in 200K
    path = _write(rows, tmp_path / "experiment_results.csv")
    assert main(["report", "--experiment", "exp", "--csv", str(path), "--out", str(tmp_path / "r")]) == 0
    fit, summary, html = _check_files(tmp_path / "r", "exp", 4)
    assert [s["budget"] for s in summary] == list(BUDGETS)
    assert summary[0]["best_trial"] == "5" and float(summary[0]["val_loss"]) == pytest.approx(rows[5]["val_loss"])
    assert float(summary[0]["runner_up_val_loss"]) > float(summary[0]["val_loss"])
    assert summary[0]["n_complete"] == "12" and summary[0]["n_failed"] == "0"
    assert fit["n_budgets"] == 4 and fit["E"]["estimate"] > 0 and len(fit["E"]["ci95"]) == 2
    assert [p["budget"] for p in fit["points"]] == list(BUDGETS)
    # 200K's clear winner bends the points: E and A are not resolved, so the page prints no law; the loss
    # ratio's interval lies below 1, so the page never calls it "no measurable scaling"
    assert fit["status"] == "no_scaling" and fit["loss_ratio"]["ci95"][1] < 1 and "Scaling law" in html
    assert "The loss falls, but no law is resolved over 4 budgets" in html and "No measurable scaling" not in html
    assert html.index("The answer, per budget") < html.index("<h2>Figures</h2>")


def test_old_csv_without_the_new_columns(tmp_path: Path) -> None:
    path = _write(_rows(), tmp_path / "old.csv", OLD_COLUMNS)
    report = write_report("exp", csv=[path], out=tmp_path / "r", n_boot=200)
    fit, summary, html = _check_files(tmp_path / "r", "exp", 4, DRAWN - {"val_curves", "loss_vs_compute"})
    assert "<li>val_curves: no per-epoch validation curve recorded.</li>" in html
    assert "<li>loss_vs_compute: no training compute recorded (train_flops).</li>" in html
    assert fit["E"] is not None and summary[3]["budget"] == "25M"
    frame = trials_frame("exp", csv=path)
    assert frame["val_curve"].map(len).eq(0).all() and frame["train_flops"].isna().all()
    assert report.html.name == "exp_report.html"


def test_budget_whose_trials_all_failed_and_nan_losses(tmp_path: Path) -> None:
    rows = _rows()
    for r in rows:
        if r["budget"] == "1M":
            r.update(state="FAIL", val_loss="", val_curve="[]")
    nan_rows = [r for r in rows if r["budget"] == "5M"][:4]
    for r in nan_rows:
        r["val_loss"] = "nan"
    rows[0]["val_loss"] = "inf"
    path = _write(rows, tmp_path / "e.csv")
    write_report("exp", csv=path, out=tmp_path / "r", n_boot=200)
    fit, summary, html = _check_files(tmp_path / "r", "exp", 4)
    by = {s["budget"]: s for s in summary}
    assert by["1M"]["best_trial"] == "" and by["1M"]["n_failed"] == "12" and by["1M"]["n_complete"] == "0"
    assert by["5M"]["val_loss"] and math.isfinite(float(by["5M"]["val_loss"]))
    assert by["200K"]["best_trial"] != "0"
    assert fit["n_budgets"] == 3 and [p["budget"] for p in fit["points"]] == ["200K", "5M", "25M"]
    assert "no finished trial" in html


def test_one_budget_only_has_no_fit_and_says_why(tmp_path: Path) -> None:
    path = _write(_rows(budgets={"1M": 1e6}), tmp_path / "one.csv")
    write_report("exp", csv=path, out=tmp_path / "r")
    fit, summary, html = _check_files(tmp_path / "r", "exp", 1)
    assert fit["E"] is None and fit["A"] is None and fit["alpha"] is None
    assert "at least 3 budgets" in fit["reason"] and "No scaling law fitted" in html


def test_family_with_its_own_metrics(tmp_path: Path) -> None:
    rows = _rows(family="char_cls")
    for i, r in enumerate(rows):
        r.update(val_accuracy=0.5 + 0.01 * (i % 10), val_f1=0.4 + 0.01 * (i % 7))
    path = _write(rows, tmp_path / "m.csv")
    report = write_report("exp", csv=path, out=tmp_path / "r", n_boot=200)
    _, summary, html = _check_files(tmp_path / "r", "exp", 4)
    assert "val_accuracy" in summary[0] and "val_f1" in summary[0] and summary[0]["val_accuracy"]
    assert "val_accuracy" in html and "char_cls" in html
    assert report.summary is not None and report.summary["val_f1"].notna().all()


def _paired_rows(encoders: tuple[str, ...] = ("sum", "linear", "cat"), seeds: int = 5) -> list[dict]:
    rows, trial = [], 0
    offset = {"sum": 0.3, "linear": 0.0, "cat": 0.1}
    rng = np.random.default_rng(1)
    for s in range(seeds):
        base = 2.2 + rng.normal(0, 0.02)  # the seed's difficulty, shared by every encoder
        for enc in encoders:
            loss = base + offset[enc] + rng.normal(0, 0.005)
            rows.append({**_rows("audit", budgets={"d32": 1e4}, per=1)[0], "trial": trial, "budget": "d32-L2-h2-ff64",
                         "param_count": 18000 + 100 * len(enc), "seed": s, "val_loss": loss, "best_epoch": 7 + s,
                         "choices": json.dumps({"encoder": enc}), "family": "signal", "phase": 1})
            trial += 1
    return rows


def test_paired_choice_table_markdown_csv_and_html(tmp_path: Path) -> None:
    path = _write(_paired_rows(), tmp_path / "p.csv")
    write_report("audit", csv=path, out=tmp_path / "r", n_boot=200)
    table = pd.read_csv(tmp_path / "r" / "audit_choices.csv")
    assert list(table["choice"]) == ["sum", "linear", "cat"] and (table["reference"] == "sum").all()
    assert (table["n_seeds"] == 5).all() and (table["n_pairs"] == 5).all()
    lin = table[table["choice"] == "linear"].iloc[0]
    assert lin["diff_mean"] == pytest.approx(-0.3, abs=0.02)
    assert lin["diff_ci95_lo"] < lin["diff_mean"] < lin["diff_ci95_hi"] < 0  # paired: the seed noise cancels
    assert lin["best_epoch"] == pytest.approx(9.0)
    md = (tmp_path / "r" / "audit_choices.md").read_text()
    assert "| linear |" in md and "reference" in md
    html = (tmp_path / "r" / "audit_report.html").read_text()
    assert "Categorical choices over paired seeds" in html
    frame = trials_frame("audit", csv=path)
    other = choice_table(frame, reference="linear")
    assert (other["reference"] == "linear").all()
    assert other.set_index("choice").loc["sum", "diff_mean"] == pytest.approx(0.3, abs=0.02)
    with pytest.raises(StudyError, match="not one of the choices"):
        choice_table(frame, reference="nope")
    assert main(["report", "--experiment", "audit", "--csv", str(path), "--out", str(tmp_path / "r2"),
                 "--reference", "cat"]) == 0
    assert (pd.read_csv(tmp_path / "r2" / "audit_choices.csv")["reference"] == "cat").all()


def test_paired_choice_table_of_a_study_still_running(tmp_path: Path) -> None:
    """Part-way through (the audit after its first seeds): every finished choice has a row; one
    shared seed gives a bare difference, none gives "–", and a reference with no finished seed
    yet leaves the budget in the table rather than dropping it."""
    rows = _paired_rows(seeds=2)
    keep = [r for r in rows if not (json.loads(r["choices"])["encoder"] == "cat" and r["seed"] == 1)]
    frame = trials_frame("audit", csv=_write(keep, tmp_path / "p.csv"))
    md = choice_markdown(choice_table(frame, reference="cat"))
    cat = next(r for r in keep if json.loads(r["choices"])["encoder"] == "cat")
    lin0 = next(r for r in keep if json.loads(r["choices"])["encoder"] == "linear" and r["seed"] == 0)
    lin = [r["val_loss"] for r in keep if json.loads(r["choices"])["encoder"] == "linear"]
    assert (f"| linear | {np.mean(lin):.4f} ± {np.std(lin, ddof=1):.4f} (2) | 7.5 | 18,600 | "
            f"{lin0['val_loss'] - cat['val_loss']:+.4f} (1) |") in md  # one pair: the difference, no interval
    body = md.split("|---|---|---|---|---|")[1]
    assert "| cat | " in body and "| reference |" in body and "[" not in body
    cat_running = [{**r, "state": "RUNNING", "val_loss": ""} if json.loads(r["choices"])["encoder"] == "cat" else r
                   for r in rows]
    table = choice_table(trials_frame("audit", csv=_write(cat_running, tmp_path / "q.csv")), reference="cat")
    assert list(table["choice"]) == ["sum", "linear"] and (table["n_pairs"] == 0).all()
    assert table["diff_mean"].isna().all()
    assert "| – (0) |" in choice_markdown(table)


def test_confirmation_rows_give_mean_std_and_the_paired_verdict(tmp_path: Path) -> None:
    rows = _rows(budgets={"200K": 2e5, "1M": 1e6, "5M": 5e6}, per=6)
    best = min((r for r in rows if r["budget"] == "1M"), key=lambda r: r["val_loss"])
    other = sorted((r for r in rows if r["budget"] == "1M" and r["d_model"] != best["d_model"]),
                   key=lambda r: r["val_loss"])[0]
    n = 100
    for s in range(4):
        for rank, src in enumerate((best, other)):
            rows.append({**src, "trial": n, "phase": 3, "seed": s, "val_loss": src["val_loss"] + 0.01 * s + 0.001 * rank})
            n += 1
    path = _write(rows, tmp_path / "c.csv")
    write_report("exp", csv=path, out=tmp_path / "r", n_boot=200)
    _, summary, html = _check_files(tmp_path / "r", "exp", 3)
    row = {s["budget"]: s for s in summary}["1M"]
    assert float(row["confirm_mean"]) == pytest.approx(best["val_loss"] + 0.015)
    assert float(row["confirm_std"]) > 0 and row["confirm_n"] == "4"
    assert row["best_trial"] == str(best["trial"])  # confirmation retrains do not compete for "best"
    assert "Confirmation" in html


def test_csv_of_another_experiment_and_both_sources_are_refused(tmp_path: Path) -> None:
    path = _write(_rows(), tmp_path / "x.csv")
    assert main(["report", "--experiment", "other", "--csv", str(path), "--out", str(tmp_path / "r")]) == 2
    assert main(["report", "--experiment", "exp", "--csv", str(path), "--storage", "sqlite:///x.db",
                 "--out", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- a real SQLite study
def _drive(url: str, budget: str, rng: np.random.Generator, fail_all: bool = False) -> None:
    """Play workers: claim every planned trial (upkeep adds later phases) and finish it with a
    loss near the law at its exact count, a 3-epoch curve and the attrs workers write."""
    settings = prepare_settings("e2e", budget, family="patchtst", data=TINY_DATA, quick=True, n_trials=6)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    for _ in range(50):
        claim = q.claim({"host": "test", "device": "cpu"})
        if claim is None:
            if q.maintain().done:
                return
            continue
        if fail_all:
            q.finish(claim, TrialState.FAIL, None, {"fail_reason": "NonFiniteLoss: loss is nan at epoch 1"})
            continue
        loss = _law(claim.arch["param_count"]) * (1 + rng.exponential(0.05))
        for epoch, factor in ((1, 1.5), (2, 1.1), (3, 1.0)):
            q.report(claim, epoch, loss * factor)
        q.finish(claim, TrialState.COMPLETE, loss, {"duration_s": 0.1, "train_loss": loss, "best_epoch": 3,
                                                    "train_flops": 10**9, "flops_per_sample": 10**5,
                                                    "samples_per_s": 50.0, "val_accuracy": 0.6})
    raise AssertionError("the plan did not finish")


def test_end_to_end_from_a_sqlite_study_with_dashboard_notes(tmp_path: Path) -> None:
    from optuna_dashboard._note import get_note_from_system_attrs

    from archhpo.search import open_storage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    rng = np.random.default_rng(0)
    for budget in ("100K", "200K", "500K"):
        _drive(url, budget, rng)
    _drive(url, "1M", rng, fail_all=True)
    launch(url, prepare_settings("e2e", "2M", family="patchtst", data=TINY_DATA, quick=True, n_trials=6))  # not run
    out = tmp_path / "results"
    assert main(["report", "--experiment", "e2e", "--storage", url, "--out", str(out)]) == 0
    fit, summary, html = _check_files(out, "e2e", 5, FIG_NAMES - {"loss_vs_compute"})  # one train_flops value
    by = {s["budget"]: s for s in summary}
    assert set(by) == {"100K", "200K", "500K", "1M", "2M"}
    assert by["2M"]["n_complete"] == "0" and by["2M"]["best_trial"] == ""
    assert by["1M"]["n_failed"] == "6" and by["1M"]["best_trial"] == ""
    assert by["200K"]["val_accuracy"] == "0.6" and int(by["200K"]["n_complete"]) >= 5
    assert fit["n_budgets"] == 3 and fit["alpha"]["estimate"] > 0
    frame = trials_frame("e2e", storage=url)
    assert set(frame["state"]) == {"COMPLETE", "FAIL"}
    assert frame.loc[frame["state"] == "COMPLETE", "val_curve"].map(len).eq(3).all()
    assert frame["extreme"].fillna("").ne("").any() and frame["phase"].isin([1, 2]).all()
    storage = open_storage(url)
    study_id = storage.get_study_id_from_name("e2e_200K")
    note = get_note_from_system_attrs(storage.get_study_system_attrs(study_id), None)["body"]
    assert "Answer for budget 200K" in note and "val_loss" in note and "Scaling law" in note
    # export --report writes the same report again from the database
    out2 = tmp_path / "exported"
    assert main(["export", "--experiment", "e2e", "--storage", url, "--out", str(out2), "--report"]) == 0
    assert (out2 / "e2e_report.html").is_file() and (out2 / "experiment_results.csv").is_file()


def test_paired_choices_from_a_sqlite_study(tmp_path: Path) -> None:
    """A pinned-architecture study with --encoder sum,linear and --paired-seeds 3: the
    table pairs each seed's values; the reference is the first encoder listed."""
    url = f"sqlite:///{tmp_path / 'paired.db'}"
    settings = prepare_settings("pair", None, family="signal", family_options={"encoder": ["sum", "linear"]},
                                pins={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}, paired_seeds=3,
                                quick=True, n_trials=6)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    while (claim := q.claim({"host": "test", "device": "cpu"})) is not None:
        encoder = claim.arch["choices"]["encoder"]
        seed = q.storage.get_trial(claim.trial_id).user_attrs["seed"]
        loss = 2.2 + 0.1 * seed + (0.3 if encoder == "sum" else 0.0)
        q.report(claim, 1, loss + 0.5)
        q.finish(claim, TrialState.COMPLETE, loss, {"best_epoch": 2, "duration_s": 0.1})
    report = write_report("pair", storage=url, out=tmp_path / "r", n_boot=200)
    table = pd.read_csv(tmp_path / "r" / "pair_choices.csv")
    assert list(table["choice"]) == ["sum", "linear"] and (table["reference"] == "sum").all()
    assert (table["n_seeds"] == 3).all()
    lin = table.set_index("choice").loc["linear"]
    assert lin["diff_mean"] == pytest.approx(-0.3) and lin["n_pairs"] == 3
    assert report.summary is not None and report.summary["budget"].tolist() == [settings.budget]
    assert report.fit["E"] is None and report.notes_written == 1
