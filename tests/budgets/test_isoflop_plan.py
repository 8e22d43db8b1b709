"""The IsoFLOP planner (budgets/_isoflop.py): log-spaced sizes around a stated centre, one grid row
per size nearest a target shape, and whole samples that put each trial's exact FLOPs within 1% of C."""

from __future__ import annotations

import math
import re

import pytest

from archhpo.budgets._grid import build_grid
from archhpo.budgets._isoflop import (
    ShapeTarget,
    centre_from_law,
    log_sizes,
    plan_isoflop,
    plan_isoflops,
    prior_centre,
)
from archhpo.errors import BudgetError
from archhpo.models import get_family

LM = get_family("lm")
LM_INFO = LM.data_info(LM.parse_data("synthetic", {}), {})


def test_the_prior_centre_is_chinchillas_twenty_tokens_per_parameter() -> None:
    c = 1.2e15
    n = prior_centre(c)
    assert n == pytest.approx(math.sqrt(1e13))
    assert 6 * n * (20 * n) == pytest.approx(c)


def test_sizes_are_log_spaced_over_the_span_around_the_centre() -> None:
    sizes = log_sizes(1e6, 7, 10.0)
    assert sizes[-1] / sizes[0] == pytest.approx(10.0)
    assert math.sqrt(sizes[0] * sizes[-1]) == pytest.approx(1e6)
    steps = [b / a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert steps == pytest.approx([10 ** (1 / 6)] * 6)


@pytest.mark.parametrize("compute", [1e13, 1e14, 1e15])
def test_every_trial_trains_whole_windows_within_one_percent_of_its_compute(compute: float) -> None:
    plan = plan_isoflop(LM, LM_INFO, compute)
    assert plan.centre_source == "prior" and plan.centre == pytest.approx(prior_centre(compute))
    assert len(plan.trials) == 7
    for t in plan.trials:
        cfg = LM.config_for(t.row.arch(), LM_INFO)
        per_sample = LM.flops_per_sample(cfg)
        assert t.row.param_count == LM.param_count(cfg)
        assert t.train_tokens == t.samples * cfg.seq_len
        assert t.train_flops == t.samples * per_sample
        assert abs(t.train_flops - compute) / compute <= 0.01
        assert t.flops_per_param_token == pytest.approx(per_sample / cfg.seq_len / t.param_count)
        assert t.user_attrs() == {"compute_budget": compute, "param_count": t.param_count,
                                  "train_tokens": t.train_tokens, "isoflop_size": t.size}


def test_each_size_takes_its_own_row_within_half_a_log_step() -> None:
    plan = plan_isoflop(LM, LM_INFO, 1e15)
    counts = [t.param_count for t in plan.trials]
    assert counts == sorted(set(counts)), "distinct rows, increasing with size"
    half = 10 ** (0.5 / 6)
    for t in plan.trials:
        assert t.target_params / half <= t.param_count < t.target_params * half


def test_the_row_is_the_one_nearest_the_target_aspect_ratio_in_its_band() -> None:
    plan = plan_isoflop(LM, LM_INFO, 1e15)
    half = 10 ** (0.5 / 6)
    for t in plan.trials:
        band = [r for r in build_grid(LM, round(t.target_params), LM_INFO, 0.5)
                if t.target_params / half <= r.param_count < t.target_params * half]
        far = lambda r: abs(math.log(r.d_model / r.n_layers / 100.0))  # noqa: E731
        assert far(t.row) == pytest.approx(min(far(r) for r in band))


def test_a_carried_shape_makes_every_size_deeper_than_the_default() -> None:
    deep = ShapeTarget.from_row({"d_model": 128, "n_layers": 8, "n_heads": 4, "d_ff": 256})
    assert (deep.aspect, deep.ff_mult, deep.head_dim) == (16.0, 2.0, 32.0)
    default = plan_isoflop(LM, LM_INFO, 1e15)
    carried = plan_isoflop(LM, LM_INFO, 1e15, shape=deep)
    aspect = lambda t: t.row.d_model / t.row.n_layers  # noqa: E731
    assert all(aspect(c) < aspect(d) for c, d in zip(carried.trials, default.trials, strict=True))


def test_k_shapes_per_size_are_distinct_bodies_ranked_by_shape() -> None:
    plan = plan_isoflop(LM, LM_INFO, 1e15, shapes=3)
    one = {t.size: t.row for t in plan_isoflop(LM, LM_INFO, 1e15).trials}
    by_size: dict[int, list] = {}
    for t in plan.trials:
        by_size.setdefault(t.size, []).append(t)
    assert set(by_size) == set(range(7))
    for size, trials in by_size.items():
        assert [t.rank for t in trials] == list(range(len(trials))) and 1 <= len(trials) <= 3
        assert trials[0].row == one[size]  # rank 0 is the one-shape plan's row
        # K shapes differ in width, depth or FFN, not only in their head count
        assert len({(t.row.d_model, t.row.n_layers, t.row.d_ff) for t in trials}) == len(trials)
        assert all(abs(t.train_flops - 1e15) <= 0.01 * 1e15 for t in trials)
    assert sum(len(v) for v in by_size.values()) > 7


def test_samples_are_a_multiple_of_the_validation_intervals() -> None:
    plan = plan_isoflop(LM, LM_INFO, 1e14, intervals=9)
    assert all(t.samples % 9 == 0 for t in plan.trials)
    assert all(abs(t.train_flops - 1e14) <= 1e12 for t in plan.trials)


def test_a_given_centre_or_an_earlier_law_moves_the_sizes() -> None:
    given = plan_isoflop(LM, LM_INFO, 1e15, centre=1e6)
    assert given.centre_source == "given" and given.targets[3] == pytest.approx(1e6)
    law = {"status": "fitted", "G": 0.5, "a": {"estimate": 0.45, "ci95": [0.4, 0.5]}}
    assert centre_from_law(law, 1e15) == pytest.approx(0.5 * 1e15**0.45)
    from_law = plan_isoflop(LM, LM_INFO, 1e15, law=law)
    assert from_law.centre_source == "law" and from_law.centre == pytest.approx(0.5 * 1e15**0.45)


def test_several_compute_budgets_are_planned_in_increasing_order() -> None:
    plans = plan_isoflops(LM, LM_INFO, [1e15, 1e13, 1e14], centres={1e14: 1e6}, sizes=5)
    assert [p.compute_budget for p in plans] == [1e13, 1e14, 1e15]
    assert [p.centre_source for p in plans] == ["prior", "given", "prior"]
    assert all(len(p.trials) == 5 for p in plans)


def test_a_family_counted_in_samples_trains_whole_samples() -> None:
    fam = get_family("patchtst")
    info = fam.data_info(fam.parse_data("synthetic", {}), {})
    plan = plan_isoflop(fam, info, 1e13, sizes=5)
    for t in plan.trials:
        assert t.units_per_sample == 1 and t.train_tokens == t.samples
        assert abs(t.train_flops - 1e13) <= 1e11


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"compute": 1e15, "sizes": 4}, "at least 5 sizes"),
    ({"compute": 1e15, "span": 1.0}, "must be above 1"),
    ({"compute": -1.0}, "must be a positive number"),
    ({"compute": 1e15, "shapes": 0}, "--shapes 0 must be a positive integer"),
    ({"compute": 1.5e9, "centre": 1e6}, "off C (at most 1%)"),
    ({"compute": 1e15, "centre": 1e3}, "No lm architecture of the grid has between"),
    ({"compute": 1e15, "law": {"status": "unresolved", "reason": "edge", "G": None, "a": None}}, "give --centre"),
])
def test_bad_input_is_refused_in_one_sentence(kwargs: dict, words: str) -> None:
    compute = kwargs.pop("compute")
    with pytest.raises(BudgetError) as err:
        plan_isoflop(LM, LM_INFO, compute, **kwargs)
    text = str(err.value)
    assert words in text and text.endswith(".") and not re.search(r"\.\s+[A-Z]", text), "one sentence"


