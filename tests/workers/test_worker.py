"""The worker loop and the trainer: failures end as FAIL with a reason and the worker goes on;
the memory estimate refuses what cannot fit; the schedule, clipping and early stop behave."""

from __future__ import annotations

import dataclasses
import math
import threading

import pytest
import torch
from optuna.trial import TrialState

import archhpo.models.patchtst_spec
import archhpo.workers._memory
from archhpo.errors import MemoryRefused, NonFiniteLoss
from archhpo.models import TensorDataset, get_family
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import (
    StopTraining,
    TrainConfig,
    TrialShape,
    Worker,
    check_fits,
    estimate_training_bytes,
    train,
)
from archhpo.workers._claim import idle_note
from archhpo.workers._train import lr_lambda
from tests.conftest import TINY_DATA


def _queue(url: str, budget: str = "200K", trials: int = 4) -> TrialQueue:
    s = prepare_settings("w", budget, n_trials=trials, data=TINY_DATA, quick=True)
    launch(url, s)
    return TrialQueue(url, s.study_name)


def _states(q: TrialQueue) -> list[TrialState]:
    return [t.state for t in q.storage.get_all_trials(q.study_id)]


def test_nan_loss_fails_the_trial_with_a_reason_and_the_worker_goes_on(storage_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def nan_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return logits.sum() * float("nan")

    fam = archhpo.models.patchtst_spec.FAMILY
    monkeypatch.setattr(archhpo.models.patchtst_spec, "FAMILY", dataclasses.replace(fam, loss=nan_loss))
    q = _queue(storage_url)
    summary = Worker([q], device="cpu").run()
    trials = q.storage.get_all_trials(q.study_id)
    assert summary.failed == len(trials) == len(q.settings.plan), "every trial was tried, none retried"
    assert all(t.state == TrialState.FAIL and "non-finite" in t.user_attrs["fail_reason"] for t in trials)


def test_out_of_memory_fails_the_trial_not_the_worker(storage_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    class Boom(torch.nn.Module):
        def __init__(self, cfg) -> None:  # type: ignore[no-untyped-def]
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    fam = archhpo.models.patchtst_spec.FAMILY
    monkeypatch.setattr(archhpo.models.patchtst_spec, "FAMILY", dataclasses.replace(fam, build=Boom))
    q = _queue(storage_url)
    Worker([q], device="cpu").run()
    trials = q.storage.get_all_trials(q.study_id)
    assert trials and all(t.user_attrs["fail_reason"].startswith("out of memory") for t in trials)


def test_a_2b_trial_is_refused_on_a_24_gib_machine(storage_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(archhpo.workers._memory, "available_bytes", lambda device: 24 * 2**30)
    q = _queue(storage_url, budget="2B", trials=4)
    summary = Worker([q], device="cpu").run()
    trials = q.storage.get_all_trials(q.study_id)
    assert summary.failed == len(trials) > 0
    for t in trials:
        reason = t.user_attrs["fail_reason"]
        assert "GiB" in reason and "larger device" in reason
        assert t.user_attrs["memory_estimate_gib"] > 24


def test_memory_estimate_scales_with_parameters_and_batch() -> None:
    def shape(params: int, batch: int, d: int = 64, heads: int = 8, d_ff: int = 256) -> TrialShape:
        return TrialShape(params, batch, 1024, 11, 1, d, 48, heads, d_ff)

    small = estimate_training_bytes(shape(2_000_000, 64), "cpu")
    assert 16 * 2_000_000 < small < 2**30
    assert estimate_training_bytes(shape(2_000_000, 256), "cpu") > small
    assert estimate_training_bytes(shape(2_000_000_000, 32, 2048, 32, 8192), "cuda") > 32 * 10**9
    with pytest.raises(MemoryRefused):
        check_fits(10**15, torch.device("cpu"), "huge")


def test_warmup_then_cosine_schedule() -> None:
    f = lr_lambda(warmup=10, total=110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1)
    assert all(f(i) >= f(i + 1) for i in range(10, 110))


def _toy_data(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 60, 2, generator=g)
    y = (x[:, -1, 0] > 0).float()
    return TensorDataset((x[:200],), y[:200], (x[200:],), y[200:])


def test_trainer_learns_and_reports_every_epoch() -> None:
    torch.manual_seed(0)
    fam = get_family("patchtst")
    model = fam.build(fam.config_for({"d_model": 64, "n_layers": 1, "n_heads": 4, "d_ff": 128},
                                     {"num_features": 2, "dropout": 0.0}))
    seen: list[tuple[int, float]] = []
    data = _toy_data()
    res = train(model, data, fam.loss, TrainConfig(learning_rate=3e-3, epochs=15, batch_size=32, warmup_steps=5),
                metrics_fn=fam.metrics, on_eval=lambda e, v: seen.append((e, v)))
    assert [e for e, _ in seen] == list(range(1, 16))
    assert res.best_val_loss == min(v for _, v in seen) < 0.6 * fam.baseline_loss(data)
    assert res.metrics["accuracy"] > 0.8


def test_trainer_detects_nan() -> None:
    fam = get_family("patchtst")
    model = fam.build(fam.config_for({"d_model": 64, "n_layers": 1, "n_heads": 4, "d_ff": 128}, {"num_features": 2}))
    with pytest.raises(NonFiniteLoss, match="non-finite"):
        train(model, _toy_data(), lambda lo, t: lo.sum() * math.nan, TrainConfig(epochs=2, warmup_steps=0))


def test_on_eval_can_stop_training_early() -> None:
    fam = get_family("patchtst")
    model = fam.build(fam.config_for({"d_model": 64, "n_layers": 1, "n_heads": 4, "d_ff": 128}, {"num_features": 2}))

    def stop(epoch: int, val: float) -> None:
        if epoch == 2:
            raise StopTraining(epoch)

    with pytest.raises(StopTraining):
        train(model, _toy_data(), fam.loss, TrainConfig(epochs=10, warmup_steps=0), on_eval=stop)


def test_train_config_rejects_nonsense() -> None:
    with pytest.raises(Exception, match="positive"):
        TrainConfig(epochs=0)


def test_an_idle_worker_says_once_what_each_budget_waits_for(sqlite_url: str) -> None:
    """A worker on a ladder's larger budget alone has nothing to claim until the smaller is done: it
    says so once (not every 2 s poll), and the reason is the plan's own."""
    from archhpo.cli import main

    assert main(["launch", "--experiment", "idle", "--ladder", "--quick", "--budget", "200K", "--budget", "500K",
                 "--trials", "8", "--data", TINY_DATA, "--storage", sqlite_url]) == 0
    notes: list[str] = []
    worker: Worker

    def on_idle(note: str) -> None:
        notes.append(note)
        if len(notes) == 1:  # stop at the poll after next: a second, unchanged note would be a repeat
            threading.Timer(5.0, worker.stop_event.set).start()

    worker = Worker([TrialQueue(sqlite_url, "idle_500K")], device="cpu", on_idle=on_idle)
    summary = worker.run()
    assert summary.trials == []
    assert notes == ["idle_500K: waiting for idle_200K (the ladder plans this budget from the smaller ones)"]


def test_the_idle_note_names_what_runs_elsewhere_or_waits_at_a_rung() -> None:
    from archhpo.search._status import PlanStatus

    busy = {"a_1M": PlanStatus(total=4, running=2), "a_2M": PlanStatus(total=4, waiting=1, held=1, details={"phase3": "x"})}
    assert idle_note(busy) == "2 trial(s) running on other workers; 1 held at a rung until its decision"
    waiting = {"a_1M": PlanStatus(total=4, details={"phase1": "waiting for a_500K", "phase3": "later"})}
    assert idle_note(waiting) == "a_1M: waiting for a_500K"
    assert idle_note({"a_1M": PlanStatus(total=4)}) == "nothing to claim yet"
