"""A study's configuration, typed and checked once: `StudyConfig`, and every study setting's one declaration.

Each study setting is a field of `StudyConfig` (or of a section: `Data`, `Pruning`, `Schedule`,
`Confirm`, `Isoflop`) written with `setting` (archhpo/_setting.py): the field is its type and
default, its `Setting` the one-line help, the check, the flag, the experiment-file key and the
stored key.  The command line's rows and the experiment files' keys (archhpo/cli/_options.py), the
options a study stores (`stored_options`) and their reload (`StoredOptions`), and the relaunch
check (search/_identity.py) are derived from the declarations (`declared`).  --ladder's defaults
are a named preset (`LADDER`).  `__post_init__` refuses a setting that cannot be used with one
sentence (an `archhpo.errors` exception), before anything is planned or written.  A family's own
flags become a frozen dataclass of their own (`family_options_class`).  This module is on the
ground floor: it imports only the standard library, archhpo.schema, archhpo.errors and its
sections' modules, so every layer may read it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from archhpo._family_options import FamilyOptions, family_options_class, family_options_of
from archhpo._isoflop_config import Isoflop, check_isoflop
from archhpo._sections import (
    FROM_BEST,
    SCALARS,
    TRAIN_TOO,
    Confirm,
    Data,
    Pruning,
    Schedule,
    check_types,
    field_doc,
)
from archhpo._setting import (
    ABSENT,
    DASHBOARD,
    EXPORT,
    FAMILY_COMMANDS,
    GRID,
    LAUNCH,
    PARAMS,
    REPORT,
    RUN,
    STUDY_COMMANDS,
    TRAIN,
    WORKER,
    Placement,
    Setting,
    setting,
)
from archhpo._stored import FAMILY, RECORDS, STORED_ORDER, Record, StoredView, order, read_stored
from archhpo.errors import BudgetError, ConfigError, StudyError
from archhpo.schema import (
    ARCH_KEYS,
    LADDER_CARRY_FINALISTS,
    LADDER_CONFIRM_AT_RUNG,
    LADDER_CONFIRM_SEEDS,
    LADDER_FINALISTS,
    LADDER_SEQUENTIAL,
    TRAINING_PARAMS,
    check_training_params,
)

PARAMETRIZATIONS = ("sp", "mup")  # --parametrization: standard, or µP (maximal update)
SHARDS = ("auto", "ddp", "fsdp")  # --shard: how a trial of several ranks splits its model

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def check_experiment(name: str) -> str:
    """An experiment name that can name studies and files, or a StudyError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # not match: "$" also matches before a final "\n"
        raise StudyError(
            f"Experiment name {name!r} must start with a letter or digit and use only letters, digits, "
            "'_', '.' and '-'; pick another --experiment."
        )
    return name


