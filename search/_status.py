"""What the plan's upkeep counts: the study's trials read lightly (state, value and the few
bookkeeping attributes), a cache of the finished ones between calls, and the per-slot rules that
turn them into a PlanStatus (final, retried, held at a rung). PlanUpkeep (search/_upkeep.py) owns
the cache, its lock and the database reads; this module holds no state of its own."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from optuna.trial import TrialState

from archhpo.schema import Attr
from archhpo.search._optuna_private import models as m
from archhpo.search._storage import read_scope

if TYPE_CHECKING:
    from archhpo.search._plan import PlanEntry

MAX_ATTEMPTS = 2  # a trial whose worker vanished is retried once with the same parameters
FINAL_FAIL_KEY = Attr.FAIL_REASON  # set by a worker: a deliberate FAIL (NaN, OOM, refused) is final
# ... except an out-of-memory error of a trial that shared its GPU (the worker sets this too): it
# is retried once with WHOLE_GPU_KEY, which only workers with a GPU of their own claim.
OOM_SHARED_KEY = Attr.OOM_SHARED
WHOLE_GPU_KEY = Attr.WHOLE_GPU


@dataclass
class PlanStatus:
    total: int
    final: int = 0
    complete: int = 0
    pruned: int = 0
    # PRUNED too, but not pruned: confirmation runs that ended at their rung (--confirm-at-rung) with a score
    at_rung: int = 0
    failed: int = 0
    running: int = 0
    waiting: int = 0
    best_value: float | None = None
    mean_duration_s: float | None = None
    phase2_created: bool = False
    phase12_final: bool = False  # every phase-1 and phase-2 slot is final (confirmation may start)
    phase3_pending: bool = False  # confirmation slots still to be assigned or enqueued
    second_wave_due: bool = False  # a sequential confirmation's first wave is final: decide the later ranks
    # Slots final without a trial (_never_filled): confirmation ranks beyond the architectures that
    # finished, and a ladder budget's phase-1 slots beyond its region's size.
    skipped: int = 0
    retries: int = 0
    whole_gpu_waiting: int = 0  # WAITING trials only a worker with a whole GPU may claim
    held: int = 0  # WAITING trials held at a successive-halving rung until its decision
    running_since: list[dt.datetime] = field(default_factory=list)  # when each RUNNING trial was claimed
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.final >= self.total

    @property
    def waits_for(self) -> str:
        """Why a budget that is not done has nothing to train (no trial running or queued), in words:
        the earliest phase's note of `details` (a ladder budget before its smaller ones, a
        confirmation's second wave before its first; a later phase's wait follows from it); "" while
        it has work, or no reason was recorded.  The progress display and an idle worker say it."""
        if self.done or self.running or self.waiting or not self.details:
            return ""
        return str(min(self.details.items())[1])  # "phase1" < "phase2" < "phase3"


_STATUS_KEYS = (Attr.PLAN_SLOT, Attr.PHASE, Attr.ATTEMPT, Attr.RETRY_OF, Attr.FAIL_REASON, Attr.DURATION_S,
                Attr.OOM_SHARED, Attr.WHOLE_GPU, Attr.RUNG, Attr.RUNG_SCORES, Attr.RUNG_HOLD, Attr.CONFIRM_RUNG)


@dataclass
class _LightTrial:
    trial_id: int
    number: int
    state: TrialState
    value: float | None
    user_attrs: dict[str, Any]
    started: dt.datetime | None = None  # the current claim's start (RUNNING trials)


class _Trials(Sequence[_LightTrial]):
    """Every trial of the study as _light_trials read it: the kept finished ones, then the live."""

    def __init__(self, final: dict[int, _LightTrial], live: list[_LightTrial]) -> None:
        self.final, self.live = final, live

    def __iter__(self) -> Iterator[_LightTrial]:
        yield from list(self.final.values())  # a snapshot: another thread's upkeep may add to it
        yield from self.live

    def __len__(self) -> int:
        return len(self.final) + len(self.live)

    def __getitem__(self, i: Any) -> Any:
        return list(self)[i]


@dataclass
class _CompletedValues:
    """The intermediate values of COMPLETE trials by step, sorted, and which trials they cover."""

    ID_MARGIN = 256  # value rows re-read below the newest seen: finishes in flight commit later
    by_step: dict[int, list[float]] = field(default_factory=dict)
    trials: set[int] = field(default_factory=set)
    mark: int = 0  # the newest trial_values id seen


def _read_light(s: Any, study_id: int, cond: Any) -> tuple[list[Any], dict[int, float], dict[int, dict[str, Any]]]:
    """(trial_id, number, state, datetime_start) rows, values and bookkeeping attrs of the study's
    trials matching `cond`."""
    T = m.TrialModel
    started = T.__table__.c.datetime_start  # the column (Optuna's model types the attribute loosely)
    rows = s.execute(sa.select(T.trial_id, T.number, T.state, started).where(T.study_id == study_id, cond)).all()
    values = dict(s.execute(
        sa.select(m.TrialValueModel.trial_id, m.TrialValueModel.value)
        .join(T, T.trial_id == m.TrialValueModel.trial_id)
        .where(T.study_id == study_id, m.TrialValueModel.objective == 0, cond)
    ).all())
    attrs: dict[int, dict[str, Any]] = {}
    for tid, key, text in s.execute(
        sa.select(m.TrialUserAttributeModel.trial_id, m.TrialUserAttributeModel.key,
                  m.TrialUserAttributeModel.value_json)
        .join(T, T.trial_id == m.TrialUserAttributeModel.trial_id)
        .where(T.study_id == study_id, m.TrialUserAttributeModel.key.in_(_STATUS_KEYS), cond)
    ):
        attrs.setdefault(tid, {})[key] = json.loads(text)
    return list(rows), values, attrs


def _open_slots(c: _LightCache, trials: Sequence[_LightTrial], plan: list[PlanEntry]) -> dict[int, list[_LightTrial]]:
    """The trials of each slot not yet settled (the plan's open entries are kept in `c.pending`)."""
    if c.pending is None or c.plan_id != id(plan):
        c.pending, c.plan_id = {e.slot: e for e in plan if e.slot not in c.settled}, id(plan)
        c.phases = {e.phase for e in plan}
        c.phase2_slots = [e.slot for e in plan if e.phase == 2]
    by_slot: dict[int, list[_LightTrial]] = {}
    # `trials` is _light_trials()'s list: its finished trials of settled slots are not looked at again.
    for t in (*c.unsettled.values(), *c.live_trials) if trials is c.last else trials:
        slot = t.user_attrs.get(Attr.PLAN_SLOT)
        if slot is not None and int(slot) not in c.settled:
            by_slot.setdefault(int(slot), []).append(t)
    return by_slot


def _never_filled(entry: PlanEntry, ranks: set[int] | None, ladder: set[int] | None) -> bool:
    """Whether no trial will ever come to the slot, so that, without one, it is final: a confirmation
    rank missing from the stored `ranks` (fewer architectures finished than --confirm asked for), or
    a ladder budget's phase-1 slot missing from its stored record's assigned `ladder` slots (beyond
    the region's size).  Until the ranks or the record are stored (None) the slot waits for them."""
    if entry.phase == 3:
        return ranks is not None and int(entry.rank or 0) not in ranks
    return entry.phase == 1 and entry.arch_idx is None and ladder is not None and entry.slot not in ladder


def _ended_at_rung(t: _LightTrial) -> bool:
    """A PRUNED confirmation run of --confirm-at-rung: it ended at its rung by plan, with a score."""
    return t.state == TrialState.PRUNED and t.user_attrs.get(Attr.CONFIRM_RUNG) is not None


def _count_slot(st: PlanStatus, ts: list[_LightTrial], skip: bool, retry: list[_LightTrial],
                durations: list[float]) -> bool:
    """Count one open slot's trials (oldest first) into `st`; True when its outcome is final.

    A failed slot is retried (its last trial appended to `retry`) while attempts remain or after an
    OOM on a shared GPU; `skip`: the slot will never be filled (_never_filled), final once empty."""
    if any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in ts):
        st.running += sum(t.state == TrialState.RUNNING for t in ts)
        st.running_since += [t.started for t in ts if t.state == TrialState.RUNNING and t.started is not None]
        st.waiting += sum(t.state == TrialState.WAITING for t in ts)
        st.whole_gpu_waiting += sum(
            t.state == TrialState.WAITING and bool(t.user_attrs.get(WHOLE_GPU_KEY)) for t in ts
        )
        st.held += sum(t.state == TrialState.WAITING and bool(t.user_attrs.get(Attr.RUNG_HOLD)) for t in ts)
        return False
    if any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in ts):
        done = next(t for t in ts if t.state in (TrialState.COMPLETE, TrialState.PRUNED))
        st.complete += done.state == TrialState.COMPLETE
        st.pruned += done.state == TrialState.PRUNED and not _ended_at_rung(done)
        st.at_rung += _ended_at_rung(done)
        if Attr.DURATION_S in done.user_attrs:
            durations.append(float(done.user_attrs[Attr.DURATION_S]))
        return True
    if not ts:
        st.skipped += skip
        return skip
    if _will_retry(ts):  # only FAILs
        retry.append(ts[-1])
        return False
    st.failed += 1
    return True


