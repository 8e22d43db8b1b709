"""The trial queue workers pull from: claim, report, finish, and plan upkeep.

Claiming and finishing write straight to Optuna's tables through its ORM models, each in one
transaction, instead of Optuna's ask/suggest/set_user_attr/tell (one commit per call, ~20 per
trial): the same rows Optuna writes, so `optuna` and optuna-dashboard read the study as usual.

Exactly-once: a WAITING trial becomes RUNNING only through a conditional UPDATE (PostgreSQL
additionally skips rows locked by a concurrent claimer), so two workers never run one trial.
Plan upkeep (stale-trial reaping, retries, creating phase 2) runs under the plan lock and only
fills slots that have no trial, so it is idempotent however many workers run it at once.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from optuna.distributions import distribution_to_json
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from archhpo.budgets import GridRow
from archhpo.errors import TrialLost
from archhpo.schema import ARCH_RECORD, TRAINING_PARAMS, Attr, gpu_share
from archhpo.search._baselines import baseline_assignments
from archhpo.search._halving import Halving, promotions
from archhpo.search._ladder import Finished, carry_up
from archhpo.search._optuna_private import models as m
from archhpo.search._optuna_private import study_id_of, trial_id_of
from archhpo.search._plan import prunable
from archhpo.search._space import PARAM_NAMES, SearchSpace, arch_distributions, arch_params
from archhpo.search._status import (
    OOM_SHARED_KEY,
    WHOLE_GPU_KEY,
    PlanStatus,
    _CompletedValues,
    _count_slot,
    _finish_status,
    _LightCache,
    _LightTrial,
    _open_slots,
    _read_light,
    _rung_scores,
    _Trials,
)
from archhpo.search._storage import (
    HEARTBEAT_INTERVAL_S,
    open_storage,
    plan_lock,
    read_scope,
    resilient,
    session_scope,
)
from archhpo.search._study import LADDER_KEY, MedianRule, StudySettings, enqueue_missing, load_study

_HALVING_KEY = "archhpo_halving"  # the study's rung decisions: {phase: [promoted slots of rung 0, 1, ...]}
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
    best_value: float = math.inf  # best validation loss reported so far (for the pruner)
    seed: int | None = None  # the plan entry's seed (paired studies, confirmation), else None
    token: str | None = None  # this claim's fence token (None: the driver's requeue safety net)
    whole_gpu: bool = False  # a retry of a shared-GPU OOM: needs a GPU of its own
    # Successive halving (None: the study does not halve): the trial's rung epochs, the rung this
    # claim trains to, the scores and branch epochs of the rungs it passed, and whether it stops and
    # waits at that rung (park) or, never prunable (a replicate), scores every rung in passing.
    rungs: list[int] | None = None
    rung: int = 0
    rung_scores: list[float] = field(default_factory=list)
    branch_epochs: list[float] = field(default_factory=list)
    park: bool = False


class PlanDone(Exception):
    """Raised internally when the plan needs no more work."""


class TrialQueue:
    def __init__(self, storage_url: str, name: str, storage: RDBStorage | None = None) -> None:
        self.storage_url = storage_url
        self.storage = storage or open_storage(storage_url, create=False)
        self.study = resilient(lambda: load_study(self.storage, name), "loading the study")
        self.study_id = study_id_of(self.study)
        self.settings = StudySettings.from_attrs(self.study.user_attrs, name)
        self.name = name
        # None: the study prunes nothing (--pruner none).
        self.median_rule = (MedianRule.for_study(bool(self.settings.options.get("quick")))
                            if self.settings.pruner == "median" else None)
        self.halving = Halving.from_options(self.settings.options)
        self._ladder: dict[str, Any] | None = None  # a ladder budget's plan, once filled (_fill_ladder)
        self._below: list[TrialQueue] | None = None  # the smaller budgets of its ladder
        space: SearchSpace = self.settings.search_space
        self.distributions = {**space.distributions(len(self.settings.archs)),
                              **arch_distributions(self.settings.archs)}
        self._dist_json = {k: distribution_to_json(v) for k, v in self.distributions.items()}
        self._postgres = self.storage.engine.dialect.name == "postgresql"
        self.heartbeat_s = float(HEARTBEAT_INTERVAL_S)
        self.reap_s = float(os.environ.get("ARCHHPO_REAP_S", "30"))
        # A RUNNING trial silent for this long is failed and retried (Optuna's rule: grace, else 2 beats).
        beat = self.storage.heartbeat_interval
        self._grace = dt.timedelta(seconds=float(self.storage.grace_period or 2 * beat)) if beat else None
        self._phase3_cache: list[dict[str, Any]] | None = None  # confirmation assignment, once made
        self._light = _LightCache()  # finished trials, read once (see _light_trials)
        # One lock for what the worker's heartbeat thread (its periodic maintain) and the main
        # thread share: self._light and the views of it that _light_trials returns.
        self._cache_lock = threading.RLock()
        self._completed = _CompletedValues()  # the median rule's values (see _completed_values)

    # ----------------------------------------------------------------------------- claiming
    def claim(self, worker_attrs: dict[str, Any]) -> Claim | None:
        """Take the oldest WAITING trial, or None when nothing is waiting right now."""
        return resilient(lambda: self._claim(worker_attrs), "claim")

    def _claim(self, worker_attrs: dict[str, Any]) -> Claim | None:
        shared = gpu_share(worker_attrs) < 1
        for _ in range(50):  # lost races on SQLite retry with the next candidate
            with session_scope(self.storage) as s:
                trial = self._pick_waiting(s, shared)
                if trial is None:
                    return None
                if not self._postgres:
                    won = s.execute(
                        sa.update(m.TrialModel)
                        .where(m.TrialModel.trial_id == trial.trial_id, m.TrialModel.state == TrialState.WAITING)
                        .values(state=TrialState.RUNNING)
                        .execution_options(synchronize_session=False)
                    ).rowcount  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult
                    if won != 1:
                        continue
                    s.expire(trial)
                trial.state = TrialState.RUNNING
                trial.datetime_start = dt.datetime.now()
                return self._start(s, trial, worker_attrs)
        return None

    def _pick_waiting(self, s: Any, shared_gpu: bool = False) -> m.TrialModel | None:
        q = (
            sa.select(m.TrialModel)
            .where(m.TrialModel.study_id == self.study_id, m.TrialModel.state == TrialState.WAITING)
            .order_by(m.TrialModel.trial_id)
            .limit(1)
        )
        if shared_gpu:  # a worker sharing its GPU never takes a trial that needs a whole one
            q = q.where(~_flag_set(WHOLE_GPU_KEY))
        if self.halving is not None:  # a trial held at a rung waits for the rung's decision
            q = q.where(~_flag_set(Attr.RUNG_HOLD))
        if self._postgres:
            q = q.with_for_update(skip_locked=True)
        return s.execute(q).scalars().first()

    def _start(self, s: Any, trial: Any, worker_attrs: dict[str, Any]) -> Claim:
        sys_attrs = _attrs(s, m.TrialSystemAttributeModel, trial.trial_id)
        user_attrs = _attrs(s, m.TrialUserAttributeModel, trial.trial_id)
        fixed = sys_attrs.get("fixed_params", {})
        params = {k: fixed[k] for k in PARAM_NAMES if k in fixed}  # the design's parameters
        arch = dict(self.settings.archs[int(params["arch_idx"])])
        self._write_params(s, trial.trial_id, {**params, **arch_params(arch, self.distributions)})
        shown = {k: arch[k] for k in ARCH_RECORD}
        choices = dict(arch.get("choices") or {})
        token = uuid.uuid4().hex
        _set_attrs(s, trial.trial_id, {
            **{k: v for k, v in choices.items() if k not in shown}, "choices": choices,
            **shown, **worker_attrs, "state_note": "running", CLAIM_TOKEN_KEY: token,
        })
        hb = s.execute(
            sa.select(m.TrialHeartbeatModel).where(m.TrialHeartbeatModel.trial_id == trial.trial_id)
        ).scalars().first()
        if hb is None:
            s.add(m.TrialHeartbeatModel(trial_id=trial.trial_id))
        else:
            hb.heartbeat = s.execute(sa.func.now()).scalar()
        claim = Claim(
            trial_id=trial.trial_id, number=trial.number, slot=int(user_attrs.get(Attr.PLAN_SLOT, -1)),
            phase=int(user_attrs.get(Attr.PHASE, 0)), attempt=int(user_attrs.get(Attr.ATTEMPT, 1)),
            params=params, arch=arch, study_name=self.name,
            seed=int(user_attrs[Attr.SEED]) if user_attrs.get(Attr.SEED) is not None else None,
            token=token, whole_gpu=bool(user_attrs.get(WHOLE_GPU_KEY, False)),
        )
        if self.halving is not None:
            self._halving_claim(claim, user_attrs)
        return claim

    def _halving_claim(self, claim: Claim, user_attrs: dict[str, Any]) -> None:
        """The claim's rungs: a prunable trial trains to the rung after the last one it was scored
        at (the first for a new trial); a replicate trains to full length, scoring rungs in passing."""
        assert self.halving is not None
        claim.rungs = self.halving.epochs(int(claim.params["epochs"]))
        claim.park = prunable(claim)
        passed = user_attrs.get(Attr.RUNG)
        claim.rung = 0 if passed is None or not claim.park else int(passed) + 1
        claim.rung_scores = [float(v) for v in user_attrs.get(Attr.RUNG_SCORES) or []]
        claim.branch_epochs = [float(v) for v in user_attrs.get(Attr.BRANCH_EPOCHS) or []]

    def _write_params(self, s: Any, trial_id: int, values: dict[str, Any]) -> None:
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
            dist = self.distributions[name]
            s.add(m.TrialParamModel(
                trial_id=trial_id, param_name=name,
                param_value=dist.to_internal_repr(value), distribution_json=self._dist_json[name],
            ))

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
                hb = s.execute(
                    sa.select(m.TrialHeartbeatModel).where(m.TrialHeartbeatModel.trial_id == claim.trial_id)
                ).scalars().first()
                now = s.execute(sa.func.now()).scalar()
                if hb is None:
                    s.add(m.TrialHeartbeatModel(trial_id=claim.trial_id, heartbeat=now))
                else:
                    hb.heartbeat = now
            return True

        # Short patience: the next beat retries anyway.
        return resilient(once, "heartbeat", HEARTBEAT_INTERVAL_S)

    def report(self, claim: Claim, step: int, value: float) -> bool:
        """Record the validation loss of an epoch; True when the pruner says stop.

        Raises TrialLost, writing nothing, when the trial is no longer ours (fenced)."""
        claim.best_value = min(claim.best_value, value)

        def once() -> bool:
            with session_scope(self.storage) as s:
                if not self._owned(s, claim):
                    raise TrialLost(f"trial {claim.number} is no longer held by this worker")
                stored, kind = m.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
                row = s.execute(
                    sa.select(m.TrialIntermediateValueModel).where(
                        m.TrialIntermediateValueModel.trial_id == claim.trial_id,
                        m.TrialIntermediateValueModel.step == step,
                    )
                ).scalars().first()
                if row is None:
                    s.add(m.TrialIntermediateValueModel(
                        trial_id=claim.trial_id, step=step, intermediate_value=stored, intermediate_value_type=kind,
                    ))
                else:
                    row.intermediate_value, row.intermediate_value_type = stored, kind
            # Only trials a pruner may judge alone (never a confirmation or paired-seed trial).
            return prunable(claim) and self._should_prune(step, claim.best_value)

        return resilient(once, "report")

    def _should_prune(self, step: int, best: float) -> bool:
        """The study's pruning rule (MedianRule, or none) for a trial whose best loss is `best`."""
        if self.median_rule is None:
            return False
        return self.median_rule.stops(step, best, self._completed_values(step))

    def _completed_values(self, step: int) -> list[float]:
        """The finite values at `step` of every COMPLETE trial, sorted.

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
        return resilient(lambda: self._finish(claim, state, value, attrs), "finish")

    def _finish(self, claim: Claim, state: TrialState, value: float | None, attrs: dict[str, Any]) -> bool:
        with session_scope(self.storage) as s:
            if not self._owned(s, claim):
                return False
            trial = s.execute(
                sa.select(m.TrialModel).where(m.TrialModel.trial_id == claim.trial_id)
            ).scalars().one()
            if claim.rungs and state == TrialState.COMPLETE:  # halving: only a full-length trial completes
                attrs = {**attrs, Attr.RUNG: len(claim.rungs) - 1}
            _set_attrs(s, claim.trial_id, {**_add_flops(s, claim.trial_id, attrs), "state_note": state.name.lower()})
            if value is not None and math.isfinite(value):
                stored, kind = m.TrialValueModel.value_to_stored_repr(value)
                s.add(m.TrialValueModel(trial_id=claim.trial_id, objective=0, value=stored, value_type=kind))
            trial.state = state
            trial.datetime_complete = dt.datetime.now()
        return True

    def park(self, claim: Claim, score: float, attrs: dict[str, Any]) -> bool:
        """Hold a trial scored at its rung (claim.rung) until the rung's decision: WAITING but not
        claimable, so no worker is tied up and the reaper (RUNNING trials only) never sees it; its
        score is stored with it.  False, writing nothing, when the trial is no longer ours."""
        return resilient(lambda: self._park(claim, score, attrs), "park")

    def _park(self, claim: Claim, score: float, attrs: dict[str, Any]) -> bool:
        with session_scope(self.storage) as s:
            if not self._owned(s, claim):
                return False
            trial = s.execute(
                sa.select(m.TrialModel).where(m.TrialModel.trial_id == claim.trial_id)
            ).scalars().one()
            _set_attrs(s, claim.trial_id, {
                **_add_flops(s, claim.trial_id, attrs), Attr.RUNG: claim.rung,
                Attr.RUNG_SCORES: [*claim.rung_scores, score], Attr.RUNG_HOLD: True,
                "state_note": f"waiting at rung {claim.rung}",
            })
            trial.state = TrialState.WAITING
            trial.datetime_start = None
        return True

    def requeue(self, claim: Claim, note: str = "interrupted", attrs: dict[str, Any] | None = None) -> bool:
        """Put a trial we own back to WAITING (Ctrl-C, shutdown): it keeps its number and params.
        ``attrs`` may carry the claim's FLOPS_SPENT (what it trained before it stopped), added to the
        trial's as a finished claim's is."""
        return resilient(lambda: self._requeue(claim, note, attrs or {}), "requeue")

    def _requeue(self, claim: Claim, note: str, attrs: dict[str, Any]) -> bool:
        with session_scope(self.storage) as s:
            if not self._owned(s, claim):
                return False
            trial = s.execute(
                sa.select(m.TrialModel).where(m.TrialModel.trial_id == claim.trial_id)
            ).scalars().one()
            trial.state = TrialState.WAITING
            trial.datetime_start = None
            _set_attrs(s, claim.trial_id, {**_add_flops(s, claim.trial_id, attrs), "state_note": f"requeued: {note}"})
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
        """Reap stale trials, retry lost ones, create phase 2 when phase 1 is final.

        blocking=False (the periodic upkeep of busy workers) skips the round when another worker
        holds the plan lock: that worker is doing the same upkeep.
        """
        return resilient(lambda: self._maintain(blocking), "plan upkeep")

    def _maintain(self, blocking: bool) -> PlanStatus:
        with plan_lock(self.storage, self.name, blocking) as held:
            if not held:
                return self.status()
            with self._cache_lock:  # taken after the plan lock: status() never waits on the plan lock
                return self._upkeep()

    def _upkeep(self) -> PlanStatus:
        """Under the plan lock: reap, retry, create phases 2 and 3; the status afterwards."""
        self._fail_stale(self._stale_candidates())
        trials = self._light_trials()
        if self.settings.options.get("ladder") and self._ladder is None:
            self._fill_ladder()
        if self.halving is not None and self._decide_rungs(trials):
            trials = self._light_trials()  # held trials were promoted or pruned
        status, retry, phase1_final = self._status(trials)
        for light in retry:
            t = self.storage.get_trial(light.trial_id)
            attempt = int(t.user_attrs.get(Attr.ATTEMPT, 1)) + 1
            extra = {k: t.user_attrs[k] for k in _CARRIED_KEYS if t.user_attrs.get(k) is not None}
            if t.user_attrs.get(OOM_SHARED_KEY) or t.user_attrs.get(WHOLE_GPU_KEY):
                extra[WHOLE_GPU_KEY] = True  # retried on a GPU of its own (and stays there)
            self.study.enqueue_trial(
                {k: v for k, v in (t.params or t.system_attrs.get("fixed_params", {})).items()
                 if k in PARAM_NAMES},  # the design's parameters; the claim adds the architecture's
                user_attrs={
                    Attr.PLAN_SLOT: t.user_attrs[Attr.PLAN_SLOT], Attr.PHASE: t.user_attrs.get(Attr.PHASE, 0),
                    Attr.ATTEMPT: attempt, Attr.RETRY_OF: t.number, **extra,
                },
            )
        needs_phase2 = bool(self._light.phase2_slots) and not status.phase2_created  # (set by _status)
        if phase1_final and needs_phase2:
            params = self._best_phase1_params(trials)
            self.study.set_user_attr("archhpo_phase2_params", params)
            enqueue_missing(self.study, self.settings, phase=2, params=params)
        confirm = status.phase12_final and status.phase3_pending
        if confirm:
            self._create_phase3(trials)
        if retry or (phase1_final and needs_phase2) or confirm:
            status, _, _ = self._status(self._light_trials())
        return status

    # -------------------------------------------------------------------------- reaping
    def _stale_candidates(self) -> list[int]:
        """RUNNING trials whose heartbeat is older than the grace period (a read, no locks)."""
        if self._grace is None:  # heartbeats off: nothing is ever stale
            return []
        T, H = m.TrialModel, m.TrialHeartbeatModel
        with read_scope(self.storage) as s:
            cutoff = _db_now(s) - self._grace
            return list(s.execute(
                sa.select(T.trial_id).join(H, H.trial_id == T.trial_id)
                .where(T.study_id == self.study_id, T.state == TrialState.RUNNING, H.heartbeat < cutoff)
            ).scalars())

    def _fail_stale(self, candidates: list[int]) -> list[int]:
        """Fail the candidates that are, in this transaction, still RUNNING with a stale heartbeat.

        Optuna's fail_stale_trials sets FAIL on the ids it read without looking again, and FAIL
        may overwrite WAITING: a trial parked at a rung (or requeued, or requeued and claimed
        again) between its read and its write became FAIL, its retry skipped the rung and the
        rung was never decided (a study hung with every worker idle).  Here the rows are locked
        (PostgreSQL; SQLite's write transaction holds the database) and read again first."""
        if not candidates or self._grace is None:
            return []
        T, H = m.TrialModel, m.TrialHeartbeatModel
        with session_scope(self.storage) as s:
            q = sa.select(T.trial_id).where(T.trial_id.in_(candidates), T.state == TrialState.RUNNING)
            running = list(s.execute(q.with_for_update() if self._postgres else q).scalars())
            cutoff = _db_now(s) - self._grace
            stale = list(s.execute(
                sa.select(H.trial_id).where(H.trial_id.in_(running), H.heartbeat < cutoff)
            ).scalars()) if running else []
            if stale:
                s.execute(sa.update(T).where(T.trial_id.in_(stale))
                          .values(state=TrialState.FAIL, datetime_complete=dt.datetime.now())
                          .execution_options(synchronize_session=False))
        return stale

    # ------------------------------------------------------------------ ladder planning
    def _fill_ladder(self) -> None:
        """A ladder budget's phase 1, once every smaller budget's plan is final (under the plan lock):
        what is carried up is stored in the study before its slots are enqueued and reused after, so
        racing or killed upkeeps fill the plan once (search/_ladder.py)."""
        ladder = self._study_attr(LADDER_KEY)
        if ladder is None:
            if self._below is None:
                self._below = [TrialQueue(self.storage_url, n, storage=self.storage)
                               for n in self.settings.options["ladder"]["below"]]
            if not all(q.status().done for q in self._below):
                return
            ladder = self._carry_from(self._below[-1])
            self.study.set_user_attr(LADDER_KEY, ladder)
        enqueue_missing(self.study, self.settings, phase=1, ladder=ladder)
        self._ladder = ladder

    def _carry_from(self, smaller: TrialQueue) -> dict[str, Any]:
        """carry_up from the next smaller budget's COMPLETE phase-1/2 trials."""
        done = smaller.storage.get_all_trials(smaller.study_id, deepcopy=False, states=(TrialState.COMPLETE,))
        finished = [
            Finished(float(t.value), t.number, int(t.user_attrs["d_model"]), int(t.user_attrs["n_layers"]),
                     (int(t.params["arch_idx"]),), {k: t.params[k] for k in TRAINING_PARAMS})
            for t in done if t.value is not None and math.isfinite(t.value) and t.user_attrs.get(Attr.PHASE) in (1, 2)
        ]
        slots = [e["slot"] for e in self.settings.plan if e["phase"] == 1]
        out = carry_up(finished, smaller.settings.budget_value, self.settings.budget_value,
                       [GridRow(**a) for a in self.settings.archs], self.settings.search_space, slots,
                       int(self.settings.options.get("seed", 0)))
        return {**out, "from": smaller.name, "from_budget": smaller.settings.budget}

    # ------------------------------------------------------------------ successive halving
    def _decide_rungs(self, trials: Sequence[_LightTrial]) -> bool:
        """Make and apply every rung decision that is due (under the plan lock); True if a held
        trial was promoted or pruned.

        Per phase (1 and 2: the prunable ones), rung 0's members are the phase's slots and rung
        r+1's are those promoted from rung r.  A rung is decided once all its members are held at
        it (or failed for good): promotions() of their scores.  The decision is stored in the study
        before it is applied, and applying it again is a no-op, so a worker or driver killed
        anywhere in between leaves the next upkeep to finish the same decision."""
        assert self.halving is not None
        decisions = self._study_attr(_HALVING_KEY) or {}
        by_slot: dict[int, list[_LightTrial]] = {}
        for t in trials:
            if t.user_attrs.get(Attr.PLAN_SLOT) is not None:
                by_slot.setdefault(int(t.user_attrs[Attr.PLAN_SLOT]), []).append(t)
        changed = False
        for phase in (1, 2):
            members = [e["slot"] for e in self.settings.plan if e["phase"] == phase and prunable(e)]
            decided: list[list[int]] = decisions.setdefault(str(phase), [])
            for rung in range(self.halving.n_rungs - 1):
                if not members:
                    break
                if rung == len(decided):
                    scores = _rung_scores(rung, members, by_slot)
                    if scores is None:  # the rung still waits for some of its members
                        break
                    decided.append(promotions(scores, self.halving.eta))
                    self.study.set_user_attr(_HALVING_KEY, decisions)
                changed |= self._apply_rung(rung, members, decided[rung], by_slot)
                members = decided[rung]
        return changed

    def _apply_rung(self, rung: int, members: list[int], promoted: list[int],
                    by_slot: dict[int, list[_LightTrial]]) -> bool:
        """Release the promoted members held at `rung` and prune the others, with their rung score
        as value, in one transaction; members no longer held there are left alone."""
        held = [t for slot in members for t in by_slot.get(slot, [])
                if t.state == TrialState.WAITING and t.user_attrs.get(Attr.RUNG_HOLD)
                and int(t.user_attrs.get(Attr.RUNG, -1)) == rung]
        if not held:
            return False
        keep = set(promoted)
        with session_scope(self.storage) as s:
            for t in held:
                if int(t.user_attrs[Attr.PLAN_SLOT]) in keep:
                    _set_attrs(s, t.trial_id, {Attr.RUNG_HOLD: False, "state_note": f"promoted to rung {rung + 1}"})
                    continue
                _set_attrs(s, t.trial_id, {Attr.RUNG_HOLD: False, "state_note": f"pruned at rung {rung}"})
                stored, kind = m.TrialValueModel.value_to_stored_repr(float(t.user_attrs[Attr.RUNG_SCORES][rung]))
                s.add(m.TrialValueModel(trial_id=t.trial_id, objective=0, value=stored, value_type=kind))
                s.execute(sa.update(m.TrialModel).where(m.TrialModel.trial_id == t.trial_id)
                          .values(state=TrialState.PRUNED, datetime_complete=dt.datetime.now())
                          .execution_options(synchronize_session=False))
        return True

    def _study_attr(self, key: str) -> Any:
        """A study user attribute read fresh from the database (not Optuna's cached study)."""
        with read_scope(self.storage) as s:
            text = s.execute(sa.select(m.StudyUserAttributeModel.value_json).where(
                m.StudyUserAttributeModel.study_id == self.study_id, m.StudyUserAttributeModel.key == key,
            )).scalar_one_or_none()
        return json.loads(text) if text is not None else None

    # ------------------------------------------------------------------ confirmation (phase 3)
    def _phase3(self, fresh: bool = False) -> list[dict[str, Any]] | None:
        """The confirmation assignment (StudySettings.phase3), read from the study once it exists."""
        if self._phase3_cache is None and any(e["phase"] == 3 for e in self.settings.plan):
            if fresh or self.settings.phase3 is None:
                with read_scope(self.storage) as s:
                    text = s.execute(
                        sa.select(m.StudyUserAttributeModel.value_json).where(
                            m.StudyUserAttributeModel.study_id == self.study_id,
                            m.StudyUserAttributeModel.key == "archhpo_phase3",
                        )
                    ).scalar_one_or_none()
                self._phase3_cache = json.loads(text) if text is not None else None
            else:
                self._phase3_cache = self.settings.phase3
        return self._phase3_cache

    def _create_phase3(self, trials: Sequence[_LightTrial]) -> None:
        """Rank the architectures of phases 1-2 and enqueue their confirmation slots (under the
        plan lock; idempotent: an assignment once stored is reused, filled slots are skipped)."""
        ranks = self._phase3(fresh=True)
        if ranks is None:
            ranks = self._rank_architectures(trials)
            if ranks:  # the rules' shapes, trained like the searched best (search/_baselines.py)
                ranks += baseline_assignments(self.settings.plan, self.settings.archs, ranks[0],
                                              self.settings.budget_value)
            self.study.set_user_attr("archhpo_phase3", ranks)
            self._phase3_cache = ranks
        enqueue_missing(self.study, self.settings, phase=3, ranks=ranks)

    def _rank_architectures(self, trials: Sequence[_LightTrial]) -> list[dict[str, Any]]:
        """Rank k = the k-th best architecture by its best COMPLETE phase-1/2 value (ties: the
        earlier trial); it is confirmed with the training parameters of that best trial."""
        n_ranks = 1 + max(int(e.get("rank") or 0) for e in self.settings.plan if e["phase"] == 3
                          and not e.get("baseline"))
        done = {
            t.trial_id: t for t in trials
            if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
            and int(t.user_attrs.get(Attr.PHASE, 0)) in (1, 2)
        }
        with read_scope(self.storage) as s:
            arch_of = {
                tid: int(v) for tid, v in s.execute(
                    sa.select(m.TrialParamModel.trial_id, m.TrialParamModel.param_value)
                    .join(m.TrialModel, m.TrialModel.trial_id == m.TrialParamModel.trial_id)
                    .where(m.TrialModel.study_id == self.study_id, m.TrialParamModel.param_name == "arch_idx")
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
            params = self.storage.get_trial(t.trial_id).params
            out.append({"rank": k, "arch_idx": arch_idx, "params": {p: params[p] for p in TRAINING_PARAMS},
                        "selection_value": t.value, "trial": t.number})
        return out

    def status(self) -> PlanStatus:
        """Plan progress without taking the plan lock or changing anything (progress display)."""
        with self._cache_lock:
            return self._status(self._light_trials())[0]

    def _light_trials(self) -> _Trials:
        """State, value and the bookkeeping attrs of every trial: the upkeep runs often, and
        Optuna's get_all_trials would load every param and attribute.

        Bounded by the live part of the study, not its size: a finished trial (COMPLETE, PRUNED,
        FAIL) never changes again, so each is read once and kept; every call reads only the
        WAITING and RUNNING trials, trials newer than any seen, and those that were live last
        time and have finished since.  A full re-read every FULL_RELOAD_S is the safety net.
        """
        c = self._light
        if time.monotonic() - c.loaded_at > _LightCache.FULL_RELOAD_S:
            c.reset()
        live_states = (TrialState.RUNNING, TrialState.WAITING)
        T = m.TrialModel
        with read_scope(self.storage) as s:
            def read(cond: Any) -> tuple[list[Any], dict[int, float], dict[int, dict[str, Any]]]:
                return _read_light(s, self.study_id, cond)

            # Two queries, not one with OR: each then uses an index on SQLite too (live: archhpo's
            # (study_id, state, trial_id); newer: a trial_id range), instead of a scan of the study.
            rows, values, attrs = read(T.state.in_(live_states))
            newer = read(T.trial_id > c.max_seen)
            rows += newer[0]
            values.update(newer[1])
            attrs.update(newer[2])
            gone = sorted(c.live - {tid for tid, _, state, _ in rows if state in live_states})
            for i in range(0, len(gone), 500):  # finished since the last call
                more = read(T.trial_id.in_(gone[i:i + 500]))
                rows += more[0]
                values.update(more[1])
                attrs.update(more[2])
        live = []
        for tid, num, state, started in {r[0]: r for r in rows}.values():  # a live trial may also be "newer"
            light = _LightTrial(tid, num, state, values.get(tid), attrs.get(tid, {}), started)
            if state in live_states:
                live.append(light)
            elif tid not in c.final:
                c.add_final(light)
            c.max_seen = max(c.max_seen, tid)
        c.live, c.live_trials = {t.trial_id for t in live}, live
        c.last = _Trials(c.final, live)  # a view, not a copy of 100,000 finished trials per call
        return c.last

    def _status(self, trials: Sequence[_LightTrial]) -> tuple[PlanStatus, list[_LightTrial], bool]:
        """Plan progress, the failed trials to retry, and whether phase 1 is final.

        Steps: the open slots' trials (_open_slots), one slot at a time (_count_slot), then the
        study-wide figures (_finish_status).  Callers hold self._cache_lock (see _snapshot)."""
        plan = self.settings.plan
        # Slots whose outcome is settled (a COMPLETE/PRUNED trial, or a final failure) never change:
        # their contribution is kept, so a large study costs one light pass, not a plan's worth of work.
        c = self._light if trials is self._light.last else _LightCache()  # any other list: from scratch
        by_slot = _open_slots(c, trials, plan)
        st = PlanStatus(total=len(plan))
        st.phase2_created = any(s in by_slot or s in c.settled for s in c.phase2_slots)
        has_phase3 = 3 in c.phases
        ranks = self._phase3() if has_phase3 else None
        assigned = {int(r["rank"]) for r in ranks} if ranks is not None else set()
        st.phase12_final = True
        st.phase3_pending = has_phase3 and ranks is None
        retry: list[_LightTrial] = []
        phase1_final = True
        durations: list[float] = []
        st.complete, st.pruned, st.failed, st.final, st.retries = c.totals
        settled_durations = (c.duration_sum, c.duration_n)  # before this call settles more slots
        for entry in list((c.pending or {}).values()):
            ts = sorted(by_slot.get(entry["slot"], []), key=lambda t: t.number)
            confirm_open = entry["phase"] == 3 and ranks is not None and int(entry["rank"]) not in assigned
            final = _count_slot(st, ts, confirm_open, retry, durations)
            st.retries += sum(1 for t in ts if Attr.RETRY_OF in t.user_attrs)
            st.final += final
            if final and ts and trials is c.last:  # settled by its trials (not a skipped confirmation slot)
                c.settle(entry["slot"], ts)
            if entry["phase"] == 1 and not final:
                phase1_final = False
            if entry["phase"] in (1, 2) and not final:
                st.phase12_final = False
            if entry["phase"] == 3 and not ts and ranks is not None and int(entry["rank"]) in assigned:
                st.phase3_pending = True  # assigned but not enqueued (upkeep stopped in between)
        _finish_status(st, c, trials, durations, settled_durations)
        if has_phase3 and ranks is None:
            st.details["phase3"] = "waiting for phases 1 and 2"
        return st, retry, phase1_final

    def _best_phase1_params(self, trials: Sequence[_LightTrial]) -> dict[str, Any]:
        done = [
            t for t in trials
            if t.state == TrialState.COMPLETE and t.user_attrs.get(Attr.PHASE) == 1 and t.value is not None
        ]
        if not done:  # every phase-1 trial failed: fall back to mid-range parameters
            return self.settings.search_space.default()
        best = self.storage.get_trial(min(done, key=lambda t: (t.value, t.number)).trial_id)
        return {k: best.params[k] for k in TRAINING_PARAMS}

    # ---------------------------------------------------------------------- the loop's API
    def next_trial(
        self, worker_attrs: dict[str, Any], should_stop: Callable[[], bool], poll_s: float = 2.0
    ) -> Claim | None:
        """Block until a trial is ours (Claim) or the plan is done (None)."""
        while not should_stop():
            claim = self.claim(worker_attrs)
            if claim is not None:
                return claim
            status = self.maintain(blocking=False)
            if status.done:
                return None
            claim = self.claim(worker_attrs)
            if claim is not None:
                return claim
            time.sleep(poll_s)
        return None


# What a retry keeps besides plan_slot and phase: the plan entry's seed, rank and baseline rule, and the rungs
# it passed (it resumes from the dead attempt's checkpoint towards the same next rung).
_CARRIED_KEYS = (Attr.SEED, Attr.RANK, Attr.BASELINE, Attr.RUNG, Attr.RUNG_SCORES, Attr.BRANCH_EPOCHS)


def _db_now(s: Any) -> dt.datetime:
    """The database's clock, as heartbeats are written (timezone dropped, as Optuna compares)."""
    return s.execute(sa.func.now()).scalar().replace(tzinfo=None)


def _flag_set(key: str) -> Any:
    """SQL: the trial has the user attribute `key` set to true."""
    return sa.exists().where(
        m.TrialUserAttributeModel.trial_id == m.TrialModel.trial_id,
        m.TrialUserAttributeModel.key == key,
        m.TrialUserAttributeModel.value_json == "true",
    )


def _add_flops(s: Any, trial_id: int, attrs: dict[str, Any]) -> dict[str, Any]:
    """`attrs` with FLOPS_SPENT (what this claim trained, from the worker) added to what the trial
    had spent in its earlier claims (successive halving trains one trial over several)."""
    if Attr.FLOPS_SPENT not in attrs:
        return attrs
    before = s.execute(sa.select(m.TrialUserAttributeModel.value_json).where(
        m.TrialUserAttributeModel.trial_id == trial_id, m.TrialUserAttributeModel.key == Attr.FLOPS_SPENT,
    )).scalar_one_or_none()
    return {**attrs, Attr.FLOPS_SPENT: int(attrs[Attr.FLOPS_SPENT]) + (int(json.loads(before)) if before else 0)}


def _attrs(s: Any, model: Any, trial_id: int) -> dict[str, Any]:
    rows = s.execute(sa.select(model).where(model.trial_id == trial_id)).scalars()
    return {r.key: json.loads(r.value_json) for r in rows}


def _set_attrs(s: Any, trial_id: int, attrs: dict[str, Any]) -> None:
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
