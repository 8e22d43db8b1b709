"""The plan's upkeep, run by every worker and the driver under the plan lock: reaping, retries,
creating phases 2 and 3, the ladder fill, the stopping rule's rung decisions, and the status.

Upkeep only fills slots that have no trial and stores each decision (a ladder, a rung, the
confirmation ranks) in the study before acting on it, so it is idempotent however many workers
run it at once, and one killed anywhere leaves the next upkeep to finish the same work.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from archhpo.environment import Environment
from archhpo.schema import Attr
from archhpo.search._baselines import baseline_assignments
from archhpo.search._confirmation import decide_waiting, listed, mark_rung, mark_waves, trained, waiting
from archhpo.search._ladder_record import ladder_record
from archhpo.search._lrfit import probe_assignments
from archhpo.search._optuna_private import models as m
from archhpo.search._optuna_private import study_id_of
from archhpo.search._ranking import best_phase1_params, rank_architectures
from archhpo.search._rules import make_rule
from archhpo.search._rungs import RungDecisions
from archhpo.search._settings import LADDER_KEY, StudySettings, load_study, settings_attr
from archhpo.search._space import PARAM_NAMES
from archhpo.search._status import (
    OOM_SHARED_KEY,
    WHOLE_GPU_KEY,
    PlanStatus,
    _count_slot,
    _finish_status,
    _LightCache,
    _LightTrial,
    _never_filled,
    _open_slots,
    _Trials,
    why_waiting,
)
from archhpo.search._storage import (
    DEFAULT_TIMING,
    open_storage,
    plan_lock,
    read_scope,
    resilient,
    session_scope,
)
from archhpo.search._study import enqueue_missing
from archhpo.search._tables import db_now, end_trials, study_attr

PHASE3_KEY = settings_attr("phase3")  # the confirmation assignment (StudySettings.phase3), once ranked
# What a retry keeps besides plan_slot and phase: the plan entry's seed, rank, baseline rule and probe, and the rungs
# it passed (it resumes from the dead attempt's checkpoint towards the same next rung).
_CARRIED_KEYS = (Attr.SEED, Attr.RANK, Attr.BASELINE, Attr.LR_PROBE, Attr.RUNG, Attr.RUNG_SCORES, Attr.BRANCH_EPOCHS,
                 Attr.CONFIRM_RUNG)


class PlanUpkeep:
    """The upkeep of one study's plan, and its status (a cache of the study's trials read lightly)."""

    def __init__(self, storage_url: str, name: str, storage: RDBStorage | None = None,
                 timing: Environment | None = None) -> None:
        self.storage_url = storage_url
        self.timing = timing or DEFAULT_TIMING  # the patience of its database calls (and a storage's timing)
        self.storage = storage or open_storage(storage_url, create=False, timing=self.timing)
        self.study = resilient(lambda: load_study(self.storage, name), "loading the study", self.timing.db_patience_s)
        self.study_id = study_id_of(self.study)
        # Read through resilient too: a connection lost between loading the study and reading its
        # settings would otherwise kill the worker while it opens its queue.
        attrs = resilient(lambda: self.study.user_attrs, "reading the study's settings", self.timing.db_patience_s)
        self.settings = StudySettings.from_attrs(attrs, name)
        self.name = name
        self.rule = make_rule(self.settings)  # the study's stopping rule (search/_rules.py)
        self.rungs = (RungDecisions(self.storage, self.study, self.study_id, self.settings.plan, self.rule)
                      if self.rule.n_rungs else None)  # a rule that holds trials at rungs decides them here
        self._ladder: dict[str, Any] | None = None  # a ladder budget's plan, once filled (_fill_ladder)
        self._ladder_slots: set[int] | None = None  # its assigned phase-1 slots, once stored (_assigned_slots)
        self._below: list[PlanUpkeep] | None = None  # the smaller budgets of its ladder
        self._postgres = self.storage.engine.dialect.name == "postgresql"
        # A RUNNING trial silent for this long is failed and retried (Optuna's rule: grace, else 2 beats).
        beat = self.storage.heartbeat_interval
        self._grace = dt.timedelta(seconds=float(self.storage.grace_period or 2 * beat)) if beat else None
        self._phase3_cache: list[dict[str, Any]] | None = None  # confirmation assignment, once made
        self._light = _LightCache()  # finished trials, read once (see _light_trials)
        # One lock for what the worker's heartbeat thread (its periodic maintain) and the main
        # thread share: self._light and the views of it that _light_trials returns.
        self._cache_lock = threading.RLock()

    def study_attr(self, key: str) -> Any:
        """A study user attribute read fresh from the database (not Optuna's cached study)."""
        return study_attr(self.storage, self.study_id, key)

    # ----------------------------------------------------------------------- plan upkeep
    def maintain(self, blocking: bool = True) -> PlanStatus:
        """Reap stale trials, retry lost ones, create phase 2 when phase 1 is final.

        blocking=False (the periodic upkeep of busy workers) skips the round when another worker
        holds the plan lock: that worker is doing the same upkeep.
        """
        return resilient(lambda: self._maintain(blocking), "plan upkeep", self.timing.db_patience_s)

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
        if self.settings.options.ladder_below and self._ladder is None:
            self._fill_ladder()
        if self.rungs is not None and self.rungs.decide(trials, self.never_filled()):
            trials = self._light_trials()  # held trials were promoted or pruned
        status, retry, phase1_final = self._status(trials)
        self._retry(retry)
        needs_phase2 = bool(self._light.phase2_slots) and not status.phase2_created  # (set by _status)
        if phase1_final and needs_phase2:
            params = best_phase1_params(self.storage, self.settings, trials)
            self.study.set_user_attr(settings_attr("phase2_params"), params)
            enqueue_missing(self.study, self.settings, phase=2, params=params)
        confirm = status.phase12_final and (status.phase3_pending or status.second_wave_due)
        if confirm:
            self._create_phase3(trials, decide=status.second_wave_due)
        if retry or (phase1_final and needs_phase2) or confirm:
            status, _, _ = self._status(self._light_trials())
        return status

    def _retry(self, retry: list[_LightTrial]) -> None:
        """Enqueue the next attempt of each failed trial to retry, with what it carries."""
        for light in retry:
            t = self.storage.get_trial(light.trial_id)
            attempt = int(t.user_attrs.get(Attr.ATTEMPT, 1)) + 1
            extra = {k: t.user_attrs[k] for k in _CARRIED_KEYS if t.user_attrs.get(k) is not None}
            slot = t.user_attrs[Attr.PLAN_SLOT]
            # the plan's own attributes of the slot (an IsoFLOP trial's C, N and D), as its first attempt had
            planned = next((e.attrs for e in self.settings.plan if e.slot == slot and e.attrs), None) or {}
            if t.user_attrs.get(OOM_SHARED_KEY) or t.user_attrs.get(WHOLE_GPU_KEY):
                extra[WHOLE_GPU_KEY] = True  # retried on a GPU of its own (and stays there)
            self.study.enqueue_trial(
                {k: v for k, v in (t.params or t.system_attrs.get("fixed_params", {})).items()
                 if k in PARAM_NAMES},  # the design's parameters; the claim adds the architecture's
                user_attrs={
                    **planned, Attr.PLAN_SLOT: slot, Attr.PHASE: t.user_attrs.get(Attr.PHASE, 0),
                    Attr.ATTEMPT: attempt, Attr.RETRY_OF: t.number, **extra,
                },
            )

    # -------------------------------------------------------------------------- reaping
    def _stale_candidates(self) -> list[int]:
        """RUNNING trials whose heartbeat is older than the grace period (a read, no locks)."""
        if self._grace is None:  # heartbeats off: nothing is ever stale
            return []
        T, H = m.TrialModel, m.TrialHeartbeatModel
        with read_scope(self.storage) as s:
            cutoff = db_now(s) - self._grace
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
        (PostgreSQL; SQLite's write transaction holds the database) and read again first; a row
        another transaction holds locked (a stalled worker's) is skipped, reaped by a later upkeep."""
        if not candidates or self._grace is None:
            return []
        T, H = m.TrialModel, m.TrialHeartbeatModel
        with session_scope(self.storage) as s:
            q = sa.select(T.trial_id).where(T.trial_id.in_(candidates), T.state == TrialState.RUNNING)
            running = list(s.execute(q.with_for_update(skip_locked=True) if self._postgres else q).scalars())
            cutoff = db_now(s) - self._grace
            stale = list(s.execute(
                sa.select(H.trial_id).where(H.trial_id.in_(running), H.heartbeat < cutoff)
            ).scalars()) if running else []
            if stale:
                end_trials(s, stale, TrialState.FAIL)
        return stale

    # ------------------------------------------------------------------ ladder planning
    def _fill_ladder(self) -> None:
        """A ladder budget's phase 1, once every smaller budget's plan is final (under the plan lock):
        what is carried up is stored in the study before its slots are enqueued and reused after, so
        racing or killed upkeeps fill the plan once (search/_ladder.py)."""
        ladder = self.study_attr(LADDER_KEY)
        if ladder is None:
            if self._below is None:
                self._below = [PlanUpkeep(self.storage_url, n, storage=self.storage, timing=self.timing)
                               for n in self.settings.options.ladder_below]
            if not all(u.status().done for u in self._below):
                return
            ladder = ladder_record(self, self._below)
            self.study.set_user_attr(LADDER_KEY, ladder)
        enqueue_missing(self.study, self.settings, phase=1, ladder=ladder)
        self._ladder = ladder

    def never_filled(self) -> set[int]:
        """The plan slots no trial will ever come to (search/_status._never_filled): a ladder budget's
        phase-1 slots beyond its region, confirmation ranks that did not finish; the progress
        display counts them as done, not as work left."""
        ranks = self._phase3()
        assigned = listed(ranks) if ranks is not None else None
        ladder = self._assigned_slots()
        return {e.slot for e in self.settings.plan if _never_filled(e, assigned, ladder)}

    def undecided(self) -> set[int]:
        """The confirmation slots of second-wave ranks not decided yet (search/_confirmation.py
        `waiting`): trained only if the first wave leaves the rank within noise of its leader; the
        ETA gives the time left without them and with them (cluster/_flops.py `eta_range`)."""
        ranks = self._phase3()
        wait = set(waiting(ranks)) if ranks is not None else set()
        return {e.slot for e in self.settings.plan if e.phase == 3 and int(e.rank or 0) in wait} if wait else set()

    def _assigned_slots(self) -> set[int] | None:
        """A ladder budget's phase-1 slots given an architecture by its stored record (None: off the
        ladder, or no record yet, when every slot waits).  Read fresh, not from _fill_ladder, so a
        status read by another budget's upkeep or the progress display knows the skipped slots too;
        the record is written once, so it is cached once seen."""
        if self._ladder_slots is None and self.settings.options.ladder_below:
            record = self._ladder if self._ladder is not None else self.study_attr(LADDER_KEY)
            if record is not None:
                self._ladder_slots = {int(a["slot"]) for a in record.get("assignments", [])}
        return self._ladder_slots

    # ------------------------------------------------------------------ confirmation (phase 3)
    def _phase3(self, fresh: bool = False) -> list[dict[str, Any]] | None:
        """The confirmation assignment (StudySettings.phase3), read from the study once it exists, and
        again while a sequential confirmation's later ranks wait for their decision (made by any
        worker's upkeep)."""
        if self._phase3_cache is not None and waiting(self._phase3_cache):
            self._phase3_cache = None
            fresh = True
        if self._phase3_cache is None and any(e.phase == 3 for e in self.settings.plan):
            if fresh or self.settings.phase3 is None:
                self._phase3_cache = self.study_attr(PHASE3_KEY)
            else:
                self._phase3_cache = self.settings.phase3
        return self._phase3_cache

    def _create_phase3(self, trials: Sequence[_LightTrial], decide: bool = False) -> None:
        """Rank the architectures of phases 1-2 and enqueue their confirmation slots (under the
        plan lock; idempotent: an assignment once stored is reused, filled slots are skipped).
        A sequential confirmation (search/_confirmation.py) stores its later ranks as waiting and,
        once the first wave is final (`decide`), their decisions, each before anything is enqueued."""
        ranks = self._phase3(fresh=True)
        if ranks is None:
            ranks = rank_architectures(self.storage, self.study_id, self.settings, trials)
            if ranks:  # the rules' shapes, trained like the searched best (search/_baselines.py), and
                # the best at other learning rates (--lr-probe, search/_lrfit.py)
                ranks += baseline_assignments(self.settings.plan, self.settings.archs, ranks[0],
                                              self.settings.budget_value)
                ranks += probe_assignments(self.settings.plan, ranks[0])
            if self.settings.options.confirm_at_rung:  # where this budget trusts a rung, confirmed there
                ranks = mark_rung(ranks, (self._ladder or self.study_attr(LADDER_KEY) or {}).get("trust"))
            if self.settings.options.confirm_sequential:
                ranks = mark_waves(ranks)
            self.study.set_user_attr(PHASE3_KEY, ranks)
        elif decide and waiting(ranks):
            done = self.storage.get_all_trials(self.study_id, deepcopy=False,
                                               states=(TrialState.COMPLETE, TrialState.PRUNED))
            ranks = decide_waiting(ranks, done)
            self.study.set_user_attr(PHASE3_KEY, ranks)
        self._phase3_cache = ranks
        go = trained(ranks)
        enqueue_missing(self.study, self.settings, phase=3, ranks=[r for r in ranks if int(r["rank"]) in go])

    # ------------------------------------------------------------------------- the status
    def status(self) -> PlanStatus:
        """Plan progress without taking the plan lock or changing anything (progress display)."""
        with self._cache_lock:
            return self._status(self._light_trials())[0]

    def _light_trials(self) -> _Trials:
        """State, value and the bookkeeping attrs of every trial, read lightly (_LightCache.refresh)."""
        return self._light.refresh(self.storage, self.study_id)

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
        assigned = listed(ranks) if ranks is not None else set()
        go, wait = (trained(ranks), waiting(ranks)) if ranks is not None else (set(), [])
        first_wave_open = False
        ladder = self._assigned_slots()
        st.phase12_final = True
        st.phase3_pending = has_phase3 and ranks is None
        retry: list[_LightTrial] = []
        phase1_final = True
        durations: list[float] = []
        st.complete, st.pruned, st.failed, st.final, st.retries, st.at_rung = c.totals
        settled_durations = (c.duration_sum, c.duration_n)  # before this call settles more slots
        for entry in list((c.pending or {}).values()):
            ts = sorted(by_slot.get(entry.slot, []), key=lambda t: t.number)
            skip = _never_filled(entry, assigned if ranks is not None else None, ladder)
            final = _count_slot(st, ts, skip, retry, durations)
            st.retries += sum(1 for t in ts if Attr.RETRY_OF in t.user_attrs)
            st.final += final
            if final and ts and trials is c.last:  # settled by its trials (not a skipped slot)
                c.settle(entry.slot, ts)
            if entry.phase == 1 and not final:
                phase1_final = False
            if entry.phase in (1, 2) and not final:
                st.phase12_final = False
            if entry.phase == 3 and not ts and int(entry.rank or 0) in go:
                st.phase3_pending = True  # assigned but not enqueued (upkeep stopped in between)
            first_wave_open |= entry.phase == 3 and not final and int(entry.rank or 0) in go
        st.second_wave_due = bool(wait) and not first_wave_open
        _finish_status(st, c, trials, durations, settled_durations)
        why_waiting(st, self.settings.options.ladder_below, has_phase3 and ranks is None, wait, ladder)
        return st, retry, phase1_final
