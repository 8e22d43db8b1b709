"""A stopped trial loses nothing and is counted whole.

A worker asked to stop (SIGTERM, SIGINT, a cancelled Ray task) stops between two steps and saves
the run as it is there: model, optimiser, schedule, RNG, the epoch's batch order and the step it
reached. Resumed, it trains the rest of that epoch and goes on, bit for bit as an uninterrupted
run would (dropout masks included: the signal family trains with dropout 0.1 here). The trial's
``duration_s`` adds the claims' times, ``train_flops`` counts the model's training once and
``flops_spent`` every claim's work.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from archhpo.cli import main as cli_main
from archhpo.models import get_family
from archhpo.report._export import export_studies
from archhpo.search import TrialQueue
from archhpo.workers import TrainConfig, Worker, train
from archhpo.workers import _loop as loop
from archhpo.workers._checkpoints import read_checkpoint
from tests.workers.test_build import _tiny_study

DATA = "multisignal:series=40,length=24"  # 20 training series (tiny data: half validates)
EPOCHS, BATCH = 4, 8


def _signal_run() -> tuple[Any, Any, Any, TrainConfig]:
    fam = get_family("signal")
    opts = {"encoder": "cat", "channels": 4, "quick": True}
    spec = fam.parse_data(DATA, opts)
    data = fam.load_data(spec, opts)
    cfg = fam.config_for({"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "choices": {"encoder": "cat"}},
                         fam.data_info(spec, opts))
    assert cfg.dropout > 0, "the masks must be resumed too"
    torch.manual_seed(0)
    model = fam.build(cfg)
    tcfg = TrainConfig(learning_rate=3e-3, epochs=EPOCHS, batch_size=BATCH, warmup_steps=2, eval_every=2, seed=5)
    return fam, model, data, tcfg


# should_stop is asked before every step and before every validation (eval_every 2: after epochs 2
# and 4). Where the run stops -> how many calls it answers False first, given the steps an epoch.
STOPS = {
    "before the first step": lambda steps: 0,
    "mid-epoch, an epoch that is not validated": lambda steps: 2,  # epoch 1, after 2 steps
    "before a validation": lambda steps: 2 * steps,  # epoch 2's steps done, its validation not yet
    "mid-epoch after a validation": lambda steps: 2 * steps + 1 + 1,  # epoch 3, after 1 step
}


@pytest.mark.parametrize("where", list(STOPS))
def test_a_run_stopped_between_two_steps_resumes_bit_for_bit(where: str) -> None:
    torch.set_num_threads(1)
    fam, model, data, tcfg = _signal_run()
    steps = math.ceil(data.n_train / BATCH)
    assert steps >= 3, "room for a stop inside an epoch"
    init = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    whole = train(model, data, fam.loss, tcfg)
    whole_state = {k: v.clone() for k, v in model.state_dict().items()}

    model.load_state_dict(init)
    torch.manual_seed(7)
    asked, saved = [0], []

    def stop() -> bool:
        asked[0] += 1
        return asked[0] > STOPS[where](steps)

    with pytest.raises(Exception) as stopped:
        train(model, data, fam.loss, tcfg, should_stop=stop, checkpoint=saved.append)
    assert type(stopped.value).__name__ == "TrialStopped"
    state = saved[-1]
    assert "partial" in state, "the stop saved where it stopped"
    first_samples = stopped.value.samples  # type: ignore[attr-defined]

    torch.manual_seed(123)  # other initial weights and RNG: everything must come from the checkpoint
    other = fam.build(model.cfg)
    resumed = train(other, data, fam.loss, tcfg, resume=state)
    assert resumed.history == whole.history, where
    assert (resumed.best_val_loss, resumed.train_loss) == (whole.best_val_loss, whole.train_loss)
    for k, v in other.state_dict().items():
        assert torch.equal(v, whole_state[k]), f"{where}: {k} differs"
    assert first_samples + resumed.samples == whole.samples == EPOCHS * data.n_train, "no step trained twice"


def _queue_with_one_trial(url: str) -> TrialQueue:
    # 100 series: 68 to train, 3 steps of batch 32 an epoch; validated at epochs 20 and 21.
    s = _tiny_study(url, "stop", "signal", "150K", "multisignal:series=100,length=12",
                    {"encoder": "linear", "channels": 4}, 21)
    return TrialQueue(url, s.study_name)


def _stopped_in_epoch_14(q: TrialQueue, ck: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """A worker stops the queue's trial inside epoch 14 and gives it back; what its claim spent."""
    real = loop._TrialRun.should_stop
    asked = [0]

    def should_stop(self: Any, event: Any) -> bool:
        asked[0] += 1
        if asked[0] == 13 * 3 + 2:  # asked before each step: epoch 14, its second step
            event.set()
        return real(self, event)

    monkeypatch.setattr(loop._TrialRun, "should_stop", should_stop)
    first = Worker([q], device="cpu", threads=1, checkpoint_dir=ck).run()
    monkeypatch.setattr(loop._TrialRun, "should_stop", real)
    assert (first.requeued, first.complete) == (1, 0)
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert trial.user_attrs["flops_from"] == 0, "the first claim started from nothing"
    return int(trial.user_attrs["flops_spent"])


