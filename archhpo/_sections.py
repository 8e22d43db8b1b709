"""The sections of a study's config (`archhpo.config.StudyConfig`'s data, pruning, schedule and
confirm), each field a declared setting (archhpo/_setting.py).  Imported by archhpo/config.py
alone (every layer reads them from there); it imports only the standard library, archhpo.schema,
archhpo.errors and the declaration of a setting.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from archhpo._setting import ABSENT, EXPORT, STUDY_COMMANDS, TRAIN, WORKER, setting
from archhpo.errors import BudgetError, ConfigError, StudyError
from archhpo.schema import (
    DEFAULT_ETA,
    DEFAULT_MIN_FRACTION,
    LR_PROBE_FACTORS,
    PRUNERS,
    SCHEDULES,
    check_schedule,
)

SCALARS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def check_types(obj: Any) -> None:
    """Each field annotated int, float, str or bool (optionally `| None`) holds such a value."""
    for f in fields(obj):
        spec = str(f.type)
        optional = spec.endswith(" | None")
        kinds = SCALARS.get(spec.removesuffix(" | None"))
        value = getattr(obj, f.name)
        if kinds is None or (optional and value is None):
            continue
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ConfigError(f"{f.name} must be {spec.removesuffix(' | None')}, got {value!r}.")


TRAIN_TOO = (*STUDY_COMMANDS, TRAIN)  # train reads these from --from's best JSON, else the default
FROM_BEST = {TRAIN: None}


def _needs_halving(flag: str) -> tuple[str, Callable[[Any], bool]]:
    return (f"{flag} counts only with --pruner halving; add --pruner halving or drop {flag}.",
            lambda c: c.pruning.rule == "halving")


def _on_ladder(flags: str) -> tuple[str, Callable[[Any], bool]]:
    return (f"{flags} choose where a ladder budget confirms its finalists, so they need --ladder with its halving "
            "(not another --pruner); add --ladder or drop the flag.", lambda c: c.ladder and c.pruning.rule == "halving")


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule every trial of the study trains with."""

    name: str = setting("cosine", "learning-rate schedule: cosine decay, or wsd (constant, then a 1-sqrt cooldown)",
                        option="schedule", stored="schedule", choices=SCHEDULES, commands=TRAIN_TOO,
                        command_defaults=FROM_BEST)
    cooldown: float = setting(
        0.2, "with --schedule wsd: the fraction of the steps spent cooling down, in [0, 1)", parse=float,
        stored="cooldown", beside="schedule", always=True, commands=TRAIN_TOO, command_defaults=FROM_BEST,
        needs=("--cooldown counts only with --schedule wsd (cosine has no cooldown); add --schedule wsd or drop "
               "--cooldown.", lambda c: c.schedule.name == "wsd"))

    def __post_init__(self) -> None:
        check_types(self)
        check_schedule(self.name, self.cooldown)


@dataclass(frozen=True)
class Pruning:
    """How trials are stopped early (the stopping rules of search/_rules.py)."""

    rule: str = setting("median", "stop trials early: the median rule, successive halving, or none",
                        option="pruner", choices=PRUNERS)
    eta: int = setting(DEFAULT_ETA, "with --pruner halving: the best 1/ETA of each rung are promoted", parse=int,
                       needs=_needs_halving("--eta"))
    min_fraction: str = setting(DEFAULT_MIN_FRACTION, "with --pruner halving: the first rung, as a fraction of "
                                "the epochs", metavar="F", needs=_needs_halving("--min-fraction"))
    trust_each_budget: bool = setting(
        False, "with --ladder: measure the rungs' trust again at every budget below the largest", switch=True,
        parse=None, stored="ladder",
        encode=lambda on, at: {"trust": "each", "largest": at.largest} if on else ABSENT,
        decode=lambda ladder: isinstance(ladder, dict) and ladder.get("trust") == "each",
        needs=("--trust-each-budget measures the rungs' trust on a ladder's budgets, so it needs --ladder with its "
               "halving (not another --pruner); add --ladder or drop --trust-each-budget.",
               lambda c: c.ladder and c.pruning.rule == "halving"))
    # None until the config resolves it: --ladder's preset (LADDER) decides it where it is not stated.
    confirm_at_rung: bool | None = setting(
        None, "with --ladder: a budget that prunes at a trusted rung confirms its finalists there", switch=True,
        negatable=True, parse=None, stored="ladder.confirm", token="rung", former=((ABSENT, "rung"), ("rung", ABSENT)),
        needs=_on_ladder("--confirm-at-rung and --no-confirm-at-rung"))
    carry_finalists: bool | None = setting(
        None, "with --ladder: the largest budget trains the next smaller one's finalists", switch=True,
        negatable=True, parse=None, stored="ladder.carry", before=False, former=((ABSENT, "finalists"),),
        encode=lambda on, at: "finalists" if on and at.largest else ABSENT, decode=lambda v: v == "finalists",
        needs=("--carry-finalists and --no-carry-finalists choose what a ladder's largest budget trains, so they "
               "need --ladder; add --ladder or drop the flag.", lambda c: c.ladder))

    def __post_init__(self) -> None:
        check_types(self)
        if self.rule not in PRUNERS:
            raise StudyError(f"Unknown pruner {self.rule!r}; choose one of: {', '.join(PRUNERS)}.")


