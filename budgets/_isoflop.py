"""IsoFLOP planning: the sizes, shapes and token counts of a compute budget C's trials (no torch).

At each C the sizes are log-spaced over a span (smallest to largest, default 10x) centred on N_c(C):
the user's ``--centre``, an earlier study's law N_opt = G·C^a (`centre_from_law`), or the prior
`prior_centre`, Chinchilla's rule (Hoffmann et al. 2022: 20 tokens per parameter at 6 FLOPs per
parameter-token, so N_c = sqrt(C / 120)). Each size takes the grid rows whose exact count lies in
its band (half a log step either side; ``--d-model``/``--n-layers`` lists replace the grid's) and
keeps the one (``shapes=K``: K of distinct d_model, n_layers, d_ff) nearest a target shape, in
d_model/n_layers, d_ff/d_model, head width: Kaplan et al.'s aspect 100, 4x FFN, 64-wide heads
(`ShapeTarget`), or an earlier best (`ShapeTarget.from_row`); ties: the count nearest, arch_idx.

Data: a trial trains whole samples (windows of seq_len tokens for lm), as many as put its FLOPs
nearest C: samples = round(C / flops_per_sample), a multiple of ``intervals`` (its validation
intervals), so train_tokens = samples x tokens per sample and the trial's FLOPs, archhpo's exact
count (attention and head included), lie within 1% of C or the plan is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from archhpo.budgets._grid import GridRow, build_grid
from archhpo.budgets._parse import format_budget
from archhpo.errors import BudgetError
from archhpo.models import Family

CHINCHILLA_TOKENS_PER_PARAM = 20.0
CHINCHILLA_FLOPS_PER_PARAM_TOKEN = 6.0
MIN_SIZES = 5
DEFAULT_SIZES = 7
DEFAULT_SPAN = 10.0  # largest size over smallest
FLOPS_TOLERANCE = 0.01  # a trial's FLOPs lie within 1% of its C
DEFAULT_ASPECT = 100.0  # Kaplan et al. 2020's d_model / n_layers (search/_baselines.py's kaplan rule)
DEFAULT_FF_MULT = 4.0
DEFAULT_HEAD_DIM = 64.0


def prior_centre(compute: float) -> float:
    """Chinchilla's compute-optimal size: D = 20 N at C = 6 N D, so N_c = sqrt(C / 120)."""
    return math.sqrt(_positive(compute, "C") / (CHINCHILLA_FLOPS_PER_PARAM_TOKEN * CHINCHILLA_TOKENS_PER_PARAM))


def centre_from_law(law: Mapping[str, Any], compute: float) -> float:
    """N_opt(C) = G·C^a of an earlier study's ``isoflop_fit`` (``law``: its "G" and "a" estimates)."""
    if law.get("status") not in (None, "fitted") or law.get("G") is None or law.get("a") is None:
        raise BudgetError(f"The earlier study's IsoFLOP law is not fitted ({law.get('status')}: "
                          f"{law.get('reason')}); give --centre instead.")
    a = law["a"]["estimate"] if isinstance(law["a"], Mapping) else law["a"]
    return float(law["G"]) * _positive(compute, "C") ** float(a)


def log_sizes(centre: float, sizes: int = DEFAULT_SIZES, span: float = DEFAULT_SPAN) -> list[float]:
    """`sizes` targets log-spaced from centre/sqrt(span) to centre·sqrt(span)."""
    _check_design(sizes, span)
    c = _positive(centre, "the centre N_c")
    return [c * span ** (i / (sizes - 1) - 0.5) for i in range(sizes)]


def _positive(value: float, name: str) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise BudgetError(f"{name} must be a positive number, got {value!r}; give it like 1e15.")
    return float(value)


def _check_design(sizes: int, span: float) -> None:
    if not isinstance(sizes, int) or isinstance(sizes, bool) or sizes < MIN_SIZES:
        raise BudgetError(f"--sizes {sizes!r}: an IsoFLOP profile needs at least {MIN_SIZES} sizes per compute "
                          "budget to fit its parabola; give --sizes 5 or more.")
    if not (math.isfinite(span) and span > 1):
        raise BudgetError(f"--span {span!r} must be above 1 (the largest size over the smallest, e.g. 10).")