def test_a_trial_stopped_mid_epoch_resumes_there_and_counts_whole(sqlite_url: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the worker and the queue: stopped inside epoch 14, six epochs past the nearest
    validation, given back, and finished by another worker; the trial's value is the one `train
    --from` gets training it uninterrupted."""
    q = _queue_with_one_trial(sqlite_url)
    ck = tmp_path / "ck"
    spent_by_the_stopped_claim = _stopped_in_epoch_14(q, ck, monkeypatch)
    (path,) = ck.rglob("*.pt")
    saved = read_checkpoint(path)
    assert saved["epoch"] == 13 and saved["partial"]["steps"] == 1, "stopped after epoch 13 and one step of 14"

    assert Worker([q], device="cpu", threads=1, checkpoint_dir=ck).run().complete == 1
    (trial,) = q.storage.get_all_trials(q.study_id)
    attrs = trial.user_attrs
    fps, n_train = attrs["flops_per_sample"], 68
    assert spent_by_the_stopped_claim == fps * (13 * n_train + 32), "recorded with the requeue"
    assert (attrs["resumed_from_epoch"], attrs["resumed_from_step"]) == (13, 1)
    assert attrs["flops_from"] == spent_by_the_stopped_claim, "the second claim started where the first stopped"
    assert attrs["train_flops"] == fps * 21 * n_train, "the model's training, counted once"
    assert attrs["flops_spent"] == attrs["train_flops"], "no step repeated, every claim counted"
    assert attrs["duration_s"] > saved["elapsed_s"] > 0, "both claims' time"
    claim_flops, claim_s = attrs["claim_work"]  # the ETA's throughput: the last claim's work in its time
    assert claim_flops == attrs["flops_spent"] - spent_by_the_stopped_claim
    assert claim_s == pytest.approx(attrs["duration_s"] - saved["elapsed_s"], abs=0.002)
    # the dashboard's Duration (Optuna's start to complete) is the last claim's, duration_s every claim's
    # (docs/guide.md names both)
    dashboard_s = (trial.datetime_complete - trial.datetime_start).total_seconds()
    assert claim_s - 0.01 <= dashboard_s < attrs["duration_s"], (dashboard_s, claim_s, attrs["duration_s"])
    export_studies(q.storage, [q.name], tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["train", "--from", str(tmp_path / "stop_150K_best.json"), "--device", "cpu",
                         "--threads", "1"]) == 0
    assert json.loads(out.getvalue().strip().splitlines()[-1])["val_loss"] == trial.value


def test_a_claim_without_the_checkpoint_starts_over_and_says_so(sqlite_url: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial goes on on a machine without the first claim's checkpoint: it trains from epoch 1,
    records that it started from nothing (flops_from 0, what the ETA reads as its progress), and
    its flops_spent counts both claims' work, the lost part included."""
    q = _queue_with_one_trial(sqlite_url)
    spent_by_the_stopped_claim = _stopped_in_epoch_14(q, tmp_path / "ck", monkeypatch)
    assert Worker([q], device="cpu", threads=1, checkpoint_dir=tmp_path / "elsewhere").run().complete == 1
    (trial,) = q.storage.get_all_trials(q.study_id)
    attrs = trial.user_attrs
    assert "resumed_from_epoch" not in attrs and attrs["flops_from"] == 0
    assert attrs["flops_spent"] == spent_by_the_stopped_claim + attrs["train_flops"]
    assert attrs["claim_work"] == [attrs["train_flops"], attrs["duration_s"]], \
        "the ETA measures this claim's training in its time, not the lost work in it"
