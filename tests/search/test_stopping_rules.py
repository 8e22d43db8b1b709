"""Stopping rules are one type (search/_rules.py): a new rule is its class and one registration.

Two toy rules are registered, launched as a study's --pruner and unregistered again: one that stops
at report time (`stops`: any trial whose loss at epoch 1 is above a threshold) and one that decides
at upkeep time (`decide`: only the best trial of each rung goes on), the latter with real workers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any, ClassVar

import optuna
import pytest
import torch
from optuna.trial import TrialState

from archhpo.config import Pruning, StoredOptions
from archhpo.errors import StudyError
from archhpo.schema import PRUNERS, TrainingPlan
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._halving import Halving
from archhpo.search._rules import (
    RULES,
    MedianRule,
    NoStopping,
    SuccessiveHalving,
    claim_plan,
    make_rule,
    register_rule,
    unregister_rule,
)
from archhpo.search._rules import _Rule as Rule
from archhpo.search._trust import RungTrust
from archhpo.workers import Worker
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}


class AboveAtFirstEpoch(Rule):
    """Stop any trial whose loss at epoch 1 is above THRESHOLD; never hold a trial."""

    name: ClassVar[str] = "toy-above"
    THRESHOLD: ClassVar[float] = 1.0

    def stops(self, step: int, best: float, completed: Any) -> bool:
        return step == 1 and best > self.THRESHOLD


class BestOfEachRung(SuccessiveHalving):
    """Successive halving's rungs, but only the best trial of each rung goes on."""

    name: ClassVar[str] = "toy-best1"

    def decide(self, rung: int, scores: Mapping[int, float]) -> list[int]:
        return sorted(scores, key=lambda slot: (scores[slot], slot))[:1]


@pytest.fixture
def toy_rules() -> Iterator[None]:
    for rule in (AboveAtFirstEpoch, BestOfEachRung):
        register_rule(rule)
    try:
        yield
    finally:
        for rule in (AboveAtFirstEpoch, BestOfEachRung):
            unregister_rule(rule.name)
    assert "toy-above" not in RULES and "toy-above" not in PRUNERS


def test_the_builtin_rules_are_registered_under_the_pruner_names() -> None:
    assert {name: RULES[name] for name in ("median", "halving", "none")} == {
        "median": MedianRule, "halving": SuccessiveHalving, "none": NoStopping}
    assert set(PRUNERS) == set(RULES)


def test_each_study_gets_its_rule_from_its_stored_name_and_options() -> None:
    median = prepare_settings("r", "500K", family="patchtst", data=TINY_DATA, quick=True, n_trials=4)
    assert make_rule(median) == MedianRule(n_warmup_steps=1)
    halving = prepare_settings("r", "500K", family="patchtst", data=TINY_DATA, n_trials=4, pruner="halving", eta=2,
                               min_fraction="1/4")
    rule = make_rule(halving)
    assert isinstance(rule, SuccessiveHalving) and rule.rungs(8) == [2, 4, 8] and rule.n_rungs == 3
    assert halving.options.halving == {"eta": 2, "min_fraction": "1/4"}
    none = prepare_settings("r", "500K", family="patchtst", data=TINY_DATA, n_trials=4, pruner="none")
    assert isinstance(make_rule(none), NoStopping) and "halving" not in none.options.keys


def test_a_claims_plan_is_what_the_rule_says_in_the_trainers_terms() -> None:
    rule = SuccessiveHalving.from_options(StoredOptions(halving={"eta": 3, "min_fraction": "1/9"}))
    new, rung = claim_plan(rule, {"epochs": 9}, True, {})
    assert rung == 0 and new == TrainingPlan(validate_at=(1,), score_at=(1,), stop_after=1, scored=(1, 3, 9))
    promoted, rung = claim_plan(rule, {"epochs": 9}, True, {"rung": 0, "rung_scores": [2.0], "branch_epochs": [0.5]})
    assert rung == 1 and (promoted.stop_after, promoted.scores, promoted.branch_epochs) == (3, (2.0,), (0.5,))
    last, rung = claim_plan(rule, {"epochs": 9}, True, {"rung": 1, "rung_scores": [2.0, 1.5]})
    assert rung == 2 and last.stop_after is None and last.score_at == () and last.scored == (1, 3, 9)
    replicate, _ = claim_plan(rule, {"epochs": 2}, False, {})  # rungs 1, 1, 2: scored twice at epoch 1
    assert (replicate.validate_at, replicate.score_at, replicate.stop_after) == ((1,), (1, 1), None)
    assert claim_plan(MedianRule(), {}, True, {}) == (TrainingPlan(), 0)


def test_a_registered_rule_is_a_pruner_choice_until_it_is_unregistered(toy_rules: None) -> None:
    assert Pruning(rule="toy-above").rule == "toy-above"
    unregister_rule("toy-above")
    with pytest.raises(StudyError, match="Unknown pruner 'toy-above'"):
        Pruning(rule="toy-above")
    register_rule(AboveAtFirstEpoch)


