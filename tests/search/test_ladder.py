"""Ladder planning (--ladder): the smallest budget is searched as designed; each larger one is
planned, once the smaller is final, from its winners: the learning rate carried as N^b (b fitted on
the smaller budgets, else Step Law's prior), the other training parameters, and the region every
axis of its best architectures (by mean) spans; fewer trials, never more than the design's; stored
in the study once, before its trials are enqueued, however many upkeeps race or die."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from archhpo.budgets import GridRow, parse_budget
from archhpo.cli import main
from archhpo.report._confirm import confirmation_summary
from archhpo.report._page import ladder_notes
from archhpo.schema import LADDER_CONFIRM_SEEDS, LADDER_FINALISTS, LR_PROBE_FACTORS
from archhpo.search import TrialQueue, _ladder_record, _study, _upkeep, launch, prepare_settings
from archhpo.search._ladder import (
    LR_WIDTH,
    Finished,
    _assign,
    axis_ranges,
    carried_params,
    carry_up,
    centred_extremes,
    describe,
    in_ranges,
    ladder_trials,
    narrowed_region,
    narrowed_space,
    region,
    top_architectures,
)
from archhpo.search._ladder_record import ladder_record
from archhpo.search._lrfit import PRIOR_DATA_GROWS, PRIOR_FIXED_DATA, best_rate, fit_lr_exponent
from archhpo.search._plan import ladder_plan
from archhpo.search._space import QUICK_SPACE, SearchSpace
from archhpo.search._status import PlanStatus
from archhpo.search._storage import open_storage
from archhpo.search._study import keyword_config
from archhpo.search._trust import describe_trust
from archhpo.search._upkeep import PlanUpkeep
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}
PARAMS = {"learning_rate": 1e-3, "weight_decay": 1e-4, "epochs": 3, "batch_size": 64, "warmup_steps": 20}
RECORD_KEYS = {"carried", "lr_width", "budget_rates", "from_trial", "space", "aspect_ratios", "aspect_range", "axes", "lr_fit", "region_size",
               "extremes_at", "grid_size", "assignments", "skipped_slots", "rule", "from", "from_budget", "trust"}


def _row(i: int, d: int, layers: int, extreme: str = "", heads: int = 2, ff: int = 0) -> GridRow:
    return GridRow(budget="x", arch_idx=i, d_model=d, n_layers=layers, n_heads=heads, d_ff=ff or 2 * d,
                   param_count=0, estimate=None, extreme=extreme)


def _done(value: float, number: int, d: int, layers: int, heads: int = 0, ff: int = 0, **params: Any) -> Finished:
    return Finished(value, number, d, layers, (d, layers, heads, ff), {**PARAMS, **params}, n_heads=heads, d_ff=ff)


def _located(lr: float, d: int = 64, layers: int = 3) -> list[Finished]:
    """One architecture trained at 4 rates around `lr`, on a parabola in log lr with its vertex at
    `lr`: a budget that located its best rate (search/_lrfit.locate_rate)."""
    return [_done(2.0 + math.log(f) ** 2, k, d, layers, learning_rate=lr * f) for k, f in enumerate((0.25, 0.5, 2, 4))]


def test_the_carried_rate_is_clipped_to_the_studys_range_and_the_rest_comes_from_the_best_trial() -> None:
    best = _done(2.0, 0, 64, 2, weight_decay=2e-4)
    assert carried_params(best, 5e-4, QUICK_SPACE) == {**PARAMS, "learning_rate": 5e-4, "weight_decay": 2e-4}
    assert carried_params(best, 2e-3, QUICK_SPACE)["learning_rate"] == 1e-3, "clipped"
    assert carried_params(best, 5e-5, QUICK_SPACE)["learning_rate"] == 1e-4, "clipped"
    space = narrowed_space(carried_params(_done(2.0, 0, 64, 2), 5e-4, QUICK_SPACE), QUICK_SPACE)
    assert space.learning_rate == pytest.approx((2.5e-4, 1e-3)) and space.epochs == (3,) and space.batch_size == (64,)
    assert space.weight_decay == pytest.approx((1e-4 / 3, 3e-4))


def test_the_top_architectures_are_ranked_by_the_mean_of_their_trials() -> None:
    lucky = [_done(1.0, 0, 64, 2), _done(3.0, 1, 64, 2)]  # the best single trial, mean 2.0
    steady = [_done(1.5, 2, 128, 4), _done(1.6, 3, 128, 4)]  # mean 1.55
    tied = [_done(2.0, 5, 256, 2), _done(2.0, 4, 64, 8)]  # mean 2.0 each: the earlier best trial first
    top = top_architectures([*lucky, *steady, *tied], k=4)
    assert [t.number for t in top] == [2, 0, 4, 5], "the steady architecture's best trial leads"
    assert top_architectures([*lucky, *steady, *tied])[0].number == 2 and len(top_architectures(lucky + steady)) == 2


def test_the_region_is_the_best_aspect_ratios_widened_and_the_extremes() -> None:
    finished = [_done(2.0, 3, 128, 4), _done(2.0, 1, 128, 4), _done(2.1, 2, 64, 4), _done(2.5, 0, 256, 2),
                _done(3.0, 5, 64, 8)]
    top = top_architectures(finished)
    assert [t.number for t in top] == [1, 2, 0], "one per architecture, the earlier of a tie"
    rows = [_row(0, 64, 8, "min_d_model"), _row(1, 64, 2), _row(2, 128, 8), _row(3, 512, 2, "max_d_model"),
            _row(4, 256, 1)]
    # ratios 32 (128/4), 16 (64/4), 128 (256/2) -> [16/1.5, 128*1.5] = [10.7, 192]
    assert [r.arch_idx for r in region(rows, top)] == [0, 1, 2, 3]


# The top architecture d128 L4 h4 ff256: aspect 32 -> [21.3, 48], head dim 32 -> [16, 64], d_ff ratio 2 ->
# [1.49, 2.68], depth 4 -> [2.67, 8].  Rows 2-6 each leave exactly one axis' range; row 7, an extreme, all.
AXIS_ROWS = [_row(0, 128, 4, heads=4), _row(1, 192, 6, heads=4), _row(2, 256, 4, heads=4),
             _row(3, 128, 4, heads=16), _row(4, 128, 4, heads=4, ff=512), _row(5, 384, 12, heads=12),
             _row(6, 64, 2, heads=2), _row(7, 512, 1, "max_d_model", heads=2, ff=2048)]
OUTSIDE = {2: "aspect", 3: "head_dim", 4: "ff_ratio", 5: "depth", 6: "depth"}


def test_every_axis_narrows_the_region_and_the_extremes_are_kept() -> None:
    top = [_done(2.0, 0, 128, 4, heads=4, ff=256)]
    ranges = axis_ranges(top)
    assert ranges == {"aspect": pytest.approx([32 / 1.5, 48]), "head_dim": pytest.approx([16, 64]),
                      "ff_ratio": pytest.approx([2 / 1.34, 2 * 1.34]), "depth": pytest.approx([4 / 1.5, 8])}
    inside, _, how = narrowed_region(AXIS_ROWS, top)
    assert [r.arch_idx for r in inside] == [0, 1, 7] and how == "every axis"
    for i, axis in OUTSIDE.items():
        assert not in_ranges(AXIS_ROWS[i], ranges)
        assert in_ranges(AXIS_ROWS[i], {**ranges, axis: None}), f"row {i} is outside {axis} alone"


def test_an_axis_unknown_for_the_smaller_budget_is_not_narrowed() -> None:
    top = [_done(2.0, 0, 128, 4)]  # n_heads and d_ff unknown (0)
    ranges = axis_ranges(top)
    assert ranges["head_dim"] is None and ranges["ff_ratio"] is None
    assert [r.arch_idx for r in narrowed_region(AXIS_ROWS, top)[0]] == [0, 1, 3, 4, 7]


def test_an_extreme_is_trained_with_the_head_dimension_and_d_ff_ratio_of_the_best_below() -> None:
    """The grid marks an extreme by its parameter count, so its head count is arbitrary: on a ladder
    the mark moves to the twin (same d_model and n_layers) nearest the best's head dimension and d_ff
    ratio, and a row holding two marks keeps both."""
    rows = [_row(0, 128, 2, "max_d_model;min_n_layers", heads=2), _row(1, 128, 2, heads=4), _row(2, 128, 2, heads=8),
            _row(3, 64, 8, "min_d_model;max_n_layers", heads=2), _row(4, 64, 8, heads=8),
            _row(5, 64, 8, heads=8, ff=256), _row(6, 64, 4, heads=8)]
    best = _done(1.5, 0, 64, 4, heads=8, ff=128)  # head dimension 8, d_ff ratio 2
    moved = centred_extremes(rows, best)
    assert {r.arch_idx: r.extreme for r in moved if r.extreme} == {2: "max_d_model;min_n_layers",
                                                                   4: "min_d_model;max_n_layers"}
    assert [r.arch_idx for r in narrowed_region(rows, [best])[0] if r.extreme] == [2, 4]
    unknown = _done(1.5, 0, 64, 4)  # head count and d_ff unknown below: the grid's own pick
    assert [r.extreme for r in centred_extremes(rows, unknown)] == [r.extreme for r in rows]
    record = carry_up([best], 100_000, 250_000, rows, QUICK_SPACE, slots=list(range(7)), seed=0)
    assert record["extremes_at"] == {"head_dim": 8.0, "ff_ratio": 2.0}
    assert "(extremes included, at the best's head dim 8, d_ff ratio 2)" in describe({**record, "from_budget": "100K"})
    tie = _done(1.5, 0, 64, 4, heads=4, ff=128)  # head dimension 16: 128/h4 = 32 and 128/h16 = 8 lie 2x either side
    assert centred_extremes([_row(0, 128, 2, "x", heads=4), _row(1, 128, 2, heads=16)], tie)[0].extreme == "x", \
        "a tie keeps the grid's pick"


def test_a_region_too_narrow_on_every_axis_falls_back_to_the_aspect_ratio() -> None:
    rows = [AXIS_ROWS[i] for i in (0, 3, 4, 7)]  # every axis keeps row 0 alone besides the extreme
    finished = [_done(2.0, 0, 128, 4, heads=4, ff=256)]
    out = carry_up(finished, 100_000, 200_000, rows, QUICK_SPACE, slots=[0, 1, 2, 3], seed=1)
    assert {a["arch_idx"] for a in out["assignments"]} == {0, 3, 4, 7} and out["region_size"] == 4
    assert out["rule"].endswith("region: aspect ratio only (every axis kept 1 besides the extremes)")
    assert out["axes"]["head_dim"] == pytest.approx([16, 64]), "the ranges are recorded all the same"


def test_carry_up_assigns_every_slot_inside_the_region_reproducibly() -> None:
    rows = [_row(i, d, layers, "x" if i == 0 else "") for i, (d, layers) in
            enumerate([(64, 8), (64, 4), (128, 4), (128, 2), (512, 1)])]
    finished = [_done(2.0, 0, 128, 4), _done(2.2, 1, 64, 4)]
    one = carry_up(finished, 100_000, 200_000, rows, QUICK_SPACE, slots=[0, 1, 2, 3, 4, 5], seed=7)
    assert one == carry_up(finished, 100_000, 200_000, rows, QUICK_SPACE, slots=[0, 1, 2, 3, 4, 5], seed=7)
    # ratios 32 and 16, widened: [10.7, 48]; depth 4 -> [2.67, 8]: 128/2 and 512/1 fall outside, the
    # extreme 64/8 is kept; each of the 3 once, the other 3 slots skipped
    assert sorted((a["slot"], a["arch_idx"]) for a in one["assignments"])[0] == (0, 0), "the extreme first"
    assert sorted(a["arch_idx"] for a in one["assignments"]) == [0, 1, 2] and one["skipped_slots"] == 3
    assert [a["slot"] for a in one["assignments"]] == [0, 1, 2]
    lo, hi = one["space"]["learning_rate"]  # at the best's width (128); the d_model-64 extreme's rate is clipped
    widths = {0: 64, 1: 64, 2: 128}
    assert all(lo * 128 / widths[a["arch_idx"]] <= a["params"]["learning_rate"] <= min(hi * 128 / widths[a["arch_idx"]],
               1e-3) and a["params"]["epochs"] == 3 for a in one["assignments"])
    # one budget to fit: Step Law's prior at fixed data (the default), or with the data growing with N; the
    # d_model-64 trial's 1e-3 reads as 5e-4 at the best's width, and three rates are too few for a vertex
    assert one["carried"]["learning_rate"] == pytest.approx(1e-3 * 2**PRIOR_FIXED_DATA, rel=1e-12)
    grows = carry_up(finished, 100_000, 200_000, rows, QUICK_SPACE, slots=[0], seed=7, data_grows=True)
    assert grows["carried"]["learning_rate"] == pytest.approx(1e-3 * 2**PRIOR_DATA_GROWS, rel=1e-12)
    assert one["rule"] == ("lr on the line N^-0.713 through 1 budget's best rate (prior exponent), at d_model 128, "
                           "x 128/d_model per architecture; region: every axis")
    assert one["lr_width"] == 128 and one["budget_rates"] == [[100_000, 1e-3]]
    assert set(one) == RECORD_KEYS - {"from", "from_budget", "trust"} and json.loads(json.dumps(one)) == one


def test_carry_up_fits_the_exponent_on_every_smaller_budget() -> None:
    rows = [_row(i, 64, layers) for i, layers in enumerate((2, 3, 4))]
    below = [(n, _located(0.3 * n**-0.5)) for n in (25_000, 50_000, 100_000)]
    out = carry_up(below[-1][1], 100_000, 400_000, rows, QUICK_SPACE, slots=[0], seed=0, below=below)
    assert out["lr_fit"]["source"] == "fitted" and out["lr_fit"]["n_budgets"] == 3
    assert out["carried"]["learning_rate"] == pytest.approx(0.3 * 400_000**-0.5, rel=1e-9)
    assert out["rule"].startswith("lr on the line N^-0.500 through 3 budgets' best rates (fitted exponent), at d_model 64")
    line = describe({**out, "from_budget": "100K"})
    assert "; aspect ratio 14.2–32, depth 2–6: 3 of 3 architectures" in line, "head dim, d_ff ratio unknown"
    assert line.endswith("learning-rate exponent N^-0.500 (fitted on 3 budgets, 90% interval -0.500 to -0.500)")
    assert out["skipped_slots"] == 0 and "slots" not in line, "a slot per architecture: nothing to say"
    four = carry_up(below[-1][1], 100_000, 400_000, rows, QUICK_SPACE, slots=[0, 1, 2, 3], seed=0, below=below)
    assert "(extremes included); phase 1: 3 of 4 slots, one per region architecture; learning-rate" in describe(
        {**four, "from_budget": "100K"})


def test_each_region_architecture_is_assigned_once_in_spread_order_and_the_other_slots_skipped() -> None:
    rows = [_row(i, d, layers, "x" if i in (1, 3) else "") for i, (d, layers) in
            enumerate([(64, 2), (64, 8), (128, 4), (512, 1), (256, 4)])]
    got = _assign(rows, lambda _: QUICK_SPACE, list(range(10, 18)), seed=3)
    # plan_order's spread order, extremes (1, 3) first; slots 15-17 have no architecture
    assert [(a["slot"], a["arch_idx"]) for a in got] == [(10, 1), (11, 3), (12, 4), (13, 0), (14, 2)]
    fewer = _assign(rows, lambda _: QUICK_SPACE, list(range(10, 13)), seed=3)
    assert fewer == got[:3], "fewer slots than rows: the same first slots, training parameters included"
    two = _assign([rows[i] for i in (4, 2)], lambda _: QUICK_SPACE, [0, 1, 2], seed=3)
    assert [(a["slot"], a["arch_idx"]) for a in two] == [(0, 4), (1, 2)], "a region's own arch_idx, once each"
    assert [(a["slot"], a["arch_idx"]) for a in _assign([rows[2]], lambda _: QUICK_SPACE, [5, 6], seed=0)] == [(5, 2)]


def test_a_ladder_record_stored_before_every_axis_is_still_described() -> None:
    old = {"carried": PARAMS, "from_trial": 4, "from_budget": "200K", "aspect_range": [10.0, 40.0],
           "rule": "lr x (N/N_small)^-0.333 = x 0.737", "region_size": 5, "grid_size": 9}
    assert describe(old) == ("from 200K (trial 4): learning rate 0.001 (lr x (N/N_small)^-0.333 = x 0.737), "
                             "weight decay 0.0001, 3 epochs, batch 64, warm-up 20; aspect ratio 10–40: 5 of 9 "
                             "architectures (extremes included)")


def test_a_ladder_budget_never_plans_more_trials_than_the_design() -> None:
    assert ladder_trials(50, 2, 3) == 12 and ladder_trials(50, 0, 3) == 50 and ladder_trials(8, 3, 3) == 5
    assert ladder_trials(4, 1, 3) == 4, "extremes + 2 = 5, but the design plans max(--trials, extremes) = 4"
    # 4 architectures, 3 of them extremes: the design trains each twice (8), not --trials 50 (halved: 25)
    assert ladder_trials(50, 1, 3, n_archs=4) == 8 and ladder_trials(50, 1, 3) == 25
    assert ladder_trials(50, 3, 3, n_archs=4) == 6 and ladder_trials(50, 3, 3, n_archs=40) == 6


def _ladder(storage_url: str, budgets: tuple[str, ...] = ("200K", "500K"), **extra: Any) -> list[Any]:
    """Each budget's settings, launched: the smallest as designed, the others on its ladder."""
    kw = {"n_trials": 8, "data": TINY_DATA, "quick": True, "seed": 0, "pruner": "none", **extra}
    out = [prepare_settings("lad", budgets[0], **kw)]
    for budget in budgets[1:]:
        out.append(prepare_settings("lad", budget, **kw, ladder_below=[s.study_name for s in out]))
    assert launch(storage_url, out[0]).enqueued == sum(e.phase == 1 for e in out[0].plan)
    for step, large in enumerate(out[1:], 1):
        assert launch(storage_url, large).enqueued == 0, "nothing to train before the smaller budget is final"
        n_ext, n = sum(1 for a in large.archs if a["extreme"]), kw["n_trials"]
        n1 = sum(e.phase == 1 for e in large.plan)
        assert n1 == ladder_trials(n, step, n_ext) == ladder_trials(n, step, n_ext, n_archs=len(large.archs))
    return out


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
    before = q.maintain()
    assert before.done is False and q.claim(WORKER) is None
    assert before.details["phase1"] == f"waiting for {small.study_name} (the ladder plans this budget from the smaller ones)"
    _finish_small(storage_url, small)
    queues = [TrialQueue(storage_url, large.study_name) for _ in range(4)]
    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=lambda x=x: (barrier.wait(), x.maintain())) for x in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ladder = q.upkeep.study_attr(_study.LADDER_KEY)
    assert ladder["from"] == small.study_name and ladder["from_trial"] == 0, "slot 0's architecture had the best mean"
    assert set(ladder) == RECORD_KEYS and set(ladder["axes"]) == {"aspect", "head_dim", "ff_ratio", "depth"}
    assert all(r is not None for r in ladder["axes"].values()), "n_heads and d_ff are read off the trials"
    fit = ladder["lr_fit"]
    assert (fit["exponent"], fit["source"], fit["n_budgets"]) == (PRIOR_FIXED_DATA, "prior", 1), "whole epochs"
    # the small budget's best rate: its trials read at the best's width, an intercept per architecture
    points = _rate_points(storage_url, small.study_name, ladder["lr_width"])
    expected = min(max(best_rate(points) * 2.5**PRIOR_FIXED_DATA, 1e-4), 1e-3)
    assert ladder["carried"]["learning_rate"] == pytest.approx(expected, rel=1e-12)
    widths = {a["arch_idx"]: large.archs[a["arch_idx"]]["d_model"] for a in ladder["assignments"]}
    assert len(set(widths.values())) > 1, "the region spans widths: the width rule is exercised"
    for a in ladder["assignments"]:  # each samples around the carried rate moved to its own d_model
        own = min(max(expected * ladder["lr_width"] / widths[a["arch_idx"]], 1e-4), 1e-3)
        lo, hi = max(own / LR_WIDTH, 1e-4), min(own * LR_WIDTH, 1e-3)
        assert lo * (1 - 1e-12) <= a["params"]["learning_rate"] <= hi * (1 + 1e-12)
    trials = q.storage.get_all_trials(q.study_id, deepcopy=False)
    assert sorted(t.user_attrs["plan_slot"] for t in trials) == list(range(len(large.plan))), "each slot once"
    assert "phase1" not in q.maintain().details, "planned: no longer waiting"
    claim = q.claim(WORKER)
    assert claim is not None and claim.params["epochs"] == ladder["carried"]["epochs"]
    notes = ladder_notes(q.storage, {"500K": large.study_name, "200K": small.study_name})
    assert list(notes) == ["500K"] and notes["500K"].startswith("from 200K (trial 0): learning rate")
    assert "learning-rate exponent N^-0.713 (prior: 1 budget to fit, Step Law with fixed data); fidelity: " in notes["500K"]
    trust = ladder["trust"]
    assert trust["from_budget"] == "200K" and trust["measure"] == "pairwise agreement"
    # --pruner none: no rungs, so nothing to trust, whatever the 5 architectures' finals say
    assert (trust["n_archs"], trust["rungs"], trust["trusted"]) == (5, [], [])
    assert notes["500K"].endswith(describe_trust(trust)), "the report says which fidelity decided, and why"


