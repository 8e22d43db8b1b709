"""archhpo: budgeted architecture and hyperparameter search for transformers.

The repository's folders ``budgets/``, ``search/``, ``workers/`` and ``models/`` are installed as
``archhpo.budgets``, ``archhpo.search``, ``archhpo.workers`` and ``archhpo.models``; data flows
one way, budgets -> search -> workers -> models, and every layer takes its exceptions from
``archhpo.errors``.  This module is the public API: each name below is imported on first use,
so ``import archhpo`` stays cheap and never imports Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

from archhpo.errors import (
    ArchhpoError,
    BudgetError,
    ConfigError,
    DataError,
    MemoryRefused,
    NonFiniteLoss,
    OutputError,
    StorageError,
    StudyError,
)

__version__ = "0.2.0"

# public name -> module that defines it (imported lazily by __getattr__)
_LAZY = {
    "parse_budget": "archhpo.budgets",
    "build_grid": "archhpo.budgets",
    "GridRow": "archhpo.budgets",
    "Family": "archhpo.models",
    "count_flops": "archhpo.models",
    "TensorDataset": "archhpo.models",
    "family_names": "archhpo.models",
    "get_family": "archhpo.models",
    "StudyConfig": "archhpo.config",
    "StudySettings": "archhpo.search",
    "TrialQueue": "archhpo.search",
    "launch": "archhpo.search",
    "prepare_settings": "archhpo.search",
    "open_storage": "archhpo.search",
    "export_studies": "archhpo.report",
    "confirmation_summary": "archhpo.report",
    # the report and its notebook API (trials as a DataFrame, the fit, every figure)
    "trials_frame": "archhpo.report._frame",
    "fit_scaling_law": "archhpo.report._fit",
    "write_report": "archhpo.report._page",
    "choice_table": "archhpo.report._page",
    "budget_summary": "archhpo.report._page",
    "plot_loss_vs_params": "archhpo.report._figures",
    "plot_arch_plane": "archhpo.report._figures",
    "plot_loss_vs_depth_width": "archhpo.report._figures",
    "plot_val_curves": "archhpo.report._figures",
    "plot_phase1_params": "archhpo.report._figures",
    "plot_loss_vs_compute": "archhpo.report._figures",
    "TrainConfig": "archhpo.workers",
    "TrainResult": "archhpo.workers",
    "Worker": "archhpo.workers",
    "TrialSpec": "archhpo.workers",
    "build_trial": "archhpo.workers",
    "trial_seeds": "archhpo.workers",
    "train": "archhpo.workers",
}

__all__ = [
    "ArchhpoError",
    "BudgetError",
    "ConfigError",
    "DataError",
    "MemoryRefused",
    "NonFiniteLoss",
    "OutputError",
    "StorageError",
    "StudyError",
    "__version__",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'archhpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
