"""What the upkeep carries from one phase to the next (search/_upkeep.py): phase 2's training
parameters (the best phase-1 trial's) and the confirmation ranks of phase 3."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from archhpo.schema import TRAINING_PARAMS, Attr
from archhpo.search._optuna_private import models as m
from archhpo.search._settings import StudySettings
from archhpo.search._status import _LightTrial
from archhpo.search._storage import read_scope


def rank_architectures(storage: RDBStorage, study_id: int, settings: StudySettings,
                       trials: Sequence[_LightTrial]) -> list[dict[str, Any]]:
    """Rank k = the k-th best architecture by its best COMPLETE phase-1/2 value (ties: the
    earlier trial); it is confirmed with the training parameters of that best trial."""
    n_ranks = 1 + max(int(e.rank or 0) for e in settings.plan if e.phase == 3 and not e.extra)
    done = {
        t.trial_id: t for t in trials
        if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
        and int(t.user_attrs.get(Attr.PHASE, 0)) in (1, 2)
    }
    with read_scope(storage) as s:
        arch_of = {
            tid: int(v) for tid, v in s.execute(
                sa.select(m.TrialParamModel.trial_id, m.TrialParamModel.param_value)
                .join(m.TrialModel, m.TrialModel.trial_id == m.TrialParamModel.trial_id)
                .where(m.TrialModel.study_id == study_id, m.TrialParamModel.param_name == "arch_idx")
            ) if tid in done
        }
    best: dict[int, _LightTrial] = {}
    for tid, arch_idx in arch_of.items():
        t = done[tid]
        if arch_idx not in best or (t.value, t.number) < (best[arch_idx].value, best[arch_idx].number):
            best[arch_idx] = t
    ranked = sorted(best.items(), key=lambda kv: (kv[1].value, kv[1].number))[:n_ranks]
    out = []
    for k, (arch_idx, t) in enumerate(ranked):
        params = storage.get_trial(t.trial_id).params
        out.append({"rank": k, "arch_idx": arch_idx, "params": {p: params[p] for p in TRAINING_PARAMS},
                    "selection_value": t.value, "trial": t.number})
    return out


def best_phase1_params(storage: RDBStorage, settings: StudySettings, trials: Sequence[_LightTrial]) -> dict[str, Any]:
    """The training parameters of the best COMPLETE phase-1 trial (phase 2 trains with them)."""
    done = [
        t for t in trials
        if t.state == TrialState.COMPLETE and t.user_attrs.get(Attr.PHASE) == 1 and t.value is not None
    ]
    if not done:  # every phase-1 trial failed: fall back to mid-range parameters
        return settings.search_space.default()
    best = storage.get_trial(min(done, key=lambda t: (t.value, t.number)).trial_id)
    return {k: best.params[k] for k in TRAINING_PARAMS}