def _rung_scores(rung: int, members: list[int], by_slot: dict[int, list[_LightTrial]]) -> dict[int, float] | None:
    """Every member's score at `rung` (inf: failed for good), or None while one is still on its way."""
    scores: dict[int, float] = {}
    for slot in members:
        ts = sorted(by_slot.get(slot, []), key=lambda t: t.number)
        live = [t for t in ts if t.state in (TrialState.WAITING, TrialState.RUNNING)]
        if live:
            t = live[-1]
            if not (t.state == TrialState.WAITING and t.user_attrs.get(Attr.RUNG_HOLD)
                    and int(t.user_attrs.get(Attr.RUNG, -1)) == rung):
                return None
            scores[slot] = float(t.user_attrs[Attr.RUNG_SCORES][rung])
        elif ts and all(t.state == TrialState.FAIL for t in ts) and not _will_retry(ts):
            scores[slot] = math.inf
        else:  # not created yet, a retry still to be enqueued, or finished without being held
            return None
    return scores


def _will_retry(ts: list[_LightTrial]) -> bool:
    """A slot whose trials all FAILed gets another attempt: its worker vanished (no fail_reason)
    and attempts remain, or it ran out of memory sharing a GPU (retried once on a whole GPU)."""
    last = ts[-1]
    lost = FINAL_FAIL_KEY not in last.user_attrs
    oom_shared = bool(last.user_attrs.get(OOM_SHARED_KEY)) and not any(t.user_attrs.get(WHOLE_GPU_KEY) for t in ts)
    return (lost and int(last.user_attrs.get(Attr.ATTEMPT, 1)) < MAX_ATTEMPTS) or oom_shared


