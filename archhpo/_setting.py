"""The declaration of one study setting (`Setting`, written with `setting`), and the names of the
commands a setting may be given on.

A study setting is one dataclass field of `archhpo.config.StudyConfig` (or of one of its sections)
whose metadata is its `Setting`: the field holds the type and the default, the `Setting` the
one-line help, the check, the flag and experiment-file key, the key the study stores it under and
what a study stored before it existed reads as.  The command line's rows, the experiment files'
keys, the stored options and their reload are derived from these declarations (archhpo/config.py).
This module imports only the standard library, so archhpo/config.py and its sections may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any

GRID, PARAMS, LAUNCH, WORKER, RUN, EXPORT, DASHBOARD, TRAIN, REPORT = (
    "grid", "params", "launch", "worker", "run", "export", "dashboard", "train", "report",
)
STUDY_COMMANDS = (LAUNCH, RUN)  # the commands that plan studies and read an experiment file (--config)
FAMILY_COMMANDS = (GRID, PARAMS, LAUNCH, RUN, TRAIN)  # the commands that take a family's flags


class _Absent:
    """The stored value of a setting a study does not store (`ABSENT`)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class Placement:
    """Where a study sits among its experiment's studies: what a stored value may depend on besides
    the settings (a --ladder budget's smaller studies, whether it is the ladder's largest)."""

    ladder_below: tuple[str, ...] = ()
    largest: bool = True
    budget: int | None = None


@dataclass(frozen=True)
class Setting:
    """One study setting's declaration, the metadata of its field (see the module docstring).

    ``stored`` is its key in the study's stored options ("a.b": key b of the stored record a); None:
    not stored there (a StudySettings field, or read by the planner only).  It is stored when it
    differs from the field's default, always with ``always``, only beside the stored key ``beside``,
    as ``token`` when a switch is on, or as ``encode(value, placement)`` gives it (ABSENT: nothing).
    A stored study lacking the key reads it as ``before`` (default: the field's default), one holding
    it as ``decode(stored)`` (a token: whether it is stored); ``former``
    lists (stored then, stored now) pairs one command launched under an older default.
    ``check(value)`` answers None or the sentence that refuses the value (raised as ``error``);
    ``needs`` (sentence, holds) refuses the setting stated where ``holds(config)`` is false.
    """

    help: str
    option: str = ""  # the argparse dest and the experiment-file key; "" = the field's name
    flag: str | None = None  # "" = the option as --dashed-name
    stored: str | None = None
    always: bool = False
    beside: str | None = None
    token: Any = None
    encode: Callable[[Any, Placement], Any] | None = None
    decode: Callable[[Any], Any] | None = None  # the typed value of what is stored (ABSENT: never called)
    before: Any = ABSENT  # ABSENT: the field's default
    former: tuple[tuple[Any, Any], ...] = ()
    check: Callable[[Any], str | None] | None = None
    error: type[Exception] | None = None  # None: archhpo.errors.ConfigError
    needs: tuple[str, Callable[[Any], bool]] | None = None
    # How the command line takes it.
    parse: Callable[[str], Any] | None = str  # None for a switch
    commands: tuple[str, ...] = STUDY_COMMANDS
    switch: bool = False
    negatable: bool = False  # a switch with --no-NAME too
    choices: Any = None  # a sequence (it may grow: the stopping rules register theirs)
    repeat: bool = False  # given several times, a tuple
    metavar: str | None = None
    required: tuple[str, ...] = ()
    command_defaults: Mapping[str, Any] = field(default_factory=dict)
    shown_default: str | None = None  # the reference's default where the value cannot say it
    cli_default: Any = ABSENT  # the parser's default where not the field's (a repeated flag: None)

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.option.replace("_", "-")


def setting(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            **declared: Any) -> Any:
    """A dataclass field declaring a study setting: its default (or `factory`) and its `Setting`."""
    meta = {"setting": Setting(help, **declared)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


__all__ = [
    "ABSENT", "DASHBOARD", "EXPORT", "FAMILY_COMMANDS", "GRID", "LAUNCH", "PARAMS", "REPORT", "RUN",
    "STUDY_COMMANDS", "TRAIN", "WORKER", "Placement", "Setting", "setting",
]
