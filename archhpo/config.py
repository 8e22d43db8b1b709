"""A study's configuration, typed and checked once: `StudyConfig`.

Every setting `launch`/`run` turn into a study is a field here, with its default and, as the
string right after it, its documentation: the command line shows that string as the flag's help
(`field_help`), so a default or a help text is written once.  `__post_init__` refuses a setting
that cannot be used with one sentence (an `archhpo.errors` exception), before anything is planned
or written.  `search.prepare_settings` plans one budget of a `StudyConfig`; the command line builds
it from the parsed flags with `StudyConfig.from_options`.

A family's own flags (``--encoder``, ``--vocab-size``) become a frozen dataclass of their own
(`family_options_class`), typed from the family's ``flags``.  The ARCHHPO_* environment variables
are archhpo.environment's `Environment`.

This module is on the ground floor: it imports only the standard library, archhpo.schema and
archhpo.errors, so every layer may read it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from archhpo._isoflop_config import Isoflop, check_isoflop
from archhpo.errors import BudgetError, ConfigError, StudyError
from archhpo.schema import (
    ARCH_KEYS,
    DEFAULT_ETA,
    DEFAULT_MIN_FRACTION,
    LADDER_CARRY_FINALISTS,
    LADDER_CONFIRM_AT_RUNG,
    LADDER_CONFIRM_SEEDS,
    LADDER_FINALISTS,
    LADDER_SEQUENTIAL,
    PRUNERS,
    TRAINING_PARAMS,
    check_schedule,
    check_training_params,
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def check_experiment(name: str) -> str:
    """An experiment name that can name studies and files, or a StudyError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # not match: "$" also matches before a final "\n"
        raise StudyError(
            f"Experiment name {name!r} must start with a letter or digit and use only letters, digits, "
            "'_', '.' and '-'; pick another --experiment."
        )
    return name


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_SCALARS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _check_types(obj: Any) -> None:
    """Each field annotated int, float, str or bool (optionally `| None`) holds such a value."""
    for f in fields(obj):
        spec = str(f.type)
        optional = spec.endswith(" | None")
        kinds = _SCALARS.get(spec.removesuffix(" | None"))
        value = getattr(obj, f.name)
        if kinds is None or (optional and value is None):
            continue
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ConfigError(f"{f.name} must be {spec.removesuffix(' | None')}, got {value!r}.")


# ----------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule every trial of the study trains with."""

    name: str = "cosine"
    """learning-rate schedule: warm-up then cosine decay (cosine), or warm-up, a constant rate and a 1-sqrt cooldown over the last --cooldown of the steps (wsd)"""
    cooldown: float = 0.2
    """with --schedule wsd: the fraction of the steps spent cooling down, in [0, 1)"""

    def __post_init__(self) -> None:
        _check_types(self)
        check_schedule(self.name, self.cooldown)