@dataclass(frozen=True)
class ShapeTarget:
    """The shape a size's row is chosen nearest to (in log ratio, in this order of precedence)."""

    aspect: float = DEFAULT_ASPECT  # d_model / n_layers
    ff_mult: float = DEFAULT_FF_MULT  # d_ff / d_model
    head_dim: float = DEFAULT_HEAD_DIM  # d_model / n_heads

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ShapeTarget:
        """An earlier study's best shape (its d_model, n_layers, n_heads, d_ff), carried to every size."""
        d = float(row["d_model"])
        return cls(d / float(row["n_layers"]), float(row["d_ff"]) / d, d / float(row["n_heads"]))

    def key(self, row: GridRow, target: float) -> tuple[float, ...]:
        far = lambda x, t: round(abs(math.log(x / t)), 12)  # noqa: E731
        return (far(row.d_model / row.n_layers, self.aspect), far(row.d_ff / row.d_model, self.ff_mult),
                far(row.d_model / row.n_heads, self.head_dim), far(row.param_count, target), row.arch_idx)


@dataclass(frozen=True)
class IsoflopTrial:
    """One planned trial: a grid row at one size of one compute budget, and the data it trains."""

    compute_budget: float
    size: int  # the size's position, 0 = smallest
    target_params: float  # the log-spaced size N the row was chosen for
    rank: int  # 0 = the row nearest the target shape, 1 the next (--shapes K)
    row: GridRow
    samples: int
    units_per_sample: int  # tokens per sample (lm: seq_len), 1 for families counted in samples

    @property
    def param_count(self) -> int:
        return self.row.param_count

    @property
    def train_tokens(self) -> int:
        """D: data units trained (tokens, or samples for a family counted in samples)."""
        return self.samples * self.units_per_sample

    @property
    def train_flops(self) -> int:
        return self.samples * int(self.row.flops_per_sample or 0)

    @property
    def flops_per_param_token(self) -> float:
        """k of C = k·N·D for this architecture (archhpo's exact count, not 6)."""
        return float(self.row.flops_per_sample or 0) / (self.units_per_sample * self.param_count)

    @property
    def tokens_per_param(self) -> float:
        return self.train_tokens / self.param_count

    def user_attrs(self) -> dict[str, Any]:
        """What every planned trial stores (Optuna user attributes); ``isoflop_size`` lets the fit
        take the best of a size's K shapes (report/_isoflop.py)."""
        return {"compute_budget": float(self.compute_budget), "param_count": int(self.param_count),
                "train_tokens": int(self.train_tokens), "isoflop_size": int(self.size)}


@dataclass(frozen=True)
class IsoflopPlan:
    """The trials of one compute budget, with where its centre came from."""

    compute_budget: float
    centre: float
    centre_source: str  # "prior" (`prior_centre`), "law" (`centre_from_law`) or "given"
    span: float
    targets: tuple[float, ...]
    trials: tuple[IsoflopTrial, ...]

    @property
    def label(self) -> str:
        """A short name of the budget for study names: 'C1e+15'."""
        return f"C{self.compute_budget:.3g}"


def _band_rows(family: Family, info: Mapping[str, Any], target: float, half_step: float,
               pins: Mapping[str, Sequence[int]] | None = None) -> list[GridRow]:
    """Rows whose exact count lies within half a log step of `target`: [target/r, target·r), and
    whose dimensions lie in `pins`' lists where given (--n-heads 2,4,8 filters the grid; --d-model
    and --n-layers lists replace the grid's, so they may reach below its smallest model)."""
    tolerance = min(0.99, half_step - 1.0)
    rows = build_grid(family, max(1, round(target)), info, tolerance, pins) if tolerance > 0 else []
    return [r for r in rows if target / half_step <= r.param_count < target * half_step
            and all(getattr(r, dim) in values for dim, values in (pins or {}).items())]