def _finish_all(storage_url: str, name: str) -> tuple[PlanStatus, list[Any]]:
    """Train every slot the plan's upkeep enqueues (value 1 + slot / 100) until the plan is done."""
    q = TrialQueue(storage_url, name)
    while not (status := q.maintain()).done:
        c = q.claim(WORKER)
        assert c is not None, f"the plan is not done and nothing waits: {status}"
        q.finish(c, TrialState.COMPLETE, 1.0 + 0.01 * c.slot, {})
    return status, _trials(storage_url, name)


def test_a_ladder_budget_trains_each_region_architecture_once_and_skips_the_other_slots(storage_url: str) -> None:
    # --trials 28: 14 slots at 500K, 12 region architectures; the --ladder confirmation stated (the keyword
    # form has no --ladder default)
    small, large = _ladder(storage_url, n_trials=28, confirm=LADDER_FINALISTS, confirm_seeds=LADDER_CONFIRM_SEEDS)
    phase1, confirm = sum(e.phase == 1 for e in large.plan), LADDER_FINALISTS * LADDER_CONFIRM_SEEDS
    assert (phase1, len(large.plan)) == (14, 14 + confirm)
    waiting = TrialQueue(storage_url, large.study_name).maintain()
    assert not waiting.done and (waiting.final, waiting.skipped) == (0, 0), "no record yet: every slot waits"
    _finish_all(storage_url, small.study_name)
    status, trials = _finish_all(storage_url, large.study_name)
    record = TrialQueue(storage_url, large.study_name).upkeep.study_attr(_study.LADDER_KEY)
    assert (record["region_size"], len(record["assignments"]), record["skipped_slots"]) == (12, 12, 2)
    first = [t for t in trials if t.user_attrs["phase"] == 1]
    assert sorted(t.user_attrs["plan_slot"] for t in first) == list(range(12)), "the slots beyond the region: none"
    assert len({t.params["arch_idx"] for t in first}) == 12, "each region architecture once"
    assert sum(t.user_attrs["phase"] == 3 for t in trials) == confirm
    assert (status.total, status.final, status.complete, status.skipped) == (14 + confirm, 14 + confirm, 12 + confirm, 2)
    assert (status.running, status.waiting) == (0, 0)
    # a status read without upkeep (a larger budget's _fill_ladder, the progress display) knows them too
    read = PlanUpkeep(storage_url, large.study_name).status()
    assert read.done and (read.final, read.skipped) == (14 + confirm, 2)
    assert PlanUpkeep(storage_url, large.study_name).never_filled() == {12, 13}, "the ETA counts them as done"
    assert "; phase 1: 12 of 14 slots, one per region architecture" in describe(record)


