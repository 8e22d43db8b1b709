"""Every project exception, in one module that every layer imports.

Each message is one sentence saying what is wrong and what to do next; the CLI prints it and
exits 2.  Only ``ArchhpoError`` subclasses are user-facing; anything else is a bug.
"""

from __future__ import annotations


class ArchhpoError(Exception):
    """A user-facing error: the message is one sentence saying what is wrong and what to do."""


class BudgetError(ArchhpoError):
    """A budget, tolerance or plan size that cannot be used."""


class ConfigError(ArchhpoError):
    """A model configuration is invalid."""


class DataError(ArchhpoError):
    """The data spec or data file cannot be used."""


class StorageError(ArchhpoError):
    """The study database cannot be reached or used."""


class OutputError(ArchhpoError):
    """A folder or file archhpo must write (results, checkpoints, the SQLite database) cannot be
    written: refused before a run starts, or the run stopped when a later write failed."""


class StudyError(ArchhpoError):
    """A study that does not exist or does not match what was asked for."""


class MemoryRefused(ArchhpoError):
    """The trial cannot fit in the device's memory; it fails before anything is built."""


class NonFiniteLoss(ArchhpoError):
    """The loss became NaN or infinite; the trial fails with this reason."""


class TrialStopped(Exception):  # control flow, not an error a user sees
    """Training stopped between two steps because the worker was asked to stop (SIGTERM, SIGINT,
    a cancelled Ray task): the trial goes back to the queue without spending an attempt."""


class TrialLost(TrialStopped):
    """This worker's trial is no longer its own (reaped while the worker was paused or cut off,
    and retried elsewhere): the worker must never write to that trial or its retry again."""


__all__ = [
    "ArchhpoError",
    "BudgetError",
    "ConfigError",
    "DataError",
    "MemoryRefused",
    "NonFiniteLoss",
    "OutputError",
    "StorageError",
    "StudyError",
    "TrialLost",
    "TrialStopped",
]
