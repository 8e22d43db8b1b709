"""The one atomic write of archhpo: results, reports, best JSONs and checkpoints.

Imports nothing but the standard library, so every layer may use it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, content: str | bytes | Callable[[BinaryIO], object]) -> None:
    """Write via a temporary file in the same directory and rename: readers never see half a file.

    ``content`` is the text or bytes, or a function writing to the open binary file (e.g.
    ``lambda fh: torch.save(obj, fh)``).  The file gets the usual permissions (0666 less the
    umask), not mkstemp's 0600: results and reports are for sharing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content.encode("utf-8") if isinstance(content, str) else content)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwritable(directory: Path) -> str | None:
    """Why files cannot be written into `directory` (made with its parents when missing), or None.

    Asked before a run creates anything, so nothing is left behind: the nearest folder that exists
    is tried with an anonymous temporary file (O_TMPFILE: it never gets a name), which finds a
    read-only mount or a missing permission that os.access alone misses (root, NFS)."""
    probe = Path(directory).absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        return f"{probe}: {exc.strerror or exc}"
    return None


__all__ = ["atomic_write", "unwritable"]
