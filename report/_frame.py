"""An experiment's trials as one pandas DataFrame, from the database or from archhpo's CSV files.

`trials_frame` is the single entry point of the report and the notebook API: every figure, the
scaling-law fit and every table of `archhpo report` is computed from its result, so a notebook
can remake and restyle any of them.  One row per trial (COMPLETE, PRUNED and FAIL; trials still
WAITING or RUNNING are left out), every budget of the experiment, with these columns:

=================== =====================================================================
experiment, study   experiment name and Optuna study name (``{experiment}_{budget}``)
budget              budget label (``2M``); ``budget_value`` its number of parameters
trial               Optuna trial number (unique within a budget)
state               ``COMPLETE``, ``PRUNED`` or ``FAIL``
phase, plan_slot    plan phase (1, 2; 3 = confirmation) and plan slot; NaN when unknown
seed                the trial's seed (paired seeds, confirmation); NaN for ordinary trials
confirm_rank        for phase-3 trials read from a database: rank of the confirmed
                    architecture (0 = the budget's best); NaN otherwise
baseline            for --baselines trials: the rule whose shape it trains (kaplan, ...); None otherwise
family              model family
arch_idx, d_model, n_layers, n_heads, d_ff, param_count (exact), extreme (grid extreme tags)
choices, choice     categorical choices as a dict (``{"encoder": "sum"}``) and as a label
                    (``sum``; ``k=v, k=v`` for several choices; ``""`` for none)
learning_rate, epochs, batch_size, weight_decay, warmup_steps   training parameters
val_loss            best validation loss (PRUNED: the best it reached; NaN if none)
train_loss, best_epoch, duration_s, timestamp
flops_per_sample, train_flops, samples_per_s    compute accounting (NaN when not recorded)
rung                successive halving: the last rung the trial was scored at (NaN without)
flops_spent, flops_full   FLOPs the trial spent (all its claims, cooldown branches included) and
                    what training it to full length once costs
baseline_val_loss   loss of always predicting the training base rate
val_curve           list of (epoch, validation loss) pairs, the per-epoch curve
depth_to_width      n_layers / d_model
fail_reason         why a FAIL trial failed (None for a trial lost with its worker)
val_<metric>        family metrics at the best epoch (char_cls: val_accuracy, val_f1, ...)
host, device, mfu, peak_memory_gib, gpu_name   where it ran, when recorded
trial_id            Optuna's database id of the trial (database only; for `load_curves`)
=================== =====================================================================

``frame.attrs`` holds ``experiment``, ``source`` (``"storage"`` or ``"csv"``), ``studies``
(budget label -> study name, database only), ``truth`` (the data's known entropy rate and loss
floor, when every study's data has one, database only: see `archhpo.report._truth`) and ``choice_order`` (choice name -> values in the
order they were listed at launch, else first appearance).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from archhpo.errors import DataError, StudyError
from archhpo.report._truth import known_truth
from archhpo.schema import ARCH_RECORD, TRAINING_PARAMS

ARCH_COLUMNS = ARCH_RECORD
TRAINING_COLUMNS = TRAINING_PARAMS
NUMERIC_EXTRA = (
    "train_loss", "best_epoch", "duration_s", "flops_per_sample", "train_flops", "samples_per_s",
    "baseline_val_loss", "mfu", "peak_memory_gib", "rung", "flops_spent", "flops_full",
    "train_tokens", "train_samples", "tokens_per_param", "samples_per_param", "data_passes",
)
FRAME_COLUMNS = (
    "experiment", "study", "budget", "budget_value", "trial", "state", "phase", "plan_slot", "seed",
    "confirm_rank", "baseline", "family", "arch_idx", *ARCH_COLUMNS, "extreme", "choices", "choice",
    *TRAINING_COLUMNS, "val_loss", "train_loss", "best_epoch", "duration_s", "timestamp",
    "flops_per_sample", "train_flops", "samples_per_s", "baseline_val_loss", "val_curve",
    "depth_to_width", "fail_reason", "host", "device", "mfu", "peak_memory_gib", "gpu_name",
    "rung", "flops_spent", "flops_full",
    "train_tokens", "train_samples", "tokens_per_param", "samples_per_param", "data_passes",
)
STATES = ("COMPLETE", "PRUNED", "FAIL")
# Trial attributes that are bookkeeping, not metrics, although they start with "val_".
_NOT_METRICS = {"val_loss", "val_curve"}


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
            frame[col] = None if col in ("choices", "val_curve", "fail_reason", "extreme", "baseline") else np.nan
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
    frame["val_curve"] = [c if isinstance(c, list) else [] for c in frame["val_curve"]]
    frame["state"] = frame["state"].fillna("COMPLETE").astype(str).str.upper()
    frame["baseline"] = [b if isinstance(b, str) and b else None for b in frame["baseline"]]
    frame["budget"] = frame["budget"].astype(str)
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


# ----------------------------------------------------------------------------- from the database
def _plan_ranks(plan: Iterable[dict[str, Any]]) -> dict[int, int]:
    return {int(e["slot"]): int(e["rank"]) for e in plan if e.get("phase") == 3 and e.get("rank") is not None}


def _choice_order(archs: Sequence[dict[str, Any]], options: dict[str, Any]) -> dict[str, list[Any]]:
    order: dict[str, list[Any]] = {}
    for arch in archs:
        for k, v in (arch.get("choices") or {}).items():
            if v not in order.setdefault(k, []):
                order[k].append(v)
    for k, seen in order.items():
        listed = options.get(k)
        if isinstance(listed, str):
            listed = [s.strip() for s in listed.split(",")]
        if isinstance(listed, list) and set(map(str, seen)) <= set(map(str, listed)):
            rank = {str(v): i for i, v in enumerate(listed)}
            seen.sort(key=lambda v: rank[str(v)])
    return order


def _read_trials(storage: Any, study_id: int, curves: bool = True) -> dict[int, dict[str, Any]]:
    """A study's finished trials straight from Optuna's tables, one query per table (loading
    FrozenTrials through Optuna's ORM costs ~1 ms per trial, too slow for 20,000 trials).
    curves=False reads each trial's best intermediate value (SQL MIN) instead of its curve."""
    import sqlalchemy as sa
    from optuna.trial import TrialState

    from archhpo.search._optuna_private import models as m

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    t = m.TrialModel.__table__.c

    def of_study(*columns: Any) -> Any:
        """A select of `columns` (the first a trial_id) over the study's finished trials."""
        return (sa.select(*columns).join(m.TrialModel.__table__, t.trial_id == columns[0])
                .where(t.study_id == study_id, t.state.in_(states)))

    with storage.engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.trial_id, t.number, t.state, t.datetime_complete)
            .where(t.study_id == study_id, t.state.in_(states))
        ).all()
        trials = {tid: {"number": number, "state": state, "complete": done, "params": {}, "value": None,
                        "attrs": {}, "curve": [], "best": None} for tid, number, state, done in rows}
        if trials:
            _read_params_values_attrs(conn, of_study, trials)
            if curves:
                _read_curves(conn, of_study, trials)
    return trials


