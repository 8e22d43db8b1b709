"""Budgets: parsing '2M'-style strings and enumerating the architectures that fit them."""

from archhpo.budgets._grid import (
    ARCH_DIMS,
    D_MODELS,
    DEFAULT_TOLERANCE,
    FF_MULTIPLIERS,
    N_HEADS,
    N_LAYERS,
    GridRow,
    build_grid,
    candidates,
    check_tolerance,
    pin_label,
    pinned_grid,
    require_rows,
)
from archhpo.budgets._parse import budget_label, format_budget, parse_budget
from archhpo.errors import BudgetError

__all__ = [
    "ARCH_DIMS",
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
    "pin_label",
    "pinned_grid",
    "require_rows",
]
