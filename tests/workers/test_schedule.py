"""The learning-rate schedules: cosine (the default) and WSD (warm-up, stable, 1-sqrt cooldown).

A WSD run is a constant-rate run plus a cooldown: resuming the constant-rate run's checkpoint
with the cooldown gives the WSD run bit for bit (what successive halving's branches rely on)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from archhpo.cli._main import main
from archhpo.errors import ArchhpoError
from archhpo.models import TensorDataset, get_family
from archhpo.workers import TrainConfig, TrialSpec, train
from archhpo.workers._train import cooldown_branch, lr_lambda
from tests.conftest import TINY_DATA


def test_wsd_holds_the_peak_then_cools_down_in_a_1_minus_sqrt_shape() -> None:
    f = lr_lambda(warmup=10, total=100, min_ratio=0.1, schedule="wsd", cooldown=0.2)
    assert [f(i) for i in (0, 9)] == [0.1, 1.0]
    assert all(f(i) == 1.0 for i in range(10, 81))  # the first cooldown step still has the peak
    assert f(81) == 0.1 + 0.9 * (1 - math.sqrt(1 / 20)) and f(100) == 0.1
    assert all(f(i) > f(i + 1) for i in range(80, 100))


def test_wsd_before_its_cooldown_does_not_depend_on_the_run_length() -> None:
    short = lr_lambda(5, 50, 0.0, "wsd", 0.2)
    long = lr_lambda(5, 500, 0.0, "wsd", 0.2)
    assert [short(i) for i in range(40)] == [long(i) for i in range(40)]


def test_cosine_stays_the_default() -> None:
    assert TrainConfig().schedule == "cosine"
    assert lr_lambda(10, 110, 0.1)(60) == lr_lambda(10, 110, 0.1, "cosine", 0.5)(60) == pytest.approx(0.55)


@pytest.mark.parametrize("bad", [{"schedule": "linear"}, {"cooldown": 1.0}, {"cooldown": -0.1}])
def test_train_config_refuses_an_unknown_schedule_or_cooldown(bad: dict[str, Any]) -> None:
    with pytest.raises(ArchhpoError, match="--schedule cosine or wsd"):
        TrainConfig(**bad)


def _data(n: int = 160) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 60, 2, generator=g)
    y = (x[:, -1, 0] > 0).float()
    return TensorDataset((x[:128],), y[:128], (x[128:],), y[128:])


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    fam = get_family("patchtst")  # dropout on: the checkpoint must carry the global RNG too
    return fam.build(fam.config_for({"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
                                    {"num_features": 2, "dropout": 0.1}))


def test_a_wsd_run_equals_a_constant_run_resumed_with_the_cooldown_bit_for_bit() -> None:
    loss = get_family("patchtst").loss
    base = {"learning_rate": 3e-3, "batch_size": 32, "warmup_steps": 3, "min_lr_ratio": 0.0, "seed": 7}
    whole = _model()
    full = train(whole, _data(), loss, TrainConfig(epochs=10, schedule="wsd", cooldown=0.2, **base))
    saved: list[dict[str, Any]] = []
    part = _model()  # the constant-rate run to (1 - 0.2) * 10 = 8 epochs, checkpointed
    train(part, _data(), loss, TrainConfig(epochs=8, schedule="wsd", cooldown=0.0, **base),
          checkpoint=lambda s: saved.append(copy.deepcopy(s)))
    resumed = _model()
    torch.manual_seed(999)  # a different global RNG (dropout): the checkpoint restores its own
    branch = train(resumed, _data(), loss, TrainConfig(epochs=10, schedule="wsd", cooldown=0.2, **base),
                   resume=saved[-1])
    assert branch.history == full.history and branch.best_val_loss == full.best_val_loss
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_cosine_run_of_another_length_is_not_that_run() -> None:
    """The check above can tell runs apart: cutting a cosine run changes what comes before."""
    loss = get_family("patchtst").loss
    base = {"learning_rate": 3e-3, "batch_size": 32, "warmup_steps": 3, "seed": 7}
    a = train(_model(), _data(), loss, TrainConfig(epochs=10, **base))
    b = train(_model(), _data(), loss, TrainConfig(epochs=8, **base))
    assert a.history[:8] != b.history


def test_launch_stores_wsd_in_the_study_and_its_trials_train_with_it(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    common = ["--budget", "200K", "--trials", "4", "--quick", "--data", TINY_DATA, "--storage", url]
    assert main(["launch", "--experiment", "w", *common, "--schedule", "wsd", "--cooldown", "0.3"]) == 0
    assert main(["launch", "--experiment", "c", *common]) == 0
    wsd = optuna.load_study(study_name="w_200K", storage=url).user_attrs["archhpo_options"]
    cosine = optuna.load_study(study_name="c_200K", storage=url).user_attrs["archhpo_options"]
    assert (wsd["schedule"], wsd["cooldown"]) == ("wsd", 0.3)
    assert "schedule" not in cosine and "cooldown" not in cosine  # older studies keep their identity
    spec = TrialSpec(family="patchtst", data={}, options=wsd, info={}, arch={}, params={"epochs": 3})
    assert (spec.train_config().schedule, spec.train_config().cooldown) == ("wsd", 0.3)
    assert main(["launch", "--experiment", "w", *common, "--schedule", "wsd"]) == 2, "another cooldown"


@pytest.mark.parametrize(("flags", "sentence"), [
    (["--schedule", "wsd", "--cooldown", "1.5"], "--cooldown such as 0.2"),
    (["--cooldown", "0.3"], "--cooldown counts only with --schedule wsd"),
])
def test_a_bad_cooldown_is_refused_with_one_sentence_and_nothing_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], sentence: str) -> None:
    db = tmp_path / "s.db"
    argv = ["launch", "--experiment", "x", "--budget", "200K", *flags]
    assert main([*argv, "--storage", f"sqlite:///{db}"]) == 2
    assert sentence in capsys.readouterr().err and not db.exists()


def test_a_cooldown_branch_scores_the_wsd_run_ending_there_and_leaves_the_model_alone() -> None:
    loss = get_family("patchtst").loss
    base = {"learning_rate": 3e-3, "batch_size": 32, "warmup_steps": 3, "min_lr_ratio": 0.0, "seed": 7}
    full = train(_model(), _data(), loss, TrainConfig(epochs=10, schedule="wsd", cooldown=0.2, **base))
    saved: list[dict[str, Any]] = []
    part = _model()
    train(part, _data(), loss, TrainConfig(epochs=8, schedule="wsd", cooldown=0.0, **base),
          checkpoint=lambda s: saved.append(copy.deepcopy(s)))
    before = copy.deepcopy(part.state_dict())
    branch = cooldown_branch(part, _data(), loss, TrainConfig(epochs=30, schedule="wsd", cooldown=0.2, **base),
                             saved[-1])
    assert (branch.val_loss, branch.steps, branch.epochs, branch.samples) == (
        full.history[-1]["val_loss"], 2 * 4, 2.0, 2 * 128)  # 128 samples = 4 batches of 32 an epoch
    assert all(torch.equal(a, b) for a, b in zip(before.values(), part.state_dict().values(), strict=True))


def test_a_cooldown_branch_ends_inside_an_epoch_when_its_steps_say_so() -> None:
    loss = get_family("patchtst").loss
    base = {"learning_rate": 3e-3, "batch_size": 32, "warmup_steps": 3, "min_lr_ratio": 0.0, "seed": 7}
    saved: list[dict[str, Any]] = []
    part = _model()
    train(part, _data(), loss, TrainConfig(epochs=3, schedule="wsd", cooldown=0.0, **base),
          checkpoint=lambda s: saved.append(copy.deepcopy(s)))
    rng = torch.get_rng_state()
    branch = cooldown_branch(part, _data(), loss, TrainConfig(epochs=30, schedule="wsd", cooldown=0.2, **base),
                             saved[-1])
    # 3 epochs of 4 steps held: a cooldown of round(12 * 0.2 / 0.8) = 3 steps, 3 of the 4 batches of epoch 4
    assert (branch.steps, branch.epochs, branch.samples) == (3, 0.75, 96)
    assert torch.equal(rng, torch.get_rng_state()), "the run it branched from keeps its dropout stream"
