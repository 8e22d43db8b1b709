"""The study: search space, trial plan, queue, storage, launch and pruning.

The analysis of a study (export, report, fit, figures) is `archhpo.report`; the Ray pool that
starts workers is `archhpo.cluster`; the command line is `archhpo.cli`.

Each name below is imported on first use (as in `archhpo/__init__.py`), so importing one module
of the package (`archhpo.search._storage`, `archhpo.search._space`) does not import them all:
the queue's upkeep, the fits (SciPy) and the launch stay out of a process that needs none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from archhpo.errors import StorageError, StudyError

if TYPE_CHECKING:
    from archhpo.search._plan import PlanEntry, make_plan, plan_sizes, spread_order
    from archhpo.search._queue import Claim, PlanStatus, TrialQueue
    from archhpo.search._settings import StudySettings
    from archhpo.search._space import FULL_SPACE, PARAM_NAMES, QUICK_SPACE, SearchSpace
    from archhpo.search._storage import (
        DEFAULT_STORAGE,
        mask_url,
        open_storage,
        plan_lock,
        resolve_storage_url,
        session_scope,
    )
    from archhpo.search._study import (
        LaunchResult,
        experiment_studies,
        keyword_config,
        launch,
        open_study,
        prepare_settings,
        study_label,
        study_name,
    )

# public name -> the module of the package that defines it (imported by __getattr__)
_LAZY = {
    **dict.fromkeys(("PlanEntry", "make_plan", "plan_sizes", "spread_order"), "_plan"),
    **dict.fromkeys(("Claim", "PlanStatus", "TrialQueue"), "_queue"),
    "StudySettings": "_settings",
    **dict.fromkeys(("FULL_SPACE", "PARAM_NAMES", "QUICK_SPACE", "SearchSpace"), "_space"),
    **dict.fromkeys(("DEFAULT_STORAGE", "mask_url", "open_storage", "plan_lock", "resolve_storage_url",
                     "session_scope"), "_storage"),
    **dict.fromkeys(("LaunchResult", "experiment_studies", "keyword_config", "launch", "open_study",
                     "prepare_settings", "study_label", "study_name"), "_study"),
}


def __getattr__(name: str) -> Any:
    """A public name from its module; a submodule (`archhpo.search._queue`) by its name."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    if name.startswith("_") and not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "DEFAULT_STORAGE",
    "FULL_SPACE",
    "PARAM_NAMES",
    "QUICK_SPACE",
    "Claim",
    "LaunchResult",
    "PlanEntry",
    "PlanStatus",
    "SearchSpace",
    "StorageError",
    "StudyError",
    "StudySettings",
    "TrialQueue",
    "experiment_studies",
    "keyword_config",
    "launch",
    "make_plan",
    "mask_url",
    "open_storage",
    "open_study",
    "plan_lock",
    "plan_sizes",
    "prepare_settings",
    "resolve_storage_url",
    "session_scope",
    "spread_order",
    "study_label",
    "study_name",
]
