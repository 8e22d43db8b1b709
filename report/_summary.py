"""The per-budget summary of `archhpo report` (`budget_summary`): the best trial, the runner-up,
the measured noise (`budget_noise`) and the confirmation result of each budget, and the number
formatting the report's tables share."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from archhpo.report._confirm import confirmation_summary
from archhpo.report._frame import best_and_runner_up, budgets_in
from archhpo.schema import ARCH_KEYS, ARCH_RECORD, TRAINING_PARAMS

SUMMARY_COLUMNS = (
    "budget", "best_trial", *ARCH_RECORD, "val_loss",
    "runner_up_val_loss", "n_complete", "n_pruned", "n_failed", "confirm_mean", "confirm_std",
)
SUMMARY_EXTRA = (
    "gap", "runner_up_trial", *(f"runner_up_{k}" for k in ARCH_RECORD), "runner_up_choice", "runner_up_differs",
    "choice", *TRAINING_PARAMS,
    "best_epoch", "train_flops", "confirm_n", "confirm_lead", "confirm_lead_ci95_lo", "confirm_lead_ci95_hi",
    "confirm_within_noise", "baseline_val_loss", "noise_std", "noise_source", "tie_within_noise",
)
ARCH = ARCH_KEYS
_INT_COLUMNS = (
    "best_trial", *ARCH, "param_count", "n_complete", "n_pruned", "n_failed", "runner_up_trial",
    *(f"runner_up_{k}" for k in (*ARCH, "param_count")), "epochs", "batch_size", "warmup_steps", "best_epoch",
    "train_flops", "confirm_n",
)


# ----------------------------------------------------------------------------- numbers
def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _i(x: Any) -> int | None:
    v = _f(x)
    return int(v) if v is not None else None


def _fmt(x: Any, digits: int = 4) -> str:
    v = _f(x)
    return "–" if v is None else f"{v:.{digits}g}"


def _count(x: Any) -> str:
    v = _i(x)
    return "–" if v is None else f"{v:,}"


# ----------------------------------------------------------------------------- confirmation
def confirmation(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per budget with phase-3 trials: `archhpo.report._confirm.confirmation_summary` of them."""
    out: dict[str, dict[str, Any]] = {}
    if not (frame["phase"] == 3).any():
        return out
    cols = [*ARCH, "param_count", "trial", "state", "phase", "seed", "val_loss", "choices", "best_epoch", "fail_reason",
            "baseline"]
    for budget, group in frame.groupby("budget", sort=False):
        if not (group["phase"] == 3).any():
            continue
        rows = group[cols].assign(rank=group["confirm_rank"]).to_dict("records")
        out[str(budget)] = confirmation_summary(rows)
    return out


# ----------------------------------------------------------------------------- summary
def _failed(group: pd.DataFrame) -> int:
    fails = group[group["state"] == "FAIL"]
    if "fail_reason" in fails and fails["fail_reason"].notna().any():
        return int(fails["fail_reason"].notna().sum())  # a trial lost with its worker is retried, not final
    return len(fails)


def budget_noise(group: pd.DataFrame) -> tuple[float | None, str]:
    """The measured noise of one budget: the pooled standard deviation (n-1) of the validation
    loss over every configuration (architecture, choices and training parameters) that ran more
    than once: seeds, confirmation retrains, repeated phase-1 runs.  (None, "") when none did."""
    from archhpo.report._frame import TRAINING_COLUMNS

    ok = group[(group["state"] == "COMPLETE") & group["val_loss"].notna()]
    runs = ok.groupby([*ARCH, "choice", *TRAINING_COLUMNS], dropna=False)
    n, var = runs["val_loss"].count(), runs["val_loss"].var(ddof=1)
    rep = n >= 2
    if not rep.any():
        return None, ""
    pooled = math.sqrt(float(((n[rep] - 1) * var[rep]).sum() / (n[rep] - 1).sum()))
    seeded = bool((runs["seed"].nunique() > 1)[rep].any())
    kind = "seed spread" if seeded else "spread of repeated runs"
    n_conf = int(rep.sum())
    return pooled, f"{kind}: {n_conf} configuration{'s' if n_conf > 1 else ''} run {int(n[rep].sum())} times"


def _noise_columns(group: pd.DataFrame, row: dict[str, Any]) -> dict[str, Any]:
    noise, source = budget_noise(group)
    base = group["baseline_val_loss"].dropna()
    gap = _f(row.get("gap"))
    return {"noise_std": noise, "noise_source": source or None,
            "tie_within_noise": (gap < noise) if noise is not None and gap is not None else None,
            "baseline_val_loss": float(base.median()) if len(base) else None}


def _differs(runner: pd.Series, best: pd.Series | None) -> str:
    """The keys (architecture keys, choices) in which the runner-up is not the winner: 'n_heads'."""
    from archhpo.report._arch import arch_fields, differences

    return " ".join(differences(arch_fields(runner), arch_fields(best) if best is not None else None))


def budget_summary(frame: pd.DataFrame, confirm: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per budget (`SUMMARY_COLUMNS`, then `SUMMARY_EXTRA` and the best trial's family
    metrics); budgets without a finished trial keep empty cells."""
    confirm = confirmation(frame) if confirm is None else confirm
    metrics = [c for c in frame.columns if c.startswith("val_") and c not in ("val_loss", "val_curve")]
    picks = best_and_runner_up(frame)
    rows = []
    for budget in budgets_in(frame):
        group = frame[frame["budget"] == budget]
        best, runner = picks.get(budget, (None, None))
        row: dict[str, Any] = {
            "budget": budget,
            "n_complete": int((group["state"] == "COMPLETE").sum()),
            "n_pruned": int((group["state"] == "PRUNED").sum()),
            "n_failed": _failed(group),
        }
        if best is not None:
            row.update(best_trial=_i(best["trial"]), **{k: _i(best[k]) for k in (*ARCH, "param_count")},
                       val_loss=_f(best["val_loss"]), choice=best["choice"],
                       **{k: best[k] for k in (*TRAINING_PARAMS, "best_epoch", "train_flops")},
                       **{m: best[m] for m in metrics})
        if runner is not None:
            row.update(runner_up_val_loss=_f(runner["val_loss"]), runner_up_trial=_i(runner["trial"]),
                       **{f"runner_up_{k}": _i(runner[k]) for k in (*ARCH, "param_count")},
                       runner_up_choice=runner["choice"], runner_up_differs=_differs(runner, best))
            row["gap"] = row["runner_up_val_loss"] - row["val_loss"]
        row.update(_noise_columns(group, row))
        c = confirm.get(budget)
        if c and c["architectures"]:
            top = c["architectures"][0]
            row.update(confirm_mean=top["mean"], confirm_std=top["std"], confirm_n=top["n"])
            comp = c.get("comparison")
            if comp:
                ci = comp.get("ci95") or [None, None]
                row.update(confirm_lead=comp["lead"], confirm_lead_ci95_lo=ci[0], confirm_lead_ci95_hi=ci[1],
                           confirm_within_noise=comp["within_noise"])
        rows.append(row)
    columns = [*SUMMARY_COLUMNS, *SUMMARY_EXTRA, *metrics]
    table = pd.DataFrame(rows, columns=columns)
    for col in _INT_COLUMNS:  # whole numbers stay whole in the CSV although some budgets lack them
        table[col] = pd.to_numeric(table[col], errors="coerce").round().astype("Int64")
    return table


__all__ = [
    "SUMMARY_COLUMNS",
    "SUMMARY_EXTRA",
    "budget_noise",
    "budget_summary",
    "confirmation",
]
