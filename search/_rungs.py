"""Rung decisions, made and applied by the plan's upkeep under the plan lock (search/_upkeep.py):
which trials held at a rung go on, and which are pruned there.  What is promoted is the study's
stopping rule's `decide` (search/_rules.py; successive halving: the best 1/eta); this module holds
the bookkeeping every rule that holds trials shares: rung membership, storing, applying.

On a --ladder a study judges only the rungs its ladder record trusts (search/_trust.py): its
`StudyTrust` says which, for the upkeep's decisions here and the queue's claims alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from archhpo.schema import Attr
from archhpo.search._rules import StoppingRule, on_ladder, prunable
from archhpo.search._settings import LADDER_KEY
from archhpo.search._status import _LightTrial, _rung_scores
from archhpo.search._storage import session_scope
from archhpo.search._tables import add_value, end_trials, set_attrs, study_attr
from archhpo.search._trust import EVERY_RUNG, RungTrust

if TYPE_CHECKING:
    from archhpo.search._plan import PlanEntry

HALVING_KEY = "archhpo_halving"  # the study's rung decisions: {phase: [promoted slots of rung 0, 1, ...]}


class StudyTrust:
    """The rungs a study judges (a RungTrust), read from its ladder record once it has one.

    Off the ladder: every rung, without a read.  On it: the record's trust; a study without a
    record (the smallest budget; a larger one not planned yet, so with no trials) judges nothing.
    The record is written once, before the budget's trials are enqueued, so it is cached once seen
    and every claim and decision of a trial reads the same trust."""

    def __init__(self, storage: RDBStorage, study_id: int, rule: StoppingRule) -> None:
        self.storage, self.study_id = storage, study_id
        self._known: RungTrust | None = None if on_ladder(rule) else EVERY_RUNG

    def __call__(self) -> RungTrust:
        if self._known is not None:
            return self._known
        record = study_attr(self.storage, self.study_id, LADDER_KEY)
        trust = RungTrust.from_record(record)
        if record is not None:
            self._known = trust
        return trust


class RungDecisions:
    """The rung decisions of one study whose stopping rule holds trials at rungs."""

    def __init__(self, storage: RDBStorage, study: optuna.Study, study_id: int, plan: list[PlanEntry],
                 rule: StoppingRule) -> None:
        self.storage, self.study, self.study_id = storage, study, study_id
        self.plan, self.rule = plan, rule
        self.trust = StudyTrust(storage, study_id, rule)  # which rungs are judged (the queue asks too)

    def decide(self, trials: Sequence[_LightTrial], never: frozenset[int] | set[int] = frozenset()) -> bool:
        """Make and apply every rung decision that is due (under the plan lock); True if a held
        trial was promoted or pruned.

        Per phase (1 and 2: the prunable ones), rung 0's members are the phase's slots and rung
        r+1's are those promoted from rung r.  A rung is decided once all its members are held at
        it (or failed for good): the rule's decide() of their scores, with the ties within the
        study's noise (search/_trust.py); a rung the study does not judge passes every member on
        (nobody is held there).  The decision is stored in the study before it is applied, and
        applying it again is a no-op, so a worker or driver killed anywhere in between leaves the
        next upkeep to finish the same decision.

        `never`: the slots no trial will come to (a ladder budget's phase-1 slots beyond its region,
        PlanUpkeep.never_filled), no member of any rung: a rung waiting for them would wait forever.
        They are also dropped from a decision stored with them (before this rule), so it goes on."""
        trust = self.trust()
        if not trust.judges_any:  # every trial trains to full length: nothing to decide or store
            return False
        decisions = study_attr(self.storage, self.study_id, HALVING_KEY) or {}
        by_slot: dict[int, list[_LightTrial]] = {}
        for t in trials:
            if t.user_attrs.get(Attr.PLAN_SLOT) is not None:
                by_slot.setdefault(int(t.user_attrs[Attr.PLAN_SLOT]), []).append(t)
        changed = False
        for phase in (1, 2):
            members = [e.slot for e in self.plan if e.phase == phase and prunable(e) and e.slot not in never]
            decided: list[list[int]] = decisions.setdefault(str(phase), [])
            for rung in range(self.rule.n_rungs - 1):
                if not members:
                    break
                if rung == len(decided):
                    promoted = self._decision(trust, rung, members, by_slot)
                    if promoted is None:  # the rung still waits for some of its members
                        break
                    decided.append(promoted)
                    self.study.set_user_attr(HALVING_KEY, decisions)
                changed |= self._apply_rung(rung, members, decided[rung], by_slot)
                members = [slot for slot in decided[rung] if slot not in never]
        return changed

    def _decision(self, trust: RungTrust, rung: int, members: list[int],
                  by_slot: dict[int, list[_LightTrial]]) -> list[int] | None:
        """The members of `rung` that go on, or None while it waits for some of them."""
        if not trust.judges(rung):
            return list(members)  # passed in passing: the next judged rung holds them all
        scores = _rung_scores(rung, members, by_slot)
        return None if scores is None else trust.ties(self.rule.decide(rung, scores), scores, rung)

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
                    set_attrs(s, t.trial_id, {Attr.RUNG_HOLD: False, "state_note": f"promoted to rung {rung + 1}"})
                    continue
                set_attrs(s, t.trial_id, {Attr.RUNG_HOLD: False, "state_note": f"pruned at rung {rung}"})
                add_value(s, t.trial_id, float(t.user_attrs[Attr.RUNG_SCORES][rung]))
                end_trials(s, t.trial_id, TrialState.PRUNED)
        return True