def test_a_ladder_record_stored_with_repeats_is_trained_as_stored(storage_url: str) -> None:
    small, large = _ladder(storage_url, n_trials=24)
    _finish_all(storage_url, small.study_name)
    q = TrialQueue(storage_url, large.study_name)
    record = ladder_record(q.upkeep, [PlanUpkeep(storage_url, small.study_name)])
    archs = [a["arch_idx"] for a in record["assignments"]]
    n = len(archs)
    assert n < 12 and record["skipped_slots"] == 12 - n
    # an earlier archhpo's record: the region's architectures repeated over all 12 slots, no count
    old = {k: v for k, v in record.items() if k != "skipped_slots"}
    old["assignments"] = [{**record["assignments"][i % n], "slot": i} for i in range(12)]
    q.study.set_user_attr(_study.LADDER_KEY, old)
    status, trials = _finish_all(storage_url, large.study_name)
    by_slot = sorted(trials, key=lambda t: t.user_attrs["plan_slot"])
    assert [t.params["arch_idx"] for t in by_slot] == [archs[i % n] for i in range(12)]
    assert (status.final, status.complete, status.skipped) == (12, 12, 0)
    assert "slots" not in describe(old)


def _trials(storage_url: str, name: str) -> list[Any]:
    q = TrialQueue(storage_url, name)
    return list(q.storage.get_all_trials(q.study_id, deepcopy=False))


