"""The winner chosen on means (the issue's "finalists confirmed"): where a budget ran a
confirmation, its answer in the best JSON, the summary table and the report is the confirmed
architecture with the lowest mean over its confirmation runs on the seeds every finalist finished
plus its phase-1/2 trials trained with exactly the same parameters (its search trial is one more
seed of the same configuration), not the best single phase-1/2 trial; a reversal of the phase-1/2
order is said so, and so are the runs each mean is over.  A study without a confirmation keeps its
outputs as they were."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from optuna.trial import TrialState

from archhpo.report import RESULTS_CSV, export_studies
from archhpo.report._confirm import CHOSEN_ON_MEAN, chosen_on_means, confirmation_summary
from archhpo.report._frame import best_and_runner_up, trials_frame
from archhpo.report._page import write_report
from archhpo.report._summary import CHOICE_COLUMNS, SUMMARY_COLUMNS, SUMMARY_EXTRA
from archhpo.search import TrialQueue, launch, open_storage, prepare_settings
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}


def _play(url: str, confirm: int, confirmed: dict[tuple[int, int], float],
          searched: dict[int, float] | None = None) -> tuple[str, dict[int, int]]:
    """A tiny study played to the end: phase 1 values by slot (`searched`, else 1 + 0.01 x slot:
    slot 0 best), phase 3 values by (rank, seed) from `confirmed`; its name and, per rank, the
    phase-1/2 trial it was selected by.  The plan (6 slots, all phase 1) trains architectures 15, 20
    and 40 at slots 0-2 and again at slots 3-5, each time with other training parameters."""
    settings = prepare_settings("cm", "500K", n_trials=6, data=TINY_DATA, quick=True, seed=0, pruner="none",
                                confirm=confirm, confirm_seeds=2)
    assert [e.arch_idx for e in settings.plan if e.phase == 1] == [15, 20, 40, 15, 20, 40]
    assert settings.plan[0].params != settings.plan[3].params
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    rank_of = {e.slot: e.rank for e in settings.plan if e.phase == 3}
    for _ in range(10):
        while (c := q.claim(WORKER)) is not None:
            value = (confirmed[(rank_of[c.slot], c.seed)] if c.phase == 3
                     else (searched or {}).get(c.slot, 1.0 + 0.01 * c.slot))
            q.finish(c, TrialState.COMPLETE, value, {"duration_s": 0.1, "train_loss": value})
        if q.maintain().done:
            break
    assert q.maintain().done
    stored = q.storage.get_study_user_attrs(q.study_id).get("archhpo_phase3") or []
    return settings.study_name, {int(r["rank"]): int(r["trial"]) for r in stored}


# rank 0 (the phase-1/2 best, search trial 1.00) against rank 1 (1.01) over seeds 0 and 1: with its
# search trial rank 0's mean is (0.90 + 0.92 + 1.00) / 3 = 0.94, rank 1's (0.85 + 0.87 + 1.01) / 3 = 0.91
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
    chosen = conf["chosen"]
    assert chosen["means"] == pytest.approx({"0": 0.94, "1": 0.91}) and chosen["seeds"] == [0, 1]
    # Each mean: 2 confirmation seeds and the one search trial trained as they were (slots 3 and 4 trained
    # the same architectures with other parameters and stay out).
    assert chosen["n"] == {"0": 3, "1": 3} and chosen["search_trials"] == {"0": [selected[0]], "1": [selected[1]]}
    assert (f"rank 1: 3 runs (search trial(s) {selected[1]}); rank 0: 3 runs (search trial(s) {selected[0]})"
            in conf["statement"])
    assert conf["statement"].startswith("Rank 1 did better than the phase-1/2 best by 0.050 on 2 seeds; ")
    assert "reversing the phase-1/2 order" in conf["statement"] and "the winner" not in conf["statement"]
    report = write_report("cm", storage=sqlite_url, out=tmp_path / "r", n_boot=50, notes=False)
    row = report.summary.iloc[0]
    assert (row["best_trial"], row["runner_up_trial"]) == (selected[1], selected[0])
    assert (row["chosen_on"], row["reverses_trial"]) == (CHOSEN_ON_MEAN, selected[0])
    assert row["confirm_mean"] == pytest.approx(0.86), "the winner's own confirmation mean (its seeds only)"
    assert row["chosen_mean"] == pytest.approx(0.91) and row["chosen_n"] == 3, "what it was chosen on"
    assert row["gap"] < 0, "on single phase-1/2 trials the displaced architecture was better"
    written = pd.read_csv(tmp_path / "r" / "cm_summary.csv")
    assert list(written.columns[-len(CHOICE_COLUMNS):]) == list(CHOICE_COLUMNS)
    assert written.loc[0, "reverses_trial"] == selected[0] and written.loc[0, "chosen_n"] == 3
    assert "reversing the phase-1/2 order" in (tmp_path / "r" / "cm_report.html").read_text()
    assert report.fit["points"][0]["trial"] == selected[1], "the fit reads the same answer"


# Confirmation alone reverses (rank 1's 0.86 against rank 0's 0.91); each finalist's search trial (slot 0:
# 0.70, slot 1: 0.81) keeps rank 0: (0.90 + 0.92 + 0.70) / 3 = 0.84 against (0.85 + 0.87 + 0.81) / 3 = 0.8433.
# Slot 3 trained rank 0's architecture with other parameters: counted it would give rank 0 (2.52 + 1.03) / 4.
SEARCHED = {0: 0.70, 1: 0.81, 2: 1.20, 3: 1.03, 4: 1.04, 5: 1.05}


def test_the_search_trial_decides_where_the_confirmation_runs_alone_would_reverse(sqlite_url: str,
                                                                                 tmp_path: Path) -> None:
    name, selected = _play(sqlite_url, 2, REVERSED, SEARCHED)
    assert selected == {0: 0, 1: 1}
    export_studies(open_storage(sqlite_url), [name], tmp_path / "x")
    best = json.loads((tmp_path / "x" / f"{name}_best.json").read_text())
    assert (best["best_trial"], best["chosen_on"], best["reverses_trial"]) == (0, CHOSEN_ON_MEAN, None)
    conf = best["confirmation"]
    chosen = conf["chosen"]
    assert chosen["order"] == [0, 1] and not chosen["reversed"]
    assert chosen["means"] == pytest.approx({"0": 0.84, "1": 2.53 / 3}, abs=1e-12)
    assert chosen["n"] == {"0": 3, "1": 3} and chosen["search_trials"] == {"0": [0], "1": [1]}, "not slots 3, 4"
    assert [a["mean"] for a in conf["architectures"]] == pytest.approx([0.91, 0.86]), "confirmation alone: rank 1"
    # The paired comparison, the noise statement, still reads the confirmation seeds alone.
    assert conf["comparison"]["lead"] == pytest.approx(-0.05)
    assert conf["statement"].startswith("The runner-up did better than the winner by 0.050 on 2 seeds; ")
    assert ("each finalist's mean over confirmation seed(s) 0, 1 and its phase-1/2 trials trained with the same "
            "parameters (rank 0: 3 runs (search trial(s) 0); rank 1: 3 runs (search trial(s) 1)): the phase-1/2 "
            "best (rank 0) keeps its place, 0.840 against rank 1's 0.843.") in conf["statement"]
    # The same choice from experiment_results.csv (every value a string, floats as written) as from the database.
    with open(tmp_path / "x" / RESULTS_CSV) as fh:
        assert confirmation_summary(list(csv.DictReader(fh)))["chosen"] == chosen
    frame = trials_frame("cm", storage=sqlite_url)
    winner, runner = best_and_runner_up(frame)["500K"]
    assert winner is not None and runner is not None and (int(winner["trial"]), int(runner["trial"])) == (0, 1)


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


P = {"learning_rate": 3e-4, "weight_decay": 1e-4, "epochs": 50, "batch_size": 64, "warmup_steps": 200}
ARCHS = [{"d_model": d, "n_layers": 2, "n_heads": 4, "d_ff": 2 * d, "param_count": d} for d in (64, 128)]


def _row(rank: int, trial: int, phase: int, value: float, seed: int | None = None, **params: float) -> dict:
    return {**ARCHS[rank], "trial": trial, "phase": phase, "seed": seed, "state": "COMPLETE", "val_loss": value,
            "choices": "{}", **params}


def test_the_means_are_taken_over_the_seeds_every_finalist_finished() -> None:
    # Rows without training parameters (a CSV written before they were read): no search trial can be
    # matched to a confirmation, so the means are over the confirmation seeds alone.
    rows = [_row(0, 0, 1, 0.50), _row(1, 1, 1, 0.51)]
    # seed 2 of rank 0 is a bad draw its rival never ran: the paired means leave it out
    for n, (rank, seed, v) in enumerate([(0, 0, 0.60), (1, 0, 0.55), (0, 1, 0.60), (1, 1, 0.55), (0, 2, 0.10)]):
        rows.append(_row(rank, 10 + n, 3, v, seed))
    out = confirmation_summary(rows)
    assert out["architectures"][0]["mean"] == pytest.approx(1.3 / 3), "rank 0's own mean counts its 3 seeds"
    assert out["architectures"][0]["params"] is None
    chosen = out["chosen"]
    assert chosen["seeds"] == [0, 1] and chosen["rank"] == 1 and chosen["reversed"] and chosen["trials"] == {
        "0": 0, "1": 1}
    assert chosen["n"] == {"0": 2, "1": 2} and chosen["search_trials"] == {"0": [], "1": []}
    assert chosen["means"] == {"0": 0.60, "1": 0.55}
    assert "rank 1: 2 runs (no search trial with those parameters)" in out["statement"]
    assert chosen_on_means([a for a in out["architectures"] if a["rank"] == 1]) is None, "rank 0 is needed"


def test_search_trials_with_the_confirmations_parameters_decide_a_reversal() -> None:
    # Both finalists confirmed with P. Rank 0 was searched twice with P (0.50, then a bad 0.70; a ladder
    # carries an architecture up more than once with the same parameters), rank 1 once with P (0.51) and
    # once with other parameters (0.70).  Confirmation alone keeps rank 0 (0.60 against 0.61); counting the
    # runs with P reverses it: (0.50 + 0.70 + 1.20) / 4 = 0.60 against (0.51 + 1.22) / 3 = 0.5767.  Counted,
    # rank 1's other-parameters run would undo the reversal: (0.51 + 0.70 + 1.22) / 4 = 0.6075.
    other = {**P, "learning_rate": 3.0000000000000003e-4}  # one ulp off: not the same configuration
    rows = [_row(0, 0, 1, 0.50, **P), _row(1, 1, 1, 0.51, **P), _row(0, 2, 2, 0.70, **P), _row(1, 3, 2, 0.70, **other)]
    for n, (rank, seed, v) in enumerate([(0, 0, 0.60), (1, 0, 0.61), (0, 1, 0.60), (1, 1, 0.61)]):
        rows.append(_row(rank, 10 + n, 3, v, seed, **P))
    out = confirmation_summary(rows)
    assert [a["mean"] for a in out["architectures"]] == pytest.approx([0.60, 0.61])
    assert out["architectures"][0]["params"] == P
    chosen = out["chosen"]
    assert chosen["rank"] == 1 and chosen["reversed"] and chosen["order"] == [1, 0]
    assert chosen["search_trials"] == {"0": [0, 2], "1": [1]} and chosen["n"] == {"0": 4, "1": 3}
    assert chosen["means"] == pytest.approx({"0": 0.60, "1": 1.73 / 3}, abs=1e-12)
    assert ("rank 1: 3 runs (search trial(s) 1); rank 0: 4 runs (search trial(s) 0, 2)): rank 1 (best phase-1/2 "
            "trial 1) has the lower mean, 0.577 against rank 0's 0.600, reversing the phase-1/2 order.") in out[
        "statement"]
    # The noise statement is the paired confirmation comparison as before: rank 0 ahead by 0.010 on 2 seeds.
    assert out["comparison"]["lead"] == pytest.approx(0.01) and out["comparison"]["n_pairs"] == 2


def test_ties_go_to_the_better_rank_and_the_choice_is_deterministic() -> None:
    archs = [{"rank": r, "values": {"0": 0.6, "1": 0.6}, "selection_trial": r, "params": P} for r in (1, 0)]
    search = {r: [{"trial": r, "value": 0.5, "params": P}] for r in (0, 1)}
    first = chosen_on_means(archs, search)
    assert first is not None and first["order"] == [0, 1] and not first["reversed"]
    assert chosen_on_means(list(reversed(archs)), search) == first


def test_a_one_seed_confirmation_is_graded_by_the_finalists_pooled_seed_noise() -> None:
    """--ladder's 3 x 1: each finalist has its search trial and one confirmation seed, too few shared
    seeds for the paired interval; the pooled within-finalist spread grades the lead instead."""
    from scipy import stats

    from archhpo.report._confirm import pooled_lead

    rows = [_row(0, 0, 1, 0.50, **P), _row(1, 1, 1, 0.52, **P)]
    rows += [_row(0, 10, 3, 0.54, 0, **P), _row(1, 11, 3, 0.55, 0, **P)]
    out = confirmation_summary(rows)
    assert out["comparison"]["ci95"] is None and "3 or more complete pairs" in out["statement"]
    pooled = out["chosen"]["pooled"]
    # runs 0.50, 0.54 (mean 0.52) and 0.52, 0.55 (mean 0.535): squares 0.0008 + 0.00045 over 2 df
    sd = (0.00125 / 2) ** 0.5
    assert pooled["df"] == 2 and pooled["n_runs"] == 4 and pooled["pooled_std"] == pytest.approx(sd, rel=1e-12)
    assert pooled["lead"] == pytest.approx(0.015, rel=1e-12) and pooled["se"] == pytest.approx(sd, rel=1e-12)
    half = stats.t.ppf(0.975, 2) * sd
    assert pooled["ci95"] == pytest.approx([0.015 - half, 0.015 + half], rel=1e-12) and pooled["within_noise"]
    assert ("Rank 0's lead of 0.015 over rank 1 lies within the finalists' pooled seed noise (pooled seed std "
            "0.025 over the finalists' 4 runs, 2 degrees of freedom") in out["statement"]
    assert out["statement"].endswith(": the two are tied.")
    clear = pooled_lead({0: [0.50, 0.501, 0.499], 1: [0.60, 0.601, 0.599]}, 0, 1)
    assert clear is not None and not clear["within_noise"] and clear["ci95"][0] > 0
    assert pooled_lead({0: [0.5], 1: [0.6]}, 0, 1) is None, "one run each: no degree of freedom"


def test_one_pooled_seed_std_serves_the_budgets_noise_and_the_confirmations_lead() -> None:
    from archhpo.search._noise import pooled_std

    groups = [[0.50, 0.54], [0.52, 0.55, 0.58], [0.7]]  # a single run adds no degree of freedom
    sd, df = pooled_std(groups)  # type: ignore[misc]
    assert df == 3 and sd == pytest.approx(((0.02**2 * 2) + (0.03**2 * 2)) ** 0.5 / 3**0.5, rel=1e-12)
    assert pooled_std([[0.5], [0.6]]) is None and pooled_std([]) is None
