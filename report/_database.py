"""An experiment's trials read from the database (`frame_from_storage`): straight from Optuna's
tables, a query per table, and each trial's per-epoch curve on demand (`load_curves`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from archhpo.errors import StudyError
from archhpo.report._columns import (
    _NOT_METRICS,
    ARCH_COLUMNS,
    FRAME_COLUMNS,
    NUMERIC_EXTRA,
    TRAINING_COLUMNS,
    _finish,
)
from archhpo.report._truth import known_truth

if TYPE_CHECKING:
    from archhpo.config import StoredOptions
    from archhpo.search._plan import PlanEntry


# ----------------------------------------------------------------------------- from the database
def _plan_ranks(plan: Iterable[PlanEntry]) -> dict[int, int]:
    return {e.slot: int(e.rank) for e in plan if e.phase == 3 and e.rank is not None}


def _choice_order(archs: Sequence[dict[str, Any]], options: StoredOptions) -> dict[str, list[Any]]:
    order: dict[str, list[Any]] = {}
    for arch in archs:
        for k, v in (arch.get("choices") or {}).items():
            if v not in order.setdefault(k, []):
                order[k].append(v)
    for k, seen in order.items():
        listed = options.family.get(k)  # a categorical dimension is a family option
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
        elif state == "PRUNED":  # the value Optuna stores (its rung score), as the CSV and dashboard show;
            finite = t["value"] is not None and math.isfinite(t["value"])  # else the best loss it reached
            value = t["value"] if finite else t["best"]
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
            "baseline": ua.get("baseline"), "lr_probe": ua.get("lr_probe"),
            "family": settings.family, "arch_idx": idx,
            **{k: arch.get(k, ua.get(k)) for k in ARCH_COLUMNS},
            "extreme": arch.get("extreme", ""), "choices": dict(choices),
            **{k: params.get(k) for k in TRAINING_COLUMNS},
            "val_loss": value, "val_curve": curve, "trial_id": tid,
            "rung_scores": [float(v) for v in ua.get("rung_scores") or []],
            "timestamp": done.astimezone().isoformat() if done else None,  # Optuna stores naive local time
            "fail_reason": ua.get("fail_reason"),
            **{k: ua.get(k) for k in (*NUMERIC_EXTRA, "host", "device", "gpu_name", "isoflop_size")},
            # the study's, as every trial of it trains (docs/mup.md)
            "parametrization": settings.options.parametrization, "mup_base_width": settings.options.mup_base_width,
            "mup_base_depth": settings.options.mup_base_depth,
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
    from archhpo.search._study import settings_attr

    attr = m.StudyUserAttributeModel
    exp_key, value_key, plan_key = (settings_attr(f) for f in ("experiment", "budget_value", "plan"))
    with storage.engine.connect() as conn:
        found = conn.execute(
            sa.select(m.StudyModel.study_id, m.StudyModel.study_name, attr.key, attr.value_json)
            .join(attr, attr.study_id == m.StudyModel.study_id)
            .where(attr.key.in_((exp_key, value_key)))
        ).all()
        planned = {sid for (sid,) in conn.execute(sa.select(attr.study_id).where(attr.key == plan_key))}
    info: dict[int, dict[str, Any]] = {}
    for sid, name, key, text in found:
        info.setdefault(sid, {"name": name})[key] = json.loads(text)
    mine = [(d.get(value_key) or 0, d["name"], sid) for sid, d in info.items()
            if d.get(exp_key) == experiment and sid in planned]
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
    ranks: dict[str, list[dict[str, Any]]] = {}  # each budget's stored confirmation assignment (its decisions)
    for study_id, name in found:
        settings = StudySettings.from_attrs(load_study(storage, name).user_attrs, name)
        studies[settings.budget] = name
        if settings.phase3:
            ranks[settings.budget] = settings.phase3
        infos.append(settings.info)
        for k, vals in _choice_order(settings.archs, settings.options).items():
            order.setdefault(k, [])
            order[k] += [v for v in vals if v not in order[k]]
        rows += _study_rows(storage, study_id, settings, curves)
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(FRAME_COLUMNS))
    frame.attrs.update({"experiment": experiment, "studies": studies, "choice_order": order,
                        "curves": curves, "truth": known_truth(infos), "confirm_ranks": ranks})
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


__all__ = [
    "frame_from_storage",
    "load_curves",
]
