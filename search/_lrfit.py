"""The learning-rate exponent of a ladder (`--ladder`), fitted on the ladder's own smaller budgets.

How the best rate moves with N depends on the family, the data and whether the tokens grow with N,
so the smaller budgets, each searched already, fit log lr* = a + b log N (`fit_lr_exponent`). The
slope b is used only when at least MIN_BUDGETS budgets *located* their best rate and its CONFIDENCE
interval is at most MAX_INTERVAL_WIDTH wide and inside PLAUSIBLE; otherwise the prior is Step Law's
fit (arXiv 2503.04715): N^-0.406 when the data grows with N, N^-0.713 at fixed data, and the reason
says why. A budget's best rate (`locate_rate`) is the vertex of a parabola in log lr with an
intercept per architecture, never read outside the rates tried; it is located only where the rate's
effect is told apart from the architectures', since a slope through one trial's rate measures which
architecture was sampled where. `--lr-probe` retrains a budget's best at schema.LR_PROBE_FACTORS so
that it locates. The carried rate is read on the line of slope b through every smaller budget
(`carried_rate`), so one lucky seed does not set it, at one reference width moved to each
architecture's d_model by WIDTH_EXPONENT (`at_width`, muP's prior); the evidence: docs/searching.md,
item 5 of "What `--ladder` does". Under µP (`mup_fit`) the smallest budget's rate carries unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from archhpo.budgets import budget_label

if TYPE_CHECKING:
    from archhpo.search._plan import PlanEntry

# Step Law (arXiv 2503.04715): eta_opt = 1.79 N^-0.713 D^0.307, fitted on 3,700 LLM trainings.
STEP_LAW_N = -0.713
STEP_LAW_D = 0.307
PRIOR_DATA_GROWS = STEP_LAW_N + STEP_LAW_D  # D ∝ N: -0.406
PRIOR_FIXED_DATA = STEP_LAW_N  # D fixed: -0.713

MIN_BUDGETS = 3  # two budgets fit a line exactly, with no residual to size an interval
CONFIDENCE = 0.90
MAX_INTERVAL_WIDTH = 1.0  # wider than a whole unit of exponent says nothing the prior does not
PLAUSIBLE = (-1.5, 0.5)  # published exponents lie within (-1, 0); an interval outside is a bad fit
MIN_RATES_FOR_QUADRATIC = 4  # three points fit any parabola exactly: a fourth checks its shape
WIDTH_EXPONENT = 1.0  # muP for Adam: the hidden layers' best rate ∝ d_model^-1 (a prior, not fitted)
MUP_SOURCE = "mup"  # an LrFit's source under µP: the smallest budget's rate, carried unchanged
MUP_TRANSFER = "docs/mup.md"  # where the measured transfer that licenses carrying it unchanged is


@dataclass(frozen=True)
class LrFit:
    """The exponent a ladder carries its learning rate with, and where it came from.

    exponent: the one used; low, high: the slope's interval (None with fewer than MIN_BUDGETS
    budgets; over every budget's best rate where too few located theirs); n_budgets: the budgets
    with a best rate, or, once an interval over the located ones was fitted, those; slope: the
    fitted slope (None with fewer than 2 budgets; over every budget's best rate where too few
    located theirs), recorded even when the prior was used; source: "fitted" or "prior"; reason:
    why, in words."""

    exponent: float
    low: float | None
    high: float | None
    n_budgets: int
    source: str
    reason: str
    slope: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """'N^-0.512 (fitted on 4 budgets, 90% interval -0.7 to -0.3)' or 'N^-0.406 (prior: why)'."""
        if self.source == MUP_SOURCE:
            return f"N^0 (µP: {self.reason})"
        if self.source == "fitted":
            return (f"N^{self.exponent:.3f} (fitted on {self.n_budgets} budgets, {CONFIDENCE:.0%} interval "
                    f"{self.low:.3f} to {self.high:.3f})")
        return f"N^{self.exponent:.3f} (prior: {self.reason})"

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> LrFit:
        return cls(**{k: stored[k] for k in ("exponent", "low", "high", "n_budgets", "source", "reason")},
                   slope=stored.get("slope"))


def prior_exponent(data_grows: bool) -> float:
    """Step Law's exponent of N: the data grows with N (tokens per parameter) or is fixed."""
    return PRIOR_DATA_GROWS if data_grows else PRIOR_FIXED_DATA


@dataclass(frozen=True)
class BestRate:
    """A budget's best learning rate; located: a convex parabola's vertex within the rates tried, the
    rate's effect told apart from the architectures' (else the best trial's rate, and `why` says
    what was missing, in words a user can act on)."""

    rate: float
    located: bool
    why: str = ""


