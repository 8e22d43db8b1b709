"""Rung decisions, made and applied by the plan's upkeep under the plan lock (search/_upkeep.py):
which trials held at a rung go on, and which are pruned there.  What is promoted is the study's
stopping rule's `decide` (search/_rules.py; successive halving: the best 1/eta); this module holds
the bookkeeping every rule that holds trials shares: rung membership, storing, applying."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from archhpo.schema import Attr
from archhpo.search._rules import StoppingRule, prunable
from archhpo.search._status import _LightTrial, _rung_scores
from archhpo.search._storage import session_scope
from archhpo.search._tables import add_value, end_trials, set_attrs, study_attr

if TYPE_CHECKING:
    from archhpo.search._plan import PlanEntry

HALVING_KEY = "archhpo_halving"  # the study's rung decisions: {phase: [promoted slots of rung 0, 1, ...]}


class RungDecisions:
    """The rung decisions of one study whose stopping rule holds trials at rungs."""

    def __init__(self, storage: RDBStorage, study: optuna.Study, study_id: int, plan: list[PlanEntry],
                 rule: StoppingRule) -> None:
        self.storage, self.study, self.study_id = storage, study, study_id
        self.plan, self.rule = plan, rule

    def decide(self, trials: Sequence[_LightTrial]) -> bool:
        """Make and apply every rung decision that is due (under the plan lock); True if a held
        trial was promoted or pruned.

        Per phase (1 and 2: the prunable ones), rung 0's members are the phase's slots and rung
        r+1's are those promoted from rung r.  A rung is decided once all its members are held at
        it (or failed for good): the rule's decide() of their scores.  The decision is stored in the study
        before it is applied, and applying it again is a no-op, so a worker or driver killed
        anywhere in between leaves the next upkeep to finish the same decision."""
        decisions = study_attr(self.storage, self.study_id, HALVING_KEY) or {}
        by_slot: dict[int, list[_LightTrial]] = {}
        for t in trials:
            if t.user_attrs.get(Attr.PLAN_SLOT) is not None:
                by_slot.setdefault(int(t.user_attrs[Attr.PLAN_SLOT]), []).append(t)
        changed = False
        for phase in (1, 2):
            members = [e.slot for e in self.plan if e.phase == phase and prunable(e)]
            decided: list[list[int]] = decisions.setdefault(str(phase), [])
            for rung in range(self.rule.n_rungs - 1):
                if not members:
                    break
                if rung == len(decided):
                    scores = _rung_scores(rung, members, by_slot)
                    if scores is None:  # the rung still waits for some of its members
                        break
                    decided.append(self.rule.decide(rung, scores))
                    self.study.set_user_attr(HALVING_KEY, decisions)
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
                    set_attrs(s, t.trial_id, {Attr.RUNG_HOLD: False, "state_note": f"promoted to rung {rung + 1}"})
                    continue
                set_attrs(s, t.trial_id, {Attr.RUNG_HOLD: False, "state_note": f"pruned at rung {rung}"})
                add_value(s, t.trial_id, float(t.user_attrs[Attr.RUNG_SCORES][rung]))
                end_trials(s, t.trial_id, TrialState.PRUNED)
        return True