# ----------------------------------------------------------------------------- the study
@dataclass(frozen=True)
class StudyConfig:
    """Everything `launch`/`run` plan a study from, for one experiment and its budgets."""

    experiment: str = setting(help="experiment name; its studies are named {experiment}_{budget}",
                              commands=(*STUDY_COMMANDS, WORKER, EXPORT, REPORT))
    budgets: tuple[str, ...] = setting(
        (), "parameter budget (2M, 20M, 1.5B); repeat for several, or pin the architecture instead",
        option="budget", repeat=True, cli_default=None, required=(GRID,), commands=(GRID, *STUDY_COMMANDS, WORKER, EXPORT))
    family: str = setting("patchtst", "model family (`--family NAME --help` lists its flags)", commands=FAMILY_COMMANDS)
    trials: int = setting(50, "planned trials per study (a paired study: configurations)", parse=int)
    data: Data = field(default_factory=Data)
    """the data every trial trains on"""
    horizon: int = setting(1, "label horizon in steps", parse=int, stored="horizon", always=True, commands=TRAIN_TOO,
                           command_defaults=FROM_BEST, error=BudgetError,
                           check=lambda v: None if v >= 1 else f"--horizon must be at least 1 step, got {v}.")
    threshold: float = setting(0.01, "label threshold on the return", parse=float, stored="threshold", always=True,
                               commands=TRAIN_TOO, command_defaults=FROM_BEST)
    seed: int = setting(0, "study seed (plan and initialisation; data too unless --data-seed)", parse=int,
                        stored="seed", always=True, commands=TRAIN_TOO, command_defaults=FROM_BEST)
    tolerance: float = setting(
        0.25, "keep architectures within ±tolerance of the budget", parse=float, commands=(GRID, *STUDY_COMMANDS),
        error=BudgetError,
        check=lambda v: None if 0 < v < 1 else f"Tolerance {v} must lie between 0 and 1 (e.g. 0.25 for ±25%).")
    pruning: Pruning = field(default_factory=Pruning)
    """how trials are stopped early"""
    schedule: Schedule = field(default_factory=Schedule)
    """the learning-rate schedule"""
    quick: bool = setting(False, "small data and few epochs (minutes on a CPU); replaces the family's own training defaults",
                          switch=True, parse=None, stored="quick", always=True, commands=TRAIN_TOO)
    compile: bool = setting(False, "compile every trial's model with torch.compile (a study is all one or the other)",
                            switch=True, parse=None, stored="compile", commands=TRAIN_TOO)
    ladder: bool = setting(False, "search the budgets smallest first, each planned from the smaller ones' winners",
                           switch=True, parse=None)
    paired_seeds: int = setting(0, "train every configuration with seeds 0..S-1 (one data set per seed); 0 = off",
                                parse=int, metavar="S", stored="paired_seeds")
    confirm: Confirm = field(default_factory=Confirm)
    """the confirmation phase"""
    isoflop: Isoflop = field(default_factory=Isoflop)
    """an IsoFLOP study's compute budgets and sizes"""
    parametrization: str = setting("sp", "how widths scale the initialisation and rates: standard (sp) or µP (mup)",
                                   choices=PARAMETRIZATIONS, stored="parametrization", commands=TRAIN_TOO,
                                   command_defaults=FROM_BEST)
    mup_base_width: int | None = setting(
        None, "with --parametrization mup: the d_model rates are tuned at (default: the smallest budget's)",
        parse=int, metavar="D", stored="mup_base_width", commands=TRAIN_TOO, command_defaults=FROM_BEST,
        check=lambda v: None if v is None or v >= 1 else f"--mup-base-width must be at least 1, got {v}.",
        needs=("--mup-base-width sets µP's base width, so it needs --parametrization mup; add it or drop "
               "--mup-base-width.", lambda c: c.parametrization == "mup"))
    mup_base_depth: int | None = setting(
        None, "with --parametrization mup: CompleteP's base n_layers (default: the smallest budget's smallest)",
        parse=int, metavar="L", stored="mup_base_depth", commands=TRAIN_TOO, command_defaults=FROM_BEST,
        check=lambda v: None if v is None or v >= 1 else f"--mup-base-depth must be at least 1, got {v}.",
        needs=("--mup-base-depth sets CompleteP's base depth under µP, so it needs --parametrization mup; add it "
               "or drop --mup-base-depth.", lambda c: c.parametrization == "mup"))
    ranks_per_trial: int = setting(1, "processes (GPUs) that train each trial together", parse=int, metavar="R",
                                   stored="ranks_per_trial",
                                   check=lambda v: None if v >= 1 else f"--ranks-per-trial must be at least 1, got {v}.")
    shard: str = setting("auto", "how a multi-rank trial splits its model: auto, ddp (replicas) or fsdp (shards)",
                         choices=SHARDS, stored="shard")
    pins: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """architecture dimensions fixed to one value or several (instead of or within a budget)"""
    fixed_params: Mapping[str, float | int] = field(default_factory=dict)
    """training parameters every trial uses (the plan samples only the others)"""
    param_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """log-scaled training parameters the plan samples within a stated range (--learning-rate LO:HI)"""
    family_options: FamilyOptions | None = None
    """the family's flags (family_options_class); None: all at the family's defaults"""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """the values of the settings declared with `register_setting` (not as a field here), by option"""
    given: frozenset[str] = frozenset()
    """the options stated on the command line or in an experiment file: a companion flag stated without
    its switch (--seeds without --confirm) is refused even at its default, and a preset leaves it alone"""

    def __post_init__(self) -> None:
        check_types(self)
        object.__setattr__(self, "budgets", tuple(self.budgets))
        object.__setattr__(self, "extra", {**{d.option: d.default for d in _REGISTERED.values()}, **self.extra})
        if self.isoflop.computes:  # its own sizes, data and training parameters; never pruned
            check_isoflop(self)
            object.__setattr__(self, "pruning", dataclasses.replace(self.pruning, rule="none"))
        if self.ladder and (len(self.budgets) < 2 or {"d_model", "n_layers"} & set(self.pins)):
            raise StudyError("--ladder needs at least two --budget values and d_model, n_layers unpinned (--n-heads, "
                             "--d-ff lists only filter the grid): it plans each larger budget from the smaller ones.")
        LADDER.apply(self)
        self.confirm.check_extras(self.ladder)
        check_experiment(self.experiment)
        for d in declared():
            _check_declared(self, d)
        object.__setattr__(self, "pins", _normalise_pins(self.pins))
        if self.paired_seeds < 0:
            raise BudgetError("--paired-seeds and --confirm must be 0 (off) or positive.")
        if self.paired_seeds and self.confirm.top:
            raise BudgetError("A paired study already trains every configuration with every seed; use "
                              "--paired-seeds or --confirm, not both.")
        check_training_params(self.fixed_params, self.param_ranges, paired=bool(self.paired_seeds))
        if self.family_options is not None and self.family_options.FAMILY != self.family:
            raise ConfigError(f"The options of the {self.family_options.FAMILY} family cannot configure a "
                              f"{self.family} study; build them for --family {self.family}.")

    @classmethod
    def from_options(cls, values: Mapping[str, Any], *, given: Sequence[str] = (),
                     family_options: FamilyOptions | None = None) -> StudyConfig:
        """A config from option values by name (the command line's: every declared setting's option;
        the architecture keys pin, the training parameters are fixed); an option left out, or None,
        keeps its default."""
        top: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        extra: dict[str, Any] = {}
        for d in declared():
            value = values.get(d.option)
            if value is None:
                continue
            value = tuple(value) if isinstance(value, list) else value
            section, _, name = d.path.rpartition(".")
            (extra if section == "extra" else sections[section] if section else top)[name] = value
        pins = {k: values[k] for k in ARCH_KEYS if values.get(k)}
        stated = {k: values[k] for k in TRAINING_PARAMS if values.get(k) is not None}
        fixed = {k: v for k, v in stated.items() if not isinstance(v, tuple | list)}  # LO:HI parses as a tuple
        ranges = {k: tuple(v) for k, v in stated.items() if isinstance(v, tuple | list)}
        built = {name: _SECTIONS[name](**kw) for name, kw in sections.items()}
        return cls(**top, **built, pins=pins, fixed_params=fixed, param_ranges=ranges, family_options=family_options,
                   extra=extra, given=frozenset(given))

    def value(self, option: str) -> Any:
        """The value of the declared setting `option` (its field's, or its `extra` entry)."""
        return _declared_by_option()[option].get(self)

    def per_ratio(self) -> list[StudyConfig]:
        """One config per data ratio (--tokens-per-param 10 --tokens-per-param 20: two), else [self]."""
        out = []
        for tokens, samples in self.data.ratios():
            data = dataclasses.replace(self.data, tokens_per_param=() if tokens is None else (tokens,),
                                       samples_per_param=() if samples is None else (samples,))
            out.append(dataclasses.replace(self, data=data))
        return out

    def family_values(self) -> dict[str, Any]:
        """The family flags that were set (a value or a list of values each)."""
        return self.family_options.given() if self.family_options is not None else {}


