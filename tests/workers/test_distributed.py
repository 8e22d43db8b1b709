"""A trial across K ranks on CPU (gloo): the same global batch on 2 ranks trains the 1-rank run's
losses (DDP and FSDP2), reruns repeat bit for bit, the state saved on 2 ranks resumes on 1, and a
stalled rank ends a collective within the group's timeout instead of torch's 30 minutes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from archhpo.config import StoredOptions
from archhpo.environment import Environment
from archhpo.errors import ArchhpoError
from archhpo.schema import TrainingPlan
from archhpo.workers import train
from archhpo.workers._checkpoints import read_checkpoint
from archhpo.workers._distributed import Ranks, _Fork, choose_shard, join_group, rank_shape
from archhpo.workers._memory import TrialShape
from archhpo.workers._ranked import fits_group
from archhpo.workers._train import cooldown_branch
from tests.workers import _ranks

# One xdist worker runs this module: its module-scoped fixtures are built once, not once per worker.
pytestmark = pytest.mark.xdist_group("distributed")

EPOCHS = 2
TOLERANCE = 1e-5  # relative, per interval: the ranks' gradients are summed in another order


def _relative(a: list[dict[str, float]], b: list[dict[str, float]]) -> float:
    assert [h["epoch"] for h in a] == [h["epoch"] for h in b]
    return max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b, strict=True) for k in ("train_loss", "val_loss"))


@pytest.fixture(scope="module")
def one_rank() -> list[dict[str, float]]:
    torch.set_num_threads(1)
    history, _ = _ranks.train_losses(None, epochs=EPOCHS)
    return history


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def two_ranks(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, float]], Path]:
    out = tmp_path_factory.mktemp(f"ranks-{request.param}")
    ckpt = out / "epoch1.pt"
    histories = _ranks.spawn(_ranks.two_rank_run, 2, out, request.param, EPOCHS, str(ckpt))
    assert histories[0] == histories[1], "every rank validates the same model"
    return request.param, histories[0], ckpt


def test_two_ranks_train_the_one_rank_losses_at_the_same_global_batch(
        one_rank: list[dict[str, float]], two_ranks: tuple[str, list[dict[str, float]], Path]) -> None:
    """The batch of 16 splits 8 + 8, the epoch's last batch of 7 splits 4 + 3 (weighted by share)."""
    mode, history, _ = two_ranks
    diff = _relative(one_rank, history)
    print(f"{mode}: largest relative difference from one rank {diff:.2e}")
    assert diff <= TOLERANCE, (mode, diff)


@pytest.mark.parametrize("two_ranks", ["ddp"], indirect=True)
def test_a_rerun_on_two_ranks_repeats_bit_for_bit(
        two_ranks: tuple[str, list[dict[str, float]], Path], tmp_path: Path) -> None:
    mode, history, _ = two_ranks
    again = _ranks.spawn(_ranks.two_rank_run, 2, tmp_path, mode, EPOCHS, str(tmp_path / "again.pt"))
    assert again[0] == history


def test_a_state_saved_on_two_ranks_resumes_on_one(
        two_ranks: tuple[str, list[dict[str, float]], Path]) -> None:
    """Rank 0 writes the state whole, checksummed and weights_only-readable; one process goes on
    from it to the 2-rank run's losses."""
    mode, history, ckpt = two_ranks
    state = read_checkpoint(ckpt)
    assert state["epoch"] == 1 and isinstance(next(iter(state["optimizer"]["state"])), int)
    torch.set_num_threads(1)
    resumed, _ = _ranks.train_losses(None, resume=state, epochs=EPOCHS)
    assert resumed[0] == history[0], "the checkpoint carries the first epoch's record"
    diff = _relative(history, resumed)
    print(f"{mode}: resumed on one rank, largest relative difference {diff:.2e}")
    assert diff <= TOLERANCE, (mode, diff)


def test_a_stalled_rank_fails_the_collective_within_the_timeout(tmp_path: Path) -> None:
    timeout = 3.0
    lead, _ = _ranks.spawn(_ranks.stalled_collective, 2, tmp_path, timeout, timeout_s=60)
    print(f"the stalled rank was noticed after {lead['elapsed']:.1f} s: {lead['error']}")
    assert lead["group_failure"], lead
    assert timeout * 0.5 <= lead["elapsed"] <= timeout + 10, lead


def test_a_finished_rank_leaves_the_groups_it_made_before_it_exits(tmp_path: Path) -> None:
    # gloo's threads still running at interpreter exit aborted a finished rank now and then
    # ("terminate called without an active exception"), which torchrun reports as a failed group.
    results = _ranks.spawn(_ranks.worker_leaves_its_group, 2, tmp_path, timeout_s=60)
    assert results == [{"rank": r, "joined": True, "initialised_after_run": False, "group_after_run": False}
                       for r in range(2)]


