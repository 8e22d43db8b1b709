"""The budget grid of docs/design.md §3: every architecture whose exact parameter count fits a budget."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from archhpo.budgets._parse import format_budget
from archhpo.errors import BudgetError, ConfigError
from archhpo.models import Family
from archhpo.schema import ARCH_KEYS

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
    # Categorical choices of this row (e.g. {"encoder": "sum"}); {} when the study has none.
    # Building the model merges them over the study's info before family.config_for.
    choices: dict[str, Any] = field(default_factory=dict, hash=False)
    # Forward+backward training FLOPs of one sample (family.flops_per_sample of this row's config).
    flops_per_sample: int | None = None

    def arch(self) -> dict[str, int]:
        return {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads, "d_ff": self.d_ff}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _flops(family: Family, cfg: Any) -> int | None:
    return family.flops_per_sample(cfg) if family.flops_per_sample else None


def candidates(pins: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, int]]:
    """The cross product of docs/design.md §3 with n_heads dividing d_model, in (d, L, h, ff) order.

    `pins`' d_model and n_layers lists, where given, replace the grid's own and need not be grid
    values (an IsoFLOP study reaches below the smallest grid model so, docs/compute-optimal.md);
    pins of the other dimensions filter the rows afterwards (build_grid's callers)."""
    pins = pins or {}
    d_models = sorted(set(pins.get("d_model") or D_MODELS))
    depths = sorted(set(pins.get("n_layers") or N_LAYERS))
    rows = []
    for d, n_layers, h, mult in itertools.product(d_models, depths, N_HEADS, FF_MULTIPLIERS):
        if d % h == 0:
            rows.append({"d_model": d, "n_layers": n_layers, "n_heads": h, "d_ff": mult * d})
    rows.sort(key=lambda a: (a["d_model"], a["n_layers"], a["n_heads"], a["d_ff"]))
    return rows


ARCH_DIMS = ARCH_KEYS  # the dimensions a grid row has (archhpo.schema)
_PIN_TAGS = {"d_model": "d", "n_layers": "L", "n_heads": "h", "d_ff": "ff"}


def pin_label(pins: Mapping[str, Sequence[int]]) -> str:
    """Readable, collision-free label of pinned dimensions: d64-L2+3-h4-ff256 ('' without pins)."""
    parts = []
    for dim in ARCH_DIMS:
        if pins.get(dim):
            parts.append(_PIN_TAGS[dim] + "+".join(str(v) for v in sorted(set(pins[dim]))))
    return "-".join(parts)


def check_tolerance(tolerance: float) -> float:
    if not 0 < tolerance < 1:
        raise BudgetError(f"Tolerance {tolerance} must lie between 0 and 1 (e.g. 0.25 for ±25%).")
    return float(tolerance)


def build_grid(
    family: Family, budget: int, info: Mapping[str, Any], tolerance: float = DEFAULT_TOLERANCE,
    pins: Mapping[str, Sequence[int]] | None = None,
) -> list[GridRow]:
    """Rows whose exact count lies within ±tolerance of budget; arch_idx is the sorted position.
    `pins`' d_model and n_layers lists replace the grid's (`candidates`); the caller filters the rest."""
    check_tolerance(tolerance)
    lo, hi = budget * (1 - tolerance), budget * (1 + tolerance)
    fitting: list[tuple[dict[str, int], int, int | None, int | None]] = []
    for arch in candidates(pins):
        try:
            cfg = family.config_for(arch, info)
        except ConfigError:
            continue  # a family-specific constraint (e.g. channels must divide d_model)
        count = family.param_count(cfg)
        if lo <= count <= hi:
            est = family.estimate(cfg) if family.estimate else None
            fitting.append((arch, count, est, _flops(family, cfg)))
    label = format_budget(budget)
    rows = [
        GridRow(label, i, a["d_model"], a["n_layers"], a["n_heads"], a["d_ff"], count, est, "",
                flops_per_sample=flops)
        for i, (a, count, est, flops) in enumerate(fitting)
    ]
    return _mark_extremes(rows, budget)


PIN_ADVICE = "drop --budget to train the pinned architecture whatever its size, or change the pins"


def pinned_grid(
    family: Family,
    info: Mapping[str, Any],
    pins: Mapping[str, Sequence[int]],
    label: str,
    budget: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    advice: str = PIN_ADVICE,
) -> list[GridRow]:
    """Rows of a study that pins architecture dimensions (`advice`: what to do when none fits the budget).

    With a budget: the budget's grid restricted to the pinned values.  Without one: the cross
    product of the pinned values, unpinned dimensions ranging over the grid's lists (d_ff over
    2x and 4x d_model); pinned values need not be grid values.  Rows the family rejects are left
    out; a study where every row is rejected raises the family's own ConfigError.
    """
    _check_pins(pins)
    if budget is not None:
        return _pinned_within_budget(family, info, pins, label, budget, tolerance, advice)
    archs = []
    for d in sorted(set(pins.get("d_model") or D_MODELS)):
        for n_layers in sorted(set(pins.get("n_layers") or N_LAYERS)):
            for h in sorted(set(pins.get("n_heads") or N_HEADS)):
                for ff in sorted(set(pins.get("d_ff") or [m * d for m in FF_MULTIPLIERS])):
                    archs.append({"d_model": d, "n_layers": n_layers, "n_heads": h, "d_ff": ff})
    rows: list[GridRow] = []
    first_error: ConfigError | None = None
    for arch in archs:
        try:
            cfg = family.config_for(arch, info)
        except ConfigError as exc:
            first_error = first_error or exc
            continue
        est = family.estimate(cfg) if family.estimate else None
        rows.append(GridRow(label, len(rows), d_model=arch["d_model"], n_layers=arch["n_layers"],
                            n_heads=arch["n_heads"], d_ff=arch["d_ff"], param_count=family.param_count(cfg),
                            estimate=est, extreme="", flops_per_sample=_flops(family, cfg)))
    if not rows:
        assert first_error is not None
        raise first_error
    counts = sorted(r.param_count for r in rows)
    return _mark_extremes(rows, counts[len(counts) // 2])


def _check_pins(pins: Mapping[str, Sequence[int]]) -> None:
    for dim, values in pins.items():
        if dim not in ARCH_DIMS:
            raise ConfigError(f"Unknown architecture dimension {dim!r}; pin one of: {', '.join(ARCH_DIMS)}.")
        for v in values:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"--{dim.replace('_', '-')} {v!r} must be a positive integer.")


def _pinned_within_budget(
    family: Family, info: Mapping[str, Any], pins: Mapping[str, Sequence[int]], label: str, budget: int,
    tolerance: float, advice: str = "",
) -> list[GridRow]:
    """The budget's grid restricted to the pinned values, renumbered under the study's label."""
    rows = [
        r for r in build_grid(family, budget, info, tolerance, pins)
        if all(getattr(r, d) in set(pins[d]) for d in pins if pins[d])
    ]
    if not rows:
        pinned = ", ".join(f"{d}={'/'.join(map(str, pins[d]))}" for d in ARCH_DIMS if pins.get(d))
        raise BudgetError(
            f"No {family.name} architecture with {pinned} fits {format_budget(budget)} ±{tolerance:.0%}; "
            f"{advice or PIN_ADVICE}."
        )
    rows = [replace(r, arch_idx=i, budget=label, extreme="") for i, r in enumerate(rows)]
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
    return [replace(r, extreme=";".join(tags.get(r.arch_idx, []))) for r in rows]


def require_rows(rows: list[GridRow], budget: int, tolerance: float, family: str) -> list[GridRow]:
    if not rows:
        raise BudgetError(
            f"No {family} architecture of the grid fits {format_budget(budget)} ±{tolerance:.0%}; "
            "raise --tolerance or choose another budget."
        )
    return rows