@dataclass(frozen=True)
class Confirm:
    """Phase 3: the best architectures retrained with fresh seeds, the rule-picked baselines and the
    learning-rate probe."""

    top: int = setting(0, "retrain the K best architectures with --seeds new seeds each (phase 3); 0 = off",
                       option="confirm", parse=int, metavar="K", stored="confirm")
    seeds: int = setting(3, "seeds per confirmed architecture (with --confirm)", parse=int, metavar="S",
                         stored="confirm_seeds", beside="confirm", always=True, before=0,
                         needs=("--seeds S counts only with --confirm K (the confirmation phase); add --confirm or "
                                "drop --seeds (paired seeds for every configuration: --paired-seeds S).",
                                lambda c: bool(c.confirm.top)))
    sequential: bool = setting(
        False, "with --confirm 3+: retrain the 2 best first, the others only within seed noise", switch=True,
        parse=None, option="sequential_confirm", stored="confirm_sequential", beside="confirm",
        former=((ABSENT, True),),
        needs=("--sequential-confirm decides the finalists after the 2 best, so it needs --confirm 3 or more; raise "
               "--confirm or drop --sequential-confirm.", lambda c: c.confirm.top >= 3))
    lr_probe: bool = setting(
        False, "with --ladder: retrain each budget's best at other learning rates to fit the rate's exponent",
        switch=True, parse=None, stored="lr_probe", before=(), decode=tuple,
        encode=lambda on, at: list(LR_PROBE_FACTORS) if on and at.budget is not None and not at.largest else ABSENT)
    baselines: bool = setting(False, "with --confirm: also train the shapes common rules pick, seed for seed",
                              switch=True, parse=None)

    def __post_init__(self) -> None:
        check_types(self)
        if self.top < 0:
            raise BudgetError("--paired-seeds and --confirm must be 0 (off) or positive.")
        if self.top and self.seeds < 1:
            raise BudgetError(f"--seeds must be at least 1 with --confirm, got {self.seeds}.")

    def check_extras(self, ladder: bool) -> None:
        """--baselines and --lr-probe need the confirmation phase, --lr-probe a ladder: checked by the
        study's config once --ladder has set its default (a ladder confirms unless --confirm 0 is stated)."""
        if self.baselines and not self.top:
            raise StudyError("--baselines compares rule-picked shapes with the searched best seed by seed, so "
                             "it needs the confirmation phase: add --confirm 1 (or more) and --seeds 3 (or more).")
        if self.lr_probe and not (ladder and self.top):
            raise StudyError("--lr-probe retrains each ladder budget's best at other learning rates beside its "
                             "confirmation, so it needs --ladder and the confirmation phase (not --confirm 0).")


@dataclass(frozen=True)
class Data:
    """What every trial trains on: the data, its seed and how much of it per parameter."""

    spec: str = setting("synthetic", "the data: synthetic[:k=v,...] or a CSV/Parquet path", option="data",
                        commands=TRAIN_TOO, command_defaults=FROM_BEST)
    seed: int | None = setting(None, "fix every trial's data with this seed (seeds then vary only the initialisation)",
                               option="data_seed", parse=int, metavar="S", stored="data_seed")
    tokens_per_param: tuple[float, ...] = setting(
        (), "train each trial on R x the budget's N tokens (Chinchilla: about 20); repeat for several R",
        parse=float, repeat=True, metavar="R", cli_default=None, commands=(*STUDY_COMMANDS, WORKER, EXPORT))
    samples_per_param: tuple[float, ...] = setting(
        (), "as --tokens-per-param, in training samples (the families that read no tokens)",
        parse=float, repeat=True, metavar="R", cli_default=None, commands=(*STUDY_COMMANDS, WORKER, EXPORT))

    def __post_init__(self) -> None:
        check_types(self)
        object.__setattr__(self, "tokens_per_param", tuple(float(r) for r in self.tokens_per_param))
        object.__setattr__(self, "samples_per_param", tuple(float(r) for r in self.samples_per_param))
        if self.tokens_per_param and self.samples_per_param:
            raise StudyError("Give --tokens-per-param or --samples-per-param, not both.")
        listed = self.tokens_per_param or self.samples_per_param
        if len(set(listed)) != len(listed):
            raise StudyError(f"A data ratio is listed twice ({', '.join(f'{r:g}' for r in listed)}); "
                             "give each R once.")

    def ratios(self) -> list[tuple[float | None, float | None]]:
        """(tokens_per_param, samples_per_param) of each study of a budget: one per R, or (None, None)."""
        if self.tokens_per_param:
            return [(r, None) for r in self.tokens_per_param]
        return [(None, r) for r in self.samples_per_param] or [(None, None)]

    @property
    def ratio(self) -> tuple[float | None, float | None]:
        """The one ratio of a single study (`StudyConfig.per_ratio` splits several)."""
        ratios = self.ratios()
        if len(ratios) != 1:
            raise StudyError("One study trains on one data ratio; plan each R of --tokens-per-param "
                             "(--samples-per-param) as its own study.")
        return ratios[0]


@functools.cache
def _docstrings(path: str = __file__) -> dict[tuple[str, str], str]:
    """(class, field) -> the string literal right after the field in the module at `path` (this one's)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    out: dict[tuple[str, str], str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                out[(node.name, stmt.target.id)] = after.value.value
    return out


def field_doc(cls: type, name: str) -> str:
    """The documentation of field `name` of `cls`: a declared setting's help, else the string after
    the field (archhpo.environment's fields); '' when it has none."""
    found = next((f for f in fields(cls) if f.name == name), None)
    if found is not None and "setting" in found.metadata:
        return str(found.metadata["setting"].help)
    return _docstrings(sys.modules[cls.__module__].__file__ or __file__).get((cls.__name__, name), "")


__all__ = ["FROM_BEST", "SCALARS", "TRAIN_TOO", "Confirm", "Data", "Pruning", "Schedule", "check_types", "field_doc"]
