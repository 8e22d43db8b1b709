"""Every command-line option, defined once.

Each option has one `Option`: its name (the argparse dest and the key of an experiment file),
type, default, help, the commands that take it and whether it is stored in the study.  The
parser (`archhpo.cli`), `archhpo train` and the experiment files of `launch`/`run` (``--config
study.toml``) all read them from here.  A study setting's row is derived from its declaration in
archhpo/config.py (`setting_option`), so nothing restates its flag, default or help; the command
line turns the parsed options into a `StudyConfig` (`StudyConfig.from_options`).
A family's own flags (``--encoder``, ``--num-features``) come from its ``Family.flags`` and are
turned into options by `family_options`.  Nothing outside `archhpo.cli` imports this table.

Precedence: a flag on the command line wins over the experiment file, which wins over the
default.  On `launch`/`run` a family flag given a comma-separated list (``--encoder
sum,linear``) becomes a dimension of the study's grid, and the architecture flags (``--d-model
64 --n-layers 2,3``) pin the grid instead of (or within) a budget.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archhpo.config import (
    ABSENT,
    DASHBOARD,
    EXPORT,
    FAMILY_COMMANDS,
    GRID,
    LADDER,
    LAUNCH,
    PARAMS,
    REPORT,
    RUN,
    STUDY_COMMANDS,
    TRAIN,
    WORKER,
    Declared,
    declared,
)
from archhpo.environment import Environment
from archhpo.errors import ArchhpoError
from archhpo.models import Family, family_names, get_family
from archhpo.schema import ARCH_HELP, ARCH_KEYS, TRAINING, TRAINING_PARAMS

ADDRESS_COMMANDS = (WORKER, EXPORT)  # address studies by --budget / pins / --study


def integers(text: str) -> list[int]:
    """'2,3' -> [2, 3] (argparse names this type in its error: invalid integers value)."""
    return [int(part) for part in str(text).split(",") if part.strip()]


def maybe_list(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """A family flag on launch/run: one value, or a comma-separated list (a grid dimension)."""

    def parse(text: str) -> Any:
        parts = [p.strip() for p in str(text).split(",")]
        return kind(parts[0]) if len(parts) == 1 else [kind(p) for p in parts]

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def value_or_range(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """A log-scaled training parameter on launch/run: one value fixes it, LO:HI (a tuple) has the plan
    sample it log-uniformly within [LO, HI] instead of the default range."""

    def parse(text: str) -> Any:
        lo, sep, hi = str(text).partition(":")
        return (kind(lo), kind(hi)) if sep else kind(text)

    parse.__name__ = f"{getattr(kind, '__name__', 'value')} or LO:HI range"
    return parse


@dataclass(frozen=True)
class Option:
    name: str  # the experiment-file key; the flag is --name-with-dashes unless `flag` says otherwise
    default: Any = None
    type: Callable[[str], Any] | None = str
    help: str = ""
    commands: tuple[str, ...] = ()
    stored: bool = False  # part of the study (its identity): set at launch, read by every worker
    switch: bool = False  # a store_true flag
    negatable: bool = False  # a switch that also has --no-NAME (its default depends on other options)
    shown_default: str | None = None  # the reference's default where a value cannot say it ("on with --ladder")
    choices: Sequence[str] | None = None  # a list may grow (PRUNERS: search/_rules.py registers rules)
    repeat: bool = False  # may be given several times (--budget 2M --budget 20M)
    required: tuple[str, ...] = ()  # commands on which argparse itself requires it
    list_commands: tuple[str, ...] = ()  # commands on which a comma-separated list is accepted
    range_commands: tuple[str, ...] = ()  # commands on which LO:HI is accepted (value_or_range)
    flag: str | None = None
    dest: str | None = None
    env: str | None = None  # an environment variable that replaces the default when set
    command_defaults: Mapping[str, Any] = field(default_factory=dict)  # e.g. train: None (from --from)
    metavar: str | None = None
    grid_dimension: bool = True  # a list on list_commands is a grid dimension (help says so)

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        return self.dest or self.name

    def default_for(self, command: str, env: Environment | None = None) -> Any:
        """The default on `command`; an environment variable (`env`, read now when not given) wins."""
        if command in self.command_defaults:
            return self.command_defaults[command]
        if self.env:
            value = (env or Environment.read()).value(self.env)
            if value:
                return value
        return self.default

    def parser_type(self, command: str) -> Callable[[str], Any] | None:
        if self.type is not None and command in self.range_commands:
            return value_or_range(self.type)
        if self.type is None or command not in self.list_commands:
            return self.type
        return integers if self.type is int and self.name in ARCH_OPTIONS else maybe_list(self.type)

    def help_for(self, command: str, family: Family | None = None) -> str:
        """The help on `command`; with a family, that family's --data forms (FAMILY_DATA)."""
        data = family_data(family)
        text = data.forms if self.name == "data" and data is not None else self.help
        if family is None and self.name == "data":
            text += " (each family reads its own forms: `--family NAME --help`)"
        if family is None and self.name in TASK_OPTIONS:
            text += f" (only --family {', '.join(n for n, d in FAMILY_DATA.items() if self.name in d.task_options)})"
        default = self.default_for(command)
        if self.env:
            text += f" (default ${self.env}, else {self.default})"
        elif not self.switch and default is not None and command not in self.command_defaults:
            text += f" (default {default})"
        if command in self.list_commands and self.name not in ARCH_OPTIONS and self.grid_dimension:
            text += "; a comma-separated list makes it a dimension of the study's grid"
        return text.replace("%", "%%")

    def applies_to(self, family: Family | None) -> bool:
        """False for a task option (--horizon) that `family`'s data never reads (FAMILY_DATA)."""
        data = family_data(family)
        return data is None or self.name not in TASK_OPTIONS or self.name in data.task_options

    def add_to(self, parser: argparse.ArgumentParser | Any, command: str, family: Family | None = None) -> None:
        """Add the flag; with `family`, as that family's help shows it (a task option it never reads
        is still accepted, so one experiment file serves several families, but not listed)."""
        shown = self.help_for(command, family) if self.applies_to(family) else argparse.SUPPRESS
        kwargs: dict[str, Any] = {"dest": self.key, "default": argparse.SUPPRESS, "help": shown}
        if self.switch:
            kwargs["action"] = argparse.BooleanOptionalAction if self.negatable else "store_true"
        else:
            kwargs["type"] = self.parser_type(command)
            if self.repeat:
                kwargs["action"] = "append"
            if self.choices:
                kwargs["choices"] = self.choices
            if self.metavar:
                kwargs["metavar"] = self.metavar
            elif not self.choices:
                kwargs["metavar"] = self.name.upper()
        if command in self.required:
            kwargs["required"] = True
        parser.add_argument(self.flag_name, **kwargs)


