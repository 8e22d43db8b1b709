"""Ladder planning (--ladder): the smallest budget is searched as designed; each larger one is
planned, once the smaller is final, from its winners: the learning rate carried as N^-1/3, the
other training parameters and the aspect ratios of its best architectures, fewer trials; stored
in the study once, before its trials are enqueued, however many upkeeps race or die."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from archhpo.budgets import GridRow
from archhpo.cli import main
from archhpo.report._page import ladder_notes
from archhpo.search import TrialQueue, _study, launch, prepare_settings
from archhpo.search._ladder import (
    Finished,
    carried_params,
    carry_up,
    ladder_trials,
    narrowed_space,
    region,
    top_architectures,
)
from archhpo.search._space import QUICK_SPACE
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}
PARAMS = {"learning_rate": 1e-3, "weight_decay": 1e-4, "epochs": 3, "batch_size": 64, "warmup_steps": 20}


def _row(i: int, d: int, layers: int, extreme: str = "") -> GridRow:
    return GridRow(budget="x", arch_idx=i, d_model=d, n_layers=layers, n_heads=2, d_ff=2 * d, param_count=0,
                   estimate=None, extreme=extreme)


def _done(value: float, number: int, d: int, layers: int, **params: Any) -> Finished:
    return Finished(value, number, d, layers, (d, layers), {**PARAMS, **params})


def test_the_learning_rate_is_carried_as_n_to_the_minus_one_third_and_clipped() -> None:
    best = _done(2.0, 0, 64, 2)
    assert carried_params(best, 100_000, 800_000, QUICK_SPACE)["learning_rate"] == pytest.approx(5e-4, rel=1e-12)
    assert carried_params(best, 800_000, 100_000, QUICK_SPACE)["learning_rate"] == 1e-3, "clipped to the range"
    space = narrowed_space(carried_params(best, 100_000, 800_000, QUICK_SPACE), QUICK_SPACE)
    assert space.learning_rate == pytest.approx((2.5e-4, 1e-3)) and space.epochs == (3,) and space.batch_size == (64,)
    assert space.weight_decay == pytest.approx((1e-4 / 3, 3e-4))


def test_the_region_is_the_best_aspect_ratios_widened_and_the_extremes() -> None:
    finished = [_done(2.0, 3, 128, 4), _done(2.0, 1, 128, 4), _done(2.1, 2, 64, 4), _done(2.5, 0, 256, 2),
                _done(3.0, 5, 64, 8)]
    top = top_architectures(finished)
    assert [t.number for t in top] == [1, 2, 0], "one per architecture, the earlier of a tie"
    rows = [_row(0, 64, 8, "min_d_model"), _row(1, 64, 2), _row(2, 128, 8), _row(3, 512, 2, "max_d_model"),
            _row(4, 256, 1)]
    # ratios 32 (128/4), 16 (64/4), 128 (256/2) -> [16/1.5, 128*1.5] = [10.7, 192]
    assert [r.arch_idx for r in region(rows, top)] == [0, 1, 2, 3]


def test_carry_up_assigns_every_slot_inside_the_region_reproducibly() -> None:
    rows = [_row(i, d, layers, "x" if i == 0 else "") for i, (d, layers) in
            enumerate([(64, 8), (64, 4), (128, 4), (128, 2), (512, 1)])]
    finished = [_done(2.0, 0, 128, 4), _done(2.2, 1, 64, 4)]
    one = carry_up(finished, 100_000, 200_000, rows, QUICK_SPACE, slots=[0, 1, 2, 3, 4, 5], seed=7)
    assert one == carry_up(finished, 100_000, 200_000, rows, QUICK_SPACE, slots=[0, 1, 2, 3, 4, 5], seed=7)
    # ratios 32 and 16, widened: [10.7, 48]; 128/2 (64) and 512/1 fall outside, the extreme 64/8 is kept
    assert {a["arch_idx"] for a in one["assignments"]} == {0, 1, 2}
    lo, hi = one["space"]["learning_rate"]
    assert all(lo <= a["params"]["learning_rate"] <= hi and a["params"]["epochs"] == 3 for a in one["assignments"])
    assert one["carried"]["learning_rate"] == pytest.approx(1e-3 * 2 ** (-1 / 3))
    assert ladder_trials(50, 2, 3) == 12 and ladder_trials(50, 0, 3) == 50 and ladder_trials(8, 3, 3) == 5


def _ladder(storage_url: str) -> tuple[Any, Any]:
    kw = {"n_trials": 8, "data": TINY_DATA, "quick": True, "seed": 0, "pruner": "none"}
    small = prepare_settings("lad", "200K", **kw)
    large = prepare_settings("lad", "500K", **kw, ladder_below=[small.study_name])
    assert launch(storage_url, small).enqueued == sum(e.phase == 1 for e in small.plan)
    assert launch(storage_url, large).enqueued == 0, "nothing to train before the smaller budget is final"
    assert len(large.plan) == ladder_trials(8, 1, sum(1 for a in large.archs if a["extreme"]))
    return small, large


def _finish_small(storage_url: str, small: Any) -> None:
    q = TrialQueue(storage_url, small.study_name)
    while (c := q.claim(WORKER)) is not None:
        q.finish(c, TrialState.COMPLETE, 1.0 + 0.01 * c.slot, {})
    assert q.maintain().done is False  # phase 2 was just created
    while (c := q.claim(WORKER)) is not None:
        q.finish(c, TrialState.COMPLETE, 2.0, {})
    assert q.maintain().done


def test_a_larger_budget_waits_then_is_planned_from_the_smaller_once(storage_url: str) -> None:
    small, large = _ladder(storage_url)
    q = TrialQueue(storage_url, large.study_name)
    assert q.maintain().done is False and q.claim(WORKER) is None
    _finish_small(storage_url, small)
    queues = [TrialQueue(storage_url, large.study_name) for _ in range(4)]
    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=lambda x=x: (barrier.wait(), x.maintain())) for x in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ladder = q.upkeep.study_attr(_study.LADDER_KEY)
    assert ladder["from"] == small.study_name and ladder["from_trial"] == 0, "slot 0 had the best value"
    trials = q.storage.get_all_trials(q.study_id, deepcopy=False)
    assert sorted(t.user_attrs["plan_slot"] for t in trials) == list(range(len(large.plan))), "each slot once"
    claim = q.claim(WORKER)
    assert claim is not None and claim.params["epochs"] == ladder["carried"]["epochs"]
    notes = ladder_notes(q.storage, {"500K": large.study_name, "200K": small.study_name})
    assert list(notes) == ["500K"] and notes["500K"].startswith("from 200K (trial 0): learning rate")


def test_a_ladder_stored_but_not_enqueued_is_enqueued_by_the_next_upkeep(
        storage_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    small, large = _ladder(storage_url)
    _finish_small(storage_url, small)

    def killed(*args: Any, **kw: Any) -> int:
        raise KeyboardInterrupt("killed between storing the ladder and enqueuing it")

    monkeypatch.setattr("archhpo.search._upkeep.enqueue_missing", killed)
    q = TrialQueue(storage_url, large.study_name)
    with pytest.raises(KeyboardInterrupt):
        q.maintain()
    stored = q.upkeep.study_attr(_study.LADDER_KEY)
    monkeypatch.undo()
    fresh = TrialQueue(storage_url, large.study_name)
    fresh.maintain()
    assert fresh.upkeep.study_attr(_study.LADDER_KEY) == stored
    assert len(fresh.storage.get_all_trials(fresh.study_id, deepcopy=False)) == len(large.plan)
    assert launch(storage_url, large).enqueued == 0, "a relaunch reuses it and duplicates nothing"


@pytest.mark.parametrize(("flags", "sentence"), [
    (["--budget", "200K"], "--ladder needs at least two --budget values"),
    (["--budget", "200K", "--budget", "500K", "--paired-seeds", "2"], "drop --ladder or --paired-seeds"),
])
def test_a_ladder_that_cannot_be_is_one_sentence_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], sentence: str) -> None:
    db = tmp_path / "s.db"
    assert main(["launch", "--experiment", "x", "--ladder", "--quick", *flags, "--storage", f"sqlite:///{db}"]) == 2
    assert sentence in capsys.readouterr().err and not db.exists()