@dataclass(frozen=True)
class Pruning:
    """How trials are stopped early (the stopping rules of search/_rules.py)."""

    rule: str = "median"
    """stop trials worse than the median (median), successive halving over the plan (halving: every trial to the first rung, the best 1/--eta of each rung go on), or never (none); confirmation and paired-seed trials are never stopped early"""
    eta: int = DEFAULT_ETA
    """with --pruner halving: the best 1/ETA of each rung are promoted"""
    min_fraction: str = DEFAULT_MIN_FRACTION
    """with --pruner halving: the first rung, as a fraction of each trial's epochs (1/9, 0.25)"""
    trust_each_budget: bool = False
    """with --ladder: measure whether the rungs predict the final ranking again at every budget below the largest (its trials score each rung in passing, about 1/9 of a trial more each), and let the next budget prune where that holds; default: measured once, at the smallest budget, where a plateau can leave every rung untrusted"""

    # None until StudyConfig.__post_init__ resolves it: the default needs --ladder and the confirmation,
    # which a Pruning alone does not see (compare a resolved config with confirm_at_rung=False, not None).
    confirm_at_rung: bool | None = None
    """with --ladder: a budget that prunes at a trusted rung also confirms its finalists there (each new seed trained to the lowest trusted rung and scored by its cooldown branch, the winner chosen on the finalists' mean scores at that rung, search runs' included), about a third of a full-length confirmation; off by default (docs/searching.md, "Choosing the defaults"): every confirmation run trains to full length"""

    # None until StudyConfig.__post_init__ resolves it (the default needs --ladder).
    carry_finalists: bool | None = None
    """with --ladder: the largest budget trains only the next smaller budget's 3 best architectures (by the mean of their full-length runs, confirmation included), each carried to the grid row of the nearest shape (aspect ratio, head dimension, d_ff ratio), and the grid's extremes centred on the best's head dimension and d_ff ratio, each once to full length (no rung pruning there), then its usual confirmation; the budgets below are searched as without it; on by default with --ladder (docs/searching.md, "Choosing the defaults"); --no-carry-finalists plans the largest budget as the others"""

    def __post_init__(self) -> None:
        _check_types(self)
        if self.rule not in PRUNERS:
            raise StudyError(f"Unknown pruner {self.rule!r}; choose one of: {', '.join(PRUNERS)}.")


@dataclass(frozen=True)
class Confirm:
    """Phase 3: the best architectures retrained with fresh seeds, the rule-picked baselines and the
    learning-rate probe."""

    top: int = 0
    """once phases 1-2 are final, retrain the K best architectures with --seeds new seeds each (phase 3); 0 = off"""
    seeds: int = 3
    """seeds per confirmed architecture (with --confirm)"""
    sequential: bool = False
    """with --confirm 3 or more: retrain the 2 best first, and each later finalist only when its search runs lie within the pooled seed noise of those two's leader (a finalist behind it beyond noise is not retrained); --ladder's default confirmation does this"""
    lr_probe: bool = False
    """with --ladder: retrain each budget's best architecture below the largest at its learning rate x1/4, x1/2 and x2 (one run each, beside its confirmation), so that every budget locates its best rate and the ladder fits the rate's exponent in N on its own budgets instead of carrying Step Law's prior; the runs count in no architecture's mean"""
    baselines: bool = False
    """with --confirm: also train the shapes common rules pick from the grid (Kaplan's d_model/n_layers ~ 100, MobileLLM's deep-and-thin ~ 19, the grid's median) with the confirmation seeds and the best's training parameters; the report gives each one's paired difference from the best"""

    def __post_init__(self) -> None:
        _check_types(self)
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

    spec: str = "synthetic"
    """synthetic[:k=v,...] or a CSV/Parquet path"""
    seed: int | None = None
    """fix every trial's data (generation, split) with this seed, paired and confirmation trials included, so seeds vary only the initialisation and batch order (default: the study seed's data, a paired seed's own data)"""
    tokens_per_param: tuple[float, ...] = ()
    """train every trial of a budget on R x the budget's N tokens (Chinchilla: about 20); repeat for several R (one study each, named {experiment}_{budget}-tR); --epochs then counts validation intervals of D/epochs (default 9); lm and char_cls"""
    samples_per_param: tuple[float, ...] = ()
    """as --tokens-per-param, in training samples, for the families that do not read tokens (patchtst, signal, ...); studies named {experiment}_{budget}-sR"""

    def __post_init__(self) -> None:
        _check_types(self)
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


# ----------------------------------------------------------------------------- family options
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


