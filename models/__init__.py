"""Model families: config dataclass + nn.Module + exact closed-form param_count() + data.

How a family is written (every family follows it; `archhpo grid`/`params`/`--help` must not
import torch, tests/cli/test_cli_startup.py checks it):

- ``models/NAME_spec.py`` is the family without torch: the config dataclass (validated in
  ``__post_init__`` with ``check_arch``), ``param_count``, ``flops_per_sample``, ``config_for``,
  its flags, and ``FAMILY = Family(...)``.  It imports no torch, numpy or pyarrow at the top
  (only the closed forms of ``_flops`` and the data module's ``parse_data``/``data_info``).
  The torch parts are given as ``Lazy("archhpo.models.NAME", "Network")``: ``build``, ``loss``,
  ``baseline_loss``, ``metrics`` (a shared one may point at another family's module, e.g.
  ``Lazy("archhpo.models.patchtst", "bce_loss")``).
- ``models/NAME.py`` holds the ``nn.Module``, loss and metrics; it imports torch and re-exports
  the spec's names (``from archhpo.models.NAME_spec import FAMILY, NameConfig, ...``).
- ``models/data/X.py``: ``parse_data`` and ``data_info`` of the default synthetic data run
  without torch/numpy/pyarrow; those are imported inside the functions that make arrays.
- Register ``"NAME": "archhpo.models.NAME_spec"`` below; tests/models/test_family_contract.py then runs
  every contract test (count = numel, meta build, FLOPs, validation, data integrity) on it.
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
