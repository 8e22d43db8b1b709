"""The study: search space, trial plan, queue, storage, launch and pruning.

The analysis of a study (export, report, fit, figures) is `archhpo.report`; the Ray pool that
starts workers is `archhpo.cluster`; the command line is `archhpo.cli`."""

from archhpo.errors import StorageError, StudyError
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
