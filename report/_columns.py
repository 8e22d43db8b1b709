"""The columns of `archhpo.report._frame.trials_frame` (`FRAME_COLUMNS`, described in that module)
and `_finish`, which gives a frame read from the database or from CSV files their types and order."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from archhpo.schema import ARCH_RECORD, TRAINING_PARAMS, Attr

ARCH_COLUMNS = ARCH_RECORD
TRAINING_COLUMNS = TRAINING_PARAMS
# How fast a trial trained (workers/_loop.py, workers/_batch.py): MFU of the timed steps and of the
# wall clock; micro-batch and accumulation steps where memory cut the batch (empty where it did not).
SPEED_COLUMNS = (Attr.STEP_MFU, Attr.TRIAL_MFU, Attr.MICRO_BATCH, Attr.ACCUMULATION_STEPS)
# How widths scale init and rates (docs/mup.md): "sp" or "mup", µP's base d_model (empty under sp) and
# CompleteP's base depth (empty without depth scaling).
MUP_COLUMNS = ("parametrization", "mup_base_width", "mup_base_depth")
NUMERIC_EXTRA = (
    "train_loss", "best_epoch", "duration_s", "flops_per_sample", "train_flops", "samples_per_s",
    "baseline_val_loss", "mfu", "peak_memory_gib", "rung", "flops_spent", "flops_full",
    "train_tokens", "train_samples", "tokens_per_param", "samples_per_param", "data_passes",
    *SPEED_COLUMNS, "lr_probe", "confirm_rung", "compute_budget", "mup_base_width", "mup_base_depth",
)
FRAME_COLUMNS = (
    "experiment", "study", "budget", "budget_value", "trial", "state", "phase", "plan_slot", "seed",
    "confirm_rank", "baseline", "lr_probe", "family", "arch_idx", *ARCH_COLUMNS, "extreme", "choices", "choice",
    *TRAINING_COLUMNS, "val_loss", "train_loss", "best_epoch", "duration_s", "timestamp",
    "flops_per_sample", "train_flops", "samples_per_s", "baseline_val_loss", "val_curve",
    "depth_to_width", "fail_reason", "host", "device", "mfu", "peak_memory_gib", "gpu_name",
    "rung", "rung_scores", "confirm_rung", "flops_spent", "flops_full",
    "train_tokens", "train_samples", "tokens_per_param", "samples_per_param", "data_passes",
    # the step's MFU (timed steps) and the trial's (wall clock); micro-batch and accumulation steps
    # where memory cut the batch (workers/_batch.py)
    *SPEED_COLUMNS,
    "compute_budget", "isoflop_size",  # an IsoFLOP trial's C and its size's position (--isoflop)
    *MUP_COLUMNS,
)
STATES = ("COMPLETE", "PRUNED", "FAIL")
# Trial attributes that are bookkeeping, not metrics, although they start with "val_".
_NOT_METRICS = {"val_loss", "val_curve"}
_LISTS = ("val_curve", Attr.RUNG_SCORES)  # JSON lists in the CSV, Python lists in the frame


def choice_label(choices: dict[str, Any] | None) -> str:
    """``{"encoder": "sum"}`` -> ``"sum"``; several choices -> ``"a=1, b=2"``; none -> ``""``."""
    if not choices:
        return ""
    if len(choices) == 1:
        return str(next(iter(choices.values())))
    return ", ".join(f"{k}={v}" for k, v in sorted(choices.items()))


def _num(v: Any) -> float:
    if v is None or v == "" or isinstance(v, bool):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _budget_value(label: str) -> float:
    from archhpo.budgets import parse_budget

    try:  # '100K', or '100K-t20' (a --tokens-per-param study)
        return float(parse_budget(label.split("-")[0]))
    except Exception:
        return math.nan  # a pinned-architecture study's label: filled from its param counts below


def _finish(frame: pd.DataFrame, experiment: str, source: str) -> pd.DataFrame:
    """Common column types and order for both sources; derived columns."""
    for col in FRAME_COLUMNS:
        if col not in frame.columns:
            frame[col] = None if col in (*_LISTS, "choices", "fail_reason", "extreme", "baseline") else np.nan
    numeric = ("budget_value", "trial", "phase", "plan_slot", "seed", "confirm_rank", "arch_idx",
               *ARCH_COLUMNS, *TRAINING_COLUMNS, "val_loss", *NUMERIC_EXTRA)
    for col in numeric:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    metric_cols = sorted(c for c in frame.columns if c.startswith("val_") and c not in _NOT_METRICS)
    for col in metric_cols:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    frame["val_loss"] = frame["val_loss"].where(np.isfinite(frame["val_loss"]))  # inf -> NaN
    if frame["trial"].notna().all():
        frame["trial"] = frame["trial"].astype("int64")
    frame["choices"] = [c if isinstance(c, dict) else {} for c in frame["choices"]]
    frame["choice"] = [choice_label(c) for c in frame["choices"]]
    for col in _LISTS:
        frame[col] = [c if isinstance(c, list) else [] for c in frame[col]]
    frame["state"] = frame["state"].fillna("COMPLETE").astype(str).str.upper()
    frame["baseline"] = [b if isinstance(b, str) and b else None for b in frame["baseline"]]
    frame["budget"] = frame["budget"].astype(str)
    # A trial (or a CSV) from before µP, or a standard one, reads as sp.
    frame["parametrization"] = [p if isinstance(p, str) and p else "sp" for p in frame["parametrization"]]
    frame["depth_to_width"] = frame["n_layers"] / frame["d_model"]
    # Budgets without a parseable label (pinned architectures) sort by their median count.
    frame.loc[frame["budget_value"] <= 0, "budget_value"] = np.nan  # a study without a budget stores 0
    missing = frame["budget_value"].isna()
    if missing.any():
        med = frame.groupby("budget")["param_count"].median()
        frame.loc[missing, "budget_value"] = frame.loc[missing, "budget"].map(med)
    extra = [c for c in frame.columns if c not in FRAME_COLUMNS and c not in metric_cols]
    frame = frame[[*FRAME_COLUMNS, *metric_cols, *extra]]
    frame = frame.sort_values(["budget_value", "budget", "trial"], kind="stable").reset_index(drop=True)
    frame.attrs.setdefault("experiment", experiment)
    frame.attrs["source"] = source
    return frame


__all__ = [
    "ARCH_COLUMNS",
    "FRAME_COLUMNS",
    "MUP_COLUMNS",
    "NUMERIC_EXTRA",
    "STATES",
    "TRAINING_COLUMNS",
    "choice_label",
]
