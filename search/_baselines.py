"""Rule-of-thumb baselines (``--baselines``): the shapes common rules would pick from a budget's grid.

A researcher who does not search picks a shape by a rule.  archhpo trains each rule's shape from
the same grid as extra confirmation slots, with the confirmation seeds and the searched best's
training parameters, so the report gives the paired difference from the best: the search either
beats the rule (the 95% interval excludes 0) or certifies it as within seed noise.  Each rule is a
target aspect ratio d_model / n_layers (the grid row nearest it in log ratio):
- ``kaplan``: Kaplan et al. 2020 (arXiv 2001.08361, Fig. 5): loss nearly flat around ≈ 100;
- ``mobilellm``: MobileLLM (arXiv 2402.14905): deep and thin, its 125M model's 576 / 30 = 19.2;
- ``median``: no rule, the grid's median shape by aspect ratio.

A rule sees only the rows with the searched best's categorical choices.  Ties go to the head
dimension nearest 64 in log ratio (both rules' own models use 64-wide heads), then the parameter
count nearest the budget, then the lower arch_idx, so the pick is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from archhpo.search._plan import PlanEntry

KAPLAN_ASPECT = 100.0
MOBILELLM_ASPECT = 576 / 30  # MobileLLM-125M: 30 layers, d_model 576
BASELINE_RULES: dict[str, str] = {
    "kaplan": "Kaplan et al. 2020: d_model / n_layers ≈ 100",
    "mobilellm": "MobileLLM (deep and thin): d_model / n_layers ≈ 19.2 (576 / 30)",
    "median": "the grid's median shape by d_model / n_layers",
}


def _aspect(row: Mapping[str, Any]) -> float:
    return float(row["d_model"]) / float(row["n_layers"])


HEAD_DIM = 64  # the head dimension both rules' own models use


def _tie_key(row: Mapping[str, Any], budget: int) -> tuple[float, int, int]:
    head_dim = float(row["d_model"]) / float(row["n_heads"])
    return (round(abs(math.log(head_dim / HEAD_DIM)), 12), abs(int(row["param_count"]) - budget),
            int(row["arch_idx"]))


def _candidates(archs: Sequence[Mapping[str, Any]], choices: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rows with the best's categorical choices (a rule picks a shape, not an encoder); all rows
    when none has them."""
    same = [r for r in archs if (r.get("choices") or {}) == dict(choices)]
    return same or list(archs)


def pick_baseline(rule: str, archs: Sequence[Mapping[str, Any]], choices: Mapping[str, Any],
                  budget: int) -> int:
    """The arch_idx `rule` picks from the grid rows `archs` (StudySettings.archs)."""
    rows = _candidates(archs, choices)
    if not rows:
        raise ValueError("a baseline needs at least one grid row")
    if rule == "median":
        by_aspect = sorted(rows, key=lambda r: (_aspect(r), _tie_key(r, budget)))
        # the lower median aspect ratio, then the tie rule among the rows that share it
        target = _aspect(by_aspect[(len(by_aspect) - 1) // 2])
    elif rule == "kaplan":
        target = KAPLAN_ASPECT
    elif rule == "mobilellm":
        target = MOBILELLM_ASPECT
    else:
        raise ValueError(f"unknown baseline rule {rule!r}; choose one of {', '.join(BASELINE_RULES)}")
    best = min(rows, key=lambda r: (round(abs(math.log(_aspect(r) / target)), 12), _tie_key(r, budget)))
    return int(best["arch_idx"])


def baseline_assignments(plan: Sequence[PlanEntry], archs: Sequence[Mapping[str, Any]],
                         best: Mapping[str, Any], budget: int) -> list[dict[str, Any]]:
    """The phase-3 assignments of the plan's baseline ranks: each rule's row, trained with the
    searched best's training parameters (`best`: the rank-0 assignment)."""
    ranks = sorted({(int(e.rank or 0), str(e.baseline)) for e in plan if e.baseline})
    choices = archs[int(best["arch_idx"])].get("choices") or {}
    return [{"rank": rank, "baseline": rule, "arch_idx": pick_baseline(rule, archs, choices, budget),
             "params": dict(best["params"])} for rank, rule in ranks]


__all__ = ["BASELINE_RULES", "HEAD_DIM", "KAPLAN_ASPECT", "MOBILELLM_ASPECT", "baseline_assignments", "pick_baseline"]