def test_a_report_time_toy_rule_stops_the_trials_it_names(storage_url: str, toy_rules: None) -> None:
    s = prepare_settings("toy", "500K", family="patchtst", data=TINY_DATA, quick=True, seed=0, n_trials=8,
                         pruner="toy-above")
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    assert isinstance(q.rule, AboveAtFirstEpoch) and q.upkeep.rungs is None
    a, b, c = q.claim(WORKER), q.claim(WORKER), q.claim(WORKER)
    assert a is not None and b is not None and c is not None and a.plan == TrainingPlan()
    assert q.report(a, 1, 1.5), "above the threshold at epoch 1: stopped"
    assert not q.report(b, 1, 0.5) and not q.report(b, 2, 1.5), "below at epoch 1, and the rule looks only there"
    assert not q.report(c, 2, 9.0)
    q.finish(a, TrialState.PRUNED, 1.5, {})
    q.finish(b, TrialState.COMPLETE, 1.5, {})
    assert q.maintain().pruned == 1


def test_an_upkeep_time_toy_rule_promotes_only_the_best_of_each_rung(sqlite_url: str, tmp_path: Any,
                                                                      toy_rules: None) -> None:
    s = prepare_settings("toy", "100K", family="lm", data="synthetic:tokens=3000", quick=True, seed=0, n_trials=6,
                         pruner="toy-best1", fixed_params={"epochs": 3, "batch_size": 16, "learning_rate": 3e-3})
    assert s.options.halving == {"eta": 3, "min_fraction": "1/9"}  # the defaults: rungs at epochs 1, 1, 3
    launch(sqlite_url, s)
    torch.set_num_threads(1)
    summary = Worker([TrialQueue(sqlite_url, s.study_name)], device="cpu", threads=1,
                     checkpoint_dir=tmp_path / "ck").run()
    assert summary.failed == 0 and summary.parked > 0
    study = optuna.load_study(study_name=s.study_name, storage=sqlite_url)
    trials = study.get_trials(deepcopy=False)
    decisions = study.user_attrs["archhpo_halving"]
    for phase, rungs in decisions.items():
        assert [len(promoted) for promoted in rungs] == [1, 1], (phase, rungs)
        members = [t for t in trials if t.user_attrs["phase"] == int(phase)]
        complete = [t for t in members if t.state == TrialState.COMPLETE]
        assert [t.user_attrs["plan_slot"] for t in complete] == rungs[-1], "only the best of each rung goes on"
        first = {t.user_attrs["plan_slot"]: t.user_attrs["rung_scores"][0] for t in members}
        assert rungs[0] == [min(first, key=lambda slot: (first[slot], slot))]
        assert all(t.state == TrialState.PRUNED for t in members if t not in complete)
    assert {t.user_attrs["rung_epochs"][0] for t in trials} == {1}


@pytest.mark.parametrize(("rule", "epochs", "share"), [
    (SuccessiveHalving(Halving(3, Fraction(1, 3))), 3, Fraction(1 + Fraction(2, 3), 3)),  # rungs 1, 3
    (SuccessiveHalving(Halving(3, Fraction(1, 9))), 9, Fraction(1 + Fraction(2, 3) + Fraction(6, 9), 9)),  # 1, 3, 9
    (SuccessiveHalving(Halving(3, Fraction(1, 9), ladder=True)), 9, 1),  # no trust measured: full length
    (NoStopping(), 9, 1),
    (MedianRule.for_study(True), 9, 1),  # the median rule cannot say how many it stops
])
def test_a_rule_says_what_share_of_a_full_training_a_new_trial_is_expected_to_train(
        rule: Any, epochs: int, share: Fraction) -> None:
    """What `run`'s ETA prices a trial no worker has started at: under successive halving every trial
    trains to the first rung and 1/eta of those go on at each rung."""
    assert rule.expected_share(epochs) == pytest.approx(float(share), abs=1e-12)


@pytest.mark.parametrize(("trusted", "share"), [
    ([0, 1], Fraction(1 + Fraction(2, 3) + Fraction(6, 9), 9)),  # both rungs judged: as off the ladder
    ([1], Fraction(3 + Fraction(6, 3), 9)),  # rung 0 passed through, halved at rung 1 alone
    ([0], Fraction(1 + Fraction(8, 3), 9)),  # halved at rung 0 alone
    ([], 1),  # measured, and no rung trusted: the region trains to full length
])
def test_a_ladder_budget_is_priced_at_the_rungs_its_trust_judges(trusted: list[int], share: Fraction) -> None:
    """On --ladder the ETA prices a new trial by the rungs its budget's measured trust judges (the
    ladder record's), and at full length while none is measured (the smallest budget, or a larger
    one not planned yet)."""
    rule = SuccessiveHalving(Halving(3, Fraction(1, 9), ladder=True))
    trust = RungTrust.from_record({"trust": {"rungs": [], "trusted": trusted, "noise": 0.01}})
    assert rule.expected_share(9, trust) == pytest.approx(float(share), abs=1e-12)
    assert rule.expected_share(9, RungTrust.from_record(None)) == 1.0
    assert SuccessiveHalving(Halving(3, Fraction(1, 9))).expected_share(9, trust) == pytest.approx(
        (1 + 2 / 3 + 6 / 9) / 9), "off the ladder every rung is judged, whatever trust is passed"
