"""What a study's compute bought: FLOPs spent against the full plan (successive halving's saving).

`flops_spent` is what each trial trained (all its claims and cooldown branches), `flops_full` what
training it to full length once costs; the full plan is one full-length training per plan slot.
Read from the report frame, so a report from CSV files says the same as one from the database.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def compute_totals(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per budget (and "all"): {"spent": FLOPs, "full_plan": FLOPs}; budgets that recorded none are left out."""
    out: dict[str, dict[str, float]] = {}
    if "flops_spent" not in frame.columns:
        return out
    for budget, group in [*frame.groupby("budget", sort=False), ("all", frame)]:
        spent = pd.to_numeric(group["flops_spent"], errors="coerce")
        full = pd.to_numeric(group["flops_full"], errors="coerce")
        by_slot = full.groupby([group["budget"], group["plan_slot"]]).first()  # one full training per slot
        if spent.notna().any() and by_slot.notna().any():
            out[str(budget)] = {"spent": float(spent.sum()), "full_plan": float(by_slot.sum())}
    return out


def compute_text(frame: pd.DataFrame) -> str | None:
    """One sentence: FLOPs spent against the full plan, and what saved the difference; None if not recorded."""
    total = compute_totals(frame).get("all")
    if not total or not total["full_plan"] or not math.isfinite(total["spent"]):
        return None
    share = total["spent"] / total["full_plan"]
    return (f"compute: {total['spent']:.3g} FLOPs spent against {total['full_plan']:.3g} to train every planned "
            f"trial to full length ({share:.0%}; {_what_saved(frame, share)})")


def _what_saved(frame: pd.DataFrame, share: float) -> str:
    """Credit a saving only to what the trials show: halving (they carry a rung) or pruning (PRUNED
    trials); otherwise it is only a shortfall (failed trials; trials resumed before a version that
    counted every claim recorded only their last one)."""
    if share > 1:
        return "nothing was saved (every trial ran to full length, cooldown branches on top)"
    if share == 1:
        return "every trial ran to full length"
    if "rung" in frame.columns and pd.to_numeric(frame["rung"], errors="coerce").notna().any():
        return f"successive halving saved {1 - share:.0%}"
    if "state" in frame.columns and (frame["state"] == "PRUNED").any():
        return f"pruning saved {1 - share:.0%}"
    return f"{1 - share:.0%} not recorded as spent: nothing was pruned, so failed or partly recorded trials"


def compute_rows(frame: pd.DataFrame) -> list[list[Any]]:
    """Rows for the report's compute table: budget, spent, full plan, share."""
    return [[b, f"{t['spent']:.3g}", f"{t['full_plan']:.3g}", f"{t['spent'] / t['full_plan']:.0%}"]
            for b, t in compute_totals(frame).items() if t["full_plan"]]


# ----------------------------------------------------------------------------- data per parameter
REPEAT_NOTE = (
    "A pass beyond the first repeats tokens the model has seen, and repeated tokens are worth less than "
    "fresh ones: Muennighoff et al. (2023, arXiv 2305.16264) find up to about 4 passes almost as good as "
    "new data and quickly less after that, so a budget trained on more passes is not comparable with one "
    "trained on fresh data at the same D."
)


def data_rows(frame: pd.DataFrame) -> list[list[Any]]:
    """Per budget of a data-budget study (--tokens-per-param / --samples-per-param): R, the data
    trained to full length (D) and the passes over the training set that took; [] otherwise."""
    rows: list[list[Any]] = []
    for unit in ("tokens", "samples"):
        ratio, trained = f"{unit}_per_param", f"train_{unit}"
        if ratio not in frame.columns or trained not in frame.columns:
            continue
        part = frame[frame[ratio].notna() & (frame["state"] == "COMPLETE")]
        for budget, group in part.groupby("budget", sort=False):
            passes = group["data_passes"].dropna() if "data_passes" in group.columns else pd.Series(dtype=float)
            rows.append([budget, f"{group[ratio].iloc[0]:g} {unit}/param", f"{group[trained].max():,.0f} {unit}",
                         f"{passes.max():.2f}" if len(passes) else "n/a"])
    return rows


def data_text(frame: pd.DataFrame) -> str | None:
    """The sentence under the data table: fresh data everywhere, or which budgets repeated it."""
    rows = data_rows(frame)
    if not rows:
        return None
    repeated = [f"{r[0]} ({r[3]} passes)" for r in rows if r[3] != "n/a" and float(r[3]) > 1.05]
    if not repeated:
        return "Every budget trained on fresh data (one pass over its training set, D a stated multiple of N)."
    return f"Repeated data at {', '.join(repeated)}. {REPEAT_NOTE}"
