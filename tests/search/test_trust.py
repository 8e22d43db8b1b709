"""Rungs only where trusted (--ladder): a rung's agreement with full-length results is measured at
the smallest budget (pairwise, ties within seed noise, a bootstrap interval over architectures), a
larger budget prunes only at rungs whose interval clears the threshold, and its cuts keep the
scores tied within noise with the worst promoted one."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest
from optuna.trial import TrialState

from archhpo.config import Pruning, StudyConfig
from archhpo.schema import Attr, TrainingPlan
from archhpo.search import TrialQueue, keyword_config, launch, prepare_settings
from archhpo.search._halving import Halving, promotions
from archhpo.search._rules import SuccessiveHalving, claim_plan, make_rule, on_ladder
from archhpo.search._study import LADDER_KEY
from archhpo.search._trust import (
    EVERY_RUNG,
    FOR_ABOVE,
    N_BOOT,
    TRUST_THRESHOLD,
    ArchRuns,
    RungTrust,
    describe_trust,
    distinguishable_pairs,
    pairwise_agreement,
    rung_trust,
    seed_noise,
    soft_promotions,
    spearman,
)
from tests.conftest import TINY_DATA


def _arch(i: int, rungs: list[float], finals: list[float]) -> ArchRuns:
    """An architecture whose every trial scored `rungs` (one per rung) and ended at one of `finals`."""
    return ArchRuns((i,), [list(rungs) for _ in finals], list(finals))


def test_seed_noise_pools_the_within_architecture_spread_of_the_finals() -> None:
    archs = [_arch(0, [], [1.0, 3.0]), _arch(1, [], [2.0, 2.0, 5.0]), _arch(2, [], [7.0])]
    # squares: (1-2)^2 + (3-2)^2 = 2 and 1 + 1 + 4 = 6 over 1 + 2 degrees of freedom
    assert seed_noise(archs) == pytest.approx(math.sqrt(8 / 3))
    assert math.isnan(seed_noise([_arch(0, [], [1.0]), _arch(1, [], [2.0])])), "no architecture trained twice"


def test_agreement_is_one_for_the_right_order_and_zero_for_the_reversed() -> None:
    finals = [1.0, 2.0, 3.0, 4.0]
    assert pairwise_agreement([10.0, 20.0, 30.0, 40.0], finals, 0.1) == 1.0
    assert pairwise_agreement([40.0, 30.0, 20.0, 10.0], finals, 0.1) == 0.0
    assert pairwise_agreement([10.0, 30.0, 20.0, 40.0], finals, 0.1) == 5 / 6, "one pair of six swapped"


def test_rung_scores_within_noise_are_half_right_and_finals_within_noise_say_nothing() -> None:
    # rung: 1.0 and 1.05 tie (noise 0.1): half; the other two pairs agree
    assert pairwise_agreement([1.0, 1.05, 2.0], [1.0, 2.0, 3.0], 0.1) == (0.5 + 1 + 1) / 3
    # finals 1.0 and 1.05 are indistinguishable: only the two pairs with the third count, both reversed
    assert pairwise_agreement([3.0, 2.0, 1.0], [1.0, 1.05, 2.0], 0.1) == 0.0
    assert math.isnan(pairwise_agreement([1.0, 2.0], [1.0, 1.05], 0.1)), "no distinguishable pair"
    assert pairwise_agreement([1.0, 1.0, 2.0], [1.0, 2.0, 3.0], math.nan) == (0.5 + 1 + 1) / 3, "nan: exact ties"
    assert pairwise_agreement([1.0, math.nan, 2.0], [1.0, 2.0, 3.0], 0.0) == 1.0, "a missing score is left out"


def test_spearman_for_the_record() -> None:
    assert spearman([1.0, 2.0, 3.0], [2.0, 4.0, 9.0]) == pytest.approx(1.0)
    assert spearman([3.0, 2.0, 1.0], [2.0, 4.0, 9.0]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1.0, 2.0], [1.0, 2.0]))


def _ladder_archs(order: list[int], n: int = 8) -> list[ArchRuns]:
    """n architectures 0.1 apart at full length (two seeds 0.01 apart); rung 0 in the right order,
    rung 1 in `order`'s (a permutation of 0..n-1 giving each one's rung-1 rank)."""
    return [ArchRuns((i,), [[1.0 + 0.1 * i, 5.0 + 0.1 * order[i]], [1.0 + 0.1 * i, 5.0 + 0.1 * order[i]]],
                     [2.0 + 0.1 * i, 2.01 + 0.1 * i]) for i in range(n)]


def test_a_rung_is_trusted_when_its_intervals_low_end_clears_the_threshold() -> None:
    archs = _ladder_archs(order=[7, 6, 5, 4, 3, 2, 1, 0])
    record = rung_trust(archs)
    assert (record["measure"], record["threshold"], record["n_archs"]) == ("pairwise agreement", TRUST_THRESHOLD, 8)
    assert record["noise"] == pytest.approx(0.01 / math.sqrt(2)), "two seeds 0.01 apart: a std of 0.01/sqrt 2"
    right, reversed_ = record["rungs"]
    assert (right["rung"], right["agreement"], right["low"], right["high"], right["trusted"]) == (0, 1.0, 1.0, 1.0, True)
    assert (reversed_["agreement"], reversed_["high"], reversed_["trusted"]) == (0.0, 0.0, False)
    assert right["spearman"] == pytest.approx(1.0) and reversed_["spearman"] == pytest.approx(-1.0)
    assert record["trusted"] == [0] and "reason" not in record


def test_the_interval_is_deterministic_for_a_seed_and_holds_the_point_estimate() -> None:
    archs = _ladder_archs(order=[1, 0, 2, 3, 5, 4, 6, 7])  # two swapped pairs: agreement 26/28
    a, b, c = rung_trust(archs, seed=3), rung_trust(archs, seed=3), rung_trust(archs, seed=4)
    assert a == b and a != c
    shaky = a["rungs"][1]
    assert shaky["agreement"] == pytest.approx(26 / 28)
    assert shaky["low"] < shaky["agreement"] <= shaky["high"] == 1.0
    # the same rung at a threshold just below and just above its interval's low end
    assert rung_trust(archs, threshold=shaky["low"], seed=3)["trusted"] == [0, 1]
    assert rung_trust(archs, threshold=shaky["low"] + 1e-9, seed=3)["trusted"] == [0]
    assert N_BOOT == a["n_boot"] == 1000


def test_the_record_and_the_report_say_how_many_pairs_the_agreement_rests_on() -> None:
    assert distinguishable_pairs([1.0, 1.05, 2.0, math.nan], 0.1) == 2, "1.0-1.05 tie; a missing final is left out"
    assert distinguishable_pairs([1.0, 2.0, 3.0], math.nan) == 3, "unknown noise: any gap counts"
    eight = rung_trust(_ladder_archs(order=list(range(8))))
    assert eight["pairs"] == 28 and "measured on 28 of 28 pairs of architectures" in describe_trust(eight)
    # One distinguishable pair (archs 0 and 3): the agreement is 1 with an interval of [1, 1], trusted
    # at the threshold, and the report says what it rests on.
    # Seeds 0.1 apart (noise 0.1 / sqrt 2 = 0.071), means 3.00, 3.02, 3.04, 3.08: only 0-3 is 0.08 apart.
    one = [_arch(i, [1.0 + i, 5.0], [2.95 + m, 3.05 + m]) for i, m in enumerate((0.0, 0.02, 0.04, 0.08))]
    record = rung_trust(one)
    assert record["pairs"] == 1 and record["rungs"][0]["low"] == 1.0 and record["trusted"] == [0]
    assert "rung 0 agreement 1.00 [1.00, 1.00]; rung 1 agreement 0.50 [0.50, 0.50]; measured on 1 of 6 pairs" \
        in describe_trust(record)


def test_too_few_architectures_or_none_distinguishable_trusts_nothing_with_a_reason() -> None:
    two = rung_trust(_ladder_archs(order=[0, 1], n=2))
    assert two["trusted"] == [] and two["rungs"] == [] and "at least 3" in two["reason"]
    same = [_arch(i, [1.0 + i, 2.0], [3.0, 3.01]) for i in range(4)]  # all finals within noise
    record = rung_trust(same)
    assert record["trusted"] == [] and "distinguishable" in record["reason"]
    assert [r["agreement"] for r in record["rungs"]] == [None, None], "JSON: no NaN"


def test_soft_promotions_keep_a_tie_at_the_cut_and_are_promotions_without_noise() -> None:
    scores = {0: 1.0, 1: 2.0, 2: 2.05, 3: 3.0, 4: 2.2, 5: math.inf}
    assert promotions(scores, 3) == [0, 1]
    assert soft_promotions(scores, 3, 0.1) == [0, 1, 2], "2.05 is within 0.1 of the worst promoted 2.0"
    assert soft_promotions(scores, 3, 0.3) == [0, 1, 2, 4], "never the failed slot"
    for noise in (0.0, math.nan):
        assert soft_promotions(scores, 3, noise) == promotions(scores, 3)
    assert soft_promotions({0: math.inf}, 3, 0.5) == []


def test_a_study_judges_every_rung_off_the_ladder_and_only_the_trusted_on_it() -> None:
    assert EVERY_RUNG.judges(0) and EVERY_RUNG.judges(5) and EVERY_RUNG.noise == 0.0
    assert RungTrust.from_record(None) == RungTrust(frozenset(), 0.0), "no record: nothing judged"
    assert not RungTrust.from_record({"from": "x"}).judges_any, "a record from before trust"
    trust = RungTrust.from_record({"trust": rung_trust(_ladder_archs(order=[7, 6, 5, 4, 3, 2, 1, 0]))})
    assert trust.judges(0) and not trust.judges(1) and trust.noise == pytest.approx(0.01 / math.sqrt(2))
    assert trust.ties([0], {0: 1.0, 1: 1.004, 2: 1.2}) == [0, 1]


# ----------------------------------------------------------------------------- the runtime
RULE = SuccessiveHalving(Halving(3, Fraction(1, 9), ladder=True))


def test_a_claim_stops_only_on_its_way_to_a_trusted_rung() -> None:
    none, only1 = RungTrust(frozenset()), RungTrust(frozenset({1}))
    full, rung = claim_plan(RULE, {"epochs": 9}, True, {}, none)
    assert rung == 2 and (full.validate_at, full.score_at, full.stop_after) == ((1, 3), (1, 3), None)
    assert full.scores_from_checkpoint, "a resumed claim's passing scores are in its checkpoint"
    first, rung = claim_plan(RULE, {"epochs": 9}, True, {}, only1)
    assert rung == 0 and (first.score_at, first.stop_after) == ((1,), 1), "stops at rung 0, held only at 1"
    second, rung = claim_plan(RULE, {"epochs": 9}, True, {"rung": 0, "rung_scores": [2.0]}, only1)
    assert rung == 1 and (second.score_at, second.stop_after, second.scores) == ((3,), 3, (2.0,))
    rest, rung = claim_plan(RULE, {"epochs": 9}, True, {"rung": 0, "rung_scores": [2.0]}, RungTrust(frozenset({0})))
    assert rung == 2 and (rest.score_at, rest.stop_after, rest.scores) == ((3,), None, (2.0,))
    assert claim_plan(RULE, {"epochs": 9}, True, {}) == claim_plan(replace(RULE, halving=Halving()), {"epochs": 9},
                                                                   True, {}), "off the ladder: every rung"


def test_a_budget_whose_measured_trust_judges_no_rung_scores_nothing() -> None:
    """The smallest budget (no record, trust still to measure) scores every rung in passing, a larger
    budget whose record trusts no rung trains to full length without cooldown branches, and one that
    trusts a rung still stops on the way to it."""
    untrusting = RungTrust.from_record({"trust": {"rungs": [{"rung": 0, "noise": 0.01}], "trusted": [], "noise": 0.02}})
    assert untrusting.measured and not untrusting.judges_any and not untrusting.scores_in_passing
    assert RungTrust.from_record(None).scores_in_passing, "the smallest budget: its scores measure the trust"
    assert RungTrust.from_record({"from": "x"}).scores_in_passing, "a record from before trust: as it was"
    for judged in (True, False):  # a planned trial and a confirmation run alike
        assert claim_plan(RULE, {"epochs": 9}, judged, {}, untrusting) == (TrainingPlan(), 0)
    measuring, _ = claim_plan(RULE, {"epochs": 9}, True, {}, RungTrust.from_record(None))
    assert measuring.score_at == (1, 3) and measuring.stop_after is None
    trusting = RungTrust.from_record({"trust": {"rungs": [], "trusted": [1], "noise": 0.02}})
    assert trusting.scores_in_passing and claim_plan(RULE, {"epochs": 9}, True, {}, trusting)[0].stop_after == 1


def test_a_ladder_halves_unless_its_pruner_is_stated_and_stores_that_it_trusts() -> None:
    budgets = ("200K", "500K")
    assert StudyConfig("e", budgets=budgets, ladder=True).pruning.rule == "halving"
    stated = StudyConfig("e", budgets=budgets, ladder=True, pruning=Pruning("median"), given=frozenset({"pruner"}))
    assert stated.pruning.rule == "median"
    assert StudyConfig("e", budgets=budgets, ladder=True, pruning=Pruning("none")).pruning.rule == "none"
    assert StudyConfig("e", budgets=budgets).pruning.rule == "median", "off the ladder: the default"
    s = _small()
    assert s.pruner == "halving" and s.options.halving == {"eta": 3, "min_fraction": "1/9", "trust": "ladder"}
    assert make_rule(s) == RULE and on_ladder(make_rule(s))


# A --ladder of two budgets, launched as the command line would (no --pruner: halving) with --confirm 0
# stated: these tests follow the rungs, and confirmation trials have none.
LADDER = replace(keyword_config("lt", n_trials=8, data=TINY_DATA, quick=True, seed=0, fixed_params={"epochs": 9}),
                 budgets=("200K", "500K"), ladder=True, given=frozenset({"confirm"}))
WORKER = {"host": "test", "device": "cpu"}


def _small() -> Any:
    return prepare_settings(LADDER, "200K")


def _score(slot: int, rung: int) -> float:
    return round(1.0 + ((slot * 7) % 5) * 0.1 - 0.01 * rung, 6)


def _play(q: TrialQueue) -> list[tuple[int, int, bool]]:
    """Every claimable trial once, as a worker would: scored and parked where its claim stops, else
    finished at full length with every rung below scored in passing; (slot, rung, held) each."""
    out = []
    while (c := q.claim(WORKER)) is not None:
        if c.plan.stop_after is not None:
            assert c.plan.score_at == (c.plan.stop_after,)
            assert q.park(c, _score(c.slot, c.rung), {})
        else:
            passing = [_score(c.slot, len(c.plan.scores) + i) for i in range(len(c.plan.score_at))]
            scores = [*c.plan.scores, *passing, _score(c.slot, 2)]  # the worker records them only when planned
            q.finish(c, TrialState.COMPLETE, _score(c.slot, 2), {Attr.RUNG_SCORES: scores} if c.plan.scored else {})
        out.append((c.slot, c.rung, c.hold))
    return out


def _run(q: TrialQueue) -> list[tuple[int, int, bool]]:
    claims = []
    for _ in range(20):
        claims += _play(q)
        if q.maintain().done:
            return claims
    raise AssertionError("the plan did not finish")


def _large_with_trust(storage_url: str, trust: dict[str, Any], trials: int = 8) -> TrialQueue:
    """The ladder's smallest budget trained to the end; the larger one planned, its record given `trust`
    (`trials`: --trials; 28 leaves one phase-1 slot of the larger budget beyond its region)."""
    small = prepare_settings(replace(LADDER, trials=trials), "200K")
    large = prepare_settings(replace(LADDER, trials=trials), "500K", ladder_below=[small.study_name])
    launch(storage_url, small)
    launch(storage_url, large)
    q_small = TrialQueue(storage_url, small.study_name)
    claims = _run(q_small)
    assert claims and all(rung == 2 and not hold for _, rung, hold in claims), "trusts none: all to full length"
    trials = q_small.storage.get_all_trials(q_small.study_id, deepcopy=False)
    assert {t.state for t in trials} == {TrialState.COMPLETE} and "archhpo_halving" not in q_small.study.user_attrs
    assert all(len(t.user_attrs[Attr.RUNG_SCORES]) == 3 for t in trials), "every rung scored in passing"
    TrialQueue(storage_url, large.study_name).maintain()  # plans the larger budget (the ladder record)
    q = TrialQueue(storage_url, large.study_name)
    record = q.upkeep.study_attr(LADDER_KEY)
    q.study.set_user_attr(LADDER_KEY, {**record, "trust": trust})  # what the integrator's upkeep stores
    return TrialQueue(storage_url, large.study_name)


def test_a_larger_budget_trusting_no_rung_trains_every_trial_to_full_length(storage_url: str) -> None:
    """No trial is held or pruned, and none pays a cooldown branch: a rung the study does not trust
    would decide nothing (its scores were measured at the smallest budget)."""
    q = _large_with_trust(storage_url, {"trusted": [], "noise": 0.05})
    claims = _run(q)
    assert claims and all(rung == 0 and not hold for _, rung, hold in claims)
    trials = q.storage.get_all_trials(q.study_id, deepcopy=False)
    assert {t.state for t in trials} == {TrialState.COMPLETE}, "none pruned"
    assert all(not t.user_attrs.get(Attr.RUNG_SCORES) and not t.user_attrs.get(Attr.BRANCH_EPOCHS)
               for t in trials), "no rung scored"
    assert "archhpo_halving" not in q.study.user_attrs, "nothing decided"


def test_a_larger_budget_trusting_rung_0_prunes_there_with_ties_within_noise(storage_url: str) -> None:
    q = _large_with_trust(storage_url, {"trusted": [0], "noise": 0.15})
    claims = _run(q)
    phase1 = sorted(e.slot for e in q.settings.plan if e.phase == 1)
    promoted = soft_promotions({slot: _score(slot, 0) for slot in phase1}, 3, 0.15)
    assert promoted != promotions({slot: _score(slot, 0) for slot in phase1}, 3), "the noise kept a tie"
    decided = q.upkeep.study_attr("archhpo_halving")
    assert decided["1"] == [promoted, promoted], "rung 1 is not judged: every survivor goes on"
    assert sorted(slot for slot, rung, hold in claims if rung == 0 and slot in phase1) == phase1
    assert all(hold for _, rung, hold in claims if rung == 0)
    trials = q.storage.get_all_trials(q.study_id, deepcopy=False)
    pruned = {t.user_attrs["plan_slot"] for t in trials if t.state == TrialState.PRUNED}
    assert pruned == set(phase1) - set(promoted)
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs["phase"] == 1]
    assert all(len(t.user_attrs[Attr.RUNG_SCORES]) == 3 for t in done), "rung 1 scored in passing"


@pytest.mark.parametrize("stored_with_skipped", [False, True])
def test_a_ladder_budget_with_skipped_slots_decides_its_trusted_rung(storage_url: str, stored_with_skipped: bool
                                                                    ) -> None:
    """A slot beyond the region never gets a trial, so no rung may wait for it: the real T3 run
    (docs/searching.md) held its 150K trials at the trusted rung 1 forever, rung 0 having passed all
    12 phase-1 slots on, 6 of them skipped.  A decision stored that way before the fix goes on too."""
    q = _large_with_trust(storage_url, {"trusted": [1], "noise": None}, trials=28)
    skipped = q.upkeep.never_filled()
    phase1 = sorted(e.slot for e in q.settings.plan if e.phase == 1)
    assert len(skipped) == 1 and skipped < set(phase1)
    if stored_with_skipped:  # what the run's upkeep stored before: rung 0 passed every phase-1 slot on
        q.study.set_user_attr("archhpo_halving", {"1": [phase1]})
    claims = _run(q)  # raises if the plan never finishes
    decided = q.upkeep.study_attr("archhpo_halving")["1"]
    assert set(decided[1]) < set(phase1) - skipped and skipped.isdisjoint(decided[1])
    assert sorted(slot for slot, rung, hold in claims if rung == 1 and hold) == sorted(set(phase1) - skipped)
    trials = q.storage.get_all_trials(q.study_id, deepcopy=False)
    assert {t.user_attrs["plan_slot"] for t in trials if t.state == TrialState.PRUNED} == (
        set(phase1) - skipped - set(decided[1]))


def test_a_rung_before_the_trusted_one_is_passed_not_held(storage_url: str) -> None:
    q = _large_with_trust(storage_url, {"trusted": [1], "noise": None})
    claims = _run(q)
    phase1 = sorted(e.slot for e in q.settings.plan if e.phase == 1)
    assert {(rung, hold) for slot, rung, hold in claims if slot in phase1} >= {(0, False), (1, True)}
    decided = q.upkeep.study_attr("archhpo_halving")
    rung1 = promotions({slot: _score(slot, 1) for slot in phase1}, 3)
    assert decided["1"] == [phase1, rung1]
    trials = q.storage.get_all_trials(q.study_id, deepcopy=False)
    assert {t.user_attrs["plan_slot"] for t in trials if t.state == TrialState.PRUNED} == set(phase1) - set(rung1)
    assert all(t.user_attrs[Attr.RUNG] == 1 for t in trials if t.state == TrialState.PRUNED)


def test_rung_scores_are_tied_within_their_own_noise_not_the_finals() -> None:
    # finals spread 0.1 between seeds; rung scores spread 0.001 between seeds and 0.01 between
    # architectures, in the finals' order: with the finals' noise every rung pair would be a tie (0.5)
    archs = [ArchRuns((i,), [[2.0 + 0.01 * i + d] for d in (0.0, 0.001)], [1.0 + i + d for d in (0.0, 0.1)])
             for i in range(4)]
    record = rung_trust(archs, n_boot=200)
    rung = record["rungs"][0]
    assert rung["noise"] == pytest.approx(math.sqrt(0.001**2 / 2))
    assert rung["agreement"] == 1.0 and rung["low"] == 1.0 and record["trusted"] == [0]
    assert pairwise_agreement([2.0, 2.01, 2.02], [1.0, 2.0, 3.0], 0.1) == 0.5, "finals' noise ties them"
    trust = RungTrust.from_record({"trust": record})
    assert trust.noise_at(0) == pytest.approx(rung["noise"]) and trust.noise_at(1) == pytest.approx(record["noise"])
    # the cut at rung 0 keeps a score within that rung's noise of the worst promoted, not beyond
    assert trust.ties([0], {0: 2.0, 1: 2.0005, 2: 2.002}, 0) == [0, 1]


# --trust-each-budget: a ladder of three budgets whose middle one scores its rungs for the largest.
EACH = replace(LADDER, budgets=("200K", "500K", "1M"), pruning=replace(LADDER.pruning, trust_each_budget=True))


def _each_ladder(storage_url: str, middle_trust: dict[str, Any]) -> tuple[TrialQueue, TrialQueue, dict[str, Any]]:
    """The smallest budget trained to the end, the middle one planned with `middle_trust` over its
    record's trust (what the integrator's upkeep stores) and trained to the end; (middle, largest,
    the middle's trust)."""
    small = prepare_settings(EACH, "200K")
    middle = prepare_settings(EACH, "500K", ladder_below=[small.study_name])
    large = prepare_settings(EACH, "1M", ladder_below=[small.study_name, middle.study_name])
    assert small.options.ladder is None and not small.options.scored_for_above
    assert middle.options.ladder == {"below": [small.study_name], "trust": "each", "largest": False}
    assert middle.options.scored_for_above and not large.options.scored_for_above
    assert large.options.trust_each_budget and large.options.ladder["largest"] is True
    for s in (small, middle, large):
        launch(storage_url, s)
    _run(TrialQueue(storage_url, small.study_name))
    q = TrialQueue(storage_url, middle.study_name)
    q.maintain()
    record = q.upkeep.study_attr(LADDER_KEY)
    assert record["trust"]["from_budget"] == "200K" and record["trust"][FOR_ABOVE] is True
    trust = {**record["trust"], **middle_trust}
    q.study.set_user_attr(LADDER_KEY, {**record, "trust": trust})
    _run(TrialQueue(storage_url, middle.study_name))
    TrialQueue(storage_url, large.study_name).maintain()
    return TrialQueue(storage_url, middle.study_name), TrialQueue(storage_url, large.study_name), trust


def test_a_middle_budget_trusting_no_rung_scores_them_for_the_next_budgets_trust(storage_url: str) -> None:
    """Under --trust-each-budget a budget below the largest that trusts no rung still scores every
    rung in passing, and the largest budget's trust is measured on its full-length trials, not on
    the smallest budget's; the largest scores nothing for a budget above it (there is none)."""
    middle, large, _ = _each_ladder(storage_url, {"trusted": [], "noise": 0.05})
    done = middle.storage.get_all_trials(middle.study_id, deepcopy=False, states=(TrialState.COMPLETE,))
    assert done and all(len(t.user_attrs[Attr.RUNG_SCORES]) == 3 for t in done), "scored in passing"
    trust = large.upkeep.study_attr(LADDER_KEY)["trust"]
    assert trust["from_budget"] == "500K" and trust[FOR_ABOVE] is False
    assert trust["n_archs"] == len({t.params["arch_idx"] for t in done}), "measured on the middle budget's trials"
    assert not RungTrust.from_record({"trust": {**trust, "trusted": []}}).scores_in_passing
    assert RungTrust.from_record({"trust": {"trusted": [], FOR_ABOVE: True}}).scores_in_passing
    assert " at 500K" in describe_trust(trust) and "for the next budget" not in describe_trust(trust)
    said = describe_trust(middle.upkeep.study_attr(LADDER_KEY)["trust"])
    assert said.startswith("fidelity: the region trained to full length (no rung's interval reaches 0.8: ")
    assert said.endswith(" at 200K; its rungs scored in passing for the next budget's trust)"), said


def test_a_middle_budget_that_pruned_carries_its_trust_up(storage_url: str) -> None:
    """Its survivors are a selected sample (the pruned trials' finals are missing), so the largest
    budget prunes with the trust the middle one pruned with, not one measured on the survivors."""
    middle, large, used = _each_ladder(storage_url, {"trusted": [0], "noise": 0.15})
    assert any(t.state == TrialState.PRUNED for t in middle.storage.get_all_trials(middle.study_id, deepcopy=False))
    assert large.upkeep.study_attr(LADDER_KEY)["trust"] == {**used, FOR_ABOVE: False}
