"""Ladder planning (`--ladder`): budgets searched smallest first, a larger budget planned from the
finished smaller ones (size as the fidelity).  Pure functions: search/_ladder_record.py calls
`carry_up` under the plan lock once every smaller budget's plan is final; the upkeep stores it.

Carried up from the next smaller budget's COMPLETE phase 1-2 trials: the learning rate, read at one
width on a fitted or prior exponent (search/_lrfit.py) and sampled within x/÷ LR_WIDTH of it per
architecture; weight decay within x/÷ WD_WIDTH; epochs, batch size and warm-up fixed; and the region:
the TOP_K best architectures by mean span a range on every searched axis, widened by WIDEN, and a
row is planned when it lies in every range or is one of the grid's extremes (kept so a change of
trend still shows; the aspect ratio alone narrows when fewer than MIN_REGION rows remain).  A ladder
budget halves the design's --trials per step, has no phase 2, and trains each region row once (slots
beyond it are skipped: --ladder retrains its finalists in phase 3 instead).  A record stored before
a rule changed is used as stored.  --carry-finalists plans the largest budget from the next smaller
one's LADDER_FINALISTS best instead (`finalist_rows`).  Under µP the smallest budget's rate is
carried unchanged to every width, not sampled around (`mup_fit`).  The rules: docs/searching.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from archhpo.budgets import GridRow
from archhpo.schema import LADDER_FINALISTS
from archhpo.search._lrfit import (
    MUP_SOURCE,
    LrFit,
    at_width,
    budget_rates,
    carried_rate,
    fit_lr_exponent,
    mup_fit,
)
from archhpo.search._plan import plan_order, plan_sizes
from archhpo.search._space import SearchSpace
from archhpo.search._trust import describe_trust

LR_WIDTH = 2.0
WD_WIDTH = 3.0
TOP_K = 3
# Each axis' range is [min over the top / down, max over the top * up].  The factors:
# - aspect 1.5 each way: the grid's depths step by 1.33-1.5, so one neighbouring shape either side;
# - head dimension 2 each way: head counts are powers of two, so the next count either side, and a
#   larger budget's best head dimension can double;
# - d_ff ratio 1.34 each way: the grid's ratios are 2 and 4, so the top's ratios themselves (a pinned
#   d_ff's ratios in between within a third) and not the other multiplier unless the top used it;
# - depth down 1.5, up 2: a larger budget's best is usually deeper, so it may grow two steps
#   (depths 2, 3, 4, 6, 8, 12, ...) and shrink one.
WIDEN: dict[str, tuple[float, float]] = {
    "aspect": (1.5, 1.5), "head_dim": (2.0, 2.0), "ff_ratio": (1.34, 1.34), "depth": (1.5, 2.0),
}
ASPECT_WIDEN = WIDEN["aspect"][1]
MIN_REGION = 2  # rows besides the extremes the narrowed region must keep, else only the aspect narrows


def ladder_trials(n_trials: int, step: int, n_extremes: int, *, n_archs: int | None = None) -> int:
    """Planned trials of the budget `step` rungs up the ladder (step 0: the smallest, the design's):
    --trials halved per step, at least the extremes + 2, and never more than the design's plan of
    that budget (max(--trials, extremes) trials; with `n_archs`, the grid's size, exactly its phases
    1-2, which a small grid keeps below --trials)."""
    if not step:
        return n_trials
    design = max(n_trials, n_extremes)
    if n_archs is not None:
        n1, reps, n2 = plan_sizes(n_archs, design, n_extremes)
        design = n1 * reps + n2
    return min(max(n_trials // 2**step, n_extremes + 2), design)


@dataclass(frozen=True)
class Finished:
    """A finished trial of a smaller budget, as the ladder reads it (n_heads, d_ff: 0 when
    unknown, and that axis is not narrowed; lr_probe: a --lr-probe run, read for the learning rate
    only, since its rate is not the one its architecture was ranked at)."""

    value: float
    number: int
    d_model: int
    n_layers: int
    arch_key: tuple[Any, ...]  # what makes two trials the same architecture
    params: Mapping[str, Any]
    n_heads: int = 0
    d_ff: int = 0
    lr_probe: bool = False


def _clip(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def carried_params(best: Finished, lr: float, space: SearchSpace) -> dict[str, Any]:
    """The training parameters carried to the larger budget: the learning rate `lr` (read on the
    ladder's line, search/_lrfit.carried_rate) clipped to the study's range, and the smaller
    budget's best trial's weight decay, epochs, batch size and warm-up."""
    return {"learning_rate": _clip(lr, *space.learning_rate), "weight_decay": float(best.params["weight_decay"]),
            **{k: int(best.params[k]) for k in ("epochs", "batch_size", "warmup_steps")}}


def narrowed_space(carried: Mapping[str, Any], space: SearchSpace, lr_width: float = LR_WIDTH) -> SearchSpace:
    """The space phase 1 of a ladder budget samples: around the carried values, inside the study's
    (`lr_width` 1: the carried learning rate exactly, as µP carries it)."""
    def around(value: float, width: float, rng: tuple[float, ...]) -> tuple[float, float]:
        lo, hi = float(rng[0]), float(rng[-1])
        return _clip(value / width, lo, hi), _clip(value * width, lo, hi)

    return SearchSpace(
        learning_rate=around(carried["learning_rate"], lr_width, space.learning_rate),
        weight_decay=around(carried["weight_decay"], WD_WIDTH, space.weight_decay),
        epochs=(int(carried["epochs"]),), batch_size=(int(carried["batch_size"]),),
        warmup_steps=(int(carried["warmup_steps"]),),
    )


def top_architectures(finished: Sequence[Finished], k: int = TOP_K) -> list[Finished]:
    """The best trial of each of the k best distinct architectures, ranked by the mean value of
    their trials, so one lucky trial does not outrank a consistently good architecture (ties: the
    earlier best trial)."""
    trials: dict[tuple[Any, ...], list[Finished]] = {}
    for t in finished:
        trials.setdefault(t.arch_key, []).append(t)
    ranked = []
    for group in trials.values():
        best = min(group, key=lambda t: (t.value, t.number))
        ranked.append((sum(t.value for t in group) / len(group), best.number, best))
    return [best for _, _, best in sorted(ranked, key=lambda r: (r[0], r[1]))[:k]]


def axis_values(d_model: int, n_layers: int, n_heads: int, d_ff: int) -> dict[str, float | None]:
    """An architecture's value on each narrowed axis (None where it is unknown: n_heads or d_ff 0)."""
    return {"aspect": d_model / n_layers, "head_dim": d_model / n_heads if n_heads else None,
            "ff_ratio": d_ff / d_model if d_ff else None, "depth": float(n_layers)}


def axis_ranges(top: Sequence[Finished]) -> dict[str, list[float] | None]:
    """Each axis' range over the top architectures, widened by WIDEN (None: unknown for all of them)."""
    out: dict[str, list[float] | None] = {}
    known = [axis_values(t.d_model, t.n_layers, t.n_heads, t.d_ff) for t in top]
    for axis, (down, up) in WIDEN.items():
        values = [value for v in known if (value := v[axis]) is not None]
        out[axis] = [min(values) / down, max(values) * up] if values else None
    return out


def in_ranges(row: GridRow, ranges: Mapping[str, Sequence[float] | None]) -> bool:
    """Whether the row lies within every known axis' range (an axis unknown here is skipped)."""
    values = axis_values(row.d_model, row.n_layers, row.n_heads, row.d_ff)
    return all(rng is None or (value := values[axis]) is None or rng[0] <= value <= rng[1]
               for axis, rng in ranges.items())


def region(rows: Sequence[GridRow], top: Sequence[Finished], widen: float = ASPECT_WIDEN) -> list[GridRow]:
    """The grid rows whose aspect ratio lies in the top architectures' range (widened), and the
    extremes: the fallback when every axis narrows too far."""
    ratios = [t.d_model / t.n_layers for t in top]
    lo, hi = min(ratios) / widen, max(ratios) * widen
    return [r for r in rows if lo <= r.d_model / r.n_layers <= hi or r.extreme]


def _log_distance(row: GridRow, target: Mapping[str, float | None]) -> float:
    """How far a row's head dimension and d_ff ratio lie from the target's, in log units (an axis
    unknown on either side counts 0)."""
    values = axis_values(row.d_model, row.n_layers, row.n_heads, row.d_ff)
    return sum(abs(math.log(v / t)) for axis in ("head_dim", "ff_ratio")
               if (v := values[axis]) is not None and (t := target[axis]) is not None)


def centred_extremes(rows: Sequence[GridRow], best: Finished) -> list[GridRow]:
    """The grid with each extreme's mark moved to its shape's twin (a row of the same d_model,
    n_layers and choices) whose head dimension and d_ff ratio lie nearest the best architecture's
    below (ties: the grid's own pick, then the lower arch_idx).

    The grid marks an extreme by its parameter count alone (budgets/_grid.py), so its head count and
    d_ff are arbitrary; the extremes are kept to check the trend in width and depth, and trained
    with another head dimension they can lose to the region for a reason that is not their shape.
    A larger budget's best is often an extreme's shape (d_model doubles, a new aspect ratio), so the
    twin is also the likeliest winner there."""
    target = axis_values(best.d_model, best.n_layers, best.n_heads, best.d_ff)
    tags: dict[int, list[str]] = {}
    for k, r in enumerate(rows):
        if not r.extreme:
            continue
        twins = [j for j, t in enumerate(rows)
                 if (t.d_model, t.n_layers, t.choices) == (r.d_model, r.n_layers, r.choices)]
        pick = min(twins, key=lambda j: (round(_log_distance(rows[j], target), 9), j != k, j))
        tags.setdefault(pick, []).extend(r.extreme.split(";"))
    return [replace(r, extreme=";".join(tags.get(k, []))) for k, r in enumerate(rows)]


def finalist_slots(n_extremes: int, n_archs: int) -> int:
    """A --carry-finalists largest budget's phase-1 slots: one per finalist and extreme, at most
    the grid's size (a duplicate among them leaves its slot skipped)."""
    return min(n_extremes + LADDER_FINALISTS, n_archs)


def shape_distance(row: GridRow, shape: Finished) -> float:
    """How far a row's shape lies from a smaller budget's architecture's, in log units: its aspect
    ratio d_model/n_layers, head dimension and d_ff ratio (an axis unknown on either side counts 0).
    Depth and width are left out: at a larger budget both grow, the proportions carry."""
    target = axis_values(shape.d_model, shape.n_layers, shape.n_heads, shape.d_ff)
    aspect = (row.d_model / row.n_layers) / (shape.d_model / shape.n_layers)
    return abs(math.log(aspect)) + _log_distance(row, target)


def carried_row(rows: Sequence[GridRow], shape: Finished) -> int:
    """The position in `rows` of the row nearest `shape` (`shape_distance`, rounded to 9 digits;
    ties: the earlier row)."""
    return min(range(len(rows)), key=lambda j: (round(shape_distance(rows[j], shape), 9), j))


def finalist_rows(rows: Sequence[GridRow], finished: Sequence[Finished]) -> list[GridRow]:
    """--carry-finalists: the rows a ladder's largest budget trains, each once.  The next smaller
    budget's LADDER_FINALISTS best architectures by the mean of their full-length runs
    (`top_architectures`: ties by the earlier best trial), each carried to its nearest row
    (`carried_row`), in their rank order; then the grid's extremes centred on the best's head
    dimension and d_ff ratio (`centred_extremes`), in grid order; a row already listed is not
    listed again.  The rows keep their centred extreme marks; --lr-probe's runs are not ranked."""
    top = top_architectures([t for t in finished if not t.lr_probe], LADDER_FINALISTS)
    if not top:
        return []
    centred = centred_extremes(rows, top[0])
    picked = [carried_row(centred, t) for t in top] + [k for k, r in enumerate(centred) if r.extreme]
    return [centred[k] for k in dict.fromkeys(picked)]


def narrowed_region(rows: Sequence[GridRow], top: Sequence[Finished]) -> tuple[list[GridRow], dict[str, Any], str]:
    """The rows inside every axis' range, and the extremes (centred on the best's head dimension and
    d_ff ratio: `centred_extremes`); the ranges; how the region was chosen (every axis, or the
    aspect ratio alone when every axis kept fewer than MIN_REGION other rows)."""
    rows = centred_extremes(rows, top[0])
    ranges = axis_ranges(top)
    inside = [r for r in rows if r.extreme or in_ranges(r, ranges)]
    if sum(1 for r in inside if not r.extreme) >= MIN_REGION:
        return inside, ranges, "every axis"
    kept = sum(1 for r in inside if not r.extreme)
    return region(rows, top), ranges, f"aspect ratio only (every axis kept {kept} besides the extremes)"


def carry_up(finished: Sequence[Finished], n_small: int, n_large: int, rows: Sequence[GridRow],
             space: SearchSpace, slots: Sequence[int], seed: int, *,
             below: Sequence[tuple[int, Sequence[Finished]]] = (), data_grows: bool = False,
             finalists: bool = False, parametrization: str = "sp", base_depth: int | None = None) -> dict[str, Any]:
    """The larger budget's plan from the next smaller budget's finished trials: what was carried,
    and an architecture and training parameters for the planned phase-1 slots, one per region architecture
    in the plan's spread order, extremes first; slots beyond the region's size are skipped ("skipped_slots").

    below: every smaller budget of the ladder as (nominal N, its finished trials), which the
    learning-rate exponent is fitted on (search/_lrfit.py; () reads the next smaller alone);
    data_grows: the study trains on a fixed data per parameter (the prior's regime).  --lr-probe's runs
    count for the learning rate only.  finalists (--carry-finalists, the ladder's largest budget): the
    slots get `finalist_rows` in its order instead of the region, the record says which
    ("carry_finalists": the carried rows' arch_idx and the trials they were carried from).
    parametrization "mup": the smallest budget's rate, carried unchanged to every row (`mup_fit`), to
    every depth with CompleteP's `base_depth` (--mup-base-depth), which the record's rule names."""
    pool = [t for t in finished if not t.lr_probe]
    top = top_architectures(pool)
    if not top:  # every trial of the smaller budget failed: nothing to carry, the design's space and grid
        assignments = _assign(list(rows), lambda _: space, slots, seed)
        return {"carried": None, "from_trial": None, "space": space.as_dict(), "aspect_ratios": [],
                "aspect_range": None, "axes": None, "lr_fit": None, "region_size": len(rows),
                "grid_size": len(rows), "rule": "nothing carried", "assignments": assignments,
                "skipped_slots": len(slots) - len(assignments)}
    width = top[0].d_model  # every smaller budget's rates are read at the best architecture's width
    fit, rates = _rate_fit(below or [(n_small, finished)], width, data_grows, parametrization)
    mup = fit.source == MUP_SOURCE
    raw = rates[0][1] if mup else carried_rate(rates, n_large, fit.exponent)
    carried = carried_params(top[0], raw, space)
    inside, ranges, how = _planned_rows(rows, top, pool, finalists)
    lr_width = 1.0 if mup else LR_WIDTH
    narrow = narrowed_space(carried, space, lr_width)

    def space_of(row: GridRow) -> SearchSpace:  # the carried rate moved to the row's own width (µP: as is)
        lr = raw if mup else at_width(raw, width, row.d_model)
        return narrowed_space({**carried, "learning_rate": _clip(lr, *space.learning_rate)}, space, lr_width)

    ratios = [t.d_model / t.n_layers for t in top]
    assignments = _assign(inside, space_of, slots, seed, ordered=finalists)
    return {
        "carried": carried, "lr_width": width, "budget_rates": [[n, lr] for n, lr in rates],
        "from_trial": top[0].number, "space": narrow.as_dict(),
        "aspect_ratios": sorted(ratios), "aspect_range": [min(ratios) / ASPECT_WIDEN, max(ratios) * ASPECT_WIDEN],
        "axes": ranges, "lr_fit": fit.as_dict(), "region_size": len(inside), "grid_size": len(rows),
        "extremes_at": {k: v for k, v in axis_values(top[0].d_model, top[0].n_layers, top[0].n_heads,
                                                     top[0].d_ff).items() if k in ("head_dim", "ff_ratio")},
        "assignments": assignments, "skipped_slots": len(slots) - len(assignments),
        "rule": _rule(fit, len(rates), width, how, _clipped(raw, carried, space), base_depth),
        **({"carry_finalists": _carried(pool, rows)} if finalists else {}),
    }


def _rate_fit(below: Sequence[tuple[int, Sequence[Finished]]], width: int, data_grows: bool,
              parametrization: str) -> tuple[LrFit, list[tuple[int, float]]]:
    """The learning-rate fit and the budgets' best rates it reads: under µP the smallest budget's
    alone, at the trials' own widths (`mup_fit`); else every budget's, read at `width`."""
    if parametrization == "mup":
        return mup_fit([(n, [(float(t.params["learning_rate"]), t.value, t.arch_key) for t in done])
                        for n, done in below])
    budgets = [(n, [(at_width(float(t.params["learning_rate"]), t.d_model, width), t.value, t.arch_key) for t in done])
               for n, done in below]
    return fit_lr_exponent(budgets, data_grows=data_grows), budget_rates(budgets)


def _planned_rows(rows: Sequence[GridRow], top: Sequence[Finished], pool: Sequence[Finished],
                  finalists: bool) -> tuple[list[GridRow], dict[str, Any], str]:
    """The rows a ladder budget's slots go to, the axes' ranges and how they were chosen: the
    narrowed region (`narrowed_region`), or under --carry-finalists `finalist_rows` (the ranges
    recorded all the same)."""
    inside, ranges, how = narrowed_region(rows, top)
    if finalists:
        return finalist_rows(rows, pool), ranges, "--carry-finalists (the finalists below and the extremes, once each)"
    return inside, ranges, how


def _clipped(raw: float, carried: Mapping[str, Any], space: SearchSpace) -> tuple[float, float] | None:
    """The study's learning-rate range when it clipped the carried rate, else None."""
    lo, hi = float(space.learning_rate[0]), float(space.learning_rate[-1])
    return (lo, hi) if carried["learning_rate"] != raw else None


def _rule(fit: LrFit, n_budgets: int, width: int, how: str, clipped: tuple[float, float] | None = None,
          base_depth: int | None = None) -> str:
    """The record's rule: where the learning rate was read (the line's slope and the exponent's
    source, the reference width; the study's range when that clipped the carried rate: a fixed
    --learning-rate keeps it; under µP, the depths it carries to), and the region's."""
    clip = f", clipped to the study's range {clipped[0]:.3g}-{clipped[1]:.3g}" if clipped else ""
    if fit.source == MUP_SOURCE:
        where = ("every d_model" if base_depth is None
                 else f"every d_model and depth (CompleteP from base depth {base_depth})")
        return f"lr carried unchanged under µP, at {where}{clip}; region: {how}"
    through = f"{n_budgets} budgets' best rates" if n_budgets != 1 else "1 budget's best rate"
    return (f"lr on the line N^{fit.exponent:.3f} through {through} ({fit.source} exponent{clip}), at d_model "
            f"{width}, x {width}/d_model per architecture; region: {how}")


def _carried(pool: Sequence[Finished], rows: Sequence[GridRow]) -> dict[str, Any]:
    """The --carry-finalists part of the record: the smaller budget's finalists (their best trials)
    and the arch_idx of the rows they were carried to, in rank order."""
    top = top_architectures([t for t in pool if not t.lr_probe], LADDER_FINALISTS)
    return {"from_trials": [t.number for t in top], "arch_idx": [rows[carried_row(rows, t)].arch_idx for t in top]}


def _assign(rows: list[GridRow], space_of: Callable[[GridRow], SearchSpace], slots: Sequence[int],
            seed: int, *, ordered: bool = False) -> list[dict[str, Any]]:
    """The first slots' architectures, one slot per row in spread order (extremes first; `ordered`:
    in the rows' own order), and training parameters sampled from `space_of(row)` (each row's own
    learning-rate range); the slots beyond the rows get none: a repeat of an architecture in phase
    1 costs a full trial, and confirmation retrains the finalists anyway."""
    order = list(range(len(rows))) if ordered else plan_order(
        [GridRow(**{**r.as_dict(), "arch_idx": i}) for i, r in enumerate(rows)], seed)
    rng = random.Random(f"ladder:{seed}")  # drawn in slot order: the assigned slots keep their old draws
    return [{"slot": slot, "arch_idx": rows[i].arch_idx, "params": space_of(rows[i]).sample(rng)}
            for slot, i in zip(slots, order, strict=False)]


_AXIS_NAMES = {"aspect": "aspect ratio", "head_dim": "head dim", "ff_ratio": "d_ff ratio", "depth": "depth"}


def describe(ladder: Mapping[str, Any]) -> str:
    """One line for the report: what a budget carried up and from where (a ladder stored before
    every axis was narrowed has only the aspect ratio's range and no fitted exponent)."""
    c = ladder["carried"]
    if c is None:
        return (f"from {ladder['from_budget']}: nothing (every trial there failed); planned as the design"
                + _slots_note(ladder))
    axes = ladder.get("axes") or {"aspect": ladder["aspect_range"]}
    ranges = ", ".join(f"{_AXIS_NAMES[a]} {r[0]:.3g}–{r[1]:.3g}" for a, r in axes.items() if r is not None)
    fit = ladder.get("lr_fit")
    exponent = f"; learning-rate exponent {LrFit.from_dict(fit).describe()}" if fit else ""
    return (f"from {ladder['from_budget']} (trial {ladder['from_trial']}): learning rate {c['learning_rate']:.3g} "
            f"({ladder['rule']}), weight decay {c['weight_decay']:.3g}, {c['epochs']} epochs, batch "
            f"{c['batch_size']}, warm-up {c['warmup_steps']}; {_planned_note(ladder, ranges)}: "
            f"{ladder['region_size']} of {ladder['grid_size']} architectures (extremes included{_extremes_note(ladder)})"
            f"{_slots_note(ladder)}{exponent}" + _fidelity_note(ladder))


def _planned_note(ladder: Mapping[str, Any], ranges: str) -> str:
    """What the budget's slots went to: the region's ranges, or --carry-finalists' carried rows."""
    carry = ladder.get("carry_finalists")
    if not carry:
        return ranges
    pairs = ", ".join(f"trial {n} to arch {k}" for n, k in zip(carry["from_trials"], carry["arch_idx"], strict=True))
    return f"--carry-finalists: the finalists carried ({pairs}) and the extremes"


def _fidelity_note(ladder: Mapping[str, Any]) -> str:
    """The record's trust in words; --carry-finalists trains every trial to full length by rule."""
    if "trust" not in ladder:
        return ""
    if ladder.get("carry_finalists"):
        return "; fidelity: every trial trained to full length (--carry-finalists)"
    return f"; {describe_trust(ladder['trust'])}"


def _extremes_note(ladder: Mapping[str, Any]) -> str:
    """The head dimension and d_ff ratio the extremes were trained at (`centred_extremes`; a record
    stored before has none, and an axis unknown below is left out)."""
    at = {_AXIS_NAMES[a]: v for a, v in (ladder.get("extremes_at") or {}).items() if v is not None}
    return (", at the best's " + ", ".join(f"{a} {v:.3g}" for a, v in at.items())) if at else ""


def _slots_note(ladder: Mapping[str, Any]) -> str:
    """How many phase-1 slots trained, where some were skipped (a record stored before slots were
    skipped has no "skipped_slots": every slot trained, repeats included, and nothing is said)."""
    skipped = int(ladder.get("skipped_slots") or 0)
    if not skipped:
        return ""
    n = len(ladder["assignments"])
    return f"; phase 1: {n} of {n + skipped} slots, one per region architecture"
