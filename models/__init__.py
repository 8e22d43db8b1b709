"""Model families: config dataclass + nn.Module + exact closed-form param_count() + data."""

from __future__ import annotations

from archhpo.errors import ArchhpoError
from archhpo.models._family import Family, FlagSpec, TensorDataset, check_arch
from archhpo.models._flops import count_flops

__all__ = [
    "Family",
    "FlagSpec",
    "TensorDataset",
    "check_arch",
    "count_flops",
    "family_names",
    "get_family",
]

# Imported lazily so that `archhpo grid` does not pay for every family's imports.
_FAMILY_MODULES = {
    "patchtst": "archhpo.models.patchtst",
    "ft_transformer": "archhpo.models.ft_transformer",
    "csn_transformer": "archhpo.models.csn_transformer",
    "char_cls": "archhpo.models.char_cls",
    "signal": "archhpo.models.signal",
    "lm": "archhpo.models.lm",
}


def family_names() -> list[str]:
    return list(_FAMILY_MODULES)


def get_family(name: str) -> Family:
    import importlib

    if name not in _FAMILY_MODULES:
        known = ", ".join(_FAMILY_MODULES)
        raise ArchhpoError(f"Unknown family {name!r}; choose one of: {known}.")
    return importlib.import_module(_FAMILY_MODULES[name]).FAMILY