def _rate_points(storage_url: str, name: str, width: int) -> list[tuple[float, float, tuple[int]]]:
    """A budget's COMPLETE trials as the ladder reads their rates: (lr at `width` by muP's rule,
    value, architecture)."""
    return [(float(t.params["learning_rate"]) * int(t.user_attrs["d_model"]) / width, float(t.value),
             (int(t.params["arch_idx"]),)) for t in _trials(storage_url, name) if t.state == TrialState.COMPLETE]


def _finish_ladder_budget(storage_url: str, settings: Any) -> None:
    """Plan, train and finish every slot of a ladder budget."""
    q = TrialQueue(storage_url, settings.study_name)
    assert q.maintain().done is False
    finished = 0
    while (c := q.claim(WORKER)) is not None:
        q.finish(c, TrialState.COMPLETE, 1.0 + 0.01 * c.slot, {})
        finished += 1
    assert q.maintain().done and finished == len(settings.plan)


def test_the_exponent_reads_every_smaller_budget_and_the_studys_data_regime(storage_url: str) -> None:
    small, middle, large = _ladder(storage_url, ("200K", "500K", "1M"), samples_per_param=20)
    _finish_small(storage_url, small)
    _finish_ladder_budget(storage_url, middle)
    q = TrialQueue(storage_url, large.study_name)
    q.maintain()
    record = q.upkeep.study_attr(_study.LADDER_KEY)
    fit, width = record["lr_fit"], record["lr_width"]
    assert (fit["exponent"], fit["source"], fit["n_budgets"]) == (PRIOR_DATA_GROWS, "prior", 2), "samples per param"
    # every budget's rates read at the best architecture's width (muP: lr x d_model / width)
    slope = math.log(best_rate(_rate_points(storage_url, middle.study_name, width))
                     / best_rate(_rate_points(storage_url, small.study_name, width))) / math.log(500_000 / 200_000)
    assert fit["slope"] == pytest.approx(slope, rel=1e-9) and fit["low"] is None
    assert fit["reason"] == f"2 budgets fit b = {slope:.3f} exactly, with no interval; Step Law with data growing with N"


