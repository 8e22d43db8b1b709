"""Successive halving over the plan (--pruner halving): every planned trial to the first rung, the
best 1/eta of each rung (per budget and phase) on to the next, decisions stored once and made by
whoever completes a rung, held trials neither claimed nor reaped, retries that keep their rungs.

The queue is driven here without training (scores by plan slot), on every storage backend; the
training side (branches, continuation, real processes) is in tests/e2e/test_halving_run.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.environment import Environment
from archhpo.errors import StudyError
from archhpo.report import export_studies
from archhpo.report._export import flops_summary
from archhpo.schema import Attr
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._halving import promotions
from archhpo.search._optuna_private import models as m
from archhpo.search._rungs import RungDecisions
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}


def _settings(**kw: Any) -> Any:
    args = {"n_trials": 10, "data": TINY_DATA, "quick": True, "seed": 0, "pruner": "halving", "eta": 3,
            "min_fraction": "1/9"}
    return prepare_settings("hv", "500K", **{**args, **kw})


def _score(slot: int, rung: int) -> float:
    """A rung score that does not rank slots in plan order (so ties and order are both exercised)."""
    return round(1.0 + ((slot * 7) % 5) * 0.1 - 0.01 * rung, 6)


def _step(q: TrialQueue, score: Callable[[int, int], float] = _score) -> list[tuple[int, int]]:
    """Every claimable trial once: held at its rung with its score, or finished at the last rung."""
    done = []
    while (c := q.claim(WORKER)) is not None:
        assert len(c.plan.scored) == 3
        if c.rung < len(c.plan.scored) - 1:
            assert c.plan.stop_after == c.plan.scored[c.rung] and c.plan.score_at == (c.plan.stop_after,)
            assert q.park(c, score(c.slot, c.rung), {Attr.FLOPS_SPENT: 10, Attr.FLOPS_FULL: 90})
        else:
            q.finish(c, TrialState.COMPLETE, score(c.slot, c.rung), {Attr.FLOPS_SPENT: 60, Attr.FLOPS_FULL: 90})
        done.append((c.slot, c.rung))
    return done


def _run_to_end(q: TrialQueue) -> list[tuple[int, int]]:
    claims = []
    for _ in range(20):
        claims += _step(q)
        if q.maintain().done:
            return claims
    raise AssertionError("the plan did not finish")


def _trials(q: TrialQueue) -> list[Any]:
    return q.storage.get_all_trials(q.study_id, deepcopy=False)


def test_halving_settings_are_stored_and_bad_ones_refused() -> None:
    s = _settings()
    assert s.pruner == "halving" and s.options.halving == {"eta": 3, "min_fraction": "1/9"}
    assert "halving" not in _settings(pruner="median").options.keys, "other studies keep their identity"
    with pytest.raises(StudyError, match="at least 2"):
        _settings(eta=1)
    with pytest.raises(StudyError, match="such as 1/9"):
        _settings(min_fraction="nine")
    with pytest.raises(StudyError, match="falls inside the WSD cooldown"):
        _settings(min_fraction="1/2", eta=2, schedule="wsd", cooldown=0.6)


@pytest.mark.parametrize(("flags", "sentence"), [
    (["--eta", "4"], "--eta counts only with --pruner halving"),
    (["--pruner", "halving", "--min-fraction", "2"], "--min-fraction 2 must be in (0, 1]"),
])
def test_bad_halving_flags_are_one_sentence_and_write_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], sentence: str) -> None:
    db = tmp_path / "s.db"
    assert main(["launch", "--experiment", "x", "--budget", "200K", *flags, "--storage", f"sqlite:///{db}"]) == 2
    assert sentence in capsys.readouterr().err and not db.exists()


def test_the_best_third_of_each_rung_go_on_and_only_full_length_trials_complete(storage_url: str) -> None:
    s = _settings()
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    claims = _run_to_end(q)
    phase1 = [e.slot for e in s.plan if e.phase == 1]
    decided = q.upkeep.study_attr("archhpo_halving")
    rung0 = promotions({slot: _score(slot, 0) for slot in phase1}, 3)
    rung1 = promotions({slot: _score(slot, 1) for slot in rung0}, 3)
    assert decided["1"] == [rung0, rung1]
    assert len(rung0) == len(phase1) // 3 and len(rung1) == 1
    assert sorted(sl for sl, r in claims if r == 0 and sl in phase1) == phase1, "every trial to the first rung"
    trials = _trials(q)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert {t.user_attrs["rung"] for t in complete} == {2}, "a winner is trained to full length"
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert all(t.value == t.user_attrs["rung_scores"][t.user_attrs["rung"]] for t in pruned)
    assert {t.user_attrs["plan_slot"] for t in pruned if t.user_attrs["phase"] == 1} == set(phase1) - set(rung1)
    assert not any(t.user_attrs.get("rung_hold") for t in trials)
    assert "2" in decided, "phase 2 (created when phase 1 was final) is halved on its own"


def test_every_trial_of_a_slot_is_one_optuna_trial_and_its_flops_add_up(storage_url: str, tmp_path: Path) -> None:
    s = _settings()
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    _run_to_end(q)
    trials = _trials(q)
    assert len(trials) == len(s.plan), "held, promoted and resumed: still one trial per planned slot"
    winner = next(t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs["phase"] == 1)
    assert winner.user_attrs["flops_spent"] == 10 + 10 + 60, "rung 0, rung 1 and the rest, added by the queue"
    summary = flops_summary(trials)
    assert summary["flops_full_plan"] == 90 * len(s.plan)
    assert summary["flops_spent"] == sum(t.user_attrs["flops_spent"] for t in trials)
    out = export_studies(q.storage, [s.study_name], tmp_path)
    best = json.loads(out[1].read_text())
    assert (best["flops_spent"], best["flops_full_plan"]) == (summary["flops_spent"], summary["flops_full_plan"])
    assert best["best_trial"] in [t.number for t in trials if t.state == TrialState.COMPLETE]
    header, *rows = out[0].read_text().splitlines()
    assert header.split(",").index("rung") > 17, "after the design's 18 columns"


def test_a_held_trial_is_neither_claimed_nor_reaped(storage_url: str) -> None:
    s = _settings(n_trials=3)
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name, timing=Environment(reap_s=0.0))
    first = q.claim(WORKER)
    assert first is not None and q.park(first, 0.5, {})
    with q.storage.engine.begin() as conn:  # its heartbeat is long stale
        conn.execute(sa.update(m.TrialHeartbeatModel.__table__).values(heartbeat=sa.text("'2000-01-01'")))
    others = [c for c in iter(lambda: q.claim(WORKER), None)]
    assert first.trial_id not in [c.trial_id for c in others]
    status = q.maintain()
    held = q.storage.get_trial(first.trial_id)
    assert held.state == TrialState.WAITING and held.user_attrs["rung_hold"] is True
    assert status.held == 1 and held.user_attrs["state_note"] == "waiting at rung 0"


def _make_stale(q: TrialQueue, trial_id: int) -> None:
    with q.storage.engine.begin() as conn:
        conn.execute(sa.update(m.TrialHeartbeatModel.__table__).where(m.TrialHeartbeatModel.trial_id == trial_id)
                     .values(heartbeat=sa.text("'2000-01-01'")))


def test_the_reaper_fails_only_what_is_still_stale_when_it_writes(storage_url: str) -> None:
    """The reaper reads stale trials, then writes FAIL. A trial parked at its rung, or requeued and
    claimed again, in between is left alone (Optuna's fail_stale_trials failed it: the parked trial's
    retry then skipped the rung, the rung was never decided, and the study hung with idle workers);
    a trial still silent is failed and retried."""
    s = _settings(n_trials=3)
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    parked, again, silent = (q.claim(WORKER) for _ in range(3))
    assert parked is not None and again is not None and silent is not None
    for c in (parked, again, silent):
        _make_stale(q, c.trial_id)
    looked = q.upkeep._stale_candidates()  # the reaper's read ...
    assert sorted(looked) == sorted(c.trial_id for c in (parked, again, silent))
    assert q.park(parked, 0.5, {})  # ... its owner parks it meanwhile ...
    assert q.requeue(again, "stopped")  # ... another is given back and claimed again
    reclaimed = q.claim(WORKER)
    assert reclaimed is not None and reclaimed.trial_id == again.trial_id
    assert q.upkeep._fail_stale(looked) == [silent.trial_id]  # ... and then the reaper writes
    held = q.storage.get_trial(parked.trial_id)
    assert held.state == TrialState.WAITING and held.user_attrs["rung_hold"] is True
    assert q.storage.get_trial(again.trial_id).state == TrialState.RUNNING
    assert q.heartbeat(reclaimed) and not q.heartbeat(silent), "the silent one is fenced out"
    assert q.storage.get_trial(silent.trial_id).state == TrialState.FAIL
    q.maintain()
    retry = [t for t in _trials(q) if t.user_attrs.get("retry_of") is not None]
    assert [t.user_attrs["plan_slot"] for t in retry] == [silent.slot], "the silent one alone is retried"


def test_a_rung_is_decided_once_however_many_upkeeps_race(storage_url: str) -> None:
    s = _settings()
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    _step(q)  # phase 1 held at rung 0, undecided
    queues = [TrialQueue(storage_url, s.study_name) for _ in range(5)]
    barrier, errors = threading.Barrier(5), []

    def go(x: TrialQueue) -> None:
        try:
            barrier.wait()
            x.maintain()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(x,)) for x in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(q.upkeep.study_attr("archhpo_halving")["1"]) == 1
    waiting = [t for t in _trials(q) if t.state == TrialState.WAITING]
    assert sorted(t.user_attrs["plan_slot"] for t in waiting) == q.upkeep.study_attr("archhpo_halving")["1"][0]
    assert all(t.user_attrs["rung_hold"] is False and t.user_attrs["rung"] == 0 for t in waiting)


def test_a_decision_stored_but_not_applied_is_finished_by_the_next_upkeep(
        storage_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings()
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    _step(q)

    def killed(*args: Any, **kw: Any) -> bool:
        raise KeyboardInterrupt("killed between storing the decision and applying it")

    monkeypatch.setattr(RungDecisions, "_apply_rung", killed)
    with pytest.raises(KeyboardInterrupt):
        q.maintain()
    stored = q.upkeep.study_attr("archhpo_halving")["1"][0]
    monkeypatch.undo()
    fresh = TrialQueue(storage_url, s.study_name)
    fresh.maintain()
    assert fresh.upkeep.study_attr("archhpo_halving")["1"] == [stored]
    waiting = sorted(t.user_attrs["plan_slot"] for t in _trials(fresh) if t.state == TrialState.WAITING)
    assert waiting == stored


def test_a_trial_lost_after_its_promotion_is_retried_towards_the_same_rung(storage_url: str) -> None:
    s = _settings()
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    _step(q)
    q.maintain()
    promoted = q.claim(WORKER)
    assert promoted is not None and promoted.rung == 1
    q.finish(promoted, TrialState.FAIL, None, {})  # no fail_reason: its worker vanished
    q.maintain()
    retry = next(c for c in iter(lambda: q.claim(WORKER), None) if c.slot == promoted.slot)
    assert retry.attempt == 2
    assert (retry.rung, retry.plan.scores) == (1, promoted.plan.scores) and retry.plan.stop_after is not None


def test_a_trial_that_fails_for_good_at_a_rung_is_never_promoted(storage_url: str) -> None:
    s = _settings()
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    best = min((e.slot for e in s.plan if e.phase == 1), key=lambda slot: (_score(slot, 0), slot))
    while (c := q.claim(WORKER)) is not None:
        if c.slot == best:
            q.finish(c, TrialState.FAIL, None, {"fail_reason": "diverged"})
        else:
            q.park(c, _score(c.slot, 0), {})
    q.maintain()
    assert best not in q.upkeep.study_attr("archhpo_halving")["1"][0]


def test_replicates_are_never_held_they_score_every_rung_in_passing(storage_url: str) -> None:
    s = _settings(paired_seeds=2, n_trials=3)
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    c = q.claim(WORKER)
    assert c is not None and c.plan.scored and c.plan.stop_after is None and c.rung == 0
    assert c.plan.score_at == c.plan.scored[:-1] and c.plan.scores_from_checkpoint
    q.finish(c, TrialState.COMPLETE, 1.0, {})
    q.maintain()
    assert q.upkeep.study_attr("archhpo_halving") is None or not any(q.upkeep.study_attr("archhpo_halving").values())


def test_flops_summary_is_empty_for_a_study_that_recorded_none() -> None:
    assert flops_summary([]) == {"flops_spent": None, "flops_full_plan": None}


def test_the_compute_line_adds_spent_flops_against_one_full_training_per_slot() -> None:
    import pandas as pd

    from archhpo.report._compute import compute_rows, compute_text

    frame = pd.DataFrame({
        "budget": ["1M", "1M", "1M", "2M"], "plan_slot": [0, 1, 1, 0],  # slot 1 of 1M: a retry, one slot
        "flops_spent": [10.0, 20.0, 5.0, 40.0], "flops_full": [90.0, 90.0, 90.0, 100.0], "rung": [0, 1, 1, 2],
        "state": ["PRUNED", "COMPLETE", "COMPLETE", "COMPLETE"],
    })
    assert compute_text(frame) == ("compute: 75 FLOPs spent against 280 to train every planned trial to full "
                                   "length (27%; successive halving saved 73%)")
    assert compute_rows(frame) == [["1M", "35", "180", "19%"], ["2M", "40", "100", "40%"], ["all", "75", "280", "27%"]]
    assert compute_text(frame.drop(columns=["flops_spent", "flops_full"])) is None


def test_the_compute_line_credits_a_saving_only_to_what_made_it() -> None:
    import pandas as pd

    from archhpo.report._compute import compute_text

    frame = pd.DataFrame({"budget": ["1M", "1M"], "plan_slot": [0, 1], "flops_spent": [30.0, 100.0],
                          "flops_full": [100.0, 100.0], "rung": [None, None], "state": ["PRUNED", "COMPLETE"]})
    assert compute_text(frame).endswith("(65%; pruning saved 35%)"), "the median pruner, not halving"
    unpruned = frame.assign(state=["COMPLETE", "COMPLETE"])
    assert compute_text(unpruned).endswith(
        "(65%; 35% not recorded as spent: nothing was pruned, so failed or partly recorded trials)")
    whole = frame.assign(flops_spent=[100.0, 100.0], state=["COMPLETE", "COMPLETE"])
    assert compute_text(whole).endswith("(100%; every trial ran to full length)")