def _finish_status(st: PlanStatus, c: _LightCache, trials: Sequence[_LightTrial], durations: list[float],
                   settled_durations: tuple[float, int]) -> None:
    """The study-wide figures: best value of phases 1-2, mean trial duration, phase-2 note."""
    # The best value of phases 1-2 (the study's answer); confirmation retrains are not in it.
    if trials is c.last:
        st.best_value = c.best
    else:
        values = [t.value for t in trials if t.state == TrialState.COMPLETE and t.value is not None
                  and t.user_attrs.get(Attr.PHASE) != 3]
        st.best_value = min(values) if values else None
    n_durations = len(durations) + settled_durations[1]
    st.mean_duration_s = (sum(durations) + settled_durations[0]) / n_durations if n_durations else None
    if not st.phase2_created and c.phase2_slots:
        st.details["phase2"] = "waiting for phase 1"


@dataclass
class _LightCache:
    """What _light_trials keeps between calls: finished trials (immutable) and the live ids."""

    FULL_RELOAD_S = 600.0
    final: dict[int, _LightTrial] = field(default_factory=dict)
    live: set[int] = field(default_factory=set)
    max_seen: int = 0
    loaded_at: float = field(default_factory=time.monotonic)
    live_trials: list[_LightTrial] = field(default_factory=list)
    last: _Trials | None = None  # what _light_trials returned last
    # What _status keeps of slots whose outcome is settled (a COMPLETE/PRUNED trial or a final
    # failure: it never changes): their counts, and finished trials of unsettled slots only.
    settled: set[int] = field(default_factory=set)
    unsettled: dict[int, _LightTrial] = field(default_factory=dict)  # finished trials of open slots
    by_slot_ids: dict[int, list[int]] = field(default_factory=dict)
    totals: list[int] = field(default_factory=lambda: [0] * 6)  # complete pruned failed final retries at_rung
    duration_sum: float = 0.0
    duration_n: int = 0
    best: float | None = None  # best COMPLETE value of phases 1-2
    pending: dict[int, PlanEntry] | None = None  # plan entries of unsettled slots
    plan_id: int = 0
    phases: set[int] = field(default_factory=set)
    phase2_slots: list[int] = field(default_factory=list)

    def reset(self) -> None:
        fresh = _LightCache()
        self.__dict__.update(fresh.__dict__)

    def add_final(self, t: _LightTrial) -> None:
        if t.trial_id in self.final:  # (the heartbeat thread's upkeep may race the main thread's)
            return
        self.final[t.trial_id] = t
        slot = t.user_attrs.get(Attr.PLAN_SLOT)
        if slot is None or int(slot) not in self.settled:
            self.unsettled[t.trial_id] = t
            if slot is not None:
                self.by_slot_ids.setdefault(int(slot), []).append(t.trial_id)
        if t.state == TrialState.COMPLETE and t.value is not None and t.user_attrs.get(Attr.PHASE) != 3:
            self.best = t.value if self.best is None else min(self.best, t.value)

    def settle(self, slot: int, ts: list[_LightTrial]) -> None:
        if slot in self.settled:  # counted once, whichever thread gets here first
            return
        outcome = next((t for t in ts if t.state in (TrialState.COMPLETE, TrialState.PRUNED)), None)
        self.settled.add(slot)
        if self.pending is not None:
            self.pending.pop(slot, None)
        for tid in self.by_slot_ids.pop(slot, []):
            self.unsettled.pop(tid, None)
        self.totals[0] += outcome is not None and outcome.state == TrialState.COMPLETE
        self.totals[1] += outcome is not None and outcome.state == TrialState.PRUNED and not _ended_at_rung(outcome)
        self.totals[2] += outcome is None
        self.totals[3] += 1
        self.totals[4] += sum(1 for t in ts if Attr.RETRY_OF in t.user_attrs)
        self.totals[5] += outcome is not None and _ended_at_rung(outcome)
        if outcome is not None and Attr.DURATION_S in outcome.user_attrs:
            self.duration_sum += float(outcome.user_attrs[Attr.DURATION_S])
            self.duration_n += 1

    def refresh(self, storage: Any, study_id: int) -> _Trials:
        """State, value and the bookkeeping attrs of every trial: the upkeep runs often, and
        Optuna's get_all_trials would load every param and attribute.

        Bounded by the live part of the study, not its size: a finished trial (COMPLETE, PRUNED,
        FAIL) never changes again, so each is read once and kept; every call reads only the
        WAITING and RUNNING trials, trials newer than any seen, and those that were live last
        time and have finished since.  A full re-read every FULL_RELOAD_S is the safety net.
        """
        c = self
        if time.monotonic() - c.loaded_at > _LightCache.FULL_RELOAD_S:
            c.reset()
        live_states = (TrialState.RUNNING, TrialState.WAITING)
        T = m.TrialModel
        with read_scope(storage) as s:
            def read(cond: Any) -> tuple[list[Any], dict[int, float], dict[int, dict[str, Any]]]:
                return _read_light(s, study_id, cond)

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


def why_waiting(st: PlanStatus, below: Sequence[str], no_ranks: bool, wait: list[int], ladder: set[int] | None) -> None:
    """What the plan waits for, in words (PlanStatus.details; the progress display shows it while a
    budget has nothing to train): `below` the ladder's smaller studies, `ladder` its assigned slots
    (None: not planned yet), `no_ranks` no confirmation assignment yet, `wait` the ranks waiting
    for the first wave."""
    if below and ladder is None:
        st.details["phase1"] = f"waiting for {below[-1]} (the ladder plans this budget from the smaller ones)"
    if no_ranks:
        st.details["phase3"] = "waiting for phases 1 and 2"
    elif wait:
        st.details["phase3"] = f"rank(s) {', '.join(map(str, wait))} wait for ranks 0-1's confirmation"
