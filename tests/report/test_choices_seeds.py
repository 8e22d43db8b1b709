"""Categorical choices as a grid dimension, pinned architectures (studies without a budget),
fixed training parameters and paired seeds: plan, naming, launch identity, a worker, export."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from archhpo.cli import main
from archhpo.errors import ArchhpoError, BudgetError, ConfigError, StudyError
from archhpo.report import SPEC_COLUMNS
from archhpo.search import TrialQueue, launch, prepare_settings, study_label
from tests.conftest import TINY_DATA

SIGNAL_DATA = "multisignal:series=32"
PIN = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}


def _signal(**kw):  # type: ignore[no-untyped-def]
    args = {"family": "signal", "data": SIGNAL_DATA, "quick": True,
            "family_options": {"encoder": ["sum", "linear", "linear-ppe"]}}
    return prepare_settings("enc", kw.pop("budget", None), **{**args, **kw})


# ----------------------------------------------------------------------------- choices
def test_a_listed_family_flag_becomes_a_grid_dimension() -> None:
    s = _signal(budget="150K", n_trials=12)
    assert s.choices == {"encoder": ["sum", "linear", "linear-ppe"]} and "encoder" not in s.options.keys
    assert [a["arch_idx"] for a in s.archs] == list(range(len(s.archs)))
    per = {c: [a for a in s.archs if a["choices"] == {"encoder": c}] for c in s.choices["encoder"]}
    assert all(per.values()), "every choice has rows"
    # The exact count depends on the choice: the same shape has other counts under other encoders.
    shape = ("d_model", "n_layers", "n_heads", "d_ff")
    counts = {c: {tuple(a[k] for k in shape): a["param_count"] for a in rows} for c, rows in per.items()}
    common = set(counts["sum"]) & set(counts["linear"])
    assert common and any(counts["sum"][k] != counts["linear"][k] for k in common)
    # The plan spreads over the choices (round-robin) and includes every choice's extremes.
    planned = [s.archs[e.arch_idx]["choices"]["encoder"] for e in s.plan if e.phase == 1 and e.arch_idx is not None]
    assert {c: planned.count(c) for c in per} == {c: planned.count("sum") for c in per}
    extremes = {a["arch_idx"] for a in s.archs if a["extreme"]}
    assert extremes <= {e.arch_idx for e in s.plan}


def test_without_choices_the_plan_is_unchanged() -> None:
    from archhpo.budgets import build_grid
    from archhpo.models import get_family
    from archhpo.search import FULL_SPACE, make_plan, spread_order

    s = prepare_settings("p", "2M")
    rows = build_grid(get_family("patchtst"), 2_000_000, s.info)
    assert make_plan(rows, 50, FULL_SPACE, 0) == s.plan
    assert [e.arch_idx for e in s.plan[:20]] == spread_order(rows, 0)[:20]
    assert all(a["choices"] == {} for a in s.archs)


def test_a_choice_that_shapes_the_data_or_is_unknown_is_refused() -> None:
    with pytest.raises(StudyError, match="--channels shapes the data"):
        _signal(budget="150K", family_options={"channels": [4, 8]})
    with pytest.raises(ConfigError, match="--encoder bogus"):
        _signal(budget="150K", family_options={"encoder": ["sum", "bogus"]})
    with pytest.raises(StudyError, match="twice"):
        _signal(budget="150K", family_options={"encoder": ["sum", "sum"]})


# ----------------------------------------------------------------------------- pins
def test_pinned_study_without_a_budget_has_a_readable_unique_name() -> None:
    s = _signal(pins=PIN, n_trials=50)
    assert s.budget == "d64-L2-h4-ff128" and s.study_name == "enc_d64-L2-h4-ff128" and s.budget_value == 0
    assert len(s.archs) == 3 and {a["d_model"] for a in s.archs} == {64}
    assert len(s.plan) == 3 * 2, "a small grid shrinks the plan: 3 configurations, two trials each"
    lists = _signal(pins={**PIN, "n_layers": [3, 2]})
    assert lists.budget == "d64-L2+3-h4-ff128" and len(lists.archs) == 6
    assert study_label("2M", {"n_layers": [2]}) == "2M-L2"
    with pytest.raises(StudyError, match="--budget"):
        study_label(None, {})


def test_pins_within_a_budget_filter_its_grid() -> None:
    full = prepare_settings("p", "2M")
    pinned = prepare_settings("p", "2M", pins={"n_layers": [2, 3]})
    assert pinned.budget == "2M-L2+3"
    want = [(a["d_model"], a["n_heads"], a["d_ff"], a["param_count"]) for a in full.archs if a["n_layers"] in (2, 3)]
    assert [(a["d_model"], a["n_heads"], a["d_ff"], a["param_count"]) for a in pinned.archs] == want
    with pytest.raises(BudgetError, match="drop --budget"):
        prepare_settings("p", "2M", pins={"d_model": [2048]})


def test_fixed_training_parameters_are_used_exactly() -> None:
    fixed = {"learning_rate": 3e-4, "epochs": 3, "warmup_steps": 0}
    s = prepare_settings("p", "200K", data=TINY_DATA, quick=True, fixed_params=fixed)
    for e in s.plan:
        if e.params:
            assert {k: e.params[k] for k in fixed} == fixed
    assert s.space["epochs"] == [3] and s.space["learning_rate"] == [3e-4, 3e-4]
    with pytest.raises(BudgetError):
        prepare_settings("p", "200K", fixed_params={"epochs": 0})


# ----------------------------------------------------------------------------- paired seeds
def test_paired_plan_trains_every_configuration_with_every_seed() -> None:
    s = _signal(pins=PIN, paired_seeds=3)
    assert s.options.paired_seeds == 3
    assert [(e.seed, e.arch_idx) for e in s.plan] == [(sd, a) for sd in range(3) for a in range(3)]
    assert {e.phase for e in s.plan} == {1}, "no phase 2 in a paired study"
    assert len({json.dumps(e.params, sort_keys=True) for e in s.plan}) == 1, "one set of parameters"
    # --trials caps the configurations; each is trained with every seed.
    capped = _signal(budget="150K", paired_seeds=2, n_trials=6)
    assert len(capped.plan) == 6 * 2 and len({e.arch_idx for e in capped.plan}) == 6


def test_paired_parameters_come_from_flags_then_family_defaults() -> None:
    s = prepare_settings("enc", None, family="signal", data=SIGNAL_DATA, pins=PIN, paired_seeds=2,
                         fixed_params={"epochs": 7})
    p = s.plan[0].params
    assert p == {"learning_rate": 3e-4, "epochs": 7, "batch_size": 32, "weight_decay": 1e-4, "warmup_steps": 0}


def test_paired_pinned_study_end_to_end(sqlite_url: str, tmp_path: Path) -> None:
    """launch (CLI) → a plain worker addressed by the pins → export by --study: every
    (configuration, seed) once, the seed and choice in the CSV and best JSON; relaunch identity."""
    import torch

    from archhpo.workers import Worker

    torch.set_num_threads(1)
    url = sqlite_url
    pins = ["--d-model", "64", "--n-layers", "2", "--n-heads", "4", "--d-ff", "128"]
    common = ["--experiment", "enc", "--family", "signal", "--data", SIGNAL_DATA, "--quick", "--epochs", "2",
              "--storage", url, *pins]
    assert main(["launch", *common, "--encoder", "sum,linear", "--paired-seeds", "2"]) == 0
    name = "enc_d64-L2-h4-ff128"
    summary = Worker([TrialQueue(url, name)], device="cpu", threads=1).run()
    assert summary.complete == 4 and summary.failed == 0
    out = tmp_path / "res"
    assert main(["export", "--experiment", "enc", "--study", name, "--storage", url, "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "experiment_results.csv").open()))
    assert tuple(rows[0])[: len(SPEC_COLUMNS)] == SPEC_COLUMNS
    got = sorted((json.loads(r["choices"])["encoder"], r["seed"]) for r in rows)
    assert got == [("linear", "0"), ("linear", "1"), ("sum", "0"), ("sum", "1")]
    assert {r["budget"] for r in rows} == {"d64-L2-h4-ff128"} and {r["family"] for r in rows} == {"signal"}
    assert all(json.loads(r["val_curve"]) for r in rows)
    best = json.loads((out / f"{name}_best.json").read_text())
    assert best["choices"]["encoder"] in ("sum", "linear") and best["seed"] in (0, 1)
    assert best["architecture"]["d_model"] == 64 and best["study_name"] == name
    assert [p["n"] for p in best["paired"]] == [2, 2]
    # Export addressed by the pins gives the same file; a relaunch adds nothing; other choices refused.
    assert main(["export", "--experiment", "enc", *pins, "--storage", url, "--out", str(out)]) == 0
    assert launch(url, prepare_settings("enc", None, family="signal", data=SIGNAL_DATA, quick=True,
                                        family_options={"encoder": ["sum", "linear"]}, pins=PIN,
                                        paired_seeds=2, fixed_params={"epochs": 2})).enqueued == 0
    with pytest.raises(StudyError, match="choices"):
        launch(url, prepare_settings("enc", None, family="signal", data=SIGNAL_DATA, quick=True,
                                     family_options={"encoder": ["sum", "cat"]}, pins=PIN, paired_seeds=2,
                                     fixed_params={"epochs": 2}))
    assert main(["worker", "--experiment", "enc", "--study", "enc_nope", "--storage", url]) == 2


def test_paired_and_confirm_together_are_refused_before_writing(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    rc = main(["launch", "--experiment", "x", "--budget", "200K", "--paired-seeds", "2", "--confirm", "2",
               "--storage", f"sqlite:///{db}"])
    assert rc == 2 and not db.exists()
    with pytest.raises(ArchhpoError):
        prepare_settings("x", "200K", paired_seeds=-1)


def test_relaunch_identity_covers_pins_seeds_and_confirmation(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    base = {"family": "signal", "data": SIGNAL_DATA, "quick": True, "pins": PIN}
    launch(url, prepare_settings("id", None, **base, paired_seeds=2))
    with pytest.raises(StudyError, match="options"):
        launch(url, prepare_settings("id", None, **base, paired_seeds=3))
    with pytest.raises(StudyError, match="space"):
        launch(url, prepare_settings("id", None, **base, paired_seeds=2, fixed_params={"epochs": 4}))
    launch(url, prepare_settings("id", "150K", family="signal", data=SIGNAL_DATA, quick=True, n_trials=6))
    with pytest.raises(StudyError, match="options"):
        launch(url, prepare_settings("id", "150K", family="signal", data=SIGNAL_DATA, quick=True, n_trials=6,
                                     confirm=1, confirm_seeds=2))
    assert launch(url, prepare_settings("id", None, **base, paired_seeds=2)).enqueued == 0


def test_paired_study_stays_paired_under_the_default_pruner(storage_url: str, tmp_path: Path) -> None:
    """With the default (median) pruner, every (configuration, seed) of a paired
    study trains to the end, and the choice table gives each difference over all pairs with its
    count (an interval only from 3 pairs on)."""
    import torch

    from archhpo.workers import Worker

    torch.set_num_threads(1)
    pins = ["--d-model", "64", "--n-layers", "2,3", "--n-heads", "4", "--d-ff", "128"]
    assert main(["launch", "--experiment", "enc", "--family", "signal", "--data", SIGNAL_DATA, "--quick",
                 "--epochs", "3", "--storage", storage_url, *pins, "--encoder", "sum,linear",
                 "--paired-seeds", "3"]) == 0
    q = TrialQueue(storage_url, "enc_d64-L2+3-h4-ff128")
    assert q.settings.pruner == "median" and len(q.settings.plan) == 4 * 3
    Worker([q], device="cpu", threads=1).run()
    trials = q.storage.get_all_trials(q.study_id)
    assert sorted(t.state.name for t in trials) == ["COMPLETE"] * 12, [(t.number, t.state.name) for t in trials]
    # The signal family validates every 20 epochs and at the last: each trial reached epoch 3.
    assert all(max(t.intermediate_values) == 3 for t in trials), "every seed trained all 3 epochs"
    out = tmp_path / "res"
    assert main(["report", "--experiment", "enc", "--storage", storage_url, "--out", str(out)]) == 0
    table = {r["choice"]: r for r in csv.DictReader((out / "enc_choices.csv").open())}
    assert set(table) == {"sum", "linear"} and table["linear"]["n_pairs"] == "3"
    best = {}  # per (encoder, seed): the best of its two architectures
    for t in trials:
        key = (t.user_attrs["choices"]["encoder"], t.user_attrs["seed"])
        best[key] = min(best.get(key, t.value), t.value)
    diffs = [best[("linear", s)] - best[("sum", s)] for s in range(3)]
    assert float(table["linear"]["diff_mean"]) == pytest.approx(sum(diffs) / 3)
    assert float(table["linear"]["diff_ci95_lo"]) <= float(table["linear"]["diff_ci95_hi"])


def test_the_choice_table_gives_no_interval_from_fewer_than_three_pairs(tmp_path: Path) -> None:
    """Two pairs: the difference and its count, no interval; three pairs: an interval."""
    from archhpo.report._frame import trials_frame
    from archhpo.report._page import choice_markdown, choice_table
    from tests.report.test_report import _paired_rows, _write

    for seeds, interval in ((2, False), (3, True)):
        frame = trials_frame("audit", csv=_write(_paired_rows(seeds=seeds), tmp_path / f"p{seeds}.csv"))
        table = choice_table(frame, n_boot=200).set_index("choice")
        assert (table["n_pairs"] == seeds).all()
        lin = table.loc["linear"]
        assert math.isfinite(lin["diff_mean"]) and math.isfinite(lin["diff_ci95_lo"]) == interval
        row = next(line for line in choice_markdown(table.reset_index()).splitlines() if line.startswith("| linear"))
        assert row.endswith(f"] ({seeds}) |") == interval and row.endswith(f"{lin['diff_mean']:+.4f} ({seeds}) |") != interval