def _read_params_values_attrs(conn: Any, of_study: Any, trials: dict[int, dict[str, Any]]) -> None:
    """Fill each trial's params (external values), objective value, user attributes and best
    intermediate value."""
    import sqlalchemy as sa
    from optuna.distributions import json_to_distribution

    from archhpo.search._optuna_private import models as m

    dists: dict[str, Any] = {}
    p = m.TrialParamModel.__table__.c
    for tid, name, value, dist in conn.execute(of_study(p.trial_id, p.param_name, p.param_value,
                                                        p.distribution_json)):
        d = dists.get(dist) or dists.setdefault(dist, json_to_distribution(dist))
        trials[tid]["params"][name] = d.to_external_repr(value)
    v = m.TrialValueModel.__table__.c
    for tid, value, kind in conn.execute(of_study(v.trial_id, v.value, v.value_type).where(v.objective == 0)):
        trials[tid]["value"] = m.TrialValueModel.stored_repr_to_value(value, kind)
    u = m.TrialUserAttributeModel.__table__.c
    for tid, key, text in conn.execute(of_study(u.trial_id, u.key, u.value_json)):
        trials[tid]["attrs"][key] = json.loads(text)
    iv = m.TrialIntermediateValueModel.__table__.c
    for tid, best in conn.execute(of_study(iv.trial_id, sa.func.min(iv.intermediate_value))
                                  .group_by(iv.trial_id)):
        trials[tid]["best"] = best  # NaN and inf are stored as NULL: the best finite value


def _read_curves(conn: Any, of_study: Any, trials: dict[int, dict[str, Any]]) -> None:
    """Fill each trial's per-epoch curve: the finite values (nearly all rows) without the enum
    column, whose per-row conversion doubles the cost; the few NaN/inf epochs in a second query."""
    from archhpo.search._optuna_private import models as m

    iv = m.TrialIntermediateValueModel.__table__.c
    to_value = m.TrialIntermediateValueModel.stored_repr_to_intermediate_value
    points: dict[int, list[tuple[int, float]]] = {}
    for tid, step, value in conn.execute(
        of_study(iv.trial_id, iv.step, iv.intermediate_value).where(iv.intermediate_value.is_not(None))
    ):
        points.setdefault(tid, []).append((step, value))
    for tid, step, value, kind in conn.execute(
        of_study(iv.trial_id, iv.step, iv.intermediate_value, iv.intermediate_value_type)
        .where(iv.intermediate_value.is_(None))
    ):
        points.setdefault(tid, []).append((step, to_value(value, kind)))
    for tid, pts in points.items():
        pts.sort()
        trials[tid]["curve"] = [[int(e), float(v)] for e, v in pts]


