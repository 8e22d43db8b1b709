"""The two-phase trial plan (docs/design.md §5): sizes, extremes, spread, no repeats, determinism."""

from __future__ import annotations

import pytest

from archhpo.budgets import build_grid
from archhpo.errors import BudgetError
from archhpo.models import get_family
from archhpo.search import FULL_SPACE, QUICK_SPACE, make_plan, plan_sizes, spread_order

ROWS_2M = build_grid(get_family("patchtst"), 2_000_000, {"num_features": 8})


def test_default_plan_is_twenty_archs_twice_then_ten_more() -> None:
    plan = make_plan(ROWS_2M, 50, FULL_SPACE, seed=0)
    p1 = [e for e in plan if e.phase == 1]
    p2 = [e for e in plan if e.phase == 2]
    assert len(plan) == 50 and len(p1) == 40 and len(p2) == 10
    assert len({e.arch_idx for e in p1}) == 20
    assert all(sum(e.arch_idx == a for e in p1) == 2 for a in {e.arch_idx for e in p1})
    assert not {e.arch_idx for e in p2} & {e.arch_idx for e in p1}, "phase 2 explores new architectures"
    assert [e.slot for e in plan] == list(range(50))
    assert all(e.params is None for e in p2)


def test_plan_always_contains_the_extremes() -> None:
    extremes = {r.arch_idx for r in ROWS_2M if r.extreme}
    for n in (4, 7, 12, 50):
        assert extremes <= {e.arch_idx for e in make_plan(ROWS_2M, n, FULL_SPACE)}


def test_plan_never_exceeds_the_requested_trials() -> None:
    for n in range(4, 60, 3):
        assert len(make_plan(ROWS_2M, n, FULL_SPACE)) <= n


def test_small_grid_shrinks_the_plan_instead_of_repeating() -> None:
    rows = ROWS_2M[:5]
    rows = [type(r)(**{**r.as_dict(), "extreme": "min_d_model" if i == 0 else ""}) for i, r in enumerate(rows)]
    plan = make_plan(rows, 50, FULL_SPACE)
    assert len(plan) == 10  # 5 architectures × 2 phase-1 trials, none left for phase 2
    assert plan_sizes(5, 50, 1) == (5, 2, 0)


def test_too_few_trials_for_the_extremes_is_a_clear_error() -> None:
    n_extremes = sum(1 for r in ROWS_2M if r.extreme)
    with pytest.raises(BudgetError, match="extreme"):
        make_plan(ROWS_2M, n_extremes - 1, FULL_SPACE)


def test_phase1_params_are_sampled_within_the_ranges() -> None:
    for space in (FULL_SPACE, QUICK_SPACE):
        for e in make_plan(ROWS_2M, 50, space, seed=3):
            if e.params is None:
                continue
            assert space.learning_rate[0] <= e.params["learning_rate"] <= space.learning_rate[1]
            assert space.weight_decay[0] <= e.params["weight_decay"] <= space.weight_decay[1]
            assert e.params["epochs"] in space.epochs and e.params["batch_size"] in space.batch_size
            assert e.params["warmup_steps"] in space.warmup_steps


def test_plan_is_deterministic_by_seed() -> None:
    assert make_plan(ROWS_2M, 50, FULL_SPACE, 1) == make_plan(ROWS_2M, 50, FULL_SPACE, 1)
    assert make_plan(ROWS_2M, 50, FULL_SPACE, 1) != make_plan(ROWS_2M, 50, FULL_SPACE, 2)


def test_spread_covers_the_d_model_depth_plane_first() -> None:
    order = spread_order(ROWS_2M)
    points = {(r.d_model, r.n_layers) for r in ROWS_2M}
    first = {(ROWS_2M[i].d_model, ROWS_2M[i].n_layers) for i in order[: len(points)]}
    # Every distinct (d_model, n_layers) point is visited before any point repeats.
    assert first == points
    assert sorted(order) == list(range(len(ROWS_2M)))
