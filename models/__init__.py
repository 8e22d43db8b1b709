"""Model families: config dataclass + nn.Module + exact closed-form param_count() + data.

Each family is ``models/NAME_spec.py`` (the family without torch: config, counts, FLOPs, flags and
``FAMILY = Family(...)``, its torch parts given as ``Lazy``), ``models/NAME.py`` (the nn.Module,
loss and metrics) and its data in ``models/data/``; `archhpo grid`/`params`/`--help` must not import
torch (tests/cli/test_cli_startup.py).  Registering ``"NAME": "archhpo.models.NAME_spec"`` below
makes it a ``--family`` choice and puts it under every contract of tests/models/test_family_contract.py.
The recipe, step by step with a worked example: docs/development.md, "Adding a model family".
"""

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
    "patchtst": "archhpo.models.patchtst_spec",
    "ft_transformer": "archhpo.models.ft_transformer_spec",
    "csn_transformer": "archhpo.models.csn_transformer_spec",
    "char_cls": "archhpo.models.char_cls_spec",
    "signal": "archhpo.models.signal_spec",
    "lm": "archhpo.models.lm_spec",
}


def family_names() -> list[str]:
    return list(_FAMILY_MODULES)


def get_family(name: str) -> Family:
    import importlib

    if name not in _FAMILY_MODULES:
        known = ", ".join(_FAMILY_MODULES)
        raise ArchhpoError(f"Unknown family {name!r}; choose one of: {known}.")
    return importlib.import_module(_FAMILY_MODULES[name]).FAMILY