def wsd_branches(rank: int, mode: str | None) -> dict[str, Any]:
    """A WSD run of 2 epochs scored at epoch 1: the cooldown branch's loss (alone, or on a group),
    the run's final loss, and (FSDP2) how many weights this rank's copy held against the whole."""
    ranks = None
    if mode is not None:
        group = join_group("cpu", timeout_s=60)
        assert group is not None
        ranks = Ranks(group, mode)
    fam, model, data, tcfg = _ranks.lm_run(epochs=2)
    whole = sum(p.numel() for p in model.parameters())
    tcfg = dataclasses.replace(tcfg, schedule="wsd")
    scores: list[float] = []
    held: list[int] = []
    wrap = _Fork.wrap

    def recording(fork: _Fork, copied: torch.nn.Module) -> torch.nn.Module:
        out = wrap(fork, copied)
        held.append(sum(p.to_local().numel() for p in out.parameters()))
        return out

    def score(epoch: int, val: float, state: dict[str, Any]) -> None:
        scores.append(cooldown_branch(model, data, fam.loss, tcfg, state).val_loss)

    _Fork.wrap = recording  # type: ignore[method-assign]  # this process only (a spawned rank)
    try:
        result = train(model, data, fam.loss, tcfg, plan=TrainingPlan(score_at=(1,)), on_score=score, ranks=ranks)
    finally:
        _Fork.wrap = wrap  # type: ignore[method-assign]
    return {"losses": [*scores, result.history[-1]["val_loss"]], "held": held, "whole": whole}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_wsd_cooldown_branch_on_two_ranks_scores_the_one_rank_branch(mode: str, tmp_path: Path) -> None:
    """The branch copies the model (under FSDP2 each rank a shard of the copy, from its own shard,
    so no rank holds more than about half the copy's weights); every rank gets its loss, and the
    run goes on after it as it would without the branch."""
    torch.set_num_threads(1)
    alone = wsd_branches(0, None)["losses"]
    pair = _ranks.spawn(wsd_branches, 2, tmp_path, mode)
    assert pair[0]["losses"] == pair[1]["losses"], "every rank gets the branch's loss and goes on alike"
    diff = max(abs(a - b) / abs(a) for a, b in zip(alone, pair[0]["losses"], strict=True))
    print(f"{mode}: branch and final loss, largest relative difference from one rank {diff:.2e}")
    assert diff <= TOLERANCE, (mode, alone, pair[0])
    if mode == "fsdp":
        held = [r["held"][0] for r in pair]
        print(f"fsdp: each rank's branch copy held {held} of {pair[0]['whole']} weights")
        assert sum(held) >= pair[0]["whole"] and max(held) <= 0.51 * pair[0]["whole"], held
    else:
        assert pair[0]["held"] == [], "a DDP replica is whole: its branch is a plain copy"


def _shape(params: int, batch: int = 16) -> TrialShape:
    return TrialShape(params, batch, 16, 64, 1, 256, 8, 8, 1024)


def test_auto_shards_with_fsdp2_only_when_one_rank_cannot_hold_the_state() -> None:
    assert choose_shard("auto", 10 * 2**30, 10**8, 2, 40 * 2**30, 0.85) == "ddp"
    assert choose_shard("auto", 40 * 2**30, 10**9, 2, 40 * 2**30, 0.85) == "fsdp"
    assert choose_shard("ddp", 40 * 2**30, 10**9, 2, 40 * 2**30, 0.85) == "ddp"
    assert choose_shard("auto", 40 * 2**30, 10**9, 1, 40 * 2**30, 0.85) == "ddp", "one rank has nothing to shard"
    with pytest.raises(ArchhpoError, match="use auto, ddp or fsdp"):
        choose_shard("zero3", 0, 0, 2, 1, 0.85)


def test_a_rank_holds_its_share_of_the_batch_and_under_fsdp2_of_the_state() -> None:
    shape = _shape(10**9, batch=15)
    assert rank_shape(shape, 2, "ddp") == TrialShape(10**9, 8, 16, 64, 1, 256, 8, 8, 1024)
    assert rank_shape(shape, 4, "fsdp") == TrialShape(250_000_000, 4, 16, 64, 1, 256, 8, 8, 1024)


def test_the_group_timeout_is_read_from_the_environment() -> None:
    assert Environment().group_timeout_s == 120.0, "torch's own 30 minutes is far too long"
    assert Environment.read({"ARCHHPO_GROUP_TIMEOUT_S": "7.5"}).group_timeout_s == 7.5
    with pytest.raises(ArchhpoError, match="must be a number of seconds"):
        Environment.read({"ARCHHPO_GROUP_TIMEOUT_S": "soon"})
    with pytest.raises(ArchhpoError, match="must be a positive number of seconds"):
        Environment.read({"ARCHHPO_GROUP_TIMEOUT_S": "0"})


def test_a_study_at_r_ranks_per_trial_is_left_to_groups_of_r_ranks() -> None:
    """A study at one rank per trial is trained by any worker; one at 2 only by groups of 2."""
    def study(ranks: int) -> Any:
        return SimpleNamespace(name="s", settings=SimpleNamespace(
            options=StoredOptions.from_dict({"ranks_per_trial": ranks})))

    pair, four = SimpleNamespace(world=2), SimpleNamespace(world=4)
    assert fits_group(None, study(1)) and fits_group(pair, study(1))  # type: ignore[arg-type]
    assert fits_group(pair, study(2)) and not fits_group(None, study(2))  # type: ignore[arg-type]
    assert not fits_group(four, study(2))  # type: ignore[arg-type]
