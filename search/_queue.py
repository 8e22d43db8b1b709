"""The trial queue workers pull from: claim, heartbeat, report, finish, park and requeue.

Claiming and finishing write straight to Optuna's tables through its ORM models, each in one
transaction (search/_tables.py), instead of Optuna's ask/suggest/set_user_attr/tell (one commit
per call, ~20 per trial): the same rows Optuna writes, so `optuna` and optuna-dashboard read the
study as usual.

Exactly-once: a WAITING trial becomes RUNNING only through a conditional UPDATE (PostgreSQL
additionally skips rows locked by a concurrent claimer), so two workers never run one trial, and
every later write of the claim is fenced on its token (_owned).  Plan upkeep (stale-trial reaping,
retries, creating phases 2 and 3, rung decisions) is search/_upkeep.py's PlanUpkeep, which
maintain() and status() delegate to.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from optuna.distributions import distribution_to_json
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from archhpo.environment import Environment
from archhpo.errors import TrialLost
from archhpo.schema import ARCH_RECORD, Attr, TrainingPlan, gpu_share
from archhpo.search._optuna_private import models as m
from archhpo.search._optuna_private import trial_id_of
from archhpo.search._rules import claim_plan, prunable
from archhpo.search._space import PARAM_NAMES, SearchSpace, arch_distributions, arch_params
from archhpo.search._status import WHOLE_GPU_KEY, PlanStatus, _CompletedValues
from archhpo.search._storage import DEFAULT_TIMING, read_scope, resilient, session_scope
from archhpo.search._tables import (
    add_flops,
    add_value,
    flag_set,
    put_intermediate,
    read_attrs,
    set_attrs,
    take_waiting,
    touch_heartbeat,
    trial_row,
    write_params,
)
from archhpo.search._trust import EVERY_RUNG, RungTrust
from archhpo.search._upkeep import PlanUpkeep

__all__ = ["CLAIM_TOKEN_KEY", "Claim", "PlanStatus", "TrialQueue"]

CLAIM_TOKEN_KEY = Attr.CLAIM_TOKEN  # who holds a RUNNING trial: heartbeat/report/finish are fenced on it


@dataclass
class Claim:
    """A trial this worker now owns (RUNNING in the database)."""

    trial_id: int
    number: int
    slot: int
    phase: int
    attempt: int
    params: dict[str, Any]
    arch: dict[str, Any]
    study_name: str
    best_value: float = math.inf  # best validation loss reported so far (for the stopping rule)
    seed: int | None = None  # the plan entry's seed (paired studies, confirmation), else None
    token: str | None = None  # this claim's fence token (None: the driver's requeue safety net)
    whole_gpu: bool = False  # a retry of a shared-GPU OOM: needs a GPU of its own
    # How far this claim trains, as the study's stopping rule planned it (search/_rules.py's
    # claim_plan): what the worker reads; and the rung it trains to (the queue's, for park).
    plan: TrainingPlan = field(default_factory=TrainingPlan)
    rung: int = 0
    hold: bool = True  # parked at its rung until the rung's decision; False: a rung its study does not judge


class PlanDone(Exception):
    """Raised internally when the plan needs no more work."""



class TrialQueue:
    """One study's queue as a worker sees it; `upkeep` (PlanUpkeep) keeps its plan.

    `timing` (an Environment the entry point read; default: the defaults) sets the heartbeat, the
    reaper's interval and the patience through database outages."""

    def __init__(self, storage_url: str, name: str, storage: RDBStorage | None = None,
                 timing: Environment | None = None) -> None:
        self.timing = timing or DEFAULT_TIMING
        self.upkeep = PlanUpkeep(storage_url, name, storage, self.timing)
        self.storage_url = storage_url
        self.storage = self.upkeep.storage
        self.study = self.upkeep.study
        self.study_id = self.upkeep.study_id
        self.settings = self.upkeep.settings
        self.name = name
        self.rule = self.upkeep.rule  # the study's stopping rule (search/_rules.py)
        space: SearchSpace = self.settings.search_space
        self.distributions = {**space.distributions(len(self.settings.archs)),
                              **arch_distributions(self.settings.archs)}
        self._dist_json = {k: distribution_to_json(v) for k, v in self.distributions.items()}
        self._postgres = self.storage.engine.dialect.name == "postgresql"
        self.heartbeat_s = float(self.timing.heartbeat_s)
        self.reap_s = self.timing.reap_s
        self._completed = _CompletedValues()  # the median rule's values (see _completed_values)

    # ----------------------------------------------------------------------------- claiming
    def claim(self, worker_attrs: dict[str, Any]) -> Claim | None:
        """Take the oldest WAITING trial, or None when nothing is waiting right now."""
        return resilient(lambda: self._claim(worker_attrs), "claim", self.timing.db_patience_s)

    def _claim(self, worker_attrs: dict[str, Any]) -> Claim | None:
        shared = gpu_share(worker_attrs) < 1
        # Which rungs the study judges, read before the claim's transaction (SQLite: one writer).
        trust = self.upkeep.rungs.trust() if self.upkeep.rungs is not None else EVERY_RUNG
        for _ in range(50):  # lost races on SQLite retry with the next candidate
            with session_scope(self.storage) as s:
                trial = self._pick_waiting(s, shared)
                if trial is None:
                    return None
                if not self._postgres:
                    if not take_waiting(s, int(trial.trial_id)):
                        continue
                    s.expire(trial)
                trial.state = TrialState.RUNNING
                trial.datetime_start = dt.datetime.now()
                return self._start(s, trial, worker_attrs, trust)
        return None

    def _pick_waiting(self, s: Any, shared_gpu: bool = False) -> m.TrialModel | None:
        q = (
            sa.select(m.TrialModel)
            .where(m.TrialModel.study_id == self.study_id, m.TrialModel.state == TrialState.WAITING)
            .order_by(m.TrialModel.trial_id)
            .limit(1)
        )
        if shared_gpu:  # a worker sharing its GPU never takes a trial that needs a whole one
            q = q.where(~flag_set(WHOLE_GPU_KEY))
        if self.rule.n_rungs:  # a trial held at a rung waits for the rung's decision
            q = q.where(~flag_set(Attr.RUNG_HOLD))
        if self._postgres:
            q = q.with_for_update(skip_locked=True)
        return s.execute(q).scalars().first()

    def _start(self, s: Any, trial: Any, worker_attrs: dict[str, Any], trust: RungTrust) -> Claim:
        sys_attrs = read_attrs(s, m.TrialSystemAttributeModel, trial.trial_id)
        user_attrs = read_attrs(s, m.TrialUserAttributeModel, trial.trial_id)
        fixed = sys_attrs.get("fixed_params", {})
        params = {k: fixed[k] for k in PARAM_NAMES if k in fixed}  # the design's parameters
        arch = dict(self.settings.archs[int(params["arch_idx"])])
        write_params(s, trial.trial_id, {**params, **arch_params(arch, self.distributions)},
                     self.distributions, self._dist_json)
        shown = {k: arch[k] for k in ARCH_RECORD}
        choices = dict(arch.get("choices") or {})
        token = uuid.uuid4().hex
        set_attrs(s, trial.trial_id, {
            **{k: v for k, v in choices.items() if k not in shown}, "choices": choices,
            **shown, **worker_attrs, "state_note": "running", CLAIM_TOKEN_KEY: token,
            Attr.FLOPS_FROM: None,  # an earlier claim's starting point is not this one's (started())
        })
        touch_heartbeat(s, trial.trial_id, first=True)
        claim = Claim(
            trial_id=trial.trial_id, number=trial.number, slot=int(user_attrs.get(Attr.PLAN_SLOT, -1)),
            phase=int(user_attrs.get(Attr.PHASE, 0)), attempt=int(user_attrs.get(Attr.ATTEMPT, 1)),
            params=params, arch=arch, study_name=self.name,
            seed=int(user_attrs[Attr.SEED]) if user_attrs.get(Attr.SEED) is not None else None,
            token=token, whole_gpu=bool(user_attrs.get(WHOLE_GPU_KEY, False)),
        )
        claim.plan, claim.rung = claim_plan(self.rule, params, prunable(claim), user_attrs, trust)
        claim.hold = trust.judges(claim.rung)
        return claim

    # ----------------------------------------------------------------------- during a trial
    def _owned(self, s: Any, claim: Claim, lock: bool = True) -> bool:
        """The fence: the trial is still RUNNING and still held by this claim (with `lock`, the row
        stays locked on PostgreSQL until the caller's transaction ends, so the reaper cannot fail it
        in between; SQLite's write transactions hold the whole database anyway)."""
        q = sa.select(m.TrialModel.state).where(m.TrialModel.trial_id == claim.trial_id)
        state = s.execute(q.with_for_update() if lock else q).scalar_one_or_none()
        if state != TrialState.RUNNING:
            return False
        if claim.token is None:
            return True
        held = s.execute(
            sa.select(m.TrialUserAttributeModel.value_json).where(
                m.TrialUserAttributeModel.trial_id == claim.trial_id,
                m.TrialUserAttributeModel.key == CLAIM_TOKEN_KEY,
            )
        ).scalar_one_or_none()
        return held is None or json.loads(held) == claim.token

    def heartbeat(self, claim: Claim) -> bool:
        """Beat for a trial we hold; False (and nothing written) when it is no longer ours:
        reaped while this worker was paused or cut off, then the worker must stop."""
        def once() -> bool:
            with session_scope(self.storage) as s:
                # No row lock: a worker paused inside its (frequent) beat must not block the reaper
                # on PostgreSQL; a beat that lands just after a reap only delays the next check.
                if not self._owned(s, claim, lock=False):
                    return False
                touch_heartbeat(s, claim.trial_id)
            return True

        # Short patience: the next beat retries anyway.
        return resilient(once, "heartbeat", self.timing.heartbeat_s)

    def started(self, claim: Claim, flops_from: int) -> bool:
        """Record where this claim's training starts (Attr.FLOPS_FROM: the FLOPs its checkpoint
        holds, 0 when it starts over), what the ETA reads as the running trial's progress; False,
        nothing written, when the trial is no longer ours."""
        def once() -> bool:
            with session_scope(self.storage) as s:
                if not self._owned(s, claim):
                    return False
                set_attrs(s, claim.trial_id, {Attr.FLOPS_FROM: int(flops_from)})
            return True

        return resilient(once, "started", self.timing.db_patience_s)

    def report(self, claim: Claim, step: int, value: float) -> bool:
        """Record the validation loss of an epoch; True when the stopping rule says stop.

        Raises TrialLost, writing nothing, when the trial is no longer ours (fenced)."""
        claim.best_value = min(claim.best_value, value)

        def once() -> bool:
            with session_scope(self.storage) as s:
                if not self._owned(s, claim):
                    raise TrialLost(f"trial {claim.number} is no longer held by this worker")
                put_intermediate(s, claim.trial_id, step, value)
            # Only trials a rule may judge alone (never a confirmation or paired-seed trial); the
            # completed trials' values at `step` are read only if the rule asks for them.
            return prunable(claim) and self.rule.stops(step, claim.best_value, lambda: self._completed_values(step))

        return resilient(once, "report", self.timing.db_patience_s)

    def _completed_values(self, step: int) -> list[float]:
        """The finite values at `step` of every COMPLETE trial, sorted (the median rule's).

        Kept between reports and topped up with the trials completed since: a trial's value row
        is written by the transaction that completes it, so reading value rows newer than the last
        seen (less a margin for finishes still committing: ids are taken before commit) finds them
        all.  Each report then reads a bounded number of rows, whatever the study's size."""
        c = self._completed
        V, T, IV = m.TrialValueModel, m.TrialModel, m.TrialIntermediateValueModel
        with read_scope(self.storage) as s:
            # The newest value rows first (an id range), then which of their trials are this study's
            # COMPLETE ones: joining the other way round scans the study's trials on SQLite.
            rows = s.execute(
                sa.select(V.trial_value_id, V.trial_id)
                .where(V.trial_value_id > c.mark - _CompletedValues.ID_MARGIN, V.objective == 0)
            ).all()
            candidates = sorted({tid for _, tid in rows} - c.trials)
            new: list[int] = []
            for i in range(0, len(candidates), 500):
                new += s.execute(
                    sa.select(T.trial_id).where(T.trial_id.in_(candidates[i:i + 500]), T.study_id == self.study_id,
                                                T.state == TrialState.COMPLETE)
                ).scalars().all()
            for i in range(0, len(new), 500):
                for at, value in s.execute(
                    sa.select(IV.step, IV.intermediate_value).where(IV.trial_id.in_(new[i:i + 500]))
                ):
                    if value is not None and math.isfinite(value):
                        bisect.insort(c.by_step.setdefault(at, []), value)
        c.trials.update(new)
        c.mark = max([c.mark, *(vid for vid, _ in rows)])
        return c.by_step.get(step, [])

    # ------------------------------------------------------------------------- finishing
    def finish(
        self, claim: Claim, state: TrialState, value: float | None, attrs: dict[str, Any]
    ) -> bool:
        """Finish the trial in one transaction; False if it was no longer ours (e.g. reaped)."""
        return resilient(lambda: self._finish(claim, state, value, attrs), "finish", self.timing.db_patience_s)

    def _finish(self, claim: Claim, state: TrialState, value: float | None, attrs: dict[str, Any]) -> bool:
        with session_scope(self.storage) as s:
            if not self._owned(s, claim):
                return False
            trial = trial_row(s, claim.trial_id)
            if claim.plan.scored and state == TrialState.COMPLETE:  # held at rungs: only at full length
                attrs = {**attrs, Attr.RUNG: len(claim.plan.scored) - 1}
            set_attrs(s, claim.trial_id, {**add_flops(s, claim.trial_id, attrs), "state_note": state.name.lower()})
            if value is not None and math.isfinite(value):
                add_value(s, claim.trial_id, value)
            trial.state = state
            trial.datetime_complete = dt.datetime.now()
        return True

    def park(self, claim: Claim, score: float, attrs: dict[str, Any]) -> bool:
        """Hold a trial scored at its rung (claim.rung) until the rung's decision: WAITING but not
        claimable, so no worker is tied up and the reaper (RUNNING trials only) never sees it; its
        score is stored with it.  At a rung its study does not judge (not claim.hold, --ladder) the
        trial is only scored: WAITING and claimable at once, on to its next rung.  False, writing
        nothing, when the trial is no longer ours."""
        return resilient(lambda: self._park(claim, score, attrs), "park", self.timing.db_patience_s)

    def _park(self, claim: Claim, score: float, attrs: dict[str, Any]) -> bool:
        with session_scope(self.storage) as s:
            if not self._owned(s, claim):
                return False
            trial = trial_row(s, claim.trial_id)
            set_attrs(s, claim.trial_id, {
                **add_flops(s, claim.trial_id, attrs), Attr.RUNG: claim.rung,
                Attr.RUNG_SCORES: [*claim.plan.scores, score], Attr.RUNG_HOLD: claim.hold,
                "state_note": f"waiting at rung {claim.rung}" if claim.hold else f"passed rung {claim.rung}",
            })
            trial.state = TrialState.WAITING
            trial.datetime_start = None
        return True

    def requeue(self, claim: Claim, note: str = "interrupted", attrs: dict[str, Any] | None = None) -> bool:
        """Put a trial we own back to WAITING (Ctrl-C, shutdown): it keeps its number and params.
        ``attrs`` may carry the claim's FLOPS_SPENT (what it trained before it stopped), added to the
        trial's as a finished claim's is."""
        return resilient(lambda: self._requeue(claim, note, attrs or {}), "requeue", self.timing.db_patience_s)

    def _requeue(self, claim: Claim, note: str, attrs: dict[str, Any]) -> bool:
        with session_scope(self.storage) as s:
            if not self._owned(s, claim):
                return False
            trial = trial_row(s, claim.trial_id)
            trial.state = TrialState.WAITING
            trial.datetime_start = None
            set_attrs(s, claim.trial_id, {**add_flops(s, claim.trial_id, attrs), "state_note": f"requeued: {note}"})
        return True

    def requeue_running(self, predicate: Callable[[dict[str, Any]], bool]) -> int:
        """Requeue RUNNING trials whose user attrs match (the driver's Ctrl-C safety net)."""
        n = 0
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            if predicate(t.user_attrs):
                claim = Claim(trial_id_of(t), t.number, -1, 0, 1, {}, {}, self.name)
                n += self.requeue(claim, "run stopped")
        return n

    # ----------------------------------------------------------------------- plan upkeep
    def maintain(self, blocking: bool = True) -> PlanStatus:
        """The plan's upkeep (PlanUpkeep.maintain): reap, retry, create phases 2 and 3, decide rungs.

        blocking=False (the periodic upkeep of busy workers) skips the round when another worker
        holds the plan lock: that worker is doing the same upkeep."""
        return self.upkeep.maintain(blocking)

    def status(self) -> PlanStatus:
        """Plan progress without taking the plan lock or changing anything (progress display)."""
        return self.upkeep.status()
