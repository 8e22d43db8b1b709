"""Budgets: parsing '2M'-style strings and enumerating the architectures that fit them."""

from budgets._grid import (
    D_MODELS,
    DEFAULT_TOLERANCE,
    FF_MULTIPLIERS,
    N_HEADS,
    N_LAYERS,
    GridRow,
    build_grid,
    candidates,
    check_tolerance,
    require_rows,
)
from budgets._parse import BudgetError, budget_label, format_budget, parse_budget

__all__ = [
    "D_MODELS",
    "DEFAULT_TOLERANCE",
    "FF_MULTIPLIERS",
    "N_HEADS",
    "N_LAYERS",
    "BudgetError",
    "GridRow",
    "budget_label",
    "build_grid",
    "candidates",
    "check_tolerance",
    "format_budget",
    "parse_budget",
    "require_rows",
]
