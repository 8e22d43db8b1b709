"""A family's own flags (``--encoder``, ``--vocab-size``) as a frozen dataclass of their own
(`family_options_class`), typed from the family's ``flags``.  Imported by archhpo/config.py alone
(every layer reads it from there); it imports only the standard library and archhpo.errors.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import field, fields
from typing import Any, ClassVar

from archhpo.errors import ConfigError


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class FamilyOptions:
    """A family's flags as a frozen dataclass (built by `family_options_class`): a field per flag,
    None when not set (the family's default applies and nothing is stored), else one value or a
    list of values (a categorical grid dimension)."""

    FAMILY: ClassVar[str] = ""
    DEFAULTS: ClassVar[Mapping[str, Any]] = {}

    def given(self) -> dict[str, Any]:
        """The flags that were set, by name (what the study stores)."""
        return {f.name: getattr(self, f.name) for f in fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) is not None}

    def values(self) -> dict[str, Any]:
        """Every flag: the set ones, else the family's default."""
        return {**self.DEFAULTS, **self.given()}


def _check_flag(family: str, flag: Any, value: Any) -> None:
    if value is None or not isinstance(flag.type, type):
        return  # a parsing function (cat_cardinalities): the family checks what it returns
    kinds: tuple[type, ...] = (int, float) if flag.type is float else (flag.type,)
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) and flag.type is not bool or not isinstance(item, kinds):
            raise ConfigError(f"{_flag(flag.name)} of the {family} family must be {flag.type.__name__} (or a list "
                              f"of them), got {item!r}.")


@functools.cache
def family_options_class(family: str, flags: tuple[Any, ...]) -> type[FamilyOptions]:
    """The frozen dataclass of `family`'s flags (``Family.flags``: name, type, default, help)."""
    specs = {f.name: f for f in flags}

    def post_init(self: FamilyOptions) -> None:
        for name, spec in specs.items():
            _check_flag(family, spec, getattr(self, name))

    cls = dataclasses.make_dataclass(
        f"{family.title().replace('_', '')}Options",
        [(f.name, Any, field(default=None, metadata={"help": f.help, "type": f.type})) for f in flags],
        bases=(FamilyOptions,), frozen=True,
        namespace={"FAMILY": family, "DEFAULTS": {f.name: f.default for f in flags}, "__post_init__": post_init},
    )
    cls.__doc__ = f"The {family} family's flags."
    return cls


def family_options_of(family: str, flags: Sequence[Any], values: Mapping[str, Any]) -> FamilyOptions:
    """`values` (flag name -> value or list) as the family's options, refusing a flag it does not have."""
    cls = family_options_class(family, tuple(flags))
    unknown = sorted(set(values) - {f.name for f in flags})
    if unknown:
        raise ConfigError(f"{_flag(unknown[0])} is not a flag of the {family} family; its flags: "
                          f"{', '.join(_flag(f.name) for f in flags) or 'none'}.")
    return cls(**values)


__all__ = ["FamilyOptions", "family_options_class", "family_options_of"]