@dataclass(frozen=True)
class FamilyData:
    """What a family's --data accepts, and the task options its data reads (its Family's
    ``data_help`` and ``task_options``)."""

    forms: str
    task_options: tuple[str, ...] = ()


TASK_OPTIONS = ("horizon", "threshold")  # study options only the labelling of some families' data reads


def family_data(family: Family | None) -> FamilyData | None:
    """`family`'s --data forms and task options; None without a family or for one that states no
    forms (it shows the generic help and every option)."""
    if family is None or not family.data_help:
        return None
    return FamilyData(family.data_help, family.task_options)


class _FamilyDataTable(Mapping[str, FamilyData]):
    """FAMILY_DATA: each registered family's FamilyData, read from its Family record when asked,
    so the forms are written once, beside the family's parse_data (models/*_spec.py)."""

    def __getitem__(self, name: str) -> FamilyData:
        data = family_data(get_family(name)) if name in family_names() else None
        if data is None:
            raise KeyError(name)
        return data

    def __iter__(self) -> Iterator[str]:
        return (name for name in family_names() if get_family(name).data_help)

    def __len__(self) -> int:
        return sum(1 for _ in self)


FAMILY_DATA: Mapping[str, FamilyData] = _FamilyDataTable()


def setting_option(d: Declared) -> Option:
    """A study setting's row, derived from its declaration (archhpo/config.py)."""
    s = d.setting
    default = s.cli_default if s.cli_default is not ABSENT else d.default
    shown = s.shown_default
    if s.negatable and shown is None:  # decided by a preset where not stated: say by which
        shown = f"on with --{LADDER.switch}" if LADDER.values().get(d.option) is True else "off"
    return Option(d.option, default=default, type=s.parse, help=s.help, commands=s.commands, stored=True,
                  switch=s.switch, negatable=s.negatable, shown_default=shown, choices=s.choices, repeat=s.repeat,
                  required=s.required, flag=s.flag, command_defaults=s.command_defaults, metavar=s.metavar)


ARCH_OPTIONS = ARCH_KEYS  # the architecture flags, one per dimension (archhpo.schema)
TRAINING_OPTIONS = TRAINING_PARAMS
_PINNING = (LAUNCH, RUN, WORKER, EXPORT)
_TASK_TRAIN_DEFAULT = {TRAIN: None}  # train: taken from --from's best JSON, else the default