def test_a_relaunch_keeps_a_ladder_budgets_stored_plan(storage_url: str) -> None:
    small, large = _ladder(storage_url)
    assert len(large.plan) == 5
    # a study stored with another plan (an earlier archhpo's ladder_trials) is relaunched as stored
    other = dataclasses.replace(large, experiment="old", plan=ladder_plan(3))
    assert launch(storage_url, other).created
    again = launch(storage_url, dataclasses.replace(large, experiment="old"))
    assert not again.created and again.settings.plan == ladder_plan(3)


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
    (["--budget", "200K", "--budget", "500K", "--d-model", "64"], "d_model, n_layers unpinned"),
])
def test_a_ladder_that_cannot_be_is_one_sentence_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], sentence: str) -> None:
    db = tmp_path / "s.db"
    assert main(["launch", "--experiment", "x", "--ladder", "--quick", *flags, "--storage", f"sqlite:///{db}"]) == 2
    assert sentence in capsys.readouterr().err and not db.exists()


def test_a_head_count_list_filters_a_ladder_grid_instead_of_refusing_it(tmp_path: Path) -> None:
    """--n-heads 2,4 (as the ground truths use it) only filters the grid: the ladder narrows the rest."""
    db = tmp_path / "s.db"
    assert main(["launch", "--experiment", "x", "--ladder", "--quick", "--budget", "200K", "--budget", "500K",
                 "--n-heads", "2,4", "--storage", f"sqlite:///{db}"]) == 0
    storage = open_storage(f"sqlite:///{db}", create=False)
    stored = [_study.read_settings(storage, f"x_{b}-h2+4") for b in ("200K", "500K")]
    assert [s.options.ladder_below for s in stored] == [(), ("x_200K-h2+4",)]
    assert all({a["n_heads"] for a in s.archs} <= {2, 4} for s in stored)


