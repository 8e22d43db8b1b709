"""Creating a study with its plan (launch) and everything a worker reads back from it.

One Optuna study per (experiment, budget).  Its user attributes hold all a worker on another
machine needs (family, data spec, task options, the architecture list, the plan), so a worker
needs only the storage URL and the study name.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.storages import RDBStorage

from archhpo.budgets import (
    DEFAULT_TOLERANCE,
    budget_label,
    build_grid,
    check_tolerance,
    parse_budget,
    require_rows,
)
from archhpo.errors import BudgetError, StorageError, StudyError
from archhpo.models import get_family
from archhpo.search._plan import PlanEntry, make_plan
from archhpo.search._space import FULL_SPACE, QUICK_SPACE, SearchSpace
from archhpo.search._storage import open_storage, plan_lock

SCHEMA_VERSION = 1
PRUNERS = ("median", "none")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")



def study_name(experiment: str, budget: str) -> str:
    return f"{experiment}_{budget}"


def check_experiment(name: str) -> str:
    if not _NAME.match(name):
        raise StudyError(
            f"Experiment name {name!r} must start with a letter or digit and use only letters, digits, "
            "'_', '.' and '-'; pick another --experiment."
        )
    return name


@dataclass
class StudySettings:
    """What `launch` stores in the study; the single source of truth for every worker."""

    experiment: str
    budget: str
    budget_value: int
    family: str
    tolerance: float
    data: dict[str, Any]
    options: dict[str, Any]  # horizon, threshold, quick, seed (+ family options)
    info: dict[str, Any]  # data shape facts the family's config needs
    archs: list[dict[str, Any]]  # GridRow dicts, indexed by arch_idx
    plan: list[dict[str, Any]]  # PlanEntry dicts
    space: dict[str, Any]
    n_trials: int
    pruner: str = "median"
    schema: int = SCHEMA_VERSION
    phase2_params: dict[str, Any] | None = field(default=None)

    @property
    def study_name(self) -> str:
        return study_name(self.experiment, self.budget)

    @property
    def search_space(self) -> SearchSpace:
        return SearchSpace.from_dict(self.space)

    def to_attrs(self) -> dict[str, Any]:
        return {f"archhpo_{k}": v for k, v in self.__dict__.items()}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], name: str) -> StudySettings:
        fields = {k[len("archhpo_"):]: v for k, v in attrs.items() if k.startswith("archhpo_")}
        if "plan" not in fields:
            raise StudyError(
                f"Study {name!r} was not created by `archhpo launch` (it has no plan); "
                "launch it first or check --experiment/--budget."
            )
        if fields.get("schema", 0) > SCHEMA_VERSION:
            raise StudyError(f"Study {name!r} was written by a newer archhpo; upgrade archhpo on this machine.")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in fields.items() if k in known})


def make_pruner(name: str, quick: bool) -> optuna.pruners.BasePruner:
    if name == "none":
        return optuna.pruners.NopPruner()
    # Median rule after a few finished trials; never before the model had a fair start.
    return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1 if quick else 10)


def load_study(storage: RDBStorage, name: str) -> optuna.Study:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            # The plan fixes every parameter, so the sampler never chooses: random is the cheapest.
            return optuna.load_study(study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler())
        except KeyError:
            raise StudyError(
                f"No study named {name!r} in this storage; run `archhpo launch` with the same "
                "--experiment, --budget and --storage first."
            ) from None


def read_settings(storage: RDBStorage, name: str) -> StudySettings:
    return StudySettings.from_attrs(load_study(storage, name).user_attrs, name)


@dataclass(frozen=True)
class LaunchResult:
    settings: StudySettings
    created: bool  # False when an identical study already existed (nothing was duplicated)
    enqueued: int


def prepare_settings(
    experiment: str,
    budget: str | int,
    *,
    family: str = "patchtst",
    n_trials: int = 50,
    data: str = "synthetic",
    horizon: int = 1,
    threshold: float = 0.01,
    seed: int = 0,
    quick: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
    pruner: str = "median",
    family_options: dict[str, Any] | None = None,
) -> StudySettings:
    """Validate everything and compute the grid and plan, touching no database."""
    check_experiment(experiment)
    value = parse_budget(budget)
    check_tolerance(tolerance)
    if horizon < 1:
        raise BudgetError(f"--horizon must be at least 1 step, got {horizon}.")
    if pruner not in PRUNERS:
        raise StudyError(f"Unknown pruner {pruner!r}; choose one of: {', '.join(PRUNERS)}.")
    fam = get_family(family)
    options: dict[str, Any] = {"horizon": horizon, "threshold": threshold, "quick": quick, "seed": seed}
    options.update(family_options or {})
    spec = fam.parse_data(data, options)
    info = fam.data_info(spec, options)
    for key, choice in (family_options or {}).items():
        info.setdefault(key, choice)  # model-only choices (variant, encoder); the data wins on shapes
    rows = require_rows(build_grid(fam, value, info, tolerance), value, tolerance, family)
    space = QUICK_SPACE if quick else FULL_SPACE
    plan = make_plan(rows, n_trials, space, seed)
    return StudySettings(
        experiment=experiment, budget=budget_label(budget), budget_value=value, family=family,
        tolerance=tolerance, data=spec, options=options, info=info,
        archs=[r.as_dict() for r in rows], plan=[e.as_dict() for e in plan],
        space=space.as_dict(), n_trials=n_trials, pruner=pruner,
    )


# Settings that must agree when a study is launched again (data may be re-resolved to the
# same absolute path; everything that changes the plan or the results must match).
_IDENTITY = ("family", "tolerance", "data", "options", "n_trials", "pruner", "budget_value")


def launch(storage_url: str, settings: StudySettings, storage: RDBStorage | None = None) -> LaunchResult:
    """Create the study and enqueue phase 1, or reload it; launching twice never duplicates."""
    storage = storage or open_storage(storage_url)
    name = settings.study_name
    with plan_lock(storage, name):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(
                study_name=name, storage=storage, direction="minimize", load_if_exists=True,
                sampler=optuna.samplers.RandomSampler(),
            )
        if study.direction != optuna.study.StudyDirection.MINIMIZE:
            raise StudyError(f"Study {name!r} exists but maximises; use another --experiment name.")
        attrs = study.user_attrs
        created = "archhpo_plan" not in attrs
        if created:
            for key, value in settings.to_attrs().items():
                study.set_user_attr(key, value)
            stored = settings
        else:
            stored = StudySettings.from_attrs(attrs, name)
            diffs = [k for k in _IDENTITY if getattr(stored, k) != getattr(settings, k)]
            if diffs:
                raise StudyError(
                    f"Study {name!r} already exists with different settings ({', '.join(diffs)}); "
                    "launch under a new --experiment name or repeat the original options."
                )
        enqueued = enqueue_missing(study, stored, phase=1)
    return LaunchResult(stored, created, enqueued)


def planned_slots(study: optuna.Study) -> set[int]:
    return {
        int(t.user_attrs["plan_slot"])
        for t in study.get_trials(deepcopy=False)
        if "plan_slot" in t.user_attrs
    }


def enqueue_missing(
    study: optuna.Study, settings: StudySettings, phase: int, params: dict[str, Any] | None = None
) -> int:
    """Enqueue every plan entry of `phase` that has no trial yet (call under plan_lock)."""
    have = planned_slots(study)
    n = 0
    for entry in map(lambda d: PlanEntry(**d), settings.plan):
        if entry.phase != phase or entry.slot in have:
            continue
        training = entry.params if entry.params is not None else params
        if training is None:
            raise StudyError(f"Phase-{phase} entry {entry.slot} has no training parameters.")
        study.enqueue_trial(
            {"arch_idx": entry.arch_idx, **training},
            user_attrs={"plan_slot": entry.slot, "phase": entry.phase, "attempt": 1},
        )
        n += 1
    return n


def open_study(storage_url: str, experiment: str, budget: str) -> tuple[RDBStorage, optuna.Study, StudySettings]:
    storage = open_storage(storage_url)
    name = study_name(check_experiment(experiment), budget_label(budget))
    study = load_study(storage, name)
    return storage, study, StudySettings.from_attrs(study.user_attrs, name)


def experiment_studies(storage: RDBStorage, experiment: str) -> list[str]:
    """Names of every archhpo study of this experiment in the storage, smallest budget first."""
    found = []
    for summary in optuna.get_all_study_summaries(storage=storage, include_best_trial=False):
        attrs = summary.user_attrs
        if attrs.get("archhpo_experiment") == experiment and "archhpo_plan" in attrs:
            found.append((attrs.get("archhpo_budget_value", 0), summary.study_name))
    return [name for _, name in sorted(found)]


__all__ = [
    "LaunchResult",
    "StorageError",
    "StudyError",
    "StudySettings",
    "check_experiment",
    "experiment_studies",
    "launch",
    "load_study",
    "make_pruner",
    "open_study",
    "prepare_settings",
    "read_settings",
    "study_name",
]
