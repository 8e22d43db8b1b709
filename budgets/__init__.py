"""Budgets: parsing '2M'-style strings and enumerating the architectures that fit them."""

from archhpo.budgets._grid import (
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
from archhpo.budgets._parse import budget_label, format_budget, parse_budget
from archhpo.errors import BudgetError

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
