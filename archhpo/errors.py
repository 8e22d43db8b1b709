"""Every project exception, in one module that every layer imports.

Each message is one sentence saying what is wrong and what to do next; the CLI prints it and
exits 2.  Only ``ArchhpoError`` subclasses are user-facing; anything else is a bug.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path


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


class DiskFull(OutputError):
    """A checkpoint or results write failed for lack of space: a pause, not a verdict. The worker
    gives its trial back (no attempt spent) and stops, `run` stops as on Ctrl-C, and the same
    command resumes once space returns.  ``DiskFull.of`` tells such a failure from others."""

    def __init__(self, path: str | os.PathLike[str], cause: str) -> None:
        self.path, self.cause = Path(path), cause
        super().__init__(f"No space left on the device holding {self.path} ({cause}); free some space "
                         "and run the same command to resume.")

    def __reduce__(self) -> tuple[type[DiskFull], tuple[Path, str]]:  # pickled whole (Ray, processes)
        return type(self), (self.path, self.cause)

    @classmethod
    def of(cls, exc: BaseException, path: str | os.PathLike[str], needed: int = 0) -> DiskFull | None:
        """The DiskFull that `exc`, raised writing `path` (about `needed` bytes), stands for, else None.

        An OSError with errno ENOSPC or EDQUOT, here or in the chain that led to it, is one; so is
        torch's RuntimeError of a failed zip write ("[enforce fail at inline_container.cc:...]",
        which hides the errno) when the device holding `path` has less than `needed` bytes, and a
        margin of 64 KiB, free.  Anything else (an I/O error, a bug) is not: it fails as before."""
        seen: list[BaseException] = []
        link: BaseException | None = exc
        while link is not None and link not in seen and len(seen) < 8:
            if isinstance(link, OSError) and link.errno is not None and link.errno in _NO_SPACE:
                return cls(link.filename or path, link.strerror or os.strerror(link.errno))
            seen.append(link)
            link = link.__cause__ or link.__context__
        if isinstance(exc, RuntimeError) and _TORCH_WRITE.search(str(exc)):
            free = _free_bytes(path)
            if free is not None and free < needed + 65536:
                return cls(path, f"{free:,} bytes free; torch: {str(exc).splitlines()[0][:200]}")
        return None


_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # a full device, a full quota
_TORCH_WRITE = re.compile(r"inline_container|file write failed", re.IGNORECASE)


def _free_bytes(path: str | os.PathLike[str]) -> int | None:
    """The bytes an unprivileged writer may still use on the device holding `path` (its nearest
    folder that exists), or None where that cannot be asked (no statvfs, nothing found)."""
    probe = Path(path).absolute()
    while not probe.is_dir() and probe.parent != probe:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except (OSError, AttributeError):  # AttributeError: Windows has no statvfs
        return None
    return st.f_bavail * st.f_frsize


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


class GroupBroken(TrialLost):
    """A rank of this trial's group died or stalled past the timeout: nothing more is written from
    this group (its rank 0's claim is reaped and retried once from the last checkpoint), and every
    surviving rank exits so its launcher can restart the group."""


__all__ = [
    "ArchhpoError",
    "BudgetError",
    "ConfigError",
    "DataError",
    "DiskFull",
    "GroupBroken",
    "MemoryRefused",
    "NonFiniteLoss",
    "OutputError",
    "StorageError",
    "StudyError",
    "TrialLost",
    "TrialStopped",
]
