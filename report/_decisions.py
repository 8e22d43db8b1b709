"""Decision accuracy: how often the ranking at a smaller budget agrees with the ranking at a larger
one (DataDecide's measure, arXiv 2504.11393), the evidence for or against trusting a ladder.

Architectures differ between budgets, so what is compared is a *shape*: the same number of layers
and heads (and the same categorical choice) at two budgets, its width grown with the budget.  For
every pair of shapes found at both budgets, the ranking agrees when the same one has the lower mean
loss at both (a tie counts half).  The interval resamples the shapes (bootstrap, seeded).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pandas as pd

from archhpo.report._frame import budgets_in, ranked

MIN_SHAPES = 3  # fewer matched shapes have no agreement to compute
MIN_PAIRS = 5  # the table shows a budget pair from 5 pairs of shapes on (see `decision_left_out`)
MIN_PAIRS_SHAPES = 4  # the fewest shapes that make MIN_PAIRS pairs (4 shapes: 6 pairs)
SHAPE = ("n_layers", "n_heads", "choice")


def shape_means(frame: pd.DataFrame) -> dict[str, dict[tuple[Any, ...], float]]:
    """Per budget: each shape's mean loss over its COMPLETE trials (confirmations left out)."""
    done = ranked(frame)
    return {str(b): {tuple(k): float(v) for k, v in g.groupby(list(SHAPE), sort=True)["val_loss"].mean().items()}
            for b, g in done.groupby("budget", sort=False)}


def _agreement(small: dict[tuple[Any, ...], float], large: dict[tuple[Any, ...], float],
               shapes: list[tuple[Any, ...]]) -> float | None:
    total, agree = 0, 0.0
    for a, b in itertools.combinations(shapes, 2):
        if a == b:  # a bootstrap draw may repeat a shape: no comparison with itself
            continue
        ds, dl = small[a] - small[b], large[a] - large[b]
        total += 1
        agree += 0.5 if ds == 0 or dl == 0 else float((ds > 0) == (dl > 0))
    return agree / total if total else None


def decision_accuracy(frame: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """Every (smaller, larger) pair of budgets: matched shapes, pairs, agreement and its 95% interval."""
    means, order = shape_means(frame), budgets_in(frame)
    out = []
    for i, small in enumerate(order):
        for large in order[i + 1:]:
            shapes = sorted(set(means.get(small, {})) & set(means.get(large, {})))
            row: dict[str, Any] = {"small": small, "large": large, "shapes": len(shapes),
                                   "pairs": len(shapes) * (len(shapes) - 1) // 2, "accuracy": None, "ci95": None}
            if len(shapes) >= MIN_SHAPES:
                row["accuracy"] = _agreement(means[small], means[large], shapes)
                rng = random.Random(f"{seed}:{small}:{large}")
                boot = [v for _ in range(n_boot)
                        if (v := _agreement(means[small], means[large], rng.choices(shapes, k=len(shapes)))) is not None]
                boot.sort()
                row["ci95"] = [boot[int(0.025 * (len(boot) - 1))], boot[int(0.975 * (len(boot) - 1))]]
            out.append(row)
    return out


def _shown(r: dict[str, Any]) -> bool:
    return r["accuracy"] is not None and r["pairs"] >= MIN_PAIRS


def decision_rows(result: list[dict[str, Any]]) -> list[list[str]]:
    """Rows for the report's table: budgets, matched shapes, agreement [interval] of `MIN_PAIRS`
    pairs or more; the other budget pairs are left out (`decision_left_out` says which)."""
    return [[f"{r['small']} → {r['large']}", str(r["shapes"]),
             f"{r['accuracy']:.0%} [{r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}] of {r['pairs']} pairs"]
            for r in result if _shown(r)]


def decision_left_out(result: list[dict[str, Any]]) -> str | None:
    """The sentence under the table naming each budget pair left out of it, with its matched
    shapes, and why (None when none is): under `MIN_PAIRS` pairs the agreement moves in steps of a
    third or more and its bootstrap interval collapses (0% [0%, 0%] of 3 pairs says nothing)."""
    out = [f"{r['small']} → {r['large']} ({r['shapes']} matched shape{'' if r['shapes'] == 1 else 's'})"
           for r in result if not _shown(r)]
    if not out:
        return None
    return (f"Left out: {', '.join(out)}: fewer than {MIN_PAIRS} pairs of shapes to compare (that takes "
            f"{MIN_PAIRS_SHAPES} matched shapes); with so few the agreement moves in steps of a third or more "
            "and its interval collapses.")
