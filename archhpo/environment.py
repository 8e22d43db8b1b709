"""The ARCHHPO_* environment variables, read in one place (`Environment`).

On the ground floor with archhpo.config: it imports only the standard library and archhpo.errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from archhpo.errors import ConfigError


@dataclass(frozen=True)
class Environment:
    """The ARCHHPO_* environment variables, read in this one place: the entry points (the command
    line's `main`; a Ray worker task, in its own process) `read` them once and pass the object down
    (``open_storage(url, timing=env)``, ``TrialQueue(url, name, timing=env)``,
    ``RunOptions(stop_wait_s=env.stop_wait_s)``).  ``Environment()``, what a library caller that
    passes nothing gets, holds the defaults; `read` leaves an unset or empty variable at its default."""

    storage: str | None = None
    """ARCHHPO_STORAGE: the database URL when --storage is not given"""
    checkpoint_dir: str | None = None
    """ARCHHPO_CHECKPOINT_DIR: the checkpoint folder when --checkpoint-dir is not given"""
    stop_wait_s: float = 20.0
    """ARCHHPO_STOP_WAIT_S: how long `run` waits for stopped workers to give their trials back (20 s fits the 30 s a scheduler gives before SIGKILL)"""
    heartbeat_s: int = 15
    """ARCHHPO_HEARTBEAT_S: seconds between a running trial's heartbeats"""
    grace_s: int = 90
    """ARCHHPO_GRACE_S: a trial without a heartbeat for this long is reaped (90 s outlasts a ~30 s database restart)"""
    db_patience_s: float = 600.0
    """ARCHHPO_DB_PATIENCE_S: how long a worker retries an unreachable database"""
    reap_s: float = 30.0
    """ARCHHPO_REAP_S: seconds between a queue's sweeps for abandoned trials"""
    group_timeout_s: float = 120.0
    """ARCHHPO_GROUP_TIMEOUT_S: a K-rank trial's bound on every collective (120 s outlasts a step, a model build or rank 0's checkpoint write; torch's own is 30 minutes)"""

    VARIABLES: ClassVar[dict[str, str]] = {
        "storage": "ARCHHPO_STORAGE", "checkpoint_dir": "ARCHHPO_CHECKPOINT_DIR",
        "stop_wait_s": "ARCHHPO_STOP_WAIT_S", "heartbeat_s": "ARCHHPO_HEARTBEAT_S", "grace_s": "ARCHHPO_GRACE_S",
        "db_patience_s": "ARCHHPO_DB_PATIENCE_S", "reap_s": "ARCHHPO_REAP_S",
        "group_timeout_s": "ARCHHPO_GROUP_TIMEOUT_S",
    }

    def __post_init__(self) -> None:
        """A timing variable's text becomes its field's type (seconds), or a ConfigError."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) and isinstance(f.default, int | float):
                kind = type(f.default)
                try:
                    object.__setattr__(self, f.name, kind(value))
                except ValueError:
                    what = "a whole number" if kind is int else "a number"
                    raise ConfigError(f"${self.VARIABLES[f.name]} {value!r} must be {what} of seconds.") from None
        if not self.group_timeout_s > 0:  # a bound of 0 would fail every collective at once
            raise ConfigError(f"$ARCHHPO_GROUP_TIMEOUT_S {self.group_timeout_s!r} must be a positive number of seconds.")

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        env = os.environ if environ is None else environ
        given: dict[str, Any] = {name: env[var] for name, var in cls.VARIABLES.items() if env.get(var)}
        return cls(**given)  # the timing variables' text becomes seconds in __post_init__

    def value(self, variable: str) -> str | None:
        """The value of one variable by its name (ARCHHPO_CHECKPOINT_DIR)."""
        name = next((n for n, v in self.VARIABLES.items() if v == variable), None)
        if name is None:
            raise KeyError(variable)
        return getattr(self, name)


__all__ = ["Environment"]
