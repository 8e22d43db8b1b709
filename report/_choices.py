"""The paired-choice table of `archhpo report` (`choice_table`, `choice_markdown`): per budget and
categorical choice, the mean over paired seeds and the paired difference against a reference
choice with its bootstrap interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from archhpo.errors import StudyError
from archhpo.report._confirm import MIN_PAIRS
from archhpo.report._summary import _count, _f, _fmt

CHOICE_COLUMNS = (
    "budget", "choice", "n_seeds", "mean", "std", "best_epoch", "param_count", "reference", "n_pairs",
    "diff_mean", "diff_ci95_lo", "diff_ci95_hi",
)


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of the mean of `values` over resamples (with replacement)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


# ----------------------------------------------------------------------------- paired choices
def _choice_order(frame: pd.DataFrame, labels: list[str]) -> list[str]:
    order = frame.attrs.get("choice_order") or {}
    if len(order) == 1:
        listed = [str(v) for v in next(iter(order.values()))]
        return sorted(labels, key=lambda v: listed.index(v) if v in listed else len(listed))
    return labels  # several choice dimensions: first appearance


def choice_table(frame: pd.DataFrame, reference: str | None = None, n_boot: int = 2000,
                 seed: int = 0) -> pd.DataFrame:
    """The paired-choice table (like the encoder audit's Table 1) for budgets whose trials
    carry categorical choices crossed with paired seeds.

    Per budget and choice: over seeds, the value of a seed is the best COMPLETE validation loss
    of that choice's trials with that seed (confirmation retrains left out); ``mean``, ``std``
    (n-1), ``best_epoch`` (mean over seeds of the selected trials' best epoch), ``param_count``
    (median), and the paired difference ``choice - reference`` over the ``n_pairs`` seeds both
    have, with a percentile bootstrap 95% interval over seeds (`n_boot` resamples) when there are
    MIN_PAIRS pairs or more.  The reference is
    `reference` (a choice label) or the first choice listed at launch.  Empty when no budget
    has two or more choices with seeds.
    """
    ok = (frame["state"] == "COMPLETE") & frame["val_loss"].notna() & frame["seed"].notna()
    ok &= frame["phase"].ne(3) | frame["phase"].isna()
    df = frame[ok & (frame["choice"] != "")]
    rows: list[dict[str, Any]] = []
    # Every planned choice, finished or not: a reference whose seeds are still running is valid.
    all_labels = set(frame.loc[frame["choice"] != "", "choice"])
    for budget, group in df.groupby("budget", sort=False):
        labels = _choice_order(frame, list(dict.fromkeys(group.sort_values("trial")["choice"])))
        if len(labels) < 2:
            continue
        per: dict[str, pd.DataFrame] = {}
        for label in labels:
            sub = group[group["choice"] == label].sort_values(["val_loss", "trial"], kind="stable")
            per[label] = sub.drop_duplicates("seed").set_index("seed")
        ref = reference if reference is not None else labels[0]
        rows += [_choice_row(budget, label, per, ref, n_boot, seed) for label in labels]
    if reference is not None and all_labels and reference not in all_labels:
        raise StudyError(f"--reference {reference!r} is not one of the choices ({', '.join(sorted(all_labels))}); "
                         "pick one of them.")
    return pd.DataFrame(rows, columns=list(CHOICE_COLUMNS))


def _choice_row(budget: Any, label: str, per: dict[str, pd.DataFrame], ref: str, n_boot: int,
                seed: int) -> dict[str, Any]:
    """One choice's row: its seeds' mean and std, and its paired difference from the reference."""
    # A study still running may have no finished reference seed yet: its rows are shown, with
    # no pairs, rather than the budget left out.
    base = per[ref]["val_loss"] if ref in per else pd.Series(dtype=float)
    sel = per[label]
    vals = sel["val_loss"]
    common = vals.index.intersection(base.index)
    diffs = (vals.loc[common] - base.loc[common]).to_numpy()
    # No interval from fewer than MIN_PAIRS pairs: a bootstrap of two values is two points.
    lo, hi = (bootstrap_ci(diffs, n_boot, seed) if label != ref and len(diffs) >= MIN_PAIRS
              else (math.nan, math.nan))
    epochs = sel["best_epoch"].dropna()
    return {
        "budget": budget, "choice": label, "n_seeds": len(vals), "mean": float(vals.mean()),
        "std": float(vals.std(ddof=1)) if len(vals) > 1 else math.nan,
        "best_epoch": float(epochs.mean()) if len(epochs) else math.nan,
        "param_count": float(sel["param_count"].median()), "reference": ref, "n_pairs": len(common),
        "diff_mean": float(diffs.mean()) if len(diffs) and label != ref else (0.0 if label == ref else math.nan),
        "diff_ci95_lo": lo, "diff_ci95_hi": hi,
    }


def _diff_text(r: pd.Series, ref: str) -> str:
    """A choice's paired difference against the reference: "+0.0123 [-0.0010, +0.0250]", or the
    bare mean where fewer than MIN_PAIRS pairs give no interval, "–" where no seed is shared."""
    if r["choice"] == ref:
        return "reference"
    if _f(r["diff_mean"]) is None:
        return "–"
    if _f(r["diff_ci95_lo"]) is None:
        return f"{r['diff_mean']:+.4f}"
    return f"{r['diff_mean']:+.4f} [{r['diff_ci95_lo']:+.4f}, {r['diff_ci95_hi']:+.4f}]"


def choice_markdown(table: pd.DataFrame, metric: str = "val_loss") -> str:
    """The paired-choice table as Markdown, one section per budget."""
    out = []
    for budget, group in table.groupby("budget", sort=False):
        ref = group["reference"].iloc[0]
        out.append(f"### {budget}\n")
        out.append(f"| choice | {metric} mean ± std (seeds) | best epoch | params | Δ vs {ref} [95% CI] (pairs) |")
        out.append("|---|---|---|---|---|")
        for _, r in group.iterrows():
            std = f" ± {r['std']:.4f}" if _f(r["std"]) is not None else ""
            diff = _diff_text(r, ref)
            diff += f" ({r['n_pairs']})" if diff != "reference" else ""
            out.append(f"| {r['choice']} | {r['mean']:.4f}{std} ({r['n_seeds']}) | {_fmt(r['best_epoch'], 3)} | "
                       f"{_count(r['param_count'])} | {diff} |")
        out.append("")
    return "\n".join(out)


__all__ = [
    "CHOICE_COLUMNS",
    "bootstrap_ci",
    "choice_markdown",
    "choice_table",
]
