"""Ladder planning (`--ladder`): budgets searched smallest first, a larger budget planned from the
finished smaller ones.  Pure functions; search/_upkeep.py calls `carry_up` under the plan lock once
every smaller budget's plan is final, and stores its result in the study before enqueuing.

What is carried up from the next smaller budget (its best COMPLETE trial of phases 1-2):
- the learning rate, scaled as N^-1/3 (OLMo's ladder, arXiv 2412.04403): lr * (N / N_small)^(-1/3),
  N the budgets' nominal parameter counts, clipped to the study's range; phase 1 samples it within
  x/÷ LR_WIDTH of that value;
- weight decay, sampled within x/÷ WD_WIDTH of the smaller best's; epochs, batch size and warm-up
  as the smaller best's (fixed);
- the architecture region: the aspect ratios d_model/n_layers of its TOP_K best distinct
  architectures, widened x/÷ ASPECT_WIDEN; the grid's extremes are always planned as well, so a
  change of trend can still show.
A ladder budget has fewer trials: the design's --trials halved per step up the ladder, never
fewer than its extremes + 2; its plan has no phase 2 (its training parameters come from below).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from archhpo.budgets import GridRow
from archhpo.search._plan import plan_order
from archhpo.search._space import SearchSpace

LR_EXPONENT = -1 / 3
LR_WIDTH = 2.0
WD_WIDTH = 3.0
TOP_K = 3
ASPECT_WIDEN = 1.5


def ladder_trials(n_trials: int, step: int, n_extremes: int) -> int:
    """Planned trials of the budget `step` rungs up the ladder (step 0: the smallest, all of them)."""
    return max(n_trials // 2**step, n_extremes + 2) if step else n_trials


@dataclass(frozen=True)
class Finished:
    """A finished trial of a smaller budget, as the ladder reads it."""

    value: float
    number: int
    d_model: int
    n_layers: int
    arch_key: tuple[Any, ...]  # what makes two trials the same architecture
    params: Mapping[str, Any]


def _clip(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def carried_params(best: Finished, n_small: int, n_large: int, space: SearchSpace) -> dict[str, Any]:
    """The training parameters carried from the smaller budget's best trial to the larger budget."""
    lr = _clip(float(best.params["learning_rate"]) * (n_large / n_small) ** LR_EXPONENT, *space.learning_rate)
    return {"learning_rate": lr, "weight_decay": float(best.params["weight_decay"]),
            **{k: int(best.params[k]) for k in ("epochs", "batch_size", "warmup_steps")}}


def narrowed_space(carried: Mapping[str, Any], space: SearchSpace) -> SearchSpace:
    """The space phase 1 of a ladder budget samples: around the carried values, inside the study's."""
    def around(value: float, width: float, rng: tuple[float, ...]) -> tuple[float, float]:
        lo, hi = float(rng[0]), float(rng[-1])
        return _clip(value / width, lo, hi), _clip(value * width, lo, hi)

    return SearchSpace(
        learning_rate=around(carried["learning_rate"], LR_WIDTH, space.learning_rate),
        weight_decay=around(carried["weight_decay"], WD_WIDTH, space.weight_decay),
        epochs=(int(carried["epochs"]),), batch_size=(int(carried["batch_size"]),),
        warmup_steps=(int(carried["warmup_steps"]),),
    )


def top_architectures(finished: Sequence[Finished], k: int = TOP_K) -> list[Finished]:
    """The best trial of each of the k best distinct architectures (ties: the earlier trial)."""
    best: dict[tuple[Any, ...], Finished] = {}
    for t in sorted(finished, key=lambda t: (t.value, t.number)):
        best.setdefault(t.arch_key, t)
    return list(best.values())[:k]


def region(rows: Sequence[GridRow], top: Sequence[Finished], widen: float = ASPECT_WIDEN) -> list[GridRow]:
    """The grid rows whose aspect ratio lies in the top architectures' range (widened), and the extremes."""
    ratios = [t.d_model / t.n_layers for t in top]
    lo, hi = min(ratios) / widen, max(ratios) * widen
    return [r for r in rows if lo <= r.d_model / r.n_layers <= hi or r.extreme]


def carry_up(finished: Sequence[Finished], n_small: int, n_large: int, rows: Sequence[GridRow],
             space: SearchSpace, slots: Sequence[int], seed: int) -> dict[str, Any]:
    """The larger budget's plan from the smaller budget's finished trials: what was carried, and an
    architecture and training parameters for each planned phase-1 slot (the region's architectures
    in the plan's spread order, extremes first, repeated if the slots outnumber them)."""
    top = top_architectures(finished)
    if not top:  # every trial of the smaller budget failed: nothing to carry, the design's space and grid
        return {"carried": None, "from_trial": None, "space": space.as_dict(), "aspect_ratios": [],
                "aspect_range": None, "region_size": len(rows), "grid_size": len(rows), "rule": "nothing carried",
                "assignments": _assign(list(rows), space, slots, seed)}
    carried = carried_params(top[0], n_small, n_large, space)
    inside = region(rows, top)
    narrow = narrowed_space(carried, space)
    assignments = _assign(inside, narrow, slots, seed)
    ratios = [t.d_model / t.n_layers for t in top]
    return {
        "carried": carried, "from_trial": top[0].number, "space": narrow.as_dict(),
        "aspect_ratios": sorted(ratios), "aspect_range": [min(ratios) / ASPECT_WIDEN, max(ratios) * ASPECT_WIDEN],
        "region_size": len(inside), "grid_size": len(rows), "assignments": assignments,
        "rule": f"lr x (N/N_small)^{LR_EXPONENT:.3f} = x {(n_large / n_small) ** LR_EXPONENT:.3f}",
    }


def _assign(rows: list[GridRow], space: SearchSpace, slots: Sequence[int], seed: int) -> list[dict[str, Any]]:
    """Each slot's architecture (the rows in spread order, extremes first, repeated if the slots
    outnumber them) and training parameters (sampled from `space`)."""
    order = plan_order([GridRow(**{**r.as_dict(), "arch_idx": i}) for i, r in enumerate(rows)], seed)
    rng = random.Random(f"ladder:{seed}")
    return [{"slot": slot, "arch_idx": rows[order[i % len(order)]].arch_idx, "params": space.sample(rng)}
            for i, slot in enumerate(slots)]


def describe(ladder: Mapping[str, Any]) -> str:
    """One line for the report: what a budget carried up and from where."""
    c = ladder["carried"]
    if c is None:
        return f"from {ladder['from_budget']}: nothing (every trial there failed); planned as the design"
    lo, hi = ladder["aspect_range"]
    return (f"from {ladder['from_budget']} (trial {ladder['from_trial']}): learning rate {c['learning_rate']:.3g} "
            f"({ladder['rule']}), weight decay {c['weight_decay']:.3g}, {c['epochs']} epochs, batch "
            f"{c['batch_size']}, warm-up {c['warmup_steps']}; aspect ratios {lo:.3g}–{hi:.3g}: "
            f"{ladder['region_size']} of {ladder['grid_size']} architectures (extremes included)")

