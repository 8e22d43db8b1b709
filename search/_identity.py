"""What must agree when a study is launched again (search/_study.py's launch), and how a refused
relaunch names what differs."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from archhpo.schema import StoredOptions

if TYPE_CHECKING:
    from archhpo.search._settings import StudySettings

# Settings that must agree when a study is launched again (data may be re-resolved to the
# same absolute path; everything that changes the plan or the results must match).
_IDENTITY = ("family", "tolerance", "data", "options", "n_trials", "pruner", "budget_value", "choices", "pins",
             "space")


# Options a newer archhpo stores by default where an older one stored nothing, by their path in the
# stored options, with that default: a study launched before keeps its own behaviour (every worker
# reads the stored settings), so the same command that launched it relaunches (resumes) it.
# (--ladder's two-wave confirmation; its confirmation at a trusted rung, a ladder budget's, the default
# from 2026-11-29 to 2026-12-02; its largest budget's carried finalists, the default since 2026-12-02.)
_ADDED_BY_DEFAULT: dict[tuple[str, ...], Any] = {("confirm_sequential",): True, ("ladder", "confirm"): "rung",
                                                  ("ladder", "carry"): "finalists"}
# Options an older archhpo stored by default where this one stores nothing, with that former default:
# a study launched under it keeps it when the same command relaunches it.
_DROPPED_BY_DEFAULT: dict[tuple[str, ...], Any] = {("ladder", "confirm"): "rung"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parents(old: dict[str, Any], now: dict[str, Any], parents: list[str]) -> tuple[Any, Any] | None:
    """The dicts of `old` and `now` at the path `parents`, or None where either lacks one."""
    was: Any = old
    new: Any = now
    for part in parents:
        was, new = was.get(part), new.get(part)
        if not isinstance(was, dict) or not isinstance(new, dict):
            return None
    return was, new


def _as_stored_before(old: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The options `now` less each one `_ADDED_BY_DEFAULT` names where `old` lacks it and `now` holds
    its default, plus each one `_DROPPED_BY_DEFAULT` names where `old` holds the former default and
    `now` nothing: what this archhpo would have stored when `old` was launched."""
    now = copy.deepcopy(now)
    for path, default in _ADDED_BY_DEFAULT.items():
        *parents, leaf = path
        at = _parents(old, now, parents)
        if at is not None and leaf not in at[0] and at[1].get(leaf) == default:
            del at[1][leaf]
    for path, former in _DROPPED_BY_DEFAULT.items():
        *parents, leaf = path
        at = _parents(old, now, parents)
        if at is not None and at[0].get(leaf) == former and leaf not in at[1]:
            at[1][leaf] = former
    return now


def _space_as_stored_before(family: str, old: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """`now`'s space with the learning-rate range an older archhpo stored, where `old` holds the
    unmoved default range and `now` the same range moved onto the family's own rate
    (`SearchSpace.bracketing`): a study launched before keeps the range it was planned with."""
    from archhpo.models import get_family
    from archhpo.search._space import FULL_SPACE, QUICK_SPACE

    rate = get_family(family).train_defaults.get("learning_rate")
    for space in (FULL_SPACE, QUICK_SPACE):
        before, moved = list(space.learning_rate), list(space.bracketing(rate).learning_rate)
        if old.get("learning_rate") == before and now.get("learning_rate") == moved != before:
            return {**now, "learning_rate": before}
    return now


def _differences(stored: StudySettings, new: StudySettings) -> list[str]:
    """'n_trials: stored 4, now 6' for each identity setting that differs (a dict such as
    `options` by its differing keys), so a refused relaunch shows what to repeat."""
    out = []
    for key in _IDENTITY:
        old, now = (v.as_dict() if isinstance(v, StoredOptions) else v for v in (getattr(stored, key), getattr(new, key)))
        if key == "options":
            now = _as_stored_before(old, now)
        if key == "space":
            now = _space_as_stored_before(stored.family, old, now)
        if old == now:
            continue
        if isinstance(old, dict) and isinstance(now, dict):
            for k in sorted(set(old) | set(now), key=str):
                if old.get(k) != now.get(k):
                    out.append(f"{key}.{k}: stored {_short(old.get(k))}, now {_short(now.get(k))}")
        else:
            out.append(f"{key}: stored {_short(old)}, now {_short(now)}")
    return out
