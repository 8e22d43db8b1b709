"""The IsoFLOP section of a study's config (`archhpo.config.StudyConfig.isoflop`), and the check
that refuses the options an IsoFLOP study plans itself. Imported by archhpo/config.py alone (every
layer reads it from there); like it, it imports only archhpo.errors and the declaration of a
setting (archhpo/_setting.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from archhpo._setting import setting
from archhpo.errors import BudgetError, ConfigError, StudyError


def _needs_isoflop(name: str) -> tuple[str, Any]:
    flag = "--" + name.replace("_", "-")
    return (f"{flag} shapes an IsoFLOP study, so it needs --isoflop C; add --isoflop or drop {flag}.",
            lambda c: bool(c.isoflop.computes))


def _check_types(obj: Any) -> None:
    """Each int, float or str field holds such a value (as archhpo.config checks its sections)."""
    kinds = {"int": (int,), "float": (int, float), "str | None": (str, type(None))}
    for f in fields(obj):
        value, want = getattr(obj, f.name), kinds.get(str(f.type))
        if want is not None and (isinstance(value, bool) or not isinstance(value, want)):
            raise ConfigError(f"{f.name} must be {str(f.type).removesuffix(' | None')}, got {value!r}.")


@dataclass(frozen=True)
class Isoflop:
    """An IsoFLOP study: at each compute budget C, models of several sizes trained on D = C/(k·N) tokens
    (budgets/_isoflop.py plans them; docs/compute-optimal.md)."""

    computes: tuple[float, ...] = setting(
        (), "plan an IsoFLOP study at compute budget C FLOPs; repeat for several C (instead of --budget)",
        option="isoflop", parse=float, repeat=True, metavar="C", cli_default=None)
    sizes: int = setting(7, "with --isoflop: model sizes per compute budget (at least 5)", parse=int,
                         metavar="N", needs=_needs_isoflop("sizes"))
    span: float = setting(10.0, "with --isoflop: the largest size over the smallest at each C", parse=float,
                          metavar="S", needs=_needs_isoflop("span"))
    centres: tuple[float, ...] = setting(
        (), "with --isoflop: the size N_c the sizes centre on, one per C or one for all", option="centre",
        parse=float, repeat=True, metavar="N", cli_default=None, needs=_needs_isoflop("centre"))
    centre_from: str | None = setting(
        None, "with --isoflop: centre the sizes on this earlier experiment's fitted IsoFLOP law",
        metavar="EXPERIMENT", needs=_needs_isoflop("centre_from"))
    shapes: int = setting(1, "with --isoflop: shapes (distinct width, depth or FFN) per size; the fit keeps the best",
                          parse=int, metavar="K", needs=_needs_isoflop("shapes"))

    def __post_init__(self) -> None:
        _check_types(self)
        object.__setattr__(self, "computes", tuple(float(c) for c in self.computes))
        object.__setattr__(self, "centres", tuple(float(c) for c in self.centres))
        for c in self.computes:
            if not (math.isfinite(c) and c > 0):
                raise BudgetError(f"--isoflop {c:g} must be a positive number of training FLOPs, e.g. --isoflop 1e13.")
        if len(set(self.computes)) != len(self.computes):
            raise BudgetError("--isoflop lists a compute budget twice; give each C once.")
        if self.sizes < 5:
            raise BudgetError(f"--sizes {self.sizes}: an IsoFLOP profile needs at least 5 sizes per compute "
                              "budget to fit its parabola; give --sizes 5 or more.")
        if not (math.isfinite(self.span) and self.span > 1):
            raise BudgetError(f"--span {self.span:g} must be above 1 (the largest size over the smallest, e.g. 10).")
        if self.shapes < 1:
            raise BudgetError(f"--shapes {self.shapes} must be at least 1 (architectures per size).")
        if any(not (math.isfinite(c) and c > 0) for c in self.centres):
            raise BudgetError("--centre must be a positive parameter count, e.g. --centre 2e5.")
        if self.centres and len(self.centres) not in (1, len(self.computes)):
            raise BudgetError(f"--centre is given {len(self.centres)} times for {len(self.computes)} --isoflop "
                              "budgets; give one per --isoflop C, in the same order, or one for all.")
        if self.centres and self.centre_from:
            raise BudgetError("Give --centre or --centre-from, not both.")

    def centre_of(self, compute: float) -> float | None:
        """The stated centre of compute budget `compute` (None: the prior's or the law's)."""
        if not self.centres:
            return None
        return self.centres[0] if len(self.centres) == 1 else self.centres[self.computes.index(compute)]


def check_isoflop(config: Any) -> None:
    """--isoflop plans its own sizes and data, one set of training parameters, no early stopping:
    refused beside the options that plan otherwise (`config`: an archhpo.config.StudyConfig)."""
    clash = [flag for flag, on in (("--budget", config.budgets), ("--tokens-per-param", config.data.tokens_per_param),
                                   ("--samples-per-param", config.data.samples_per_param),
                                   ("--ladder", config.ladder), ("--paired-seeds", config.paired_seeds),
                                   ("--confirm", config.confirm.top))
             if on]
    if clash:
        raise StudyError(f"--isoflop plans each compute budget's sizes and data itself, so it takes no "
                         f"{' or '.join(clash)}; drop {'them' if len(clash) > 1 else 'it'} (--n-heads and "
                         "--d-ff lists may filter its grid, --d-model and --n-layers lists replace its widths "
                         "and depths).")
    if "pruner" in config.given and config.pruning.rule != "none":
        raise StudyError(f"--pruner {config.pruning.rule} would stop an IsoFLOP study's trials before their FLOPs "
                         "reach C; drop --pruner (IsoFLOP trials always train to the end).")


__all__ = ["Isoflop", "check_isoflop"]
