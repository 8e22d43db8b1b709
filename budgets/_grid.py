"""The budget grid of SPEC §3: every architecture whose exact parameter count fits a budget."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from archhpo.budgets._parse import format_budget
from archhpo.errors import BudgetError, ConfigError
from archhpo.models import Family

D_MODELS = (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
N_LAYERS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
N_HEADS = (2, 4, 8, 16, 32)
FF_MULTIPLIERS = (2, 4)
DEFAULT_TOLERANCE = 0.25


@dataclass(frozen=True)
class GridRow:
    budget: str
    arch_idx: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    param_count: int
    estimate: int | None
    extreme: str  # "" or ";"-joined tags such as "min_d_model;max_n_layers"

    def arch(self) -> dict[str, int]:
        return {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads, "d_ff": self.d_ff}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidates() -> list[dict[str, int]]:
    """The cross product of SPEC §3 with n_heads dividing d_model, in (d, L, h, ff) order."""
    rows = []
    for d, n_layers, h, mult in itertools.product(D_MODELS, N_LAYERS, N_HEADS, FF_MULTIPLIERS):
        if d % h == 0:
            rows.append({"d_model": d, "n_layers": n_layers, "n_heads": h, "d_ff": mult * d})
    rows.sort(key=lambda a: (a["d_model"], a["n_layers"], a["n_heads"], a["d_ff"]))
    return rows


def check_tolerance(tolerance: float) -> float:
    if not 0 < tolerance < 1:
        raise BudgetError(f"Tolerance {tolerance} must lie between 0 and 1 (e.g. 0.25 for ±25%).")
    return float(tolerance)


def build_grid(
    family: Family, budget: int, info: Mapping[str, Any], tolerance: float = DEFAULT_TOLERANCE
) -> list[GridRow]:
    """Rows whose exact count lies within ±tolerance of budget; arch_idx is the sorted position."""
    check_tolerance(tolerance)
    lo, hi = budget * (1 - tolerance), budget * (1 + tolerance)
    fitting: list[tuple[dict[str, int], int, int | None]] = []
    for arch in candidates():
        try:
            cfg = family.config_for(arch, info)
        except ConfigError:
            continue  # a family-specific constraint (e.g. channels must divide d_model)
        count = family.param_count(cfg)
        if lo <= count <= hi:
            est = family.estimate(cfg) if family.estimate else None
            fitting.append((arch, count, est))
    label = format_budget(budget)
    rows = [
        GridRow(label, i, a["d_model"], a["n_layers"], a["n_heads"], a["d_ff"], count, est, "")
        for i, (a, count, est) in enumerate(fitting)
    ]
    return _mark_extremes(rows, budget)


def _mark_extremes(rows: list[GridRow], budget: int) -> list[GridRow]:
    """Tag one row per extreme: among the rows at the smallest/largest d_model and n_layers,
    the one whose count is closest to the budget (ties: lowest arch_idx)."""
    if not rows:
        return rows
    tags: dict[int, list[str]] = {}
    for key in ("d_model", "n_layers"):
        values = [getattr(r, key) for r in rows]
        for tag, target in (("min", min(values)), ("max", max(values))):
            holders = [r for r in rows if getattr(r, key) == target]
            pick = min(holders, key=lambda r: (abs(r.param_count - budget), r.arch_idx))
            tags.setdefault(pick.arch_idx, []).append(f"{tag}_{key}")
    return [
        GridRow(**{**r.as_dict(), "extreme": ";".join(tags.get(r.arch_idx, []))}) for r in rows
    ]


def require_rows(rows: list[GridRow], budget: int, tolerance: float, family: str) -> list[GridRow]:
    if not rows:
        raise BudgetError(
            f"No {family} architecture of the grid fits {format_budget(budget)} ±{tolerance:.0%}; "
            "raise --tolerance or choose another budget."
        )
    return rows
