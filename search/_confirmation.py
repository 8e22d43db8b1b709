"""A sequential confirmation (--sequential-confirm; the --ladder default): phase 3 in two waves.

The first wave retrains the FIRST_WAVE best architectures of phases 1-2 (and the rules' baselines);
once it is final, each later finalist is retrained only when its search runs lie within the seed
noise of the first wave's leader (the seed std pooled over the first wave's runs), and skipped only
when the leader's lead over it is positive beyond that noise's 95% interval: one more run could not
make a finalist that trails beyond noise the leader's equal.  Its cost on the truths' replays:
docs/searching.md.

The stored assignment (search/_upkeep.py's PHASE3_KEY) is the ranks list of search/_ranking.py,
a later rank marked {"wave": 2} until decided, then with its "decision" (`decide`'s dict);
decisions are made under the plan lock and stored before any slot is enqueued, so racing or killed
upkeeps decide once.  A study without the option confirms every rank at once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from archhpo.schema import Attr
from archhpo.search._noise import pooled_lead
from archhpo.search._plan import is_extra

FIRST_WAVE = 2  # the finalists always confirmed: the two the single-run ranking could swap
WAVE_KEY, DECISION_KEY = "wave", "decision"
# --confirm-at-rung: a finalist's rank confirmed at this rung (the lowest its budget trusts), its
# runs there compared (search/_upkeep.py stores it with the assignment, before anything is enqueued).
AT_RUNG_KEY = "at_rung"


def mark_waves(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks with every finalist beyond the first wave marked as waiting for its decision
    (baselines and learning-rate probes are trained like the best and belong to the first wave)."""
    return [{**r, WAVE_KEY: 2} if int(r["rank"]) >= FIRST_WAVE and not _extra(r) else r for r in ranks]