_HEAD: tuple[Option, ...] = (
    Option("config", None, str, "experiment file (TOML, or YAML with pyyaml) with any of these options; "
           "flags win", (LAUNCH, RUN), metavar="FILE"),
)
_TAIL: tuple[Option, ...] = (
    Option("study", None, str, "an exact study name as `launch` printed it; repeat for several (instead of "
           "--budget)", (WORKER, EXPORT), repeat=True),
    *(Option(name, None, int, f"{name} ({ARCH_HELP[name]}): pin it, or a list of values, in or instead of a budget",
             (GRID, PARAMS, TRAIN, *_PINNING), stored=True, required=(PARAMS,), list_commands=(GRID, *_PINNING))
      for name in ARCH_OPTIONS),
    *(Option(name, None, p.type, f"fix {name} for every trial" + (", or LO:HI: sample it log-uniformly within"
             if p.kind == "log" else " (the plan samples the other training parameters)"),
             (TRAIN, *STUDY_COMMANDS), stored=True, range_commands=STUDY_COMMANDS if p.kind == "log" else ())
      for name, p in zip(TRAINING_OPTIONS, TRAINING, strict=True)),
    Option("storage", None, str, "database URL (default $ARCHHPO_STORAGE, else sqlite:///archhpo.db)",
           (*STUDY_COMMANDS, WORKER, EXPORT, DASHBOARD, REPORT)),
    Option("device", "auto", str, "auto, cpu or cuda", (WORKER, RUN, TRAIN)),
    Option("threads", None, int, "torch CPU threads (run: per worker; default cores / --workers)",
           (WORKER, RUN, TRAIN)),
    Option("checkpoint_dir", "checkpoints", str, "per-epoch checkpoints, so a retried trial resumes (shared on a "
           "cluster)", (WORKER, RUN), env="ARCHHPO_CHECKPOINT_DIR", metavar="DIR"),
    Option("checkpoint_every", 1, int, "write a trial's checkpoint every N validated epochs (a stop always saves)",
           (WORKER, RUN), metavar="N"),
    Option("workers", None, int, "Ray workers (default: one per GPU of the cluster, else 2)", (RUN,)),
    Option("ray_address", None, str, "an existing Ray cluster (default: a private local Ray)", (RUN,),
           metavar="ADDR"),
    Option("gpus_per_trial", None, str, "GPU share per worker (0.25 packs four on a GPU), or auto: sized from "
           "memory", (RUN,), metavar="F"),
    Option("out", "results", str, "directory for the CSV, best JSON (and report)", (RUN, EXPORT, REPORT),
           metavar="DIR"),
    Option("csv", None, str, "an experiment_results.csv to read instead of a database; repeat for several",
           (REPORT,), repeat=True, metavar="FILE"),
    Option("compute", None, float, "the compute budget C (FLOPs) to recommend N*, D* and a shape for (default: "
           "the largest's)", (REPORT,), metavar="FLOPS"),
    Option("reference", None, str, "the choice paired differences are taken against (default: the first "
           "listed)", (REPORT,), metavar="VALUE"),
    Option("report", False, None, "also write the report (HTML, figures, scaling fit, summary)", (EXPORT,),
           switch=True),
    Option("format", "table", str, "output format", (GRID,), choices=("table", "json", "csv")),
    Option("format", "text", str, "output format", (PARAMS,), choices=("text", "json"), dest="format"),
    Option("from_json", None, str, "a *_best.json to reproduce", (TRAIN,), flag="--from", metavar="BEST_JSON"),
    Option("save", None, str, "write the trained weights and config here (.pt)", (TRAIN,), metavar="FILE"),
    Option("host", "127.0.0.1", str, "address to bind", (DASHBOARD,)),
    Option("port", 8080, int, "port", (DASHBOARD,)),
)


def all_options() -> tuple[Option, ...]:
    """Every option: the experiment file's, each declared study setting's (archhpo/config.py), the rest."""
    return (*_HEAD, *(setting_option(d) for d in declared()), *_TAIL)


OPTIONS = all_options()  # as declared at import (a setting registered later is in `all_options` only)


def options_for(command: str) -> list[Option]:
    return [o for o in all_options() if command in o.commands]


def option(name: str, command: str | None = None) -> Option:
    for o in all_options():
        if o.name == name and (command is None or command in o.commands):
            return o
    raise KeyError(name)


def default(name: str, command: str = LAUNCH) -> Any:
    """The one default of an option (as `launch` sees it unless another command is named)."""
    matching = [o for o in all_options() if o.name == name]
    if not matching:
        raise KeyError(name)
    chosen = next((o for o in matching if command in o.commands), matching[0])
    return chosen.default_for(command)