def test_a_compute_budget_listed_twice_is_refused() -> None:
    with pytest.raises(BudgetError, match="lists a compute budget twice"):
        plan_isoflops(LM, LM_INFO, [1e14, 1e14])


def test_width_and_depth_lists_replace_the_grids_so_a_plan_reaches_below_its_smallest_model() -> None:
    floor = min(r.param_count for r in build_grid(LM, 80_000, LM_INFO, 0.5))
    with pytest.raises(BudgetError, match="--d-model 16,32,48,64 --n-layers 1,2 reach below the grid"):
        plan_isoflop(LM, LM_INFO, 1e11, sizes=5, span=4.0, centre=3e4)
    pins = {"d_model": (16, 32, 48, 64), "n_layers": (1, 2), "n_heads": (2, 4)}
    plan = plan_isoflop(LM, LM_INFO, 1e11, sizes=5, span=4.0, centre=3e4, pins=pins)
    rows = [t.row for t in plan.trials]
    assert len(rows) == 5 and max(r.param_count for r in rows) < floor  # every size below the grid's floor
    assert all(r.d_model in pins["d_model"] and r.n_layers in pins["n_layers"] and r.n_heads in (2, 4) for r in rows)
    assert all(abs(t.train_flops - 1e11) / 1e11 <= 0.01 for t in plan.trials)


def test_pins_of_grid_values_only_filter_the_grid() -> None:
    pins = {"d_model": (64, 128), "n_layers": (2, 3, 4)}
    unpinned = [r.arch() for r in build_grid(LM, 300_000, LM_INFO, 0.5)
                if r.d_model in pins["d_model"] and r.n_layers in pins["n_layers"]]
    assert [r.arch() for r in build_grid(LM, 300_000, LM_INFO, 0.5, pins)] == unpinned != []
