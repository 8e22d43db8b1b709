"""An experiment's trials as one pandas DataFrame, from the database or from archhpo's CSV files.

`trials_frame` is the single entry point of the report and the notebook API: every figure, the
scaling-law fit and every table of `archhpo report` is computed from its result, so a notebook
can remake and restyle any of them.  One row per trial (COMPLETE, PRUNED and FAIL; trials still
WAITING or RUNNING are left out), every budget of the experiment; a PRUNED trial's val_loss is the
value the study stores, as in experiment_results.csv.  The columns, one by one, and the keys of
``frame.attrs`` (the experiment, its source, the data's truth (a CSV's truth columns), and from a
database the studies, data kinds and stored confirmation ranks): docs/design.md §8b.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from archhpo.errors import DataError, StudyError
from archhpo.report._columns import (
    ARCH_COLUMNS,
    FRAME_COLUMNS,
    TRAINING_COLUMNS,
    _budget_value,
    _finish,
    choice_label,
)
from archhpo.report._confirm import frame_confirmation
from archhpo.report._database import frame_from_storage, load_curves
from archhpo.report._truth import TRUTH_KEYS, known_truth


# ----------------------------------------------------------------------------- from CSV files
def _json_cell(text: Any, kind: type) -> Any:
    if isinstance(text, kind):
        return text
    if not isinstance(text, str) or not text.strip():
        return kind()
    try:
        value = json.loads(text)
    except ValueError:
        return kind()
    return value if isinstance(value, kind) else kind()


def frame_from_csv(paths: Sequence[str | Path], experiment: str | None = None) -> pd.DataFrame:
    """Rows of archhpo's ``experiment_results.csv`` files (old ones without the appended columns
    too); only the rows of `experiment` when given."""
    parts = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise DataError(f"CSV file {str(path)!r} does not exist; pass an experiment_results.csv "
                            "written by `archhpo run` or `archhpo export`.")
        try:
            part = pd.read_csv(path, dtype={"budget": str, "experiment": str}, keep_default_na=True)
        except (ValueError, pd.errors.ParserError) as exc:
            raise DataError(f"Cannot read {str(path)!r} as CSV ({exc}); pass an experiment_results.csv.") from None
        need = {"experiment", "trial", "budget", "param_count", "val_loss"}
        if not need <= set(part.columns):
            missing = ", ".join(sorted(need - set(part.columns)))
            raise DataError(f"{str(path)!r} lacks the columns {missing}; it is not an archhpo "
                            "experiment_results.csv.")
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if experiment is not None:  # "a,b": several experiments pooled (a re-centred IsoFLOP plan beside the first)
        wanted = experiment.split(",")
        held = set(frame["experiment"].astype(str)) if not frame.empty else set()
        absent = [n for n in wanted if n not in held]
        if absent:
            raise StudyError(f"No rows of experiment {absent[0]!r} in the CSV files given; "
                             "check --experiment.")
        frame = frame[frame["experiment"].astype(str).isin(wanted)].copy()
    else:
        names = sorted(set(frame["experiment"].astype(str)))
        experiment = names[0] if len(names) == 1 else ",".join(names)
    frame = frame.drop_duplicates(subset=["experiment", "budget", "trial"], keep="last")
    frame["study"] = frame["experiment"].astype(str) + "_" + frame["budget"].astype(str)
    frame["budget_value"] = [_budget_value(b) for b in frame["budget"].astype(str)]
    frame["choices"] = [_json_cell(c, dict) for c in frame.get("choices", [None] * len(frame))]
    for col in ("val_curve", "rung_scores"):
        frame[col] = [_json_cell(c, list) for c in frame.get(col, [None] * len(frame))]
    if "state" not in frame.columns:
        frame["state"] = "COMPLETE"  # an older CSV: COMPLETE and PRUNED rows are not told apart
    order: dict[str, list[Any]] = {}
    for ch in frame["choices"]:
        for k, v in ch.items():
            if v not in order.setdefault(k, []):
                order[k].append(v)
    frame.attrs.update({"experiment": experiment, "studies": {}, "choice_order": order, "truth": _csv_truth(frame)})
    frame = frame.drop(columns=[k for k in TRUTH_KEYS if k in frame.columns])  # a frame's truth is in its attrs
    return _finish(frame, experiment, "csv")


def _csv_truth(frame: pd.DataFrame) -> dict[str, float]:
    """The data's known truth from the CSV's truth columns: only where every row records one value
    (an older CSV, other data or mixed data have none, and the report then checks no floor)."""
    rows = frame.reindex(columns=list(TRUTH_KEYS)).to_dict("records")  # a missing column reads as empty
    return known_truth([{k: float(v) for k, v in r.items() if pd.notna(v)} for r in rows])


def trials_frame(
    experiment: str | None,
    storage: Any = None,
    csv: str | Path | Sequence[str | Path] | None = None,
    budgets: Sequence[str] | None = None,
    curves: bool = True,
) -> pd.DataFrame:
    """An experiment's trials as a pandas DataFrame (its columns: docs/design.md §8b).

    Read from the database (`storage`: a URL, an open RDBStorage, or None for
    ``$ARCHHPO_STORAGE`` / ``sqlite:///archhpo.db``) or, when `csv` is given, from one or more
    ``experiment_results.csv`` files written by archhpo.  ``curves=False`` (database only) skips
    the per-epoch curves, the slow part of a 20,000-trial read (`load_curves` fills chosen rows).
    Example::

        from archhpo import trials_frame, fit_scaling_law, plot_loss_vs_params
        df = trials_frame("demo", storage="sqlite:///archhpo.db")
        fit = fit_scaling_law(df)
        plot_loss_vs_params(df, fit).savefig("loss.png")
    """
    if csv is not None:
        paths = [csv] if isinstance(csv, str | Path) else list(csv)
        frame = frame_from_csv(paths, experiment)
        if budgets:
            from archhpo.budgets import budget_label

            frame = frame[frame["budget"].isin({budget_label(b) for b in budgets})].reset_index(drop=True)
        return frame
    if experiment is None:  # only CSV files may leave the experiment to their contents
        raise StudyError("Reading a database needs an experiment name (archhpo report --experiment NAME).")
    from archhpo.report._units import data_kinds, study_data
    from archhpo.search._storage import open_storage, resolve_storage_url

    if storage is None or isinstance(storage, str):
        storage = open_storage(resolve_storage_url(storage), create=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings
        frame = frame_from_storage(storage, experiment, budgets, curves)
        frame.attrs["data_kinds"] = data_kinds(study_data(storage, frame.attrs.get("studies") or {}))
    return frame


# ----------------------------------------------------------------------------- selections
def budgets_in(frame: pd.DataFrame) -> list[str]:
    """Budget labels, smallest budget first (budgets whose trials all failed included)."""
    labels = list(dict.fromkeys(frame["budget"]))
    labels += [b for b in frame.attrs.get("empty_budgets", []) if b not in labels]
    return labels


def ranked(frame: pd.DataFrame, include_confirmation: bool = False) -> pd.DataFrame:
    """COMPLETE trials with a finite loss, best first within each budget (phase-3 confirmation
    retrains are left out unless asked: they re-measure a winner, they do not compete)."""
    ok = (frame["state"] == "COMPLETE") & frame["val_loss"].notna()
    if not include_confirmation:
        ok &= frame["phase"].ne(3) | frame["phase"].isna()
    return frame[ok].sort_values(["budget_value", "budget", "val_loss", "trial"], kind="stable")


def arch_key(row: Any) -> tuple[Any, ...]:
    return (row["d_model"], row["n_layers"], row["n_heads"], row["d_ff"], row["choice"])


def best_and_runner_up(frame: pd.DataFrame, confirm: Mapping[str, Mapping[str, Any]] | None = None
                       ) -> dict[str, tuple[pd.Series | None, pd.Series | None]]:
    """Per budget: the best trial and the runner-up, i.e. the best trial of a *different*
    architecture (another (d_model, n_layers, n_heads, d_ff, choices)); None where missing.  Where
    the budget's confirmation chose the winner on its means (`confirm`: `frame_confirmation`, read
    from the frame when None), the best is the chosen architecture's best phase-1/2 trial and the
    runner-up that of the next mean: the winner is chosen on means, not on one trial."""
    confirm = frame_confirmation(frame) if confirm is None else confirm
    out: dict[str, tuple[pd.Series | None, pd.Series | None]] = {b: (None, None) for b in budgets_in(frame)}
    for budget, group in ranked(frame).groupby("budget", sort=False):
        chosen = _chosen_trials(group, (confirm.get(str(budget)) or {}).get("chosen"))
        if chosen is not None:
            out[str(budget)] = chosen
            continue
        best = group.iloc[0]
        key = arch_key(best)
        runner = None
        for _, row in group.iloc[1:].iterrows():
            if arch_key(row) != key:
                runner = row
                break
        out[str(budget)] = (best, runner)
    return out


def _chosen_trials(group: pd.DataFrame, chosen: Mapping[str, Any] | None) -> tuple[pd.Series, pd.Series] | None:
    """The best phase-1/2 trials of the first two architectures by the finalists' means
    (`chosen_on_means`: confirmation runs plus the phase-1/2 trials trained as they were; their
    "selection_trial"), or None when the budget has no such choice or a trial is not in the frame."""
    if not chosen:
        return None
    trials = [chosen["trials"].get(str(rank)) for rank in chosen["order"][:2]]
    rows = [group[group["trial"] == t] for t in trials]
    if any(t is None or r.empty for t, r in zip(trials, rows, strict=True)):
        return None
    return rows[0].iloc[0], rows[1].iloc[0]


__all__ = [
    "ARCH_COLUMNS",
    "FRAME_COLUMNS",
    "TRAINING_COLUMNS",
    "best_and_runner_up",
    "budgets_in",
    "choice_label",
    "frame_from_csv",
    "frame_from_storage",
    "load_curves",
    "ranked",
    "trials_frame",
]
