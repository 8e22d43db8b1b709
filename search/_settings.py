"""The study's record: what `launch` stores in a study and everyone else reads back.

StudySettings (its fields, their stored form: ``to_attrs``/``from_attrs``), the names of the
study user attributes it lives under (``settings_attr``, ``LADDER_KEY``), a study's name, and
opening a stored study (``load_study``, ``read_settings``).  The launch (_study.py), the queue and
the upkeep, the rules, the rankings and the report all read it, so it sits at the bottom of
search/: of search/ it imports only the definitions its fields are made of (_plan.py's PlanEntry,
_space.py's SearchSpace), and the package's import graph has no circles
(tests/search/test_import_graph.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.storages import RDBStorage

from archhpo.config import StoredOptions
from archhpo.errors import StudyError
from archhpo.search._plan import PlanEntry
from archhpo.search._space import SearchSpace

SCHEMA_VERSION = 1


def settings_attr(field: str) -> str:
    """The study user attribute holding StudySettings' `field` (`to_attrs`): archhpo_{field}."""
    return f"archhpo_{field}"


LADDER_KEY = "archhpo_ladder"  # a ladder budget's carried values and phase-1 assignments (search/_ladder.py)


def study_name(experiment: str, budget: str) -> str:
    return f"{experiment}_{budget}"


@dataclass
class StudySettings:
    """What `launch` stores in the study; the single source of truth for every worker."""

    experiment: str
    budget: str
    budget_value: int
    family: str
    tolerance: float
    data: dict[str, Any]
    options: StoredOptions  # horizon, threshold, quick, seed (+ family options), typed
    info: dict[str, Any]  # data shape facts the family's config needs
    archs: list[dict[str, Any]]  # GridRow dicts, indexed by arch_idx
    plan: list[PlanEntry]  # stored as PlanEntry.as_dict() dicts (to_attrs/from_attrs)
    space: dict[str, Any]
    n_trials: int
    pruner: str = "median"
    schema: int = SCHEMA_VERSION
    phase2_params: dict[str, Any] | None = field(default=None)
    # Categorical grid dimensions ({"encoder": ["sum", "linear"]}); each arch row has its "choices".
    choices: dict[str, list[Any]] = field(default_factory=dict)
    # Pinned architecture dimensions ({"d_model": [64], "n_layers": [2, 3]}); {} for a plain budget.
    pins: dict[str, list[int]] = field(default_factory=dict)
    # Phase 3 (confirmation), set by plan upkeep once phases 1-2 are final:
    # [{"rank": k, "arch_idx": i, "params": {...}, "selection_value": v, "trial": n}] (missing ranks:
    # fewer architectures finished than --confirm asked for; their slots are skipped).
    phase3: list[dict[str, Any]] | None = field(default=None)

    @property
    def study_name(self) -> str:
        return study_name(self.experiment, self.budget)

    @property
    def search_space(self) -> SearchSpace:
        return SearchSpace.from_dict(self.space)

    def to_attrs(self) -> dict[str, Any]:
        """The study's user attributes: every field under archhpo_*, the options and the plan in their
        stored (JSON) form; the one place they are serialised (`from_attrs` reads them back)."""
        stored = {**self.__dict__, "options": self.options.as_dict(), "plan": [e.as_dict() for e in self.plan]}
        return {settings_attr(k): v for k, v in stored.items()}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], name: str) -> StudySettings:
        prefix = settings_attr("")
        fields = {k[len(prefix):]: v for k, v in attrs.items() if k.startswith(prefix)}
        if "plan" not in fields:
            raise StudyError(
                f"Study {name!r} was not created by `archhpo launch` (it has no plan); "
                "launch it first or check --experiment/--budget."
            )
        if fields.get("schema", 0) > SCHEMA_VERSION:
            raise StudyError(f"Study {name!r} was written by a newer archhpo; upgrade archhpo on this machine.")
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in fields.items() if k in known}
        values.update(options=StoredOptions.from_dict(values.get("options") or {}),
                      plan=[PlanEntry.from_dict(d) for d in values["plan"]])
        return cls(**values)


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


__all__ = [
    "LADDER_KEY",
    "SCHEMA_VERSION",
    "StudySettings",
    "load_study",
    "read_settings",
    "settings_attr",
    "study_name",
]