@pytest.mark.parametrize(("flags", "phase3"), [
    ([], LADDER_FINALISTS * LADDER_CONFIRM_SEEDS), (["--seeds", "3"], LADDER_FINALISTS * 3), (["--confirm", "0"], 0),
])
def test_a_ladder_launched_plans_its_finalists_confirmation_at_every_budget(
        sqlite_url: str, flags: list[str], phase3: int) -> None:
    assert main(["launch", "--experiment", "lc", "--ladder", "--quick", "--budget", "200K", "--budget", "500K",
                 "--trials", "8", "--data", TINY_DATA, *flags, "--storage", sqlite_url]) == 0
    small, large = TrialQueue(sqlite_url, "lc_200K").settings, TrialQueue(sqlite_url, "lc_500K").settings
    for s in (small, large):
        assert sum(e.phase == 3 for e in s.plan) == phase3
        assert (s.options.confirm or 0) == (LADDER_FINALISTS if phase3 else 0)
        assert s.options.confirm_sequential == bool(phase3), "the default confirmation goes in two waves"
    confirmation = [(e.rank, e.seed) for e in large.plan if e.phase == 3]
    seeds = phase3 // LADDER_FINALISTS
    assert confirmation == [(r, s) for s in range(seeds) for r in range(LADDER_FINALISTS)], "every finalist, each seed"
    assert [e.phase for e in large.plan if e.phase != 3] == [1] * (len(large.plan) - phase3), "slots the ladder fills"


def test_a_carried_rate_clipped_by_the_study_range_says_so() -> None:
    rows = [_row(i, 64, layers) for i, layers in enumerate((2, 3, 4))]
    lo = float(QUICK_SPACE.learning_rate[0])
    low = carry_up([_done(2.0, 0, 64, 3, learning_rate=lo)], 100_000, 200_000, rows, QUICK_SPACE, slots=[0], seed=0)
    assert low["carried"]["learning_rate"] == lo
    assert f"(prior exponent, clipped to the study's range {lo:.3g}-" in low["rule"]
    inside = carry_up([_done(2.0, 0, 64, 3, learning_rate=4 * lo)], 100_000, 200_000, rows, QUICK_SPACE, slots=[0],
                      seed=0)
    assert "clipped" not in inside["rule"] and inside["carried"]["learning_rate"] == pytest.approx(4 * lo * 2**-0.713)


WIDE = SearchSpace(learning_rate=(1e-5, 1.0))


