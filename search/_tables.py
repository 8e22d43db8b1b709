"""Every write archhpo makes to Optuna's trial tables, and the small reads they need.

The queue (search/_queue.py) and the plan's upkeep (search/_upkeep.py, search/_rungs.py) write
the rows Optuna itself would write (states, values, intermediate values, parameters, user
attributes, heartbeats) through Optuna's ORM models (search/_optuna_private.py), inside the
caller's transaction: each helper takes the open session `s` and never commits.  The light reads
of the status (search/_status.py) and the report read the same tables.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from optuna.distributions import BaseDistribution
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from archhpo.schema import Attr
from archhpo.search._optuna_private import models as m
from archhpo.search._storage import read_scope


def db_now(s: Any) -> dt.datetime:
    """The database's clock, as heartbeats are written (timezone dropped, as Optuna compares)."""
    return s.execute(sa.func.now()).scalar().replace(tzinfo=None)


def flag_set(key: str) -> Any:
    """SQL: the trial has the user attribute `key` set to true."""
    return sa.exists().where(
        m.TrialUserAttributeModel.trial_id == m.TrialModel.trial_id,
        m.TrialUserAttributeModel.key == key,
        m.TrialUserAttributeModel.value_json == "true",
    )


def study_attr(storage: RDBStorage, study_id: int, key: str) -> Any:
    """A study user attribute read fresh from the database (not Optuna's cached study)."""
    with read_scope(storage) as s:
        text = s.execute(sa.select(m.StudyUserAttributeModel.value_json).where(
            m.StudyUserAttributeModel.study_id == study_id, m.StudyUserAttributeModel.key == key,
        )).scalar_one_or_none()
    return json.loads(text) if text is not None else None


def trial_row(s: Any, trial_id: int) -> Any:
    """The trial's row (its ORM model, changed in place inside the caller's transaction)."""
    return s.execute(sa.select(m.TrialModel).where(m.TrialModel.trial_id == trial_id)).scalars().one()


def take_waiting(s: Any, trial_id: int) -> bool:
    """WAITING -> RUNNING only if the trial is still WAITING (a conditional UPDATE); True if won."""
    won = s.execute(
        sa.update(m.TrialModel)
        .where(m.TrialModel.trial_id == trial_id, m.TrialModel.state == TrialState.WAITING)
        .values(state=TrialState.RUNNING)
        .execution_options(synchronize_session=False)
    ).rowcount  # an UPDATE's result: a CursorResult
    return bool(won == 1)


def end_trials(s: Any, trial_ids: int | list[int], state: TrialState) -> None:
    """Set a final state (FAIL, PRUNED) on one trial or several, with an UPDATE."""
    T = m.TrialModel
    which = T.trial_id.in_(trial_ids) if isinstance(trial_ids, list) else T.trial_id == trial_ids
    s.execute(sa.update(T).where(which)
              .values(state=state, datetime_complete=dt.datetime.now())
              .execution_options(synchronize_session=False))


def add_value(s: Any, trial_id: int, value: float) -> None:
    """The trial's (single objective's) value row."""
    stored, kind = m.TrialValueModel.value_to_stored_repr(value)
    s.add(m.TrialValueModel(trial_id=trial_id, objective=0, value=stored, value_type=kind))


def put_intermediate(s: Any, trial_id: int, step: int, value: float) -> None:
    """Insert or overwrite the trial's intermediate value at `step`."""
    stored, kind = m.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
    row = s.execute(
        sa.select(m.TrialIntermediateValueModel).where(
            m.TrialIntermediateValueModel.trial_id == trial_id,
            m.TrialIntermediateValueModel.step == step,
        )
    ).scalars().first()
    if row is None:
        s.add(m.TrialIntermediateValueModel(
            trial_id=trial_id, step=step, intermediate_value=stored, intermediate_value_type=kind,
        ))
    else:
        row.intermediate_value, row.intermediate_value_type = stored, kind


def touch_heartbeat(s: Any, trial_id: int, first: bool = False) -> None:
    """Beat now (the database's clock); `first` (a claim): a new row takes the column's default."""
    hb = s.execute(
        sa.select(m.TrialHeartbeatModel).where(m.TrialHeartbeatModel.trial_id == trial_id)
    ).scalars().first()
    if hb is None and first:
        s.add(m.TrialHeartbeatModel(trial_id=trial_id))
        return
    now = s.execute(sa.func.now()).scalar()
    if hb is None:
        s.add(m.TrialHeartbeatModel(trial_id=trial_id, heartbeat=now))
    else:
        hb.heartbeat = now


def add_flops(s: Any, trial_id: int, attrs: dict[str, Any]) -> dict[str, Any]:
    """`attrs` with FLOPS_SPENT (what this claim trained, from the worker) added to what the trial
    had spent in its earlier claims (successive halving trains one trial over several)."""
    if Attr.FLOPS_SPENT not in attrs:
        return attrs
    before = s.execute(sa.select(m.TrialUserAttributeModel.value_json).where(
        m.TrialUserAttributeModel.trial_id == trial_id, m.TrialUserAttributeModel.key == Attr.FLOPS_SPENT,
    )).scalar_one_or_none()
    return {**attrs, Attr.FLOPS_SPENT: int(attrs[Attr.FLOPS_SPENT]) + (int(json.loads(before)) if before else 0)}


def read_attrs(s: Any, model: Any, trial_id: int) -> dict[str, Any]:
    """A trial's attributes of `model` (TrialUserAttributeModel or TrialSystemAttributeModel)."""
    rows = s.execute(sa.select(model).where(model.trial_id == trial_id)).scalars()
    return {r.key: json.loads(r.value_json) for r in rows}


def set_attrs(s: Any, trial_id: int, attrs: dict[str, Any]) -> None:
    """Upsert trial user attributes inside the caller's transaction."""
    existing = {
        r.key: r for r in s.execute(
            sa.select(m.TrialUserAttributeModel).where(m.TrialUserAttributeModel.trial_id == trial_id)
        ).scalars()
    }
    for key, value in attrs.items():
        text = json.dumps(value)
        if key in existing:
            existing[key].value_json = text
        else:
            s.add(m.TrialUserAttributeModel(trial_id=trial_id, key=key, value_json=text))


def write_params(s: Any, trial_id: int, values: dict[str, Any], distributions: Mapping[str, BaseDistribution],
                 dist_json: Mapping[str, str]) -> None:
    """Store a claimed trial's parameters with their distributions (the design's and the
    architecture dimensions); a requeued trial keeps those it already has."""
    existing = {
        p.param_name for p in s.execute(
            sa.select(m.TrialParamModel).where(m.TrialParamModel.trial_id == trial_id)
        ).scalars()
    }
    for name, value in values.items():
        if name in existing:
            continue
        dist = distributions[name]
        s.add(m.TrialParamModel(
            trial_id=trial_id, param_name=name,
            param_value=dist.to_internal_repr(value), distribution_json=dist_json[name],
        ))