def locate_rate(points: Sequence[tuple[float, float] | tuple[float, float, Hashable]]) -> BestRate:
    """A budget's best learning rate from its finished trials' (learning rate, value) pairs, or
    (learning rate, value, architecture) triples (lower value is better): the convex parabola's
    vertex within the rates tried (with an intercept per architecture where one is identified),
    else the best trial's; located as the module docstring says."""
    if not points:
        raise ValueError("best_rate needs at least one finished trial")
    rate = float(min(points, key=lambda p: p[1])[0])
    x = np.log(np.array([p[0] for p in points], dtype=float))
    if len(np.unique(x)) < MIN_RATES_FOR_QUADRATIC:
        return BestRate(rate, False, f"{len(np.unique(x))} rate(s) tried, a parabola needs {MIN_RATES_FOR_QUADRATIC}")
    y = np.array([p[1] for p in points], dtype=float)
    c2, c1, separated = _curve(x, y, [p[2] if len(p) > 2 else None for p in points])
    if c2 <= 0:  # concave or flat: no minimum to read
        return BestRate(rate, False, "the losses do not curve up around a best rate")
    vertex = -c1 / (2 * c2)
    if not x.min() <= vertex <= x.max():  # outside the rates tried: an extrapolation
        side = "above the highest" if vertex > x.max() else "below the lowest"
        return BestRate(rate, False, f"the best lies {side} rate tried")
    if not separated:
        return BestRate(float(math.exp(vertex)), False, "each architecture ran at one rate, so the rate's effect "
                                                        "is not told apart from the architectures'")
    return BestRate(float(math.exp(vertex)), located=True)


def best_rate(points: Sequence[tuple[float, float] | tuple[float, float, Hashable]]) -> float:
    """`locate_rate`'s rate."""
    return locate_rate(points).rate


def _curve(x: np.ndarray, y: np.ndarray, groups: Sequence[Hashable | None]) -> tuple[float, float, bool]:
    """The curvature and slope of y against x, and whether the rate's effect is told apart from the
    groups': one intercept per group where the groups identify them (some group at two or more x,
    and more points than coefficients, so the shape is checked), else one shared intercept
    (np.polyfit's parabola), which tells them apart only when the points name one group or none."""
    labels = sorted({g for g in groups if g is not None}, key=repr)
    if None not in groups and len(labels) > 1:
        design = np.column_stack([x**2, x] + [np.array([g == label for g in groups], dtype=float) for label in labels])
        if len(y) > design.shape[1] and np.linalg.matrix_rank(design) == design.shape[1]:
            coef = np.linalg.lstsq(design, y, rcond=None)[0]
            return float(coef[0]), float(coef[1]), True
    c2, c1, _ = np.polyfit(x, y, 2)
    return float(c2), float(c1), len(labels) <= 1 and (None in groups) == (not labels)


def at_width(lr: float, from_width: int, to_width: int) -> float:
    """A learning rate found at d_model `from_width`, moved to d_model `to_width` by muP's rule
    (lr ∝ d_model^-WIDTH_EXPONENT): 1e-2 at 64 is 5e-3 at 128."""
    return lr * (from_width / to_width) ** WIDTH_EXPONENT


def budget_rates(budgets: Sequence[tuple[int, Sequence[Any]]]) -> list[tuple[int, float]]:
    """Each budget's (nominal N, best rate) from its (learning rate, value[, architecture]) points
    (`best_rate`); budgets without a finished trial are skipped."""
    return [(n, best_rate(points)) for n, points in budgets if points]


def carried_rate(rates: Sequence[tuple[int, float]], n_large: int, exponent: float) -> float:
    """The rate at N = n_large on the line of slope `exponent` (in log lr against log N) through the
    budgets' (N, best rate): the mean of log lr_i - b log N_i, plus b log n_large."""
    if not rates:
        raise ValueError("carried_rate needs at least one budget's best rate")
    intercept = sum(math.log(lr) - exponent * math.log(n) for n, lr in rates) / len(rates)
    return math.exp(intercept + exponent * math.log(n_large))


def mup_fit(budgets: Sequence[tuple[int, Sequence[Any]]]) -> tuple[LrFit, list[tuple[int, float]]]:
    """µP's carry: the smallest budget's best rate (`locate_rate` over its (learning rate, value[,
    architecture]) points, at the trials' own widths, which µP makes irrelevant) and exponent 0, so
    every larger budget gets it unchanged; the fit and [(that budget's N, its rate)].  The budgets
    above the smallest trained at the carried rate and are not read."""
    searched = [(n, points) for n, points in budgets if points]
    if not searched:
        raise ValueError("mup_fit needs the smallest budget's finished trials")
    n, points = min(searched, key=lambda b: b[0])
    best = locate_rate(points)
    how = "its parabola's vertex" if best.located else f"its best trial's rate: {best.why}"
    reason = (f"the rate searched at {budget_label(n)} only ({how}), carried unchanged; "
              f"the measured transfer across width and depth is in {MUP_TRANSFER}")
    return LrFit(0.0, None, None, 1, MUP_SOURCE, reason), [(n, best.rate)]


