"""The per-budget summary of `archhpo report` (`budget_summary`): the best trial, the runner-up,
the measured noise (`budget_noise`) and the confirmation result of each budget, and the number
formatting the report's tables share."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from archhpo.report._confirm import CHOSEN_ON_MEAN, CHOSEN_ON_TRIAL, frame_confirmation
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
# Appended where the experiment ran a confirmation: how each budget's winner was chosen (CHOSEN_ON_MEAN:
# the lowest mean over a finalist's confirmation runs and its phase-1/2 trials trained as they were,
# `chosen_on_means`; CHOSEN_ON_TRIAL: the best phase-1/2 trial), where the means reversed the phase-1/2
# order the best trial they displaced, and the winner's mean it was chosen on and over how many runs
# (confirm_mean/confirm_n are its confirmation seeds alone, the paired comparison's side).
CHOICE_COLUMNS = ("chosen_on", "reverses_trial", "chosen_mean", "chosen_n")
ARCH = ARCH_KEYS
_INT_COLUMNS = (
    "best_trial", *ARCH, "param_count", "n_complete", "n_pruned", "n_failed", "runner_up_trial",
    *(f"runner_up_{k}" for k in (*ARCH, "param_count")), "epochs", "batch_size", "warmup_steps", "best_epoch",
    "confirm_n", "reverses_trial", "chosen_n",
)
# Floats although whole: a training run's FLOPs pass Int64's 9.2e18 (a 1e20-FLOP IsoFLOP budget).
_FLOAT_COLUMNS = ("train_flops",)


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
confirmation = frame_confirmation  # per budget with phase-3 trials: its confirmation_summary


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
    from archhpo.search._noise import pooled_std

    ok = group[(group["state"] == "COMPLETE") & group["val_loss"].notna()]
    runs = ok.groupby([*ARCH, "choice", *TRAINING_COLUMNS], dropna=False)
    n = runs["val_loss"].count()
    rep = n >= 2
    found = pooled_std([float(v) for v in values] for _, values in runs["val_loss"])
    if found is None:
        return None, ""
    pooled = found[0]
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


def _confirm_columns(c: dict[str, Any] | None, best_trial: int | None) -> dict[str, Any]:
    """A budget's confirmation cells: the winner's mean ± std over its confirmation seeds (the
    architecture chosen on the finalists' means, else rank 0), the paired lead of rank 0 over rank 1,
    and how the winner was chosen (on the means only where `best_and_runner_up` could pick the chosen
    one's trial), with the mean it was chosen on and its number of runs."""
    chosen = (c or {}).get("chosen")
    if chosen and chosen["trials"][str(chosen["rank"])] != best_trial:
        chosen = None
    row: dict[str, Any] = {"chosen_on": CHOSEN_ON_MEAN if chosen else CHOSEN_ON_TRIAL if best_trial is not None
                           else None}
    if chosen and chosen["reversed"]:
        row["reverses_trial"] = chosen["trials"]["0"]
    if chosen:
        row.update(chosen_mean=chosen["means"][str(chosen["rank"])], chosen_n=chosen["n"][str(chosen["rank"])])
    if not (c and c["architectures"]):
        return row
    rank = chosen["rank"] if chosen else c["architectures"][0]["rank"]
    top = next(a for a in c["architectures"] if a["rank"] == rank)
    row.update(confirm_mean=top["mean"], confirm_std=top["std"], confirm_n=top["n"])
    comp = c.get("comparison")
    if comp:
        ci = comp.get("ci95") or [None, None]
        row.update(confirm_lead=comp["lead"], confirm_lead_ci95_lo=ci[0], confirm_lead_ci95_hi=ci[1],
                   confirm_within_noise=comp["within_noise"])
    return row


def budget_summary(frame: pd.DataFrame, confirm: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per budget (`SUMMARY_COLUMNS`, then `SUMMARY_EXTRA`, `CHOICE_COLUMNS` where the
    experiment ran a confirmation, and the best trial's family metrics); the best is
    `best_and_runner_up`'s (where a confirmation chose on its means, the chosen architecture's best
    phase-1/2 trial); budgets without a finished trial keep empty cells."""
    confirm = confirmation(frame) if confirm is None else confirm
    metrics = [c for c in frame.columns if c.startswith("val_") and c not in ("val_loss", "val_curve")]
    picks = best_and_runner_up(frame, confirm)
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
        row.update(_confirm_columns(confirm.get(budget), row.get("best_trial")))
        rows.append(row)
    # Only an experiment with a confirmation says how its winners were chosen: the others' tables keep their columns.
    columns = [*SUMMARY_COLUMNS, *SUMMARY_EXTRA, *(CHOICE_COLUMNS if confirm else ()), *metrics]
    table = pd.DataFrame(rows, columns=columns)
    for col in (c for c in _INT_COLUMNS if c in table):  # whole numbers stay whole although some budgets lack them
        table[col] = pd.to_numeric(table[col], errors="coerce").round().astype("Int64")
    for col in (c for c in _FLOAT_COLUMNS if c in table):
        table[col] = pd.to_numeric(table[col], errors="coerce").astype(float)
    return table


__all__ = [
    "CHOICE_COLUMNS",
    "SUMMARY_COLUMNS",
    "SUMMARY_EXTRA",
    "budget_noise",
    "budget_summary",
    "confirmation",
]