def _study_rows(storage: Any, study_id: int, settings: Any, curves: bool = True) -> list[dict[str, Any]]:
    ranks = _plan_ranks(settings.plan)
    rows = []
    for tid, t in _read_trials(storage, study_id, curves).items():
        ua, params, curve = t["attrs"], t["params"], t["curve"]
        idx = params.get("arch_idx")
        arch = settings.archs[int(idx)] if idx is not None and 0 <= int(idx) < len(settings.archs) else {}
        state = t["state"].name
        if state == "COMPLETE":
            value = t["value"]
        elif state == "PRUNED":
            value = t["best"]  # the best validation loss it reached
        else:
            value = None
        slot = ua.get("plan_slot")
        choices = arch.get("choices") or ua.get("choices") or {}
        done = t["complete"]
        row = {
            "experiment": settings.experiment, "study": settings.study_name, "budget": settings.budget,
            "budget_value": settings.budget_value, "trial": t["number"], "state": state,
            "phase": ua.get("phase"), "plan_slot": slot, "seed": ua.get("seed"),
            "confirm_rank": ranks.get(int(slot), ua.get("rank")) if slot is not None else ua.get("rank"),
            "baseline": ua.get("baseline"),
            "family": settings.family, "arch_idx": idx,
            **{k: arch.get(k, ua.get(k)) for k in ARCH_COLUMNS},
            "extreme": arch.get("extreme", ""), "choices": dict(choices),
            **{k: params.get(k) for k in TRAINING_COLUMNS},
            "val_loss": value, "val_curve": curve, "trial_id": tid,
            "timestamp": done.astimezone().isoformat() if done else None,  # Optuna stores naive local time
            "fail_reason": ua.get("fail_reason"),
            **{k: ua.get(k) for k in (*NUMERIC_EXTRA, "host", "device", "gpu_name")},
        }
        for k, v in ua.items():
            if k.startswith("val_") and k not in _NOT_METRICS and isinstance(v, int | float):
                row[k] = v
        rows.append(row)
    return rows


def _experiment_studies(storage: Any, experiment: str) -> list[tuple[int, str]]:
    """(study_id, name) of every archhpo study of the experiment, smallest budget first; read
    from the study attribute table alone (optuna.get_all_study_summaries loads every trial)."""
    import sqlalchemy as sa

    from archhpo.search._optuna_private import models as m

    attr = m.StudyUserAttributeModel
    with storage.engine.connect() as conn:
        found = conn.execute(
            sa.select(m.StudyModel.study_id, m.StudyModel.study_name, attr.key, attr.value_json)
            .join(attr, attr.study_id == m.StudyModel.study_id)
            .where(attr.key.in_(("archhpo_experiment", "archhpo_budget_value")))
        ).all()
        planned = {sid for (sid,) in conn.execute(sa.select(attr.study_id).where(attr.key == "archhpo_plan"))}
    info: dict[int, dict[str, Any]] = {}
    for sid, name, key, text in found:
        info.setdefault(sid, {"name": name})[key] = json.loads(text)
    mine = [(d.get("archhpo_budget_value") or 0, d["name"], sid) for sid, d in info.items()
            if d.get("archhpo_experiment") == experiment and sid in planned]
    return [(sid, name) for _, name, sid in sorted(mine)]


def frame_from_storage(storage: Any, experiment: str, budgets: Sequence[str] | None = None,
                       curves: bool = True) -> pd.DataFrame:
    """Every budget (study) of `experiment` in an open RDBStorage (or a URL), as one frame;
    curves=False leaves ``val_curve`` empty (reading 20,000 curves takes seconds): fill the
    rows you need with `load_curves`."""
    from archhpo.search._storage import open_storage, resolve_storage_url
    from archhpo.search._study import StudySettings, check_experiment, load_study

    if storage is None or isinstance(storage, str):
        storage = open_storage(resolve_storage_url(storage), create=False)
    check_experiment(experiment)
    found = _experiment_studies(storage, experiment)
    if budgets:
        from archhpo.budgets import budget_label

        wanted = {f"{experiment}_{budget_label(b)}" for b in budgets}
        found = [(sid, n) for sid, n in found if n in wanted]
    if not found:
        raise StudyError(f"No archhpo study of experiment {experiment!r} in this storage; "
                         "check --experiment and --storage.")
    rows: list[dict[str, Any]] = []
    studies: dict[str, str] = {}
    order: dict[str, list[Any]] = {}
    infos = []
    for study_id, name in found:
        settings = StudySettings.from_attrs(load_study(storage, name).user_attrs, name)
        studies[settings.budget] = name
        infos.append(settings.info)
        for k, vals in _choice_order(settings.archs, settings.options).items():
            order.setdefault(k, [])
            order[k] += [v for v in vals if v not in order[k]]
        rows += _study_rows(storage, study_id, settings, curves)
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(FRAME_COLUMNS))
    frame.attrs.update({"experiment": experiment, "studies": studies, "choice_order": order,
                        "curves": curves, "truth": known_truth(infos)})
    finished = {r["budget"] for r in rows}
    frame.attrs["empty_budgets"] = [b for b in studies if b not in finished]  # nothing finished there yet
    return _finish(frame, experiment, "storage")