# ----------------------------------------------------------------------------- the study
# The command line's study options and the field each one sets ("section.field" inside a section).
OPTION_FIELDS: dict[str, str] = {
    "experiment": "experiment", "budget": "budgets", "family": "family", "trials": "trials",
    "data": "data.spec", "horizon": "horizon", "threshold": "threshold", "seed": "seed",
    "tolerance": "tolerance", "pruner": "pruning.rule", "eta": "pruning.eta",
    "min_fraction": "pruning.min_fraction", "schedule": "schedule.name", "cooldown": "schedule.cooldown",
    "quick": "quick", "compile": "compile", "ladder": "ladder", "paired_seeds": "paired_seeds",
    "tokens_per_param": "data.tokens_per_param", "samples_per_param": "data.samples_per_param",
    "data_seed": "data.seed", "confirm": "confirm.top", "seeds": "confirm.seeds",
    "baselines": "confirm.baselines", "sequential_confirm": "confirm.sequential", "lr_probe": "confirm.lr_probe",
    "trust_each_budget": "pruning.trust_each_budget", "confirm_at_rung": "pruning.confirm_at_rung",
    "carry_finalists": "pruning.carry_finalists",
    "isoflop": "isoflop.computes", "sizes": "isoflop.sizes", "span": "isoflop.span", "centre": "isoflop.centres",
    "centre_from": "isoflop.centre_from", "shapes": "isoflop.shapes",
}
_SECTIONS: dict[str, type] = {"data": Data, "pruning": Pruning, "schedule": Schedule, "confirm": Confirm,
                              "isoflop": Isoflop}

# A flag that only means something beside another: (flag, what it needs, its switch is on).
_COMPANIONS: tuple[tuple[str, str, Callable[[StudyConfig], bool]], ...] = (
    ("seeds", "--seeds S counts only with --confirm K (the confirmation phase); add --confirm or drop --seeds "
              "(paired seeds for every configuration: --paired-seeds S).", lambda c: bool(c.confirm.top)),
    ("cooldown", "--cooldown counts only with --schedule wsd (cosine has no cooldown); add --schedule wsd or "
                 "drop --cooldown.", lambda c: c.schedule.name == "wsd"),
    ("sequential_confirm", "--sequential-confirm decides the finalists after the 2 best, so it needs --confirm 3 "
                           "or more; raise --confirm or drop --sequential-confirm.", lambda c: c.confirm.top >= 3),
    ("trust_each_budget", "--trust-each-budget measures the rungs' trust on a ladder's budgets, so it needs "
                          "--ladder with its halving (not another --pruner); add --ladder or drop --trust-each-budget.",
     lambda c: c.ladder and c.pruning.rule == "halving"),
    ("confirm_at_rung", "--confirm-at-rung and --no-confirm-at-rung choose where a ladder budget confirms its "
                        "finalists, so they need --ladder with its halving (not another --pruner); add --ladder or "
                        "drop the flag.",
     lambda c: c.ladder and c.pruning.rule == "halving"),
    ("carry_finalists", "--carry-finalists and --no-carry-finalists choose what a ladder's largest budget trains, "
                        "so they need --ladder; add --ladder or drop the flag.", lambda c: c.ladder),
    *((name, f"--{name.replace('_', '-')} shapes an IsoFLOP study, so it needs --isoflop C; add --isoflop or drop "
              f"--{name.replace('_', '-')}.", lambda c: bool(c.isoflop.computes))
      for name in ("sizes", "span", "centre", "centre_from", "shapes")),
    ("eta", "--eta counts only with --pruner halving; add --pruner halving or drop --eta.",
     lambda c: c.pruning.rule == "halving"),
    ("min_fraction", "--min-fraction counts only with --pruner halving; add --pruner halving or drop "
                     "--min-fraction.", lambda c: c.pruning.rule == "halving"),
)


