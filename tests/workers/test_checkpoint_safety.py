"""Checkpoints that cannot run code or lie.

A checkpoint is read with ``weights_only=True`` after its sha256 is checked: a crafted pickle
builds nothing, and a file with flipped bits is not resumed. Either is set aside as
``<file>.bad`` with one logged sentence, and the trial goes on from an older attempt's file or
from scratch, ending at exactly the uninterrupted run's value.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from optuna.trial import TrialState

from archhpo.search import TrialQueue
from archhpo.workers import Worker
from archhpo.workers._checkpoints import HEADER, CheckpointRefused, Checkpoints, _atomic_save, read_checkpoint
from tests.workers.test_stop_resume import _queue_with_one_trial, _stopped_in_epoch_14


class _MakesAFile:
    """Unpickled without weights_only, this opens (creates) `path`: code run by loading."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


@pytest.fixture(scope="module")
def uninterrupted_value(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The trial's value trained in one claim from scratch, no checkpoint read."""
    url = f"sqlite:///{tmp_path_factory.mktemp('whole') / 'study.db'}"
    q = _queue_with_one_trial(url)
    assert Worker([q], device="cpu", threads=1).run().complete == 1
    (trial,) = q.storage.get_all_trials(q.study_id)
    return float(trial.value)


def _finish(q: TrialQueue, ck: Path, caplog: pytest.LogCaptureFixture) -> tuple[Any, list[str]]:
    """Another worker finishes the given-back trial; the trial and the set-aside sentences logged."""
    with caplog.at_level(logging.WARNING, logger="archhpo.worker"):
        assert Worker([q], device="cpu", threads=1, checkpoint_dir=ck).run().complete == 1
    (trial,) = q.storage.get_all_trials(q.study_id)
    return trial, [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]


def _stopped_checkpoint(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path, Path]:
    """A one-trial study whose worker was stopped inside epoch 14: the queue, its checkpoint folder
    and the one checkpoint file it left."""
    q = _queue_with_one_trial(url)
    ck = tmp_path / "ck"
    _stopped_in_epoch_14(q, ck, monkeypatch)
    (path,) = ck.rglob("*.pt")
    return q, ck, path


def _assert_trained_from_scratch(trial: Any, value: float) -> None:
    assert trial.state == TrialState.COMPLETE
    assert "resumed_from_epoch" not in trial.user_attrs and trial.user_attrs["flops_from"] == 0
    assert trial.value == value, "exactly the uninterrupted run's value"


def test_a_crafted_checkpoint_runs_nothing_is_refused_and_the_trial_trains_from_scratch(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        uninterrupted_value: float) -> None:
    q, ck, path = _stopped_checkpoint(sqlite_url, tmp_path, monkeypatch)
    # The craft works: loaded the old way (weights_only=False) such a file creates its file.
    control = tmp_path / "control.pt"
    _atomic_save({"x": _MakesAFile(tmp_path / "ran-on-unsafe-load")}, control)
    torch.load(io.BytesIO(control.read_bytes()[HEADER:]), weights_only=False)
    assert (tmp_path / "ran-on-unsafe-load").exists()

    marker = tmp_path / "ran-on-resume"
    _atomic_save({**read_checkpoint(path), "note": _MakesAFile(marker)}, path)  # a valid checksum
    with pytest.raises(CheckpointRefused, match="could run code.*GLOBAL"):
        read_checkpoint(path)  # refused by weights_only, not by the checksum

    trial, said = _finish(q, ck, caplog)
    assert not marker.exists(), "nothing in the pickle ran"
    assert not path.exists() and path.with_name(path.name + ".bad").exists(), "set aside, not deleted"
    assert len(said) == 1 and str(path) in said[0] and "could run code" in said[0], said
    _assert_trained_from_scratch(trial, uninterrupted_value)


def _flip_16_low_bits(path: Path) -> None:
    """Flip the lowest bit of 16 elements of the largest weight tensor, in the file's bytes."""
    model = read_checkpoint(path)["model"]
    weight = max((t for t in model.values() if t.is_floating_point()), key=lambda t: t.numel())
    assert weight.dtype == torch.float32 and weight.numel() >= 16
    flipped = weight.clone().flatten()
    flipped.view(torch.int32)[:16] ^= 1
    data = path.read_bytes()
    raw = weight.flatten().numpy().tobytes()
    assert data.count(raw) == 1
    path.write_bytes(data.replace(raw, flipped.numpy().tobytes()))
    # torch alone does not notice: the zip's CRCs are not checked, the weights differ by 1 ulp.
    unchecked = torch.load(io.BytesIO(path.read_bytes()[HEADER:]), weights_only=True)["model"]
    changed = next(t for t in unchecked.values() if t.shape == weight.shape and not torch.equal(t, weight))
    assert int((changed != weight).sum()) == 16


def test_a_checkpoint_with_flipped_bits_is_set_aside_and_the_trial_ends_at_the_uninterrupted_value(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        uninterrupted_value: float) -> None:
    q, ck, path = _stopped_checkpoint(sqlite_url, tmp_path, monkeypatch)
    _flip_16_low_bits(path)

    trial, said = _finish(q, ck, caplog)
    assert not path.exists() and path.with_name(path.name + ".bad").exists()
    assert len(said) == 1 and str(path) in said[0] and "sha256 does not match" in said[0], said
    _assert_trained_from_scratch(trial, uninterrupted_value)


def _slot(tmp_path: Path, attempt: int) -> tuple[Checkpoints, Any, Any]:
    queue, claim = SimpleNamespace(name="s_100K"), SimpleNamespace(slot=3, attempt=attempt, params={"lr": 0.1})
    return Checkpoints(tmp_path), queue, claim


def test_a_retry_whose_checkpoint_is_corrupted_resumes_the_previous_attempts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ckpts, queue, claim = _slot(tmp_path, attempt=2)
    first, second = ckpts.path(queue, claim, 1), ckpts.path(queue, claim, 2)
    assert first is not None and second is not None
    _atomic_save({"params": claim.params, "epoch": 3, "w": torch.arange(64.0)}, first)
    _atomic_save({"params": claim.params, "epoch": 5, "w": torch.arange(64.0)}, second)
    data = bytearray(second.read_bytes())
    data[-100] ^= 0x01
    second.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="archhpo.worker"):
        state = ckpts.load_resume(queue, claim)
    assert state is not None and state["epoch"] == 3 and torch.equal(state["w"], torch.arange(64.0))
    assert first.exists() and not second.exists() and second.with_name(second.name + ".bad").exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint {second} set aside as {second.name}.bad: its sha256 does not match its contents "
        "(corrupted or truncated); trying an older checkpoint, else training from scratch"]


