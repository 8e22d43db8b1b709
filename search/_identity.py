"""What must agree when a study is launched again (search/_study.py's launch), and how a refused
relaunch names what differs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from archhpo.schema import StoredOptions

if TYPE_CHECKING:
    from archhpo.search._study import StudySettings

# Settings that must agree when a study is launched again (data may be re-resolved to the
# same absolute path; everything that changes the plan or the results must match).
_IDENTITY = ("family", "tolerance", "data", "options", "n_trials", "pruner", "budget_value", "choices", "pins",
             "space")


# Options a newer archhpo stores by default where an older one stored nothing, with that default: a
# study launched before keeps its own behaviour (every worker reads the stored settings), so the
# same command that launched it relaunches (resumes) it.  (--ladder's two-wave confirmation.)
_ADDED_BY_DEFAULT = {"confirm_sequential": True}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _differences(stored: StudySettings, new: StudySettings) -> list[str]:
    """'n_trials: stored 4, now 6' for each identity setting that differs (a dict such as
    `options` by its differing keys), so a refused relaunch shows what to repeat."""
    out = []
    for key in _IDENTITY:
        old, now = (v.as_dict() if isinstance(v, StoredOptions) else v for v in (getattr(stored, key), getattr(new, key)))
        if old == now:
            continue
        if isinstance(old, dict) and isinstance(now, dict):
            for k in sorted(set(old) | set(now), key=str):
                if key == "options" and k not in old and k in _ADDED_BY_DEFAULT and now[k] == _ADDED_BY_DEFAULT[k]:
                    continue
                if old.get(k) != now.get(k):
                    out.append(f"{key}.{k}: stored {_short(old.get(k))}, now {_short(now.get(k))}")
        else:
            out.append(f"{key}: stored {_short(old)}, now {_short(now)}")
    return out
