"""A --ladder budget's record (search/_settings.py LADDER_KEY): what is carried up from the smaller
budgets' finished trials (search/_ladder.py `carry_up`) and which rungs the budget may prune at
(search/_trust.py), built once by the upkeep under the plan lock and stored before any of the
budget's trials is enqueued (PlanUpkeep._fill_ladder), so every claim and rung decision reads one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from optuna.trial import TrialState

from archhpo.budgets import GridRow
from archhpo.schema import TRAINING_PARAMS, Attr
from archhpo.search._ladder import Finished, carry_up
from archhpo.search._settings import LADDER_KEY
from archhpo.search._trust import FOR_ABOVE, TRUST_THRESHOLD, ArchRuns, rung_trust

if TYPE_CHECKING:
    from optuna.storages import RDBStorage

    from archhpo.search._rules import StoppingRule
    from archhpo.search._settings import StudySettings


class Upkeep(Protocol):
    """What a budget's record reads of a budget: search/_upkeep.py's PlanUpkeep passes itself and
    the smaller budgets' upkeeps, and this module imports nothing of the upkeep (no circle)."""

    name: str
    settings: StudySettings
    storage: RDBStorage
    study_id: int
    rule: StoppingRule

    def study_attr(self, key: str) -> Any: ...


def ladder_record(upkeep: Upkeep, below: Sequence[Upkeep]) -> dict[str, Any]:
    """carry_up from the next smaller budget's COMPLETE phase-1/2 trials; the learning-rate
    exponent is fitted on every smaller budget's (search/_lrfit.py), its prior's regime read
    from whether the study trains on a fixed data per parameter (--tokens-per-param)."""
    settings = upkeep.settings
    finished = [(u.settings.budget_value, _finished(u)) for u in below]
    smaller = below[-1]
    slots = [e.slot for e in settings.plan if e.phase == 1]
    out = carry_up(finished[-1][1], smaller.settings.budget_value, settings.budget_value,
                   [GridRow(**a) for a in settings.archs], settings.search_space, slots,
                   int(settings.options.seed), below=finished, data_grows=settings.options.budget is not None,
                   finalists=settings.options.carry_finalists, parametrization=settings.options.parametrization,
                   base_depth=settings.options.mup_base_depth)
    # Which rungs this budget may prune at (search/_trust.py); stored in the same write as the
    # rest, before any trial is enqueued, so every claim and rung decision of this budget reads one trust.
    out["trust"] = _no_rung(smaller) if settings.options.carry_finalists else _trust(upkeep, below)
    return {**out, "from": smaller.name, "from_budget": smaller.settings.budget}


def _no_rung(smaller: Upkeep) -> dict[str, Any]:
    """--carry-finalists' trust at the ladder's largest budget: measured (so nothing is scored in
    passing) and trusting no rung, so every trial, confirmation included, trains to full length."""
    return {"trusted": [], "rungs": [], "threshold": TRUST_THRESHOLD, "carry_finalists": True,
            "reason": f"--carry-finalists: the finalists of {smaller.settings.budget} and the extremes"}


def _trust(upkeep: Upkeep, below: Sequence[Upkeep]) -> dict[str, Any]:
    """The rung trust, measured on the smallest budget, trained to the end; under
    --trust-each-budget on the next smaller budget where its trials scored their rungs in passing
    for it, or carried from it where it pruned at a trusted rung (its survivors are a selected
    sample: their scores would overstate the agreement)."""
    options, source = upkeep.settings.options, below[0]
    if options.trust_each_budget and len(below) > 1:  # the next smaller budget is not the smallest
        nearer = (below[-1].study_attr(LADDER_KEY) or {}).get("trust") or {}
        if nearer.get("trusted"):
            return {**nearer, FOR_ABOVE: options.scored_for_above}
        if nearer.get(FOR_ABOVE):
            source = below[-1]
    trust = rung_trust(_arch_runs(source, max(upkeep.rule.n_rungs - 1, 0)), seed=int(options.seed))
    trust["from_budget"] = source.settings.budget
    if options.trust_each_budget:
        trust[FOR_ABOVE] = options.scored_for_above
    return trust


def _arch_runs(upkeep: Upkeep, below: int) -> list[ArchRuns]:
    """A budget's COMPLETE trials as the rung trust reads them: per architecture, each trial's
    scores at the `below` rungs under full length (recorded in passing) and its full-length value."""
    runs: dict[int, tuple[list[list[float]], list[float]]] = {}
    for t in upkeep.storage.get_all_trials(upkeep.study_id, deepcopy=False, states=(TrialState.COMPLETE,)):
        scores = [float(v) for v in t.user_attrs.get(Attr.RUNG_SCORES) or []][:below]
        if t.value is None or not math.isfinite(t.value) or len(scores) < below:
            continue  # a trial from before its rungs were recorded says nothing about them
        if t.user_attrs.get(Attr.LR_PROBE) is not None:
            continue  # trained at another rate than its architecture's: not its architecture's evidence
        rungs, finals = runs.setdefault(int(t.params["arch_idx"]), ([], []))
        rungs.append(scores)
        finals.append(float(t.value))
    return [ArchRuns((k,), rungs, finals) for k, (rungs, finals) in sorted(runs.items())]


def _finished(upkeep: Upkeep) -> list[Finished]:
    """A budget's COMPLETE trials with a finite value (confirmation included: the top is ranked
    on means, and a confirmed architecture's seeds are the best evidence of it; --lr-probe's runs
    marked, read for the learning rate only)."""
    done = upkeep.storage.get_all_trials(upkeep.study_id, deepcopy=False, states=(TrialState.COMPLETE,))
    return [
        Finished(float(t.value), t.number, int(t.user_attrs["d_model"]), int(t.user_attrs["n_layers"]),
                 (int(t.params["arch_idx"]),), {k: t.params[k] for k in TRAINING_PARAMS},
                 n_heads=int(t.user_attrs.get("n_heads", 0)), d_ff=int(t.user_attrs.get("d_ff", 0)),
                 lr_probe=t.user_attrs.get(Attr.LR_PROBE) is not None)
        for t in done
        if t.value is not None and math.isfinite(t.value) and t.user_attrs.get(Attr.PHASE) in (1, 2, 3)
    ]
