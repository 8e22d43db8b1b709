"""The stored form of a study's options, the part that needs no declaration: the stored keys'
order (`STORED_ORDER`), the records the planner stores beside the settings (`RECORDS`) and the
methods of the typed view (`StoredView`), whose fields archhpo/config.py derives from the settings'
declarations (`StoredOptions`).  Imported by archhpo/config.py alone; it imports only the standard
library, archhpo.schema and the declaration of a setting (archhpo/_setting.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from archhpo._setting import ABSENT
from archhpo.schema import DataBudget, isoflop_key

# The keys of a study's stored options in their stored order: the four every study stores, the
# family's own options (FAMILY), then the others as earlier releases wrote them; a setting declared
# later is stored after these, in declaration order.  The records are what the planner stores
# beside the settings (RECORDS).
FAMILY = "<family>"
STORED_ORDER = ("horizon", "threshold", "quick", "seed", FAMILY, "paired_seeds", "confirm", "confirm_seeds",
                "confirm_sequential", "schedule", "cooldown", "halving", "ladder", "baselines", "lr_probe", "compile",
                "data_budget", "data_seed", "isoflop")


@dataclass(frozen=True)
class Record:
    """A stored key the planner writes (not one setting's value): its type and what a study without
    it reads."""

    key: str
    kind: Any
    before: Any = None
    decode: Callable[[Any], Any] | None = None


RECORDS = (
    Record("halving", Mapping[str, Any] | None),  # the stopping rule's (search/_rules.py study_options)
    Record("ladder", Mapping[str, Any] | None),  # a ladder budget's smaller studies: {"below": [names]}
    Record("baselines", tuple[str, ...], (), tuple),  # the rule-picked shapes phase 3 trains
    Record("data_budget", Mapping[str, Any] | None),  # DataBudget.as_option
    Record("isoflop", Mapping[str, Any] | None),  # an IsoFLOP study's plan (search/_isoflop_study.py)
)


def read_stored(key: str, before: Any, decode: Callable[[Any], Any] | None, stored: Mapping[str, Any]) -> Any:
    record, _, leaf = key.partition(".")
    value = stored.get(record, ABSENT)
    if leaf:
        value = value.get(leaf, ABSENT) if isinstance(value, Mapping) else ABSENT
    if value is ABSENT:
        return before
    return decode(value) if decode is not None else value


class StoredView:
    """A study's options as it stores them (``StudySettings.options``; a worker's ``TrialSpec`` reads
    the same dict), typed and frozen: StoredOptions, a field per stored key derived from the
    declarations (archhpo/config.py), each defaulting to what a study stored before the key existed
    reads.  `from_dict` keeps every key (one no field names is the family's, in `family`) and
    `as_dict` writes them back in their stored order, so a reloaded study is stored byte for byte
    as the one launched; two are equal when their stored dicts are (key order aside)."""

    _ALWAYS: ClassVar[tuple[str, ...]] = ()  # the keys every study stores, in the stored order
    _NESTED: ClassVar[Mapping[str, Callable[[Mapping[str, Any]], Any]]] = {}  # settings inside a record
    family: Mapping[str, Any]
    keys: tuple[str, ...]
    ladder: Mapping[str, Any] | None
    isoflop: Mapping[str, Any] | None
    data_budget: Mapping[str, Any] | None
    trust_each_budget: bool

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            if f.metadata.get("tuple"):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        if not self.keys:
            named = [f.name for f in fields(self) if f.name not in (*self._ALWAYS, "family", "keys")  # type: ignore[arg-type]
                     and getattr(self, f.name) != f.default]
            object.__setattr__(self, "keys", (*self._ALWAYS, *self.family, *named))

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> Any:
        """The options of a study as stored (its user attribute's JSON object)."""
        named = {f.name for f in fields(cls)} - {"family", "keys"}  # type: ignore[arg-type]
        values: dict[str, Any] = {k: v for k, v in stored.items() if k in named}
        values.update(family={k: v for k, v in stored.items() if k not in named}, keys=tuple(stored))
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The stored form: the keys of `keys` in their order (lists for tuples, nested dicts copied)."""
        out: dict[str, Any] = {}
        for key in self.keys:
            value = self.family[key] if key in self.family else getattr(self, key)
            out[key] = list(value) if isinstance(value, tuple) else copy.deepcopy(value)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoredView) and self.as_dict() == other.as_dict()

    def __getattr__(self, name: str) -> Any:
        """A setting stored inside a record (confirm_at_rung: the ladder record's "confirm")."""
        if name.startswith("_") or name not in self._NESTED:
            raise AttributeError(f"StoredOptions has no {name!r}")
        return self._NESTED[name](self.as_dict())

    @property
    def ladder_below(self) -> tuple[str, ...]:
        """A ladder budget's smaller studies, smallest first; () when the study is not on a ladder."""
        return tuple((self.ladder or {}).get("below", ()))

    @property
    def scored_for_above(self) -> bool:
        """Whether a budget above reads this one's rung scores (--trust-each-budget, not the largest)."""
        return bool(self.trust_each_budget) and not (self.ladder or {}).get("largest", True)

    def planned_samples(self, arch: Mapping[str, Any]) -> int | None:
        """The training samples an IsoFLOP study planned for architecture `arch` (its FLOPs within 1% of
        the study's C: budgets/_isoflop.py), or None (not an IsoFLOP study, or an architecture it did not plan)."""
        samples = (self.isoflop or {}).get("samples")
        if not samples:  # not an IsoFLOP study: the architecture needs no key (it may be partial)
            return None
        found = samples.get(isoflop_key(arch))
        return None if found is None else int(found)

    @property
    def budget(self) -> DataBudget | None:
        """The study's data per parameter, or None (whole epochs)."""
        return DataBudget.of({DataBudget.OPTION: self.data_budget})


def order(top: Mapping[str, Any], family: Mapping[str, Any]) -> dict[str, Any]:
    """The stored keys `top` and the family's options in the stored order: STORED_ORDER's keys
    first (the family's where it says FAMILY), then any other key in its given order."""
    out: dict[str, Any] = {}
    for key in STORED_ORDER:
        if key == FAMILY:
            out.update(family)
        elif key in top:
            out[key] = top[key]
    return {**out, **{k: v for k, v in top.items() if k not in out}}


__all__ = ["FAMILY", "RECORDS", "STORED_ORDER", "Record", "StoredView", "order", "read_stored"]
