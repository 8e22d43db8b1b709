"""Why an experiment has no result: the sentence a report leads with when every trial failed.

A study whose trials all failed (each refused by the memory estimate, say) has nothing to fit or
draw; its figures would be empty and never say why, so the command line prints this first and
`run` exits non-zero.  A trial that diverged (models/_diverged.py: a non-finite or rising loss)
failed because of its learning rate, not its architecture, so such trials are counted apart, with
their rates (`why_diverged`); on a ladder that is the carried rate.
"""

from __future__ import annotations

from typing import Any

from archhpo.models._diverged import is_diverged
from archhpo.schema import Attr


def why_all_failed(storage: Any, names: list[str] | None = None, experiment: str | None = None) -> str | None:
    """'every trial of X failed (N of N); trial 0: <its reason> ...' when no trial of the studies
    `names` (else of `experiment`) completed or was pruned and at least one failed; else None.

    `storage` is a URL (None: the default one) or an open RDBStorage.  The reason shown is the first failed trial's
    (`fail_reason`, written by the worker); how many others gave the same one is counted."""
    from optuna.trial import TrialState

    from archhpo.search._storage import open_storage, resolve_storage_url
    from archhpo.search._study import experiment_studies

    rdb = open_storage(resolve_storage_url(storage), create=False) if storage is None or isinstance(storage, str) \
        else storage
    names = names if names is not None else experiment_studies(rdb, experiment or "")
    failed: list[tuple[str, int, str]] = []
    for name in names:
        trials = rdb.get_all_trials(rdb.get_study_id_from_name(name), deepcopy=False)
        if any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials):
            return None
        failed += [(name, t.number, str(t.user_attrs.get(Attr.FAIL_REASON) or "no reason was recorded"))
                   for t in trials if t.state == TrialState.FAIL]
    if not failed:
        return None
    name, number, reason = min(failed, key=lambda f: (names.index(f[0]), f[1]))
    studies = ", ".join(dict.fromkeys(f[0] for f in failed))
    if all(is_diverged(r) for _, _, r in failed):
        return (f"every trial of {studies} diverged (all {len(failed)}), so the report has no result: the learning "
                f"rate{_rates(rdb, names)} is too high for these models, not a fault of their "
                f"architectures; {name} trial {number}: {reason.rstrip('.')}.")
    same = sum(_kind(r) == _kind(reason) for _, _, r in failed) - 1
    others = f" (as did {same} other trial(s))" if same else ""
    return (f"every trial of {studies} failed (all {len(failed)}), so the report has no result; "
            f"{name} trial {number}: {reason.rstrip('.')}{others}.")


def why_diverged(storage: Any, name: str) -> str | None:
    """'2 of 9 trials diverged at learning rate 0.02 (trial 3: <its reason>): the rate, not their
    architectures; they are not ranked' for the study `name` in the open RDBStorage `storage`, or
    None when none diverged."""
    trials = storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False)
    diverged = [t for t in trials if is_diverged(t.user_attrs.get(Attr.FAIL_REASON))]
    if not diverged:
        return None
    first = min(diverged, key=lambda t: t.number)
    what = str(first.user_attrs[Attr.FAIL_REASON]).split(": ", 1)[-1].rstrip(".")
    return (f"{len(diverged)} of {len(trials)} trials diverged at learning rate{_rates(storage, [name])} (trial "
            f"{first.number}: {what}): the rate, not their architectures; they are not ranked")


def _rates(storage: Any, names: list[str]) -> str:
    """' 0.02' or 's 0.01-0.02': the learning rates the studies' diverged trials trained at."""
    rates = sorted({float(t.params["learning_rate"]) for name in names
                    for t in storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False)
                    if is_diverged(t.user_attrs.get(Attr.FAIL_REASON)) and "learning_rate" in t.params})
    if not rates:
        return ""
    return f" {rates[0]:.3g}" if len(rates) == 1 else f"s {rates[0]:.3g}-{rates[-1]:.3g}"


def _kind(reason: str) -> str:
    """The reason without its numbers: two trials refused for memory count as the same reason."""
    return "".join(c for c in reason if not c.isdigit())


__all__ = ["why_all_failed", "why_diverged"]