@pytest.mark.parametrize("damage", ["no checksum (an older archhpo's file)", "truncated"])
def test_an_unverifiable_checkpoint_is_set_aside_and_the_trial_starts_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    ckpts, queue, claim = _slot(tmp_path, attempt=1)
    path = ckpts.path(queue, claim)
    assert path is not None
    state = {"params": claim.params, "epoch": 2}
    if damage == "truncated":
        _atomic_save(state, path)
        path.write_bytes(path.read_bytes()[:-10])
    else:
        path.parent.mkdir(parents=True)
        torch.save(state, path)  # weights_only could read it, but nothing says it is intact
    with caplog.at_level(logging.WARNING, logger="archhpo.worker"):
        assert ckpts.load_resume(queue, claim) is None
    assert not path.exists() and path.with_name(path.name + ".bad").exists()
    reason = "carries no checksum" if damage.startswith("no") else "sha256 does not match"
    (said,) = [r.getMessage() for r in caplog.records]
    assert str(path) in said and reason in said


def test_a_saved_state_reads_back_exactly(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(5)
    state = {"params": {"lr": 0.1}, "model": {"w": torch.randn(7, 3, generator=gen)}, "generator": gen.get_state(),
             "best": float("inf"), "history": [{"epoch": 1.0, "val_loss": 2.5}], "partial": {"loss_sum": None}}
    path = tmp_path / "a.pt"
    _atomic_save(state, path)
    back = read_checkpoint(path)
    assert back.keys() == state.keys() and back["best"] == state["best"] and back["history"] == state["history"]
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and torch.equal(back["generator"], state["generator"])
    assert back["partial"] == {"loss_sum": None}