@dataclass(frozen=True)
class StudyConfig:
    """Everything `launch`/`run` plan a study from, for one experiment and its budgets."""

    experiment: str
    """experiment name; its studies are named {experiment}_{budget}"""
    budgets: tuple[str, ...] = ()
    """parameter budget such as 2M, 20M, 1.5B, 500K; repeat for several (launch/run: or pin the architecture with --d-model ... instead)"""
    family: str = "patchtst"
    """model family (its flags are listed below: pass --family NAME --help for another family's)"""
    trials: int = 50
    """planned trials per study (a paired study: configurations, each trained with every seed)"""
    data: Data = field(default_factory=Data)
    """the data every trial trains on"""
    horizon: int = 1
    """label horizon in steps"""
    threshold: float = 0.01
    """label threshold on the return"""
    seed: int = 0
    """study seed (plan and initialisation; data too unless --data-seed)"""
    tolerance: float = 0.25
    """keep architectures within ±tolerance of the budget"""
    pruning: Pruning = field(default_factory=Pruning)
    """how trials are stopped early"""
    schedule: Schedule = field(default_factory=Schedule)
    """the learning-rate schedule"""
    quick: bool = False
    """small data and few epochs (minutes on a CPU); replaces the family's own training defaults (e.g. signal's batch 32, lr 3e-4) with the quick search space; --epochs etc. still win"""
    compile: bool = False
    """compile every trial's model with torch.compile (default off: on a CPU it wins for no family, compile time counted (BENCHMARKS.md §9); on an H100 it made lm at 124M-2B 30-66% faster for 23-145 s of compiling (docs/benchmarks.md §13)). Compiled and eager runs differ in their last bits and, with dropout, in their masks: a study is all one or the other"""
    ladder: bool = False
    """with several budgets: search them smallest first and plan each larger one from the smaller ones' winners (learning rate along N^b: Step Law's prior, or b fitted where 3 budgets located their best rate, as --lr-probe makes them; their aspect ratios; half the trials a step); unless --pruner, --confirm or --seeds say otherwise it halves at trusted rungs only and confirms each budget's 3 finalists with 1 new seed each (the third only where its search run is within seed noise of the first two's leader: --sequential-confirm), choosing the winner on their means, and a budget that prunes at a trusted rung confirms at that rung (--confirm-at-rung)"""
    paired_seeds: int = 0
    """train every planned configuration with seeds 0..S-1 (seed s fixes data, split and initialisation, the same for every configuration); 0 = off"""
    confirm: Confirm = field(default_factory=Confirm)
    """the confirmation phase"""
    isoflop: Isoflop = field(default_factory=Isoflop)
    """an IsoFLOP study's compute budgets and sizes"""
    pins: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """architecture dimensions fixed to one value or several (instead of or within a budget)"""
    fixed_params: Mapping[str, float | int] = field(default_factory=dict)
    """training parameters every trial uses (the plan samples only the others)"""
    param_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """log-scaled training parameters the plan samples within a stated range (--learning-rate LO:HI) instead of the default one"""
    family_options: FamilyOptions | None = None
    """the family's flags (family_options_class); None: all at the family's defaults"""
    given: frozenset[str] = frozenset()
    """the options stated on the command line or in an experiment file: a companion flag stated without its switch (--seeds without --confirm) is refused even at its default"""

    def __post_init__(self) -> None:
        _check_types(self)
        object.__setattr__(self, "budgets", tuple(self.budgets))
        if self.isoflop.computes:  # its own sizes, data and training parameters; never pruned
            check_isoflop(self)
            object.__setattr__(self, "pruning", dataclasses.replace(self.pruning, rule="none"))
        if self.ladder and (len(self.budgets) < 2 or {"d_model", "n_layers"} & set(self.pins)):
            raise StudyError("--ladder needs at least two --budget values and d_model, n_layers unpinned (--n-heads, "
                             "--d-ff lists only filter the grid): it plans each larger budget from the smaller ones.")
        if self.ladder and "pruner" not in self.given and self.pruning.rule == Pruning.rule:
            # A ladder halves unless --pruner is stated (`given`: a config built without it, e.g. by the keyword
            # form, states none), pruning only at the rungs its smallest budget trusts (search/_trust.py).
            object.__setattr__(self, "pruning", dataclasses.replace(self.pruning, rule="halving"))
        if self.ladder and not self.paired_seeds and "confirm" not in self.given and self.confirm.top == Confirm.top:
            # ... and confirms its finalists unless --confirm is stated (schema.LADDER_FINALISTS says why 3 and 1);
            # a stated --seeds wins; a paired ladder is refused with its own sentence (search/_study.py).
            seeds = self.confirm.seeds
            seeds = LADDER_CONFIRM_SEEDS if "seeds" not in self.given and seeds == Confirm.seeds else seeds
            object.__setattr__(self, "confirm", dataclasses.replace(self.confirm, top=LADDER_FINALISTS, seeds=seeds,
                                                                    sequential=LADDER_SEQUENTIAL))
        if self.pruning.confirm_at_rung is None:
            # ... and confirms at the rungs it trusts, unless stated otherwise (the rule that chose this
            # default, and its paired evidence: docs/searching.md, "Choosing the defaults").
            at_rung = LADDER_CONFIRM_AT_RUNG and self.ladder and self.pruning.rule == "halving" and bool(self.confirm.top)
            object.__setattr__(self, "pruning", dataclasses.replace(self.pruning, confirm_at_rung=at_rung))
        if self.pruning.carry_finalists is None:  # ... and its largest budget trains the finalists carried up
            carry = LADDER_CARRY_FINALISTS and self.ladder
            object.__setattr__(self, "pruning", dataclasses.replace(self.pruning, carry_finalists=carry))
        self.confirm.check_extras(self.ladder)
        for name, sentence, on in _COMPANIONS:
            if name in self.given and not on(self):
                raise StudyError(sentence)
        check_experiment(self.experiment)
        object.__setattr__(self, "pins", _normalise_pins(self.pins))
        if not 0 < self.tolerance < 1:
            raise BudgetError(f"Tolerance {self.tolerance} must lie between 0 and 1 (e.g. 0.25 for ±25%).")
        if self.horizon < 1:
            raise BudgetError(f"--horizon must be at least 1 step, got {self.horizon}.")
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
        """A config from option values by name (the command line's, `OPTION_FIELDS`; the architecture
        keys pin, the training parameters are fixed); an option left out, or None, keeps its default."""
        top: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        for option, path in OPTION_FIELDS.items():
            value = values.get(option)
            if value is None:
                continue
            if isinstance(value, list):
                value = tuple(value)
            section, _, name = path.rpartition(".")
            (sections[section] if section else top)[name] = value
        pins = {d: values[d] for d in ARCH_KEYS if values.get(d)}
        stated = {k: values[k] for k in TRAINING_PARAMS if values.get(k) is not None}
        fixed = {k: v for k, v in stated.items() if not isinstance(v, tuple | list)}  # LO:HI parses as a tuple
        ranges = {k: tuple(v) for k, v in stated.items() if isinstance(v, tuple | list)}
        built = {name: _SECTIONS[name](**kw) for name, kw in sections.items()}
        return cls(**top, **built, pins=pins, fixed_params=fixed, param_ranges=ranges, family_options=family_options,
                   given=frozenset(given))

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


# ----------------------------------------------------------------------------- defaults and help
def _field_of(option: str) -> tuple[type, dataclasses.Field[Any]]:
    section, _, name = OPTION_FIELDS[option].rpartition(".")
    owner = _SECTIONS[section] if section else StudyConfig
    return owner, next(f for f in fields(owner) if f.name == name)


def field_default(option: str) -> Any:
    """The default of a study option (`OPTION_FIELDS`), or None when it has none."""
    _, f = _field_of(option)
    if f.default is not MISSING:
        return f.default
    return None if f.default_factory is MISSING else f.default_factory()


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
    """The documentation of field `name` of `cls` (the string after it); '' when it has none."""
    return _docstrings(sys.modules[cls.__module__].__file__ or __file__).get((cls.__name__, name), "")


def field_help(option: str) -> str:
    """The help text of a study option: its field's documentation."""
    owner, f = _field_of(option)
    return field_doc(owner, f.name)


__all__ = [
    "OPTION_FIELDS", "Confirm", "Data", "FamilyOptions", "Isoflop", "Pruning", "Schedule", "StudyConfig",
    "check_experiment", "family_options_class", "family_options_of", "field_default", "field_doc", "field_help",
]