def mark_rung(ranks: list[dict[str, Any]], trust: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """--confirm-at-rung: the ranks marked to be confirmed at the lowest rung `trust` (the budget's
    ladder record's) trusts, the rules' baselines with them (they are compared with the best seed by
    seed); unchanged where it trusts none.  A learning-rate probe stays at full length: the rate is
    fitted on full-length losses (search/_lrfit.py)."""
    trusted = [int(r) for r in (trust or {}).get("trusted", ())]
    if not trusted:
        return ranks
    return [r if r.get("lr_probe") is not None else {**r, AT_RUNG_KEY: min(trusted)} for r in ranks]


def _extra(rank: Mapping[str, Any]) -> bool:
    return is_extra(rank.get("baseline"), rank.get("lr_probe"))


def waiting(ranks: Iterable[Mapping[str, Any]]) -> list[int]:
    """The ranks of the second wave not decided yet."""
    return [int(r["rank"]) for r in ranks if r.get(WAVE_KEY) == 2 and DECISION_KEY not in r]


def trained(ranks: Iterable[Mapping[str, Any]]) -> set[int]:
    """The ranks whose slots are filled: the first wave, and every later rank decided to confirm."""
    return {int(r["rank"]) for r in ranks
            if r.get(WAVE_KEY) != 2 or (DECISION_KEY in r and r[DECISION_KEY]["confirm"])}


def decide(runs: Mapping[int, Sequence[float]], candidate: int, candidate_runs: Sequence[float]) -> dict[str, Any]:
    """Whether to confirm `candidate` (its search runs `candidate_runs`) after the first wave's
    `runs` ({rank: every finished run of its configuration}): the leader is the first-wave rank with
    the lowest mean (ties: the better rank); the candidate is skipped only when its mean trails
    the leader's beyond the pooled seed noise (`pooled_lead`'s 95% interval above 0).  Without a
    degree of freedom, or without a run, nothing says it is behind: it is confirmed.

    Returns {"confirm", "leader", "leader_mean", "candidate_mean", "lead", "pooled_std", "df", "ci95"}
    (the last four None where no noise was measured)."""
    means = {r: statistics.fmean(v) for r, v in runs.items() if v}
    out: dict[str, Any] = {"confirm": True, "leader": None, "leader_mean": None,
                           "candidate_mean": statistics.fmean(candidate_runs) if candidate_runs else None,
                           "lead": None, "pooled_std": None, "df": None, "ci95": None}
    if not means or not candidate_runs:
        return out
    leader = min(means, key=lambda r: (means[r], r))
    out.update(leader=leader, leader_mean=means[leader])
    graded = pooled_lead({**{r: list(v) for r, v in runs.items()}, candidate: list(candidate_runs)}, leader, candidate)
    if graded is None:
        return out
    out.update(lead=graded["lead"], pooled_std=graded["pooled_std"], df=graded["df"], ci95=graded["ci95"],
               confirm=not graded["ci95"][0] > 0)
    return out


def listed(ranks: Iterable[Mapping[str, Any]]) -> set[int]:
    """The ranks whose slots will be filled or may be (search/_status._never_filled: every other
    confirmation slot is final without a trial)."""
    ranks = list(ranks)
    return trained(ranks) | set(waiting(ranks))


def run_value(t: Any, rung: int | None) -> float | None:
    """What a finished trial (Optuna FrozenTrial) counts as in a confirmation: its full-length value
    (COMPLETE), or, for a rank confirmed at `rung` (--confirm-at-rung), its score there: a
    confirmation run's value (it ended there, PRUNED) or a COMPLETE search run's score recorded at
    that rung.  None: it does not count (pruned search runs, a run without that score)."""
    state = getattr(t.state, "name", t.state)
    if rung is None or t.user_attrs.get(Attr.PHASE) not in (1, 2):
        counts = state == "COMPLETE" if rung is None else t.user_attrs.get(Attr.CONFIRM_RUNG) == rung
        value = t.value if counts else None
    else:
        scores = t.user_attrs.get(Attr.RUNG_SCORES) or []
        value = scores[rung] if state == "COMPLETE" and len(scores) > rung else None
    return float(value) if value is not None and math.isfinite(value) else None


def decide_waiting(ranks: Sequence[Mapping[str, Any]], done: Iterable[Any]) -> list[dict[str, Any]]:
    """The ranks with every waiting one decided (`decide`), from the study's finished trials `done`
    (Optuna FrozenTrials): a first-wave rank's runs are its confirmation runs and its configuration's
    phase-1/2 runs trained with its confirmation's parameters (report/_confirm.py `chosen_on_means`
    counts the same), a waiting rank's are its phase-1/2 runs alone; each counted as `run_value`
    (at the rank's rung under --confirm-at-rung)."""
    done = sorted(done, key=lambda t: t.number)

    def search_runs(r: Mapping[str, Any]) -> list[float]:
        return [v for t in done
                if t.user_attrs.get(Attr.PHASE) in (1, 2) and int(t.params.get("arch_idx", -1)) == int(r["arch_idx"])
                and {k: t.params.get(k) for k in r["params"]} == dict(r["params"])
                and (v := run_value(t, r.get(AT_RUNG_KEY))) is not None]

    def confirmation_runs(r: Mapping[str, Any]) -> list[float]:
        return [v for t in done
                if t.user_attrs.get(Attr.PHASE) == 3 and t.user_attrs.get(Attr.RANK) == int(r["rank"])
                and not t.user_attrs.get(Attr.BASELINE) and (v := run_value(t, r.get(AT_RUNG_KEY))) is not None]

    first = [r for r in ranks if r.get(WAVE_KEY) != 2 and not _extra(r)]
    runs = {int(r["rank"]): confirmation_runs(r) + search_runs(r) for r in first}
    due = set(waiting(ranks))
    return [{**r, DECISION_KEY: decide(runs, int(r["rank"]), search_runs(r))} if int(r["rank"]) in due else dict(r)
            for r in ranks]
