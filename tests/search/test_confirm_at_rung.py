"""--confirm-at-rung: a ladder budget that trusts a rung confirms its finalists there. Each
confirmation run trains to the lowest trusted rung, is scored by its cooldown branch and ends
(PRUNED, its score its value); the second wave and the winner are decided on the finalists' scores
at that rung (their search runs' scores recorded there included); a budget trusting no rung
confirms at full length as before."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState

from archhpo.config import StudyConfig
from archhpo.errors import ArchhpoError
from archhpo.report._confirm import confirmation_summary, frame_confirmation
from archhpo.report._export import RESULTS_CSV, csv_text, result_rows
from archhpo.report._frame import trials_frame
from archhpo.schema import Attr
from archhpo.search import TrialQueue, keyword_config, launch, prepare_settings
from archhpo.search._confirmation import AT_RUNG_KEY, mark_rung, run_value
from archhpo.search._halving import Halving
from archhpo.search._rules import SuccessiveHalving, claim_plan
from archhpo.search._study import LADDER_KEY
from archhpo.search._upkeep import PHASE3_KEY
from archhpo.workers import Worker
from tests.conftest import TINY_DATA

RULE = SuccessiveHalving(Halving(3, Fraction(1, 9), ladder=True))
WORKER = {"host": "test", "device": "cpu"}


def test_a_confirmation_run_at_a_rung_scores_up_to_it_and_ends_there() -> None:
    at1, rung = claim_plan(RULE, {"epochs": 9}, False, {Attr.CONFIRM_RUNG: 1})
    assert rung == 1 and (at1.score_at, at1.stop_after, at1.ends) == ((1, 3), 3, True)
    assert at1.scores_from_checkpoint, "never held: a resumed claim's scores are in its checkpoint"
    at0, rung = claim_plan(RULE, {"epochs": 9}, False, {Attr.CONFIRM_RUNG: 0})
    assert rung == 0 and (at0.score_at, at0.stop_after, at0.ends) == ((1,), 1, True)
    full, _ = claim_plan(RULE, {"epochs": 9}, False, {})
    assert full.stop_after is None and not full.ends, "without the mark: full length, as before"


def test_the_finalists_and_baselines_are_marked_at_the_lowest_trusted_rung_not_the_probes() -> None:
    ranks = [{"rank": 0}, {"rank": 1}, {"rank": 2, "baseline": "kaplan"}, {"rank": 3, "lr_probe": 0.5}]
    marked = mark_rung(ranks, {"trusted": [1, 0]})
    assert [r.get(AT_RUNG_KEY) for r in marked] == [0, 0, 0, None]
    assert mark_rung(ranks, {"trusted": []}) == ranks and mark_rung(ranks, None) == ranks


def test_the_option_needs_a_ladder_and_is_stored_with_it() -> None:
    with pytest.raises(ArchhpoError, match="--confirm-at-rung and --no-confirm-at-rung choose where a ladder"):
        StudyConfig("e", budgets=("200K", "500K"), pruning=replace(StudyConfig("e").pruning, confirm_at_rung=True),
                    given=frozenset({"confirm_at_rung"}))
    config = _config(3)
    small = prepare_settings(config, "200K")
    large = prepare_settings(config, "500K", ladder_below=[small.study_name])
    assert small.options.ladder is None, "the smallest budget trusts nothing: it confirms at full length"
    assert large.options.ladder == {"below": [small.study_name], "confirm": "rung"} and large.options.confirm_at_rung


def test_a_ladder_budget_launched_before_the_default_resumes_as_stored(storage_url: str) -> None:
    """A ladder budget stored without `"confirm": "rung"` (launched before 2026-11-29, when it became
    --ladder's default) relaunches with --confirm-at-rung and keeps confirming at full length; a budget
    stored with it (launched while it was the default, until 2026-12-02) relaunches with today's
    default command, which no longer confirms at the rung, and keeps confirming at the rung."""
    from archhpo.errors import StudyError

    config = _config(3)
    before = replace(config, pruning=replace(config.pruning, confirm_at_rung=False))
    small = prepare_settings(before, "200K")
    launch(storage_url, prepare_settings(before, "500K", ladder_below=[small.study_name]))
    today = prepare_settings(config, "500K", ladder_below=[small.study_name])
    assert today.options.confirm_at_rung
    assert not launch(storage_url, today).settings.options.confirm_at_rung, "the stored behaviour is kept"
    assert not TrialQueue(storage_url, today.study_name).settings.options.confirm_at_rung
    other = replace(config, experiment="cq")
    launch(storage_url, prepare_settings(other, "500K", ladder_below=[small.study_name]))
    default_now = replace(other, pruning=replace(other.pruning, confirm_at_rung=False))
    again = launch(storage_url, prepare_settings(default_now, "500K", ladder_below=[small.study_name]))
    assert again.settings.options.confirm_at_rung, "the stored behaviour is kept"
    carried = replace(other, experiment="cc", pruning=replace(other.pruning, carry_finalists=True))
    launch(storage_url, prepare_settings(carried, "500K", ladder_below=[small.study_name]))
    with pytest.raises(StudyError, match=r"options.ladder: stored .*'carry': 'final"):
        opted_out = replace(carried, pruning=replace(carried.pruning, carry_finalists=False))
        launch(storage_url, prepare_settings(opted_out, "500K", ladder_below=[small.study_name]))


def _config(confirm: int) -> Any:
    base = keyword_config("cr", n_trials=8, data=TINY_DATA, quick=True, seed=0, fixed_params={"epochs": 9},
                          confirm=confirm, confirm_seeds=1, sequential_confirm=True)
    return replace(base, budgets=("200K", "500K"), ladder=True, pruning=replace(base.pruning, confirm_at_rung=True))


def _score(slot: int, rung: int) -> float:
    """Rung scores ranked by slot as the finals are; a confirmation run (slot beyond phase 1) a little behind."""
    return round(1.0 + ((slot * 7) % 5) * 0.1 - 0.01 * rung, 6)


def _play(q: TrialQueue, confirm: dict[int, float]) -> None:
    """Claim and settle every claimable trial as a worker would: parked at a rung it stops at, ended
    there (PRUNED) under `plan.ends`, else finished at full length; a confirmation of rank r scores
    its architecture's search run's score + confirm[r]."""
    while (c := q.claim(WORKER)) is not None:
        rank = q.storage.get_trial(c.trial_id).user_attrs.get("rank")
        source = c.slot if rank is None else _slot_of(q, int(c.params["arch_idx"]))
        shift = 0.0 if rank is None else confirm.get(int(rank), 0.0)
        if c.plan.ends:
            scores = [_score(source, r) + shift for r in range(len(c.plan.score_at))]
            assert q.finish(c, TrialState.PRUNED, scores[-1], {Attr.RUNG_SCORES: scores, Attr.RUNG: len(scores) - 1})
        elif c.plan.stop_after is not None:
            assert q.park(c, _score(source, c.rung) + shift, {})
        else:
            scores = [*c.plan.scores, *(_score(source, len(c.plan.scores) + i) + shift
                                        for i in range(len(c.plan.score_at))), _score(source, 2) + shift]
            q.finish(c, TrialState.COMPLETE, scores[-1], {Attr.RUNG_SCORES: scores} if c.plan.scored else {})


def _slot_of(q: TrialQueue, arch_idx: int) -> int:
    return next(int(t.user_attrs["plan_slot"]) for t in q.storage.get_all_trials(q.study_id, deepcopy=False)
                if t.user_attrs.get("phase") == 1 and int(t.params["arch_idx"]) == arch_idx)


def _run(q: TrialQueue, confirm: dict[int, float]) -> None:
    for _ in range(30):
        _play(q, confirm)
        if q.maintain().done:
            return
    raise AssertionError("the plan did not finish")


def _planned(storage_url: str, trust: dict[str, Any]) -> TrialQueue:
    """The smallest budget trained to the end, the larger planned with `trust` as its record's."""
    config = _config(3)
    small = prepare_settings(config, "200K")
    large = prepare_settings(config, "500K", ladder_below=[small.study_name])
    launch(storage_url, small)
    launch(storage_url, large)
    _run(TrialQueue(storage_url, small.study_name), {})
    TrialQueue(storage_url, large.study_name).maintain()
    q = TrialQueue(storage_url, large.study_name)
    q.study.set_user_attr(LADDER_KEY, {**q.upkeep.study_attr(LADDER_KEY), "trust": trust})
    return TrialQueue(storage_url, large.study_name)


def _ladder(storage_url: str, trust: dict[str, Any], confirm: dict[int, float]) -> TrialQueue:
    """`_planned`, then the larger budget run."""
    q = _planned(storage_url, trust)
    _run(q, confirm)
    return q


def test_a_budget_trusting_rung_0_confirms_there_and_chooses_on_the_scores_there(storage_url: str,
                                                                                 tmp_path: Path) -> None:
    q = _ladder(storage_url, {"trusted": [0], "noise": 0.15}, {0: 0.3, 1: -0.3})  # 2 survive: 2 finalists
    ranks = q.upkeep.study_attr(PHASE3_KEY)
    finalists = [r for r in ranks if r.get("baseline") is None and r.get("lr_probe") is None]
    assert finalists and all(r[AT_RUNG_KEY] == 0 for r in finalists)
    trials = q.storage.get_all_trials(q.study_id, deepcopy=False)
    confirmations = [t for t in trials if t.user_attrs["phase"] == 3]
    assert confirmations and all(t.state == TrialState.PRUNED and t.user_attrs[Attr.CONFIRM_RUNG] == 0
                                 and t.value == t.user_attrs[Attr.RUNG_SCORES][-1]
                                 and len(t.user_attrs[Attr.RUNG_SCORES]) == 1 for t in confirmations)
    search = [t for t in trials if t.user_attrs["phase"] == 1 and t.state == TrialState.COMPLETE]
    assert all(run_value(t, 0) == t.user_attrs[Attr.RUNG_SCORES][0] != t.value for t in search)
    summary = confirmation_summary(trials, q.settings.archs, ranks)
    assert summary["at_rung"] == 0 and summary["statement"].startswith("The finalists were confirmed at rung 0")
    chosen = summary["chosen"]
    assert chosen["rank"] == 1 and chosen["reversed"], "rank 1's scores at the rung are the lower mean"
    for rank in (0, 1):  # its confirmation run's score and its search run's, both at rung 0
        runs = [t for t in confirmations if t.user_attrs["rank"] == rank]
        searched = [t for t in search if t.params["arch_idx"] == runs[0].params["arch_idx"]]
        values = [runs[0].value, *(t.user_attrs[Attr.RUNG_SCORES][0] for t in searched)]
        assert chosen["means"][str(rank)] == pytest.approx(sum(values) / len(values))
    # counted apart from the pruned, by the running upkeep and by one reading the study afresh
    pruned = [t for t in trials if t.state == TrialState.PRUNED and Attr.CONFIRM_RUNG not in t.user_attrs]
    for st in (q.maintain(), TrialQueue(storage_url, q.settings.study_name).maintain()):
        assert (st.at_rung, st.pruned) == (len(confirmations), len(pruned))
    # the report read from the CSV alone makes the same choice
    study = optuna.load_study(study_name=q.settings.study_name, storage=storage_url)
    (tmp_path / RESULTS_CSV).write_text(csv_text(result_rows(study, q.settings)))
    from_csv = frame_confirmation(trials_frame("cr", csv=tmp_path / RESULTS_CSV))[q.settings.budget]
    assert from_csv["at_rung"] == 0 and from_csv["chosen"]["means"] == chosen["means"]


def test_runs_eta_prices_a_ladder_budgets_queued_trials_at_its_trusted_rungs(storage_url: str) -> None:
    """The progress line reads each budget's trust from its ladder record (RunProgress._read_work):
    the larger budget, trusting rung 0, prices its queued phase-1 trials at halving's share there."""
    import io

    from archhpo.cluster._progress import RunProgress
    from archhpo.search._rules import make_rule
    from archhpo.search._trust import RungTrust

    q = _planned(storage_url, {"trusted": [0], "noise": 0.1})
    work = RunProgress(io.StringIO(), {q.settings.study_name: q}, 1)._read_work()
    expected = make_rule(q.settings).expected_share(9, RungTrust.from_record({"trust": {"trusted": [0]}}))
    shares = {(e.phase, round(s.share, 12)) for e, s in zip(q.settings.plan, work.slots, strict=True) if not s.done}
    assert expected < 1 and shares == {(1, round(expected, 12)), (3, 1.0)}, "confirmations: never pruned"


def test_a_budget_trusting_no_rung_confirms_at_full_length(storage_url: str) -> None:
    q = _ladder(storage_url, {"trusted": [], "noise": 0.05}, {})
    assert all(AT_RUNG_KEY not in r for r in q.upkeep.study_attr(PHASE3_KEY))
    confirmations = [t for t in q.storage.get_all_trials(q.study_id, deepcopy=False) if t.user_attrs["phase"] == 3]
    assert confirmations and all(t.state == TrialState.COMPLETE and Attr.CONFIRM_RUNG not in t.user_attrs
                                 for t in confirmations)


def test_a_worker_ends_a_run_marked_at_its_rung(sqlite_url: str, tmp_path: Path) -> None:
    """A real worker: replicates (never judged, as confirmation runs) marked at rung 0 train to it,
    score a cooldown branch there and end PRUNED with that score, for a fraction of a full run."""
    s = prepare_settings("cw", "100K", family="lm", data="synthetic:tokens=3000", quick=True, seed=0, n_trials=2,
                         paired_seeds=2, schedule="wsd", cooldown=0.2, pruner="halving", eta=2, min_fraction="1/2",
                         fixed_params={"epochs": 4, "batch_size": 16, "learning_rate": 3e-3})
    launch(sqlite_url, s)
    q = TrialQueue(sqlite_url, s.study_name)
    waiting = q.storage.get_all_trials(q.study_id, deepcopy=False, states=(TrialState.WAITING,))
    assert len(waiting) == 4
    for t in waiting:  # what the upkeep's enqueue writes for a confirmation at rung 0
        q.storage.set_trial_user_attr(t._trial_id, Attr.CONFIRM_RUNG, 0)
    torch.set_num_threads(1)
    Worker([TrialQueue(sqlite_url, s.study_name)], device="cpu", threads=1, checkpoint_dir=tmp_path / "ck").run()
    done = q.storage.get_all_trials(q.study_id, deepcopy=False)
    assert {t.state for t in done} == {TrialState.PRUNED} and len(done) == 4
    for t in done:
        assert t.user_attrs[Attr.RUNG_EPOCHS] == [2, 4] and t.user_attrs[Attr.PRUNED_AT_EPOCH] == 2
        assert len(t.user_attrs[Attr.RUNG_SCORES]) == 1 and t.value == t.user_attrs[Attr.RUNG_SCORES][0]
        assert t.value != t.intermediate_values[2], "a cooldown branch's score, not the constant-rate loss"
        assert sorted(t.intermediate_values) == [1, 2] and t.user_attrs[Attr.BRANCH_EPOCHS][0] > 0
        assert t.user_attrs[Attr.FLOPS_SPENT] < t.user_attrs[Attr.FLOPS_FULL], "it stopped at its rung"
    assert not list((tmp_path / "ck").rglob("*.pt")), "ended, not held: nothing left to resume"


def test_runs_closing_line_counts_confirmations_at_a_rung_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """`run`'s closing line: a confirmation run that ended at its rung is not called pruned, and a
    study without any keeps the line it always printed."""
    from archhpo.cli._study_cmds import _print_statuses
    from archhpo.search._status import PlanStatus

    _print_statuses({"cr_500K": PlanStatus(total=9, complete=4, pruned=3, at_rung=2, best_value=1.25),
                     "cr_200K": PlanStatus(total=8, complete=8, best_value=1.5)})
    assert capsys.readouterr().err.splitlines() == [
        "cr_500K: 4 complete, 3 pruned, 2 confirmed at a rung, 0 failed; best val_loss 1.2500",
        "cr_200K: 8 complete, 0 pruned, 0 failed; best val_loss 1.5000"]