_SECTIONS: dict[str, type] = {"data": Data, "pruning": Pruning, "schedule": Schedule, "confirm": Confirm,
                              "isoflop": Isoflop}


def _normalise_pins(pins: Mapping[str, int | Sequence[int] | None]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for dim, values in pins.items():
        if dim not in ARCH_KEYS:
            raise StudyError(f"Cannot pin {dim!r}; pin one of: {', '.join(ARCH_KEYS)}.")
        if values is None:
            continue
        items = [values] if isinstance(values, int) else list(values)
        if items:
            out[dim] = tuple(sorted(set(items)))
    return out


# ----------------------------------------------------------------------------- the declarations
@dataclass(frozen=True)
class Declared:
    """A declared setting where it lives: its `Setting`, the field's path in StudyConfig
    ("confirm.seeds"; "extra.NAME" for one declared with `register_setting`), default and type."""

    setting: Setting
    path: str
    default: Any
    kind: str  # the field's annotation ("int", "float | None", ...)

    @property
    def option(self) -> str:
        return self.setting.option or self.path.rpartition(".")[2]

    @property
    def before(self) -> Any:
        """What a stored study that lacks the setting's key reads it as."""
        return self.default if self.setting.before is ABSENT else self.setting.before

    def get(self, config: StudyConfig) -> Any:
        owner: Any = config
        *sections, name = self.path.split(".")
        for part in sections:
            owner = getattr(owner, part)
        return owner[name] if isinstance(owner, Mapping) else getattr(owner, name)


_REGISTERED: dict[str, Declared] = {}


def _walk(cls: type, prefix: str) -> Iterator[Declared]:
    for f in fields(cls):
        setting_ = f.metadata.get("setting")
        if setting_ is not None:
            default = f.default if f.default is not MISSING else (
                None if f.default_factory is MISSING else f.default_factory())
            yield Declared(setting_, prefix + f.name, default, str(f.type))
        elif f.name in _SECTIONS and cls is StudyConfig:
            yield from _walk(_SECTIONS[f.name], f"{f.name}.")


@functools.cache
def _field_declarations() -> tuple[Declared, ...]:
    return tuple(_walk(StudyConfig, ""))


def declared() -> tuple[Declared, ...]:
    """Every study setting, in declaration order: StudyConfig's fields (sections' in place), then
    those `register_setting` added."""
    return (*_field_declarations(), *_REGISTERED.values())


def _declared_by_option() -> dict[str, Declared]:
    return {d.option: d for d in declared()}


def register_setting(name: str, default: Any, kind: type, declaration: Setting) -> None:
    """Declare a setting without a field of StudyConfig (its value lives in `StudyConfig.extra`):
    the command line, the experiment files and the stored form take it as any other."""
    if name in _declared_by_option():
        raise ConfigError(f"A study setting named {name!r} is already declared; pick another name.")
    _REGISTERED[name] = Declared(dataclasses.replace(declaration, option=name), f"extra.{name}", default,
                                 kind.__name__)


def unregister_setting(name: str) -> None:
    """Remove a setting `register_setting` declared."""
    del _REGISTERED[name]


def _check_declared(config: StudyConfig, d: Declared) -> None:
    """One setting's own check (its type, `check`) and its companion rule (`needs`)."""
    value, s = d.get(config), d.setting
    if d.path.startswith("extra.") and value is not None:
        kinds = SCALARS.get(d.kind, (object,))
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ConfigError(f"{s.flag_name} must be {d.kind}, got {value!r}.")
    sentence = s.check(value) if s.check is not None else None
    if sentence:
        raise (s.error or ConfigError)(sentence)
    if s.needs is not None and d.option in config.given and not s.needs[1](config):
        raise StudyError(s.needs[0])


def _replace(config: StudyConfig, path: str, value: Any) -> None:
    section, _, name = path.rpartition(".")
    if section:
        object.__setattr__(config, section, dataclasses.replace(getattr(config, section), **{name: value}))
    else:
        object.__setattr__(config, name, value)


@dataclass(frozen=True)
class Preset:
    """The values a switch gives the settings a study leaves unstated (neither in `given` nor moved
    from their default).  Each group applies where the switch is on, the group's condition holds and
    its first option is unstated; it then sets each of its options that is unstated.  A switch
    setting still None afterwards (decided by a preset) is off."""

    switch: str
    groups: tuple[tuple[Callable[[StudyConfig], bool], tuple[tuple[str, Any], ...]], ...]

    def apply(self, config: StudyConfig) -> None:
        by_option = _declared_by_option()

        def unstated(option: str) -> bool:
            d = by_option[option]
            return option not in config.given and d.get(config) == d.default

        if config.value(self.switch):
            for holds, values in self.groups:
                if holds(config) and unstated(values[0][0]):
                    for option, value in values:
                        if unstated(option):
                            _replace(config, by_option[option].path, value)
        for d in declared():
            if d.setting.switch and d.get(config) is None:
                _replace(config, d.path, False)

    def values(self) -> dict[str, Any]:
        """Every option the preset may set, with its value."""
        return {option: value for _, group in self.groups for option, value in group}


# --ladder's defaults (schema.LADDER_FINALISTS says why 3 finalists and 1 seed; docs/searching.md,
# "Choosing the defaults", the evidence for each): halving at the trusted rungs, the finalists
# confirmed in two waves (a paired ladder is refused with its own sentence: search/_study.py).
LADDER = Preset("ladder", (
    (lambda c: True, (("pruner", "halving"),)),
    (lambda c: not c.paired_seeds, (("confirm", LADDER_FINALISTS), ("seeds", LADDER_CONFIRM_SEEDS),
                                    ("sequential_confirm", LADDER_SEQUENTIAL))),
    (lambda c: c.pruning.rule == "halving" and bool(c.confirm.top), (("confirm_at_rung", LADDER_CONFIRM_AT_RUNG),)),
    (lambda c: True, (("carry_finalists", LADDER_CARRY_FINALISTS),)),
))


def field_default(option: str) -> Any:
    """The default of a study setting by option name, or None when it has none."""
    default = _declared_by_option()[option].default
    return None if default is MISSING else default


def field_help(option: str) -> str:
    """The one-line help of a study setting by option name."""
    return _declared_by_option()[option].setting.help


def option_fields() -> dict[str, str]:
    """Each study setting's option name and its field's path in StudyConfig ("seeds": "confirm.seeds")."""
    return {d.option: d.path for d in declared()}


# ----------------------------------------------------------------------------- the stored form
_RECORD_KEYS = {r.key for r in RECORDS}


def _stored_value(d: Declared, config: StudyConfig, at: Placement) -> Any:
    """What the study stores for setting `d` (ABSENT: nothing), before the `beside` rule."""
    s, value = d.setting, d.get(config)
    if s.encode is not None:
        return s.encode(value, at)
    if s.token is not None:
        return s.token if value else ABSENT
    if not s.always and value == d.default:
        return ABSENT
    if isinstance(value, tuple):
        return list(value)
    if d.kind.startswith("float") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def stored_options(config: StudyConfig, at: Placement, records: Mapping[str, Any],
                   family: Mapping[str, Any]) -> dict[str, Any]:
    """The options a study of `config` stores (and every trial reads), derived from the declared
    settings: each stored key a setting or a record names, in the stored order; only those that
    differ from their default (or `always` stored), so a study using none keeps its identity.
    `records`: the planner's (RECORDS' keys); `family`: the family's scalar options."""
    top: dict[str, Any] = {k: copy.deepcopy(v) for k, v in records.items()}
    inner: list[tuple[str, str, Any]] = []
    for d in declared():
        key = d.setting.stored
        value = ABSENT if key is None else _stored_value(d, config, at)
        if key is None or value is ABSENT or (d.setting.beside and d.setting.beside not in top):
            continue
        record, _, leaf = key.partition(".")
        if leaf or record in _RECORD_KEYS:
            inner.append((record, leaf, value))
        else:
            top[key] = value
    for record, leaf, value in inner:  # stored inside a record: only where the planner wrote it
        if isinstance(top.get(record), dict):
            top[record].update({leaf: value} if leaf else value)
    return order(top, family)


def _reader(d: Declared) -> tuple[str, Callable[[Mapping[str, Any]], Any]]:
    """A setting stored inside a record, read from the stored dict: its option, and the reader."""
    key = str(d.setting.stored)
    decode = d.setting.decode
    if d.setting.token is not None:
        decode = functools.partial(operator.eq, d.setting.token)
    return d.option, functools.partial(read_stored, key, False if d.setting.token is not None else d.before, decode)


def _top_level(d: Declared) -> bool:
    key = d.setting.stored
    return key is not None and "." not in key and key not in _RECORD_KEYS


def stored_keys() -> dict[str, Any]:
    """Every top-level stored key a setting or a record names, with its type (the field's annotation,
    or the record's), in the stored order: the fields of `StoredOptions`."""
    hints: dict[str, Any] = {}
    for d in declared():
        if _top_level(d) and not d.path.startswith("extra."):
            section, _, name = d.path.rpartition(".")
            hint = typing.get_type_hints(_SECTIONS[section] if section else StudyConfig)[name]
            hints[str(d.setting.stored)] = tuple[Any, ...] if d.setting.decode is tuple else hint
    hints.update({r.key: r.kind for r in RECORDS})
    ranked = {k: i for i, k in enumerate(STORED_ORDER)}
    return dict(sorted(hints.items(), key=lambda kv: ranked.get(kv[0], len(ranked))))


def _stored_class() -> type[StoredView]:
    """StoredOptions: a frozen dataclass with a field per top-level stored key (`stored_keys`), its
    default what a study without the key reads (the setting's ``before``, the record's), then
    ``family`` (every other key) and ``keys`` (the stored order)."""
    befores = {str(d.setting.stored): d.before for d in declared() if _top_level(d)}
    befores.update({r.key: r.before for r in RECORDS})
    specs: list[Any] = [(k, hint, field(default=befores[k], metadata={"tuple": isinstance(befores[k], tuple)}))
                        for k, hint in stored_keys().items()]
    specs += [("family", Mapping[str, Any], field(default_factory=dict)),
              ("keys", tuple[str, ...], field(default=(), repr=False))]
    always = {str(d.setting.stored) for d in declared() if d.setting.always and not d.setting.beside}
    nested = dict(_reader(d) for d in declared() if d.setting.stored and not _top_level(d))
    cls = dataclasses.make_dataclass("StoredOptions", specs, bases=(StoredView,), frozen=True, eq=False, namespace={
        "_ALWAYS": tuple(k for k in STORED_ORDER if k in always), "_NESTED": nested, "__doc__": StoredView.__doc__})
    cls.__module__ = __name__
    return cls


StoredOptions: Any = _stored_class()


__all__ = [
    "ABSENT", "DASHBOARD", "EXPORT", "FAMILY", "FAMILY_COMMANDS", "GRID", "LADDER", "LAUNCH", "PARAMETRIZATIONS", "PARAMS",
    "RECORDS", "REPORT", "RUN", "SHARDS", "STORED_ORDER", "STUDY_COMMANDS", "TRAIN", "WORKER", "Confirm", "Data",
    "Declared", "FamilyOptions", "Isoflop", "Placement", "Preset", "Pruning", "Record", "Schedule", "Setting",
    "StoredOptions", "StudyConfig", "check_experiment", "declared", "family_options_class", "family_options_of",
    "field_default", "field_doc", "field_help", "option_fields", "register_setting", "setting", "stored_keys",
    "stored_options", "unregister_setting",
]