def _distinct_bodies(rows: Sequence[GridRow]) -> list[GridRow]:
    """The first row (in `rows`' order) of each body (d_model, n_layers, d_ff): ``--shapes K`` searches
    K shapes that differ in width, depth or FFN, each at its head count nearest the target, rather than
    one body's head counts (which share its parameter count and most of its loss)."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for row in rows:
        if (body := (row.d_model, row.n_layers, row.d_ff)) not in seen:
            seen.add(body)
            out.append(row)
    return out


def _samples(compute: float, row: GridRow, intervals: int, family: str) -> int:
    """Whole samples (a multiple of `intervals`) whose FLOPs lie nearest C, within 1% of it."""
    per = int(row.flops_per_sample or 0)
    if per <= 0:
        raise BudgetError(f"The {family} family counts no training FLOPs per sample; it cannot plan an IsoFLOP study.")
    samples = intervals * max(1, round(compute / (per * intervals)))
    off = abs(samples * per - compute) / compute
    if off > FLOPS_TOLERANCE:
        raise BudgetError(
            f"At C = {compute:.3g} FLOPs the {format_budget(row.param_count)} row trains {samples} samples of "
            f"{per:.3g} FLOPs, {off:.1%} off C (at most {FLOPS_TOLERANCE:.0%}); raise C or plan smaller sizes "
            "(a lower --centre or a narrower --span).")
    return samples


def plan_isoflop(family: Family, info: Mapping[str, Any], compute: float, *, sizes: int = DEFAULT_SIZES,
                 span: float = DEFAULT_SPAN, centre: float | None = None, law: Mapping[str, Any] | None = None,
                 shape: ShapeTarget | None = None, shapes: int = 1, intervals: int = 1,
                 pins: Mapping[str, Sequence[int]] | None = None) -> IsoflopPlan:
    """The trials of compute budget `compute` (FLOPs): `sizes` sizes log-spaced over `span` around
    `centre` (else `law`'s N_opt(C), else `prior_centre`), `shapes` rows per size nearest `shape`
    (default `ShapeTarget()`), each trained on the whole samples that put its FLOPs within 1% of C.
    `info` is the data's shape facts (``family.data_info``); `pins` lists the values a dimension may take.
    Raises BudgetError with one sentence."""
    compute = _positive(compute, "An IsoFLOP compute budget C")
    if not isinstance(shapes, int) or isinstance(shapes, bool) or shapes < 1:
        raise BudgetError(f"--shapes {shapes!r} must be a positive integer (shapes searched per size).")
    if not isinstance(intervals, int) or isinstance(intervals, bool) or intervals < 1:
        raise BudgetError(f"intervals {intervals!r} must be a positive integer.")
    source = "given" if centre is not None else "law" if law is not None else "prior"
    n_c = centre if centre is not None else centre_from_law(law, compute) if law is not None else prior_centre(compute)
    targets = log_sizes(n_c, sizes, span)
    half_step = span ** (0.5 / (sizes - 1))
    shape = shape or ShapeTarget()
    trials: list[IsoflopTrial] = []
    for i, target in enumerate(targets):
        rows = sorted(_band_rows(family, info, target, half_step, pins), key=lambda r: shape.key(r, target))
        if not rows:
            raise BudgetError(
                f"No {family.name} architecture of the grid has between {target / half_step:,.0f} and "
                f"{target * half_step:,.0f} parameters (size {i + 1} of {sizes} at C = {compute:.3g}); "
                "move the centre (--centre) or widen the span (--span), plan fewer sizes, or list the widths and "
                "depths to choose from (--d-model 16,32,48,64 --n-layers 1,2 reach below the grid).")
        for rank, row in enumerate(_distinct_bodies(rows)[:shapes]):
            cfg = family.config_for(row.arch(), info)
            trials.append(IsoflopTrial(compute, i, target, rank, row, _samples(compute, row, intervals, family.name),
                                       family.units_per_sample(cfg)))
    return IsoflopPlan(compute, float(n_c), source, float(span), tuple(targets), tuple(trials))


def plan_isoflops(family: Family, info: Mapping[str, Any], computes: Sequence[float],
                  centres: Mapping[float, float] | None = None, **options: Any) -> list[IsoflopPlan]:
    """One plan per compute budget (a repeated ``--isoflop C``), in increasing C; `centres` gives a
    centre per C where the user stated one (the others follow `plan_isoflop`'s rule)."""
    if not computes:
        raise BudgetError("An IsoFLOP study needs at least one compute budget: give --isoflop C, e.g. --isoflop 1e15.")
    values = sorted(_positive(c, "An IsoFLOP compute budget C") for c in computes)
    if len(set(values)) < len(values):
        raise BudgetError(f"--isoflop lists a compute budget twice ({', '.join(f'{c:.3g}' for c in values)}); "
                          "give each C once.")
    centres = centres or {}
    return [plan_isoflop(family, info, c, centre=centres.get(c, options.get("centre")),
                         **{k: v for k, v in options.items() if k != "centre"}) for c in values]


__all__ = [
    "CHINCHILLA_TOKENS_PER_PARAM",
    "DEFAULT_ASPECT",
    "DEFAULT_SIZES",
    "DEFAULT_SPAN",
    "FLOPS_TOLERANCE",
    "MIN_SIZES",
    "IsoflopPlan",
    "IsoflopTrial",
    "ShapeTarget",
    "centre_from_law",
    "log_sizes",
    "plan_isoflop",
    "plan_isoflops",
    "prior_centre",
]
