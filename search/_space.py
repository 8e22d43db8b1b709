"""Training-parameter ranges (docs/design.md §5) and their Optuna distributions.

`--quick` studies use a shrunken space so that what is recorded is what was trained: a quick
trial that ran 3 epochs says epochs=3, never 50.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from archhpo.errors import BudgetError
from archhpo.schema import ARCH_KEYS, PLAN_PARAMS, TRAINING, TRAINING_PARAMS, training_param

PARAM_NAMES = PLAN_PARAMS  # the Optuna parameters of a planned trial (archhpo.schema)
# Stored beside arch_idx on every trial (never part of the design's parameters: best_params and
# requeues keep PARAM_NAMES), so optuna-dashboard's importance, slice and parallel-coordinate
# plots name architecture dimensions instead of ranking an index.
ARCH_PARAMS = ARCH_KEYS
_CATEGORY_TYPES = (str, int, float, bool, type(None))


def arch_distributions(archs: list[dict[str, Any]]) -> dict[str, BaseDistribution]:
    """Optuna distributions of a study's architecture dimensions: each of `ARCH_PARAMS` as an
    integer range over the grid (log-scaled, as the grid is), each categorical choice (``encoder``)
    as its values in grid order.  A choice whose name is taken or whose values Optuna cannot
    store as a category is left out (it stays in the trial's ``choices`` attribute)."""
    out: dict[str, BaseDistribution] = {}
    for k in ARCH_PARAMS:
        values = sorted({int(a[k]) for a in archs if a.get(k) is not None})
        if values:
            out[k] = IntDistribution(values[0], values[-1], log=values[0] >= 1)
    seen: dict[str, list[Any]] = {}
    for arch in archs:
        for k, v in (arch.get("choices") or {}).items():
            if v not in seen.setdefault(k, []):
                seen[k].append(v)
    for k, values in seen.items():
        if k not in out and k not in PARAM_NAMES and all(isinstance(v, _CATEGORY_TYPES) for v in values):
            out[k] = CategoricalDistribution(values)
    return out


def arch_params(arch: dict[str, Any], distributions: dict[str, BaseDistribution]) -> dict[str, Any]:
    """A trial's architecture dimensions and choices, for the names `arch_distributions` gave."""
    values = {**{k: arch.get(k) for k in ARCH_PARAMS}, **(arch.get("choices") or {})}
    return {k: (int(values[k]) if k in ARCH_PARAMS else values[k])
            for k in distributions if k not in PARAM_NAMES and values.get(k) is not None}


@dataclass(frozen=True)
class SearchSpace:
    """The training parameters' ranges (defaults: a full study's, from archhpo.schema)."""

    learning_rate: tuple[float, float] = training_param("learning_rate").full  # type: ignore[assignment]
    epochs: tuple[int, ...] = training_param("epochs").full  # type: ignore[assignment]
    batch_size: tuple[int, ...] = training_param("batch_size").full  # type: ignore[assignment]
    weight_decay: tuple[float, float] = training_param("weight_decay").full  # type: ignore[assignment]
    warmup_steps: tuple[int, ...] = training_param("warmup_steps").full  # type: ignore[assignment]

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchSpace:
        return cls(**{k: tuple(v) for k, v in d.items()})

    def distributions(self, n_archs: int) -> dict[str, BaseDistribution]:
        return {
            "arch_idx": IntDistribution(0, max(n_archs - 1, 0)),
            "learning_rate": FloatDistribution(*self.learning_rate, log=self.learning_rate[0] > 0),
            "epochs": CategoricalDistribution(self.epochs),
            "batch_size": CategoricalDistribution(self.batch_size),
            "weight_decay": FloatDistribution(*self.weight_decay, log=self.weight_decay[0] > 0),
            "warmup_steps": CategoricalDistribution(self.warmup_steps),
        }

    def sample(self, rng: random.Random) -> dict[str, Any]:
        def log_uniform(lo: float, hi: float) -> float:
            if lo == hi:  # a fixed parameter: exactly its value, never a rounding of it
                rng.random()  # keep the draws of the other parameters where they were
                return float(lo)
            return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))

        return {
            "learning_rate": log_uniform(*self.learning_rate),
            "epochs": rng.choice(self.epochs),
            "batch_size": rng.choice(self.batch_size),
            "weight_decay": log_uniform(*self.weight_decay),
            "warmup_steps": rng.choice(self.warmup_steps),
        }

    def default(self) -> dict[str, Any]:
        """Mid-range parameters, used for phase 2 if every phase-1 trial failed."""
        def mid(lo: float, hi: float) -> float:
            return float(lo) if lo == hi else math.sqrt(lo * hi)

        return {
            "learning_rate": mid(*self.learning_rate),
            "epochs": self.epochs[len(self.epochs) // 2],
            "batch_size": self.batch_size[len(self.batch_size) // 2],
            "weight_decay": mid(*self.weight_decay),
            "warmup_steps": self.warmup_steps[len(self.warmup_steps) // 2],
        }


    def bracketing(self, rate: float | None) -> SearchSpace:
        """This space with its learning-rate range moved, at the same log width, to centre on
        `rate` (a family's own default rate) when the range does not already hold it: an unstated
        range then searches around the rate the family trains at, not beside it."""
        lo, hi = self.learning_rate
        if rate is None or lo == hi or lo <= rate <= hi:
            return self
        half = math.sqrt(hi / lo)
        return replace(self, learning_rate=(rate / half, rate * half))

    def within(self, ranges: Mapping[str, tuple[float, float]]) -> SearchSpace:
        """This space with the given log-scaled parameters sampled within stated ranges (LO, HI)
        instead of its own (StudyConfig checked them: 0 < LO < HI)."""
        stated: dict[str, Any] = {k: (float(lo), float(hi)) for k, (lo, hi) in ranges.items()}
        return replace(self, **stated)

    def fixed(self, values: dict[str, Any]) -> SearchSpace:
        """This space with the given training parameters fixed (a one-point range or set), so the
        plan samples only the others and Optuna's distributions contain the fixed values."""
        unknown = set(values) - set(TRAINING_PARAMS)
        if unknown:
            raise BudgetError(f"Cannot fix {', '.join(sorted(unknown))}; fixable: {', '.join(TRAINING_PARAMS)}.")
        changes: dict[str, Any] = {}
        for key, value in values.items():
            if training_param(key).kind == "log":
                v = float(value)
                if not (v > 0 or (key == "weight_decay" and v == 0)) or not math.isfinite(v):
                    raise BudgetError(f"--{key.replace('_', '-')} {value} must be a positive number.")
                changes[key] = (v, v)
            else:
                v = int(value)
                if v < (0 if key == "warmup_steps" else 1):
                    raise BudgetError(f"--{key.replace('_', '-')} {value} must be a positive integer.")
                changes[key] = (v,)
        return replace(self, **changes)


FULL_SPACE = SearchSpace()
# Quick studies: a few epochs and warm-ups that fit inside them (a few dozen steps per epoch).
QUICK_SPACE = SearchSpace(**{p.name: p.quick for p in TRAINING})  # type: ignore[arg-type]