def fit_lr_exponent(budgets: Sequence[tuple[int, Sequence[Any]]], *, data_grows: bool) -> LrFit:
    """The exponent b of lr* ∝ N^b from the smaller budgets' (nominal N, [(learning rate, value[,
    architecture])]) (budgets without a finished trial are skipped), by the module's rule: fitted when at least
    MIN_BUDGETS budgets that located their best rate give a narrow, plausible interval, else Step Law's prior."""
    estimates = [(n, locate_rate(points)) for n, points in budgets if points]
    known = [(n, e.rate) for n, e in estimates]
    prior = prior_exponent(data_grows)
    regime = "data growing with N" if data_grows else "fixed data"
    if len({n for n, _ in known}) < 2:
        return LrFit(prior, None, None, len(known), "prior",
                     f"{len(known)} budget{'s' * (len(known) != 1)} to fit, Step Law with {regime}")
    slope = _slope(known)
    if len(known) < MIN_BUDGETS:
        return LrFit(prior, None, None, len(known), "prior",
                     f"2 budgets fit b = {slope:.3f} exactly, with no interval; Step Law with {regime}",
                     slope=slope)
    located = [(n, e.rate) for n, e in estimates if e.located]
    if len({n for n, _ in located}) < MIN_BUDGETS:
        low, high = _slope_interval(known, slope)
        whys = "; ".join(f"{budget_label(n)}: {e.why}" for n, e in estimates if not e.located)
        return LrFit(prior, low, high, len(known), "prior",
                     f"{len(located)} of {len(known)} budgets located their best rate ({whys}), so b = {slope:.3f} "
                     f"({CONFIDENCE:.0%} interval {low:.3f} to {high:.3f}) through them is not used; "
                     f"Step Law with {regime}", slope=slope)
    slope = _slope(located)
    low, high = _slope_interval(located, slope)
    fit = LrFit(slope, low, high, len(located), "fitted", f"{CONFIDENCE:.0%} interval {low:.3f} to {high:.3f}",
                slope=slope)
    if high - low > MAX_INTERVAL_WIDTH:
        why = f"the fitted {CONFIDENCE:.0%} interval {low:.3f} to {high:.3f} is wider than {MAX_INTERVAL_WIDTH:g}"
    elif not PLAUSIBLE[0] <= low <= high <= PLAUSIBLE[1]:
        why = f"the fitted interval {low:.3f} to {high:.3f} leaves the plausible {PLAUSIBLE[0]:g} to {PLAUSIBLE[1]:g}"
    else:
        return fit
    return LrFit(prior, low, high, len(located), "prior", f"{why}; Step Law with {regime}", slope=slope)


def _slope(rates: Sequence[tuple[int, float]]) -> float:
    """The least-squares slope of log lr against log N."""
    slope, _ = np.polyfit(np.log([float(n) for n, _ in rates]), np.log([lr for _, lr in rates]), 1)
    return float(slope)


def _slope_interval(rates: Sequence[tuple[int, float]], slope: float) -> tuple[float, float]:
    """The t-based CONFIDENCE interval of the least-squares slope of log lr against log N (n - 2
    degrees of freedom).  SciPy is imported here, not with the module: a worker's queue imports
    this module (through the upkeep) and fits a slope only when it plans a ladder's budget."""
    from scipy import stats

    x = np.log(np.array([n for n, _ in rates], dtype=float))
    y = np.log(np.array([lr for _, lr in rates], dtype=float))
    n = len(x)
    residual = y - (slope * x + (y.mean() - slope * x.mean()))
    sxx = float(((x - x.mean()) ** 2).sum())
    se = math.sqrt(float((residual**2).sum()) / (n - 2) / sxx)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 2)) * se
    return slope - half, slope + half


def probe_assignments(plan: Sequence[PlanEntry], best: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The phase-3 assignments of the plan's --lr-probe ranks: the rank-0 architecture (`best`, its
    assignment) with its training parameters, the learning rate times each entry's factor.  The
    probe is not clipped to the study's range: it brackets the rate the budget trained at, wherever
    that lies."""
    probes = sorted({(int(e.rank or 0), float(e.lr_probe)) for e in plan if e.lr_probe is not None})
    return [{"rank": rank, "lr_probe": factor, "arch_idx": int(best["arch_idx"]),
             "params": {**best["params"], "learning_rate": float(best["params"]["learning_rate"]) * factor}}
            for rank, factor in probes]