def load_curves(frame: pd.DataFrame, storage: Any, index: Iterable[Any]) -> None:
    """Fill ``val_curve`` of the rows `index` of a database frame read with curves=False."""
    import sqlalchemy as sa

    from archhpo.search._optuna_private import models as m

    index = [i for i in index if pd.notna(frame.at[i, "trial_id"])]
    if not index:
        return
    ids = {int(frame.at[i, "trial_id"]): i for i in index}
    iv = m.TrialIntermediateValueModel.__table__.c
    to_value = m.TrialIntermediateValueModel.stored_repr_to_intermediate_value
    points: dict[int, list[tuple[int, float]]] = {}
    with storage.engine.connect() as conn:
        for tid, step, value, kind in conn.execute(
            sa.select(iv.trial_id, iv.step, iv.intermediate_value, iv.intermediate_value_type)
            .where(iv.trial_id.in_(list(ids)))
        ):
            points.setdefault(tid, []).append((step, value if value is not None else to_value(value, kind)))
    for tid, i in ids.items():
        frame.at[i, "val_curve"] = [[int(e), float(v)] for e, v in sorted(points.get(tid, []))]


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
    if experiment is not None:
        frame = frame[frame["experiment"].astype(str) == experiment].copy()
        if frame.empty:
            raise StudyError(f"No rows of experiment {experiment!r} in the CSV files given; "
                             "check --experiment.")
    else:
        names = sorted(set(frame["experiment"].astype(str)))
        experiment = names[0] if len(names) == 1 else ",".join(names)
    frame = frame.drop_duplicates(subset=["experiment", "budget", "trial"], keep="last")
    frame["study"] = frame["experiment"].astype(str) + "_" + frame["budget"].astype(str)
    frame["budget_value"] = [_budget_value(b) for b in frame["budget"].astype(str)]
    frame["choices"] = [_json_cell(c, dict) for c in frame.get("choices", [None] * len(frame))]
    frame["val_curve"] = [_json_cell(c, list) for c in frame.get("val_curve", [None] * len(frame))]
    if "state" not in frame.columns:
        frame["state"] = "COMPLETE"  # an older CSV: COMPLETE and PRUNED rows are not told apart
    order: dict[str, list[Any]] = {}
    for ch in frame["choices"]:
        for k, v in ch.items():
            if v not in order.setdefault(k, []):
                order[k].append(v)
    frame.attrs.update({"experiment": experiment, "studies": {}, "choice_order": order})
    return _finish(frame, experiment, "csv")


def trials_frame(
    experiment: str | None,
    storage: Any = None,
    csv: str | Path | Sequence[str | Path] | None = None,
    budgets: Sequence[str] | None = None,
    curves: bool = True,
) -> pd.DataFrame:
    """An experiment's trials as a pandas DataFrame (see the module docstring for the columns).

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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings
        return frame_from_storage(storage, experiment, budgets, curves)


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


def best_and_runner_up(frame: pd.DataFrame) -> dict[str, tuple[pd.Series | None, pd.Series | None]]:
    """Per budget: the best trial and the runner-up, i.e. the best trial of a *different*
    architecture (another (d_model, n_layers, n_heads, d_ff, choices)); None where missing."""
    out: dict[str, tuple[pd.Series | None, pd.Series | None]] = {b: (None, None) for b in budgets_in(frame)}
    for budget, group in ranked(frame).groupby("budget", sort=False):
        best = group.iloc[0]
        key = arch_key(best)
        runner = None
        for _, row in group.iloc[1:].iterrows():
            if arch_key(row) != key:
                runner = row
                break
        out[str(budget)] = (best, runner)
    return out


__all__ = [
    "FRAME_COLUMNS",
    "best_and_runner_up",
    "budgets_in",
    "choice_label",
    "frame_from_csv",
    "frame_from_storage",
    "load_curves",
    "ranked",
    "trials_frame",
]