def test_a_ladder_whose_rates_follow_mups_width_rule_fits_a_flat_exponent() -> None:
    """Rates that halve as d_model doubles (muP) with N: read at one width they do not move with N
    (slope exactly 0), where the raw rates would fit -1 and carry the largest budget's rate down."""
    rows = [_row(i, 256, layers) for i, layers in enumerate((2, 3, 4))]
    below = [(n, _located(lr, d, 2)) for n, d, lr in ((100_000, 64, 1e-2), (200_000, 128, 5e-3), (400_000, 256, 2.5e-3))]
    out = carry_up(below[-1][1], 400_000, 800_000, rows, WIDE, slots=[0], seed=0, below=below)
    assert out["lr_fit"]["source"] == "fitted" and out["lr_fit"]["slope"] == pytest.approx(0.0, abs=1e-12)
    assert out["lr_width"] == 256 and out["carried"]["learning_rate"] == pytest.approx(2.5e-3, rel=1e-12)
    raw = fit_lr_exponent([(n, [(float(t.params["learning_rate"]), t.value) for t in done]) for n, done in below],
                          data_grows=True)
    assert raw.slope == pytest.approx(-1.0, rel=1e-12), "without the width rule"


def test_each_architecture_samples_around_the_carried_rate_moved_to_its_own_width() -> None:
    rows = [_row(0, 64, 2, "x"), _row(1, 128, 2, "x"), _row(2, 256, 2, "x")]  # extremes: all planned
    out = carry_up([_done(2.0, 0, 128, 2, learning_rate=4e-3)], 100_000, 200_000, rows, WIDE,
                   slots=[0, 1, 2], seed=1, data_grows=True)
    carried = 4e-3 * 2**PRIOR_DATA_GROWS
    assert out["carried"]["learning_rate"] == pytest.approx(carried, rel=1e-12)
    for a in out["assignments"]:
        d = rows[a["arch_idx"]].d_model
        at_own = carried * 128 / d  # muP: x 2 at d_model 64, x 1/2 at 256
        assert at_own / LR_WIDTH <= a["params"]["learning_rate"] <= at_own * LR_WIDTH, d
    assert sorted(rows[a["arch_idx"]].d_model for a in out["assignments"]) == [64, 128, 256]


def test_the_carried_rate_is_read_on_the_line_through_every_budgets_best_rate() -> None:
    """Not the next smaller budget's best trial scaled: one lucky rate there moves the line only by
    its share, and a budget of four or more rates gives its parabola's vertex."""
    rows = [_row(i, 64, layers) for i, layers in enumerate((2, 3, 4))]
    sweep = [_done(1.0 + math.log(lr / 3e-4) ** 2, i, 64, 2, learning_rate=lr)
             for i, lr in enumerate((1e-4, 2e-4, 5e-4, 1e-3))]  # vertex 3e-4; best trial 2e-4
    lucky = [_done(0.9, 0, 64, 2, learning_rate=1.2e-3)]  # the next smaller budget's best trial
    below = [(100_000, sweep), (200_000, lucky)]
    out = carry_up(lucky, 200_000, 400_000, rows, WIDE, slots=[0], seed=0, below=below)
    b = out["lr_fit"]["exponent"]
    assert out["lr_fit"]["source"] == "prior" and b == PRIOR_FIXED_DATA
    assert out["budget_rates"] == [[100_000, pytest.approx(3e-4, rel=1e-9)], [200_000, 1.2e-3]]
    mean_point = math.exp((math.log(3e-4) - b * math.log(1e5) + math.log(1.2e-3) - b * math.log(2e5)) / 2)
    assert out["carried"]["learning_rate"] == pytest.approx(mean_point * 400_000**b, rel=1e-9)
    assert out["carried"]["learning_rate"] < 1.2e-3 * 2**b, "below the lucky trial scaled alone"


# --lr-probe: every budget below the largest retrains its best at other rates, so it locates its rate.
# The simulated loss: every architecture on one parabola in log(lr x d_model) (muP's invariant), its
# vertex at PROBE_C * N^PROBE_B, offset per architecture; noise-free, so each vertex and the slope are exact.
PROBE_B, PROBE_C = -0.3, 1.5


def _probe_value(claim: Any, n: int) -> float:
    lr_d = float(claim.params["learning_rate"]) * int(claim.arch["d_model"])
    return 1.0 + 0.01 * int(claim.params["arch_idx"]) + 0.1 * math.log(lr_d / (PROBE_C * n**PROBE_B)) ** 2


def _train_on_the_parabola(storage_url: str, settings: Any) -> list[Any]:
    q = TrialQueue(storage_url, settings.study_name)
    while not (status := q.maintain()).done:
        c = q.claim(WORKER)
        assert c is not None, f"the plan is not done and nothing waits: {status}"
        q.finish(c, TrialState.COMPLETE, _probe_value(c, settings.budget_value), {})
    return _trials(storage_url, settings.study_name)


