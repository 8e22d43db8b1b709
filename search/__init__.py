"""Search: study creation, the trial plan and queue, Ray orchestration, export and the CLI."""

from archhpo.errors import StorageError, StudyError
from archhpo.search._confirm import confirmation_summary, paired_summary
from archhpo.search._export import (
    CSV_COLUMNS,
    RESULTS_CSV,
    SPEC_COLUMNS,
    best_summary,
    export_studies,
    result_rows,
)
from archhpo.search._plan import PlanEntry, make_plan, plan_sizes, spread_order
from archhpo.search._queue import Claim, PlanStatus, TrialQueue
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
    StudySettings,
    experiment_studies,
    launch,
    open_study,
    prepare_settings,
    study_label,
    study_name,
)

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_STORAGE",
    "FULL_SPACE",
    "PARAM_NAMES",
    "QUICK_SPACE",
    "RESULTS_CSV",
    "SPEC_COLUMNS",
    "Claim",
    "LaunchResult",
    "PlanEntry",
    "PlanStatus",
    "SearchSpace",
    "StorageError",
    "StudyError",
    "StudySettings",
    "TrialQueue",
    "best_summary",
    "confirmation_summary",
    "experiment_studies",
    "export_studies",
    "launch",
    "make_plan",
    "mask_url",
    "open_storage",
    "open_study",
    "paired_summary",
    "plan_lock",
    "plan_sizes",
    "prepare_settings",
    "resolve_storage_url",
    "result_rows",
    "session_scope",
    "spread_order",
    "study_label",
    "study_name",
]
