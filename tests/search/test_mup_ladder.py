"""A µP ladder: the learning rate searched at the smallest budget is carried unchanged to every
larger budget and every width, is not sampled around, and the record says so."""

from __future__ import annotations

import math
from typing import Any

import pytest

from archhpo.budgets import GridRow
from archhpo.search._ladder import Finished, carry_up, describe
from archhpo.search._lrfit import MUP_SOURCE, MUP_TRANSFER, mup_fit
from archhpo.search._space import QUICK_SPACE

PARAMS = {"weight_decay": 1e-4, "epochs": 3, "batch_size": 64, "warmup_steps": 10}


def _row(i: int, d: int, layers: int) -> GridRow:
    return GridRow(budget="x", arch_idx=i, d_model=d, n_layers=layers, n_heads=2, d_ff=2 * d,
                   param_count=0, estimate=None, extreme="")


def _done(value: float, number: int, d: int, layers: int, lr: float) -> Finished:
    return Finished(value, number, d, layers, (d, layers), {**PARAMS, "learning_rate": lr})


def _located(lr: float, d: int) -> list[Finished]:
    """One architecture at 4 rates on a parabola in log lr whose vertex is `lr`."""
    return [_done(2.0 + math.log(f) ** 2, k, d, 2, lr * f) for k, f in enumerate((0.25, 0.5, 2, 4))]


def _ladder() -> tuple[list[GridRow], list[tuple[int, list[Finished]]]]:
    rows = [_row(0, 64, 2), _row(1, 128, 2), _row(2, 128, 4)]
    # The smallest budget searched the rate (vertex 4e-4); the next one trained wider models at a
    # rate it was given, which a µP carry must not read.
    below = [(25_000, _located(4e-4, 64)), (50_000, [_done(1.9, 10, 128, 2, 2.5e-4), _done(1.95, 11, 128, 4, 9e-4)])]
    return rows, below


def _carry(parametrization: str, base_depth: int | None = None) -> dict[str, Any]:
    rows, below = _ladder()
    return carry_up(below[-1][1], 50_000, 200_000, rows, QUICK_SPACE, slots=[0, 1, 2], seed=0, below=below,
                    parametrization=parametrization, base_depth=base_depth)


def test_a_mup_ladder_carries_the_smallest_budgets_rate_unchanged_to_every_width() -> None:
    out = _carry("mup")
    assert out["carried"]["learning_rate"] == pytest.approx(4e-4, rel=1e-9)
    assert out["budget_rates"] == [[25_000, pytest.approx(4e-4, rel=1e-9)]]
    assert len(out["assignments"]) == 3
    assert {a["arch_idx"] for a in out["assignments"]} == {0, 1, 2}
    # Every architecture, d_model 64 or 128, trains at exactly the carried rate: nothing is sampled.
    assert {a["params"]["learning_rate"] for a in out["assignments"]} == {out["carried"]["learning_rate"]}
    assert out["space"]["learning_rate"] == [out["carried"]["learning_rate"]] * 2
    assert out["lr_fit"]["source"] == MUP_SOURCE and out["lr_fit"]["exponent"] == 0.0


def test_the_standard_ladder_moves_the_same_rate_with_n_and_width() -> None:
    sp, mup = _carry("sp"), _carry("mup")
    assert sp["lr_fit"]["source"] == "prior"
    assert sp["carried"]["learning_rate"] != pytest.approx(mup["carried"]["learning_rate"], rel=1e-3)
    rates = {a["arch_idx"]: a["params"]["learning_rate"] for a in sp["assignments"]}
    assert len(set(rates.values())) == 3, "sampled within a range around each width's own carried rate"


def test_a_mup_ladder_record_says_the_rate_was_carried_unchanged_and_cites_the_transfer() -> None:
    line = describe({**_carry("mup"), "from_budget": "50K"})
    assert "learning rate 0.0004 (lr carried unchanged under µP, at every d_model; region:" in line
    assert line.endswith("learning-rate exponent N^0 (µP: the rate searched at 25K only (its parabola's "
                         f"vertex), carried unchanged; the measured transfer across width and depth is in {MUP_TRANSFER})")


def test_a_completep_ladder_record_says_the_rate_carries_across_depth_from_its_base() -> None:
    line = describe({**_carry("mup", base_depth=2), "from_budget": "50K"})
    assert ("(lr carried unchanged under µP, at every d_model and depth (CompleteP from base depth 2); "
            "region:") in line
    assert "at every d_model;" not in line


def test_mup_reads_the_best_trial_where_the_smallest_budget_did_not_locate_its_rate() -> None:
    points = [(1e-3, 2.1, "a"), (3e-3, 2.0, "a"), (1e-2, 2.4, "a")]  # 3 rates: no parabola is read
    fit, rates = mup_fit([(400_000, [(5e-3, 1.0, "b")]), (100_000, points)])
    assert rates == [(100_000, 3e-3)]
    assert "100K only (its best trial's rate: 3 rate(s) tried, a parabola needs 4)" in fit.reason


def test_mup_needs_the_smallest_budgets_trials() -> None:
    with pytest.raises(ValueError, match="smallest budget's finished trials"):
        mup_fit([(100_000, [])])