def test_lr_probe_makes_every_budget_locate_its_rate_and_the_ladder_fits_the_exponent(storage_url: str) -> None:
    budgets = ("200K", "500K", "1M", "2M")
    config = keyword_config("lp", budget=list(budgets), ladder=True, lr_probe=True, n_trials=8, data=TINY_DATA,
                            quick=True, seed=0, pruner="none", samples_per_param=20)
    chain: list[Any] = []
    for b in budgets:
        chain.append(prepare_settings(config, b, ladder_below=[s.study_name for s in chain]))
        launch(storage_url, chain[-1])
    probes = [[e.lr_probe for e in s.plan if e.lr_probe is not None] for s in chain]
    assert probes == [list(LR_PROBE_FACTORS)] * 3 + [[]], "every budget but the largest probes"
    for settings in chain[:-1]:
        trials = _train_on_the_parabola(storage_url, settings)
        ranks = TrialQueue(storage_url, settings.study_name).upkeep.study_attr(_upkeep.PHASE3_KEY)
        best = next(r for r in ranks if r["rank"] == 0)
        probed = {float(t.user_attrs["lr_probe"]): t for t in trials if "lr_probe" in t.user_attrs}
        assert sorted(probed) == sorted(LR_PROBE_FACTORS)
        for factor, t in probed.items():  # rank 0's architecture and parameters, its rate times the factor
            assert t.params["arch_idx"] == best["arch_idx"] and t.user_attrs["seed"] == 0
            assert t.params["learning_rate"] == pytest.approx(best["params"]["learning_rate"] * factor, rel=1e-12)
            assert {k: t.params[k] for k in PARAMS if k != "learning_rate"} == {
                k: best["params"][k] for k in PARAMS if k != "learning_rate"}
    q = TrialQueue(storage_url, chain[-1].study_name)
    q.maintain()
    record = q.upkeep.study_attr(_study.LADDER_KEY)
    fit, width = record["lr_fit"], record["lr_width"]
    assert (fit["source"], fit["n_budgets"]) == ("fitted", 3), fit["reason"]
    assert fit["exponent"] == pytest.approx(PROBE_B, abs=1e-6) and fit["high"] - fit["low"] < 1e-6
    # every budget's located rate is its vertex, read at the reference width
    assert [lr for _, lr in record["budget_rates"]] == pytest.approx(
        [PROBE_C * parse_budget(b) ** PROBE_B / width for b in budgets[:-1]], rel=1e-6)
    expected = PROBE_C * 2_000_000**PROBE_B / width
    assert record["carried"]["learning_rate"] == pytest.approx(min(max(expected, 1e-4), 1e-3), rel=1e-6)


def test_lr_probe_runs_count_in_no_architectures_ranking_mean_or_rung_trust(storage_url: str) -> None:
    config = keyword_config("lq", budget=["200K", "500K"], ladder=True, lr_probe=True, n_trials=8, data=TINY_DATA,
                            quick=True, seed=0, pruner="none", samples_per_param=20)
    small = prepare_settings(config, "200K")
    launch(storage_url, small)
    trials = [t for t in _train_on_the_parabola(storage_url, small) if t.state == TrialState.COMPLETE]
    probes = [t for t in trials if "lr_probe" in t.user_attrs]
    assert len(probes) == len(LR_PROBE_FACTORS)
    upkeep = TrialQueue(storage_url, small.study_name).upkeep
    assert sorted(f.number for f in _ladder_record._finished(upkeep) if f.lr_probe) == sorted(t.number for t in probes)
    runs = _ladder_record._arch_runs(upkeep, 0)
    assert sum(len(r.finals) for r in runs) == len(trials) - len(probes), "the rung trust reads no probe"
    # the report's confirmation: the confirmed ranks with their own runs; the probes (ranks 3-5, rank 0's shape) are none
    summary = confirmation_summary(_trials(storage_url, small.study_name), archs=small.archs)
    confirmed = [t for t in trials if t.user_attrs.get("phase") == 3 and "lr_probe" not in t.user_attrs]
    assert {a["rank"] for a in summary["architectures"]} == {t.user_attrs["rank"] for t in confirmed} <= {0, 1, 2}
    for a in summary["architectures"]:  # each rank's values are its confirmation runs' (probes run at seed 0 too)
        assert sorted(a["values"].values()) == sorted(t.value for t in confirmed if t.user_attrs["rank"] == a["rank"])


def test_carry_up_ranks_architectures_without_their_probe_runs() -> None:
    rows = [_row(i, 64, layers) for i, layers in enumerate((2, 3, 4))]
    a, b = _done(1.0, 0, 64, 2), _done(1.05, 1, 64, 3)
    bad_rates = [dataclasses.replace(_done(v, 2 + k, 64, 2, learning_rate=1e-3 * f), lr_probe=True)
                 for k, (v, f) in enumerate(((1.5, 0.25), (1.6, 0.5), (1.4, 2.0)))]
    assert top_architectures([a, b, *bad_rates])[0] is b, "counted, the probes' rates would sink a's mean"
    out = carry_up([a, b, *bad_rates], 200_000, 500_000, rows, QUICK_SPACE, [0, 1, 2], 0)
    assert out["from_trial"] == a.number


def test_relaunching_a_ladder_with_lr_probe_changed_is_refused_and_writes_nothing(
        sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["launch", "--experiment", "rp", "--ladder", "--quick", "--budget", "200K", "--budget", "500K",
              "--trials", "8", "--data", TINY_DATA, "--storage", sqlite_url]
    assert main(common) == 0
    before = _trials(sqlite_url, "rp_200K")
    capsys.readouterr()
    assert main([*common, "--lr-probe"]) == 2
    err = capsys.readouterr().err
    assert "options.lr_probe: stored None, now [0.25, 0.5, 2.0]" in err, err
    assert len(_trials(sqlite_url, "rp_200K")) == len(before)
    assert not TrialQueue(sqlite_url, "rp_500K").settings.options.lr_probe, "the largest budget never probes"


def test_lr_probe_without_a_ladder_or_its_confirmation_is_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    for flags in (["--budget", "200K"], ["--ladder", "--budget", "200K", "--budget", "500K", "--confirm", "0"]):
        assert main(["launch", "--experiment", "x", "--quick", "--lr-probe", *flags, "--storage", f"sqlite:///{db}"]) == 2
        assert "--lr-probe retrains each ladder budget's best at other learning rates" in capsys.readouterr().err
    assert not db.exists()
