"""What must agree when a study is launched again (search/_study.py's launch), and how a refused
relaunch names what differs."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from archhpo.config import ABSENT, StoredOptions, declared

if TYPE_CHECKING:
    from archhpo.search._settings import StudySettings

# Settings that must agree when a study is launched again (data may be re-resolved to the
# same absolute path; everything that changes the plan or the results must match).
_IDENTITY = ("family", "tolerance", "data", "options", "n_trials", "pruner", "budget_value", "choices", "pins",
             "space")


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
    """The options `now` as this archhpo would have stored them when `old` was launched: for each
    setting's declared ``former`` pair (stored then, stored now; ABSENT: no key), where `old` holds
    the first and `now` the second, `now` takes the first (the same command launched both under
    different defaults: a study keeps its own behaviour, so that command resumes it)."""
    now = copy.deepcopy(now)
    for d in declared():
        for then, current in d.setting.former:
            *parents, leaf = str(d.setting.stored).split(".")
            at = _parents(old, now, parents)
            if at is None or not (_same(at[0].get(leaf, ABSENT), then) and _same(at[1].get(leaf, ABSENT), current)):
                continue
            if then is ABSENT:
                del at[1][leaf]
            else:
                at[1][leaf] = then
    return now


def _same(value: Any, declared_value: Any) -> bool:
    if value is ABSENT or declared_value is ABSENT:
        return value is declared_value
    return bool(value == declared_value)


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
