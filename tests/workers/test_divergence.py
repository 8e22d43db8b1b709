"""A diverging loss (non-finite, or a training loss that ends above its first epoch's) fails the
trial as diverged, with its learning rate, and the report counts it apart from failed architectures."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from optuna.trial import TrialState

import archhpo.models.patchtst_spec
from archhpo.models._diverged import DIVERGED_MARGIN, diverged_reason, is_diverged, rising_loss
from archhpo.report._failures import why_all_failed, why_diverged
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._storage import open_storage
from archhpo.workers import Worker
from archhpo.workers._divergence import mark_diverged
from tests.conftest import TINY_DATA


def _history(*train_losses: float) -> list[dict[str, float]]:
    return [{"epoch": k + 1, "train_loss": v, "val_loss": v} for k, v in enumerate(train_losses)]


def test_a_training_loss_ending_above_its_first_epochs_by_the_margin_is_a_rising_loss() -> None:
    assert rising_loss(_history(2.0, 1.5, 2.3)) == "the training loss rose from 2 in epoch 1 to 2.3 in epoch 3"
    assert rising_loss(_history(2.0, 3.0, 2.0 * (1 + DIVERGED_MARGIN))) is None, "at the margin: not diverged"
    assert rising_loss(_history(2.0, 1.0)) is None
    assert rising_loss(_history(9.0)) is None, "one epoch has nothing to rise from"


def test_a_diverged_reason_names_the_rate_and_is_recognised() -> None:
    reason = diverged_reason("training loss became non-finite (nan) in epoch 2", 0.0123456)
    assert reason == "diverged at learning rate 0.0123: training loss became non-finite (nan) in epoch 2"
    assert is_diverged(reason)
    assert not is_diverged("NonFiniteLoss: loss is nan at epoch 1") and not is_diverged(None)


def _queue(url: str, trials: int = 4) -> TrialQueue:
    settings = prepare_settings("div", "200K", n_trials=trials, data=TINY_DATA, quick=True)
    launch(url, settings)
    return TrialQueue(url, settings.study_name)


def _run_with_loss(url: str, monkeypatch: pytest.MonkeyPatch,
                   loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> TrialQueue:
    fam = archhpo.models.patchtst_spec.FAMILY
    monkeypatch.setattr(archhpo.models.patchtst_spec, "FAMILY", dataclasses.replace(fam, loss=loss))
    q = _queue(url)
    Worker([q], device="cpu").run()
    return q


def test_a_nan_loss_fails_as_diverged_at_the_trials_rate(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    q = _run_with_loss(sqlite_url, monkeypatch, lambda logits, target: logits.sum() * float("nan"))
    trials = q.storage.get_all_trials(q.study_id)
    assert trials and all(t.state == TrialState.FAIL for t in trials)
    for t in trials:
        rate = t.params["learning_rate"]
        assert t.user_attrs["fail_reason"] == diverged_reason("training loss became non-finite (nan) in epoch 1", rate)
    why = why_all_failed(sqlite_url, [q.settings.study_name]) or ""
    assert why.startswith(f"every trial of {q.settings.study_name} diverged (all {len(trials)}), so the report has no "
                          "result: the learning rate")
    assert "not a fault of their architectures" in why


def _run(state: TrialState = TrialState.COMPLETE) -> SimpleNamespace:
    """What mark_diverged reads and writes of a worker's trial run."""
    return SimpleNamespace(claim=SimpleNamespace(params={"learning_rate": 0.02}), attrs={}, state=state, value=1.9)


def test_a_full_length_trial_whose_loss_rose_fails_as_diverged_at_its_rate() -> None:
    run = _run()
    mark_diverged(run, history=_history(2.0, 2.5, 2.4))
    assert (run.state, run.value) == (TrialState.FAIL, None)
    assert run.attrs == {"fail_reason": "diverged at learning rate 0.02: the training loss rose from 2 in epoch 1 "
                                        "to 2.4 in epoch 3"}


def test_a_trial_that_learned_or_stopped_early_is_not_marked() -> None:
    learned, parked = _run(), _run(TrialState.PRUNED)
    mark_diverged(learned, history=_history(2.0, 1.5))
    mark_diverged(parked, history=_history(2.0, 2.5))
    assert (learned.state, learned.value, learned.attrs) == (TrialState.COMPLETE, 1.9, {})
    assert (parked.state, parked.attrs) == (TrialState.PRUNED, {}), "a run stopped at a rung is not at its end"
    other = _run(TrialState.FAIL)
    other.attrs["fail_reason"] = "out of memory on cpu"
    mark_diverged(other, RuntimeError("out of memory"))
    assert other.attrs == {"fail_reason": "out of memory on cpu"}


def test_the_report_counts_diverged_trials_apart_with_their_rate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    q = _queue(url)
    first, second = q.claim({"host": "t"}), q.claim({"host": "t"})
    assert first is not None and second is not None
    rate = float(first.params["learning_rate"])
    q.finish(first, TrialState.FAIL, None, {"fail_reason": diverged_reason("the training loss rose", rate)})
    q.report(second, 1, 0.5)
    q.finish(second, TrialState.COMPLETE, 0.5, {})
    storage = open_storage(url, create=False)
    n = len(storage.get_all_trials(storage.get_study_id_from_name(q.settings.study_name)))
    assert why_diverged(storage, q.settings.study_name) == (
        f"1 of {n} trials diverged at learning rate {rate:.3g} (trial {first.number}: the training loss rose): "
        "the rate, not their architectures; they are not ranked")
    assert why_all_failed(url, [q.settings.study_name]) is None, "a trial completed: there is a result"


def test_a_ladder_budgets_line_says_which_trials_diverged_at_the_carried_rate(tmp_path: Path) -> None:
    from archhpo.budgets import GridRow
    from archhpo.report._page import ladder_notes
    from archhpo.search._ladder import Finished, carry_up
    from archhpo.search._settings import LADDER_KEY
    from archhpo.search._space import QUICK_SPACE

    url = f"sqlite:///{tmp_path / 'study.db'}"
    q = _queue(url)
    params = {"weight_decay": 1e-4, "epochs": 3, "batch_size": 64, "warmup_steps": 10, "learning_rate": 4e-4}
    rows = [GridRow(budget="x", arch_idx=0, d_model=64, n_layers=2, n_heads=2, d_ff=128, param_count=0,
                    estimate=None, extreme="")]
    record = carry_up([Finished(2.0, 0, 64, 2, (64, 2), params)], 100_000, 200_000, rows, QUICK_SPACE, [0], 0,
                      parametrization="mup")
    storage = open_storage(url, create=False)
    study_id = storage.get_study_id_from_name(q.settings.study_name)
    storage.set_study_user_attr(study_id, LADDER_KEY, {**record, "from_budget": "100K"})
    claim = q.claim({"host": "t"})
    assert claim is not None
    rate = float(claim.params["learning_rate"])
    q.finish(claim, TrialState.FAIL, None, {"fail_reason": diverged_reason("the training loss rose", rate)})
    line = ladder_notes(storage, {"200K": q.settings.study_name})["200K"]
    assert "lr carried unchanged under µP, at every d_model" in line
    assert line.endswith(f"; {why_diverged(storage, q.settings.study_name)}")
    assert f"diverged at learning rate {rate:.3g} (trial {claim.number}: the training loss rose)" in line