def family_options(family: Family | None) -> list[Option]:
    """A family's flags (Family.flags) as options of grid/params/launch/run/train."""
    if family is None:
        return []
    try:  # flags that shape the data take one value per study (a list would need other data)
        shaping = set(family.data_info(family.parse_data(default("data"), {}), {}))
    except Exception:  # noqa: BLE001 - only decides which help text to show
        shaping = set()
    out = []
    for flag in family.flags:
        listable = flag.type in (str, int, float)  # a data-shaping list is refused with a sentence
        out.append(Option(
            flag.name, flag.default, flag.type, flag.help, FAMILY_COMMANDS, stored=True,
            dest=f"fam_{flag.name}", list_commands=STUDY_COMMANDS if listable else (),
            grid_dimension=flag.name not in shaping,
        ))
    return out


# ----------------------------------------------------------------------------- experiment files
def load_config(path: str) -> dict[str, Any]:
    """Read an experiment file: TOML (.toml) or YAML (.yaml/.yml, needs pyyaml); one flat table."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ArchhpoError(f"Experiment file {path} does not exist; check --config.") from None
    except OSError as exc:
        raise ArchhpoError(f"Cannot read experiment file {path} ({exc.strerror}); check --config.") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ArchhpoError(f"Reading {path} needs pyyaml (pip install pyyaml), or write it as TOML.") from None
        try:
            data = yaml.safe_load(raw.decode())
        except yaml.YAMLError as exc:
            raise ArchhpoError(f"{path} is not valid YAML ({str(exc).splitlines()[0]}); fix the file.") from None
        data = {} if data is None else data
    else:
        try:
            data = tomllib.loads(raw.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ArchhpoError(f"{path} is not valid TOML ({exc}); fix the file.") from None
    if not isinstance(data, dict):
        raise ArchhpoError(f"{path} must hold key = value pairs (one table), not a {type(data).__name__}.")
    return data


def config_values(config: Mapping[str, Any], path: str, command: str, opts: Iterable[Option]) -> dict[str, Any]:
    """The experiment file's values by argparse dest, converted exactly as their flags would be.

    Every option of launch or run is a valid key (one file serves both; run-only keys such as
    `workers` are ignored by launch), written with '_' or '-'.  Anything else is refused."""
    by_key = {o.name: o for o in opts if o.name != "config"}
    out: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = str(raw_key).replace("-", "_")
        o = by_key.get(key)
        if o is None:
            known = ", ".join(sorted(by_key))
            near = difflib.get_close_matches(key, list(by_key), n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise ArchhpoError(f"Unknown key {raw_key!r} in {path}; {hint}an experiment file takes only these "
                               f"keys: {known}.")
        if command not in o.commands:
            continue  # e.g. `workers` read by launch
        out[o.key] = _convert(o, raw_key, value, path, command)
    return out


def _convert(o: Option, key: str, value: Any, path: str, command: str) -> Any:
    where = f"Key {key!r} in {path}"
    if isinstance(value, dict):
        raise ArchhpoError(f"{where} must be a value or a list, not a table.")
    if o.switch:
        if not isinstance(value, bool):
            raise ArchhpoError(f"{where} must be true or false, got {value!r}.")
        return value
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, bool | list | dict) for v in items):
        raise ArchhpoError(f"{where} has an unusable value {value!r}; write it as on the command line.")
    texts = [str(v) for v in items]
    try:
        if o.repeat:
            return [o.type(t) if o.type else t for t in texts]
        kind = o.parser_type(command)
        if isinstance(value, list) and len(value) == 2 and command in o.range_commands:
            texts = [":".join(texts)]  # learning-rate = [1e-3, 3e-2]: the range LO:HI
        elif isinstance(value, list) and command not in o.list_commands:
            if command in o.range_commands:
                raise ArchhpoError(f"{where} takes one value or a range [LO, HI], not a list of {len(value)}.")
            if o.type in (str, int, float):
                raise ArchhpoError(f"{where} takes one value, not a list.")
            texts = [",".join(texts)]  # a family type that parses lists itself (cat_cardinalities)
        result = kind(",".join(texts)) if kind else ",".join(texts)
    except (ValueError, TypeError):
        name = getattr(o.type, "__name__", "value")
        raise ArchhpoError(f"{where}: {value!r} is not a valid {name}.") from None
    if o.choices and result not in o.choices:
        raise ArchhpoError(f"{where} must be one of {', '.join(o.choices)}, got {value!r}.")
    return result


def argv_value(argv: list[str], flag: str) -> str | None:
    """The last value of `flag` on the line (`--flag X` or `--flag=X`), without parsing it."""
    found = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


__all__ = [
    "ARCH_OPTIONS",
    "FAMILY_DATA",
    "OPTIONS",
    "TASK_OPTIONS",
    "STUDY_COMMANDS",
    "TRAINING_OPTIONS",
    "Option",
    "argv_value",
    "config_values",
    "default",
    "family_data",
    "family_options",
    "load_config",
    "all_options",
    "option",
    "options_for",
    "setting_option",
]
