"""The winner chosen on means (the issue's "finalists confirmed"): where a budget ran a
confirmation, its answer in the best JSON, the summary table and the report is the confirmed
architecture with the lowest mean over the confirmation seeds every finalist finished (a paired
comparison), not the best single phase-1/2 trial; a reversal of the phase-1/2 order is said so.
A study without a confirmation keeps its outputs as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from optuna.trial import TrialState

from archhpo.report import export_studies
from archhpo.report._confirm import CHOSEN_ON_MEAN, chosen_on_means, confirmation_summary
from archhpo.report._frame import best_and_runner_up, trials_frame
from archhpo.report._page import write_report
from archhpo.report._summary import CHOICE_COLUMNS, SUMMARY_COLUMNS, SUMMARY_EXTRA
from archhpo.search import TrialQueue, launch, open_storage, prepare_settings
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}


def _play(url: str, confirm: int, confirmed: dict[tuple[int, int], float]) -> tuple[str, dict[int, int]]:
    """A tiny study played to the end: phase 1-2 values by slot (slot 0 best), phase 3 values by
    (rank, seed) from `confirmed`; its name and, per rank, the phase-1/2 trial it was selected by."""
    settings = prepare_settings("cm", "500K", n_trials=6, data=TINY_DATA, quick=True, seed=0, pruner="none",
                                confirm=confirm, confirm_seeds=2)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    rank_of = {e.slot: e.rank for e in settings.plan if e.phase == 3}
    for _ in range(10):
        while (c := q.claim(WORKER)) is not None:
            value = confirmed[(rank_of[c.slot], c.seed)] if c.phase == 3 else 1.0 + 0.01 * c.slot
            q.finish(c, TrialState.COMPLETE, value, {"duration_s": 0.1, "train_loss": value})
        if q.maintain().done:
            break
    assert q.maintain().done
    stored = q.storage.get_study_user_attrs(q.study_id).get("archhpo_phase3") or []
    return settings.study_name, {int(r["rank"]): int(r["trial"]) for r in stored}


# rank 0 (the phase-1/2 best) against rank 1 over seeds 0 and 1: rank 1's mean is lower
REVERSED = {(0, 0): 0.90, (0, 1): 0.92, (1, 0): 0.85, (1, 1): 0.87}
KEPT = {(0, 0): 0.80, (0, 1): 0.82, (1, 0): 0.85, (1, 1): 0.87}


def test_a_confirmation_that_reverses_the_order_names_the_better_mean(sqlite_url: str, tmp_path: Path) -> None:
    name, selected = _play(sqlite_url, 2, REVERSED)
    assert set(selected) == {0, 1}
    export_studies(open_storage(sqlite_url), [name], tmp_path / "x")
    best = json.loads((tmp_path / "x" / f"{name}_best.json").read_text())
    assert best["best_trial"] == selected[1], "rank 1's architecture has the lower confirmation mean"
    assert (best["chosen_on"], best["reverses_trial"]) == (CHOSEN_ON_MEAN, selected[0])
    conf = best["confirmation"]
    rank1 = next(a for a in conf["architectures"] if a["rank"] == 1)
    assert best["architecture"] == {k: rank1["architecture"][k] for k in best["architecture"]}
    assert best["best_value"] == rank1["selection_value"] > conf["architectures"][0]["selection_value"]
    assert conf["chosen"]["means"] == pytest.approx({"0": 0.91, "1": 0.86}) and conf["chosen"]["seeds"] == [0, 1]
    assert conf["statement"].startswith("Rank 1 did better than the phase-1/2 best by 0.050 on 2 seeds; ")
    assert "reversing the phase-1/2 order" in conf["statement"] and "the winner" not in conf["statement"]
    report = write_report("cm", storage=sqlite_url, out=tmp_path / "r", n_boot=50, notes=False)
    row = report.summary.iloc[0]
    assert (row["best_trial"], row["runner_up_trial"]) == (selected[1], selected[0])
    assert (row["chosen_on"], row["reverses_trial"]) == (CHOSEN_ON_MEAN, selected[0])
    assert row["confirm_mean"] == pytest.approx(0.86), "the winner's own confirmation mean"
    assert row["gap"] < 0, "on single phase-1/2 trials the displaced architecture was better"
    written = pd.read_csv(tmp_path / "r" / "cm_summary.csv")
    assert list(written.columns[-len(CHOICE_COLUMNS):]) == list(CHOICE_COLUMNS)
    assert written.loc[0, "reverses_trial"] == selected[0]
    assert "reversing the phase-1/2 order" in (tmp_path / "r" / "cm_report.html").read_text()
    assert report.fit["points"][0]["trial"] == selected[1], "the fit reads the same answer"


def test_a_confirmation_that_agrees_keeps_the_best_trial(sqlite_url: str, tmp_path: Path) -> None:
    name, selected = _play(sqlite_url, 2, KEPT)
    export_studies(open_storage(sqlite_url), [name], tmp_path / "x")
    best = json.loads((tmp_path / "x" / f"{name}_best.json").read_text())
    assert best["best_trial"] == selected[0] == 0 and best["best_value"] == 1.0
    assert (best["chosen_on"], best["reverses_trial"]) == (CHOSEN_ON_MEAN, None)
    assert best["confirmation"]["statement"].startswith("The winner leads the runner-up by 0.050 on 2 seeds; ")
    assert "keeps its place" in best["confirmation"]["statement"]
    frame = trials_frame("cm", storage=sqlite_url)
    winner, runner = best_and_runner_up(frame)["500K"]
    assert winner is not None and runner is not None
    assert (int(winner["trial"]), int(runner["trial"])) == (selected[0], selected[1])


def test_one_confirmed_architecture_stays_chosen_on_its_best_trial(sqlite_url: str, tmp_path: Path) -> None:
    name, selected = _play(sqlite_url, 1, {(0, 0): 0.9, (0, 1): 0.8})
    export_studies(open_storage(sqlite_url), [name], tmp_path / "x")
    best = json.loads((tmp_path / "x" / f"{name}_best.json").read_text())
    assert (best["best_trial"], best["chosen_on"], best["reverses_trial"]) == (selected[0], "best trial", None)
    assert best["confirmation"]["chosen"] is None, "nothing to compare the one finalist with"


def test_a_study_without_confirmation_keeps_its_outputs(sqlite_url: str, tmp_path: Path) -> None:
    name, selected = _play(sqlite_url, 0, {})
    assert selected == {}
    export_studies(open_storage(sqlite_url), [name], tmp_path / "x")
    best = json.loads((tmp_path / "x" / f"{name}_best.json").read_text())
    assert "chosen_on" not in best and "confirmation" not in best and best["best_trial"] == 0
    report = write_report("cm", storage=sqlite_url, out=tmp_path / "r", n_boot=50, notes=False)
    assert list(report.summary.columns) == [*SUMMARY_COLUMNS, *SUMMARY_EXTRA]


def test_the_means_are_taken_over_the_seeds_every_finalist_finished() -> None:
    arch = [{"d_model": d, "n_layers": 2, "n_heads": 4, "d_ff": 2 * d, "param_count": d} for d in (64, 128)]
    rows = [{**a, "trial": i, "phase": 1, "state": "COMPLETE", "val_loss": 0.5 + 0.01 * i, "choices": "{}"}
            for i, a in enumerate(arch)]
    # seed 2 of rank 0 is a bad draw its rival never ran: the paired means leave it out
    for n, (rank, seed, v) in enumerate([(0, 0, 0.60), (1, 0, 0.55), (0, 1, 0.60), (1, 1, 0.55), (0, 2, 0.10)]):
        rows.append({**arch[rank], "trial": 10 + n, "phase": 3, "seed": seed, "state": "COMPLETE", "val_loss": v,
                     "choices": "{}"})
    out = confirmation_summary(rows)
    assert out["architectures"][0]["mean"] == pytest.approx(1.3 / 3), "rank 0's own mean counts its 3 seeds"
    chosen = out["chosen"]
    assert chosen["seeds"] == [0, 1] and chosen["rank"] == 1 and chosen["reversed"] and chosen["trials"] == {
        "0": 0, "1": 1}
    assert chosen_on_means([a for a in out["architectures"] if a["rank"] == 1]) is None, "rank 0 is needed"
