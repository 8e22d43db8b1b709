"""Datasets the model families train on; each returns a models.TensorDataset."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from archhpo.errors import DataError


def file_sha256(path: str | Path) -> str:
    """The sha256 of a data file: stored in the study, checked by every worker that loads it."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


FINGERPRINT_EDGE = 1 << 20  # the first and the last MiB
FINGERPRINT_BLOCKS = 62  # blocks of FINGERPRINT_BLOCK bytes evenly spaced between them
FINGERPRINT_BLOCK = 1 << 16


def file_fingerprint(path: str | Path) -> str:
    """The sha256 of a large file's size, first and last MiB and FINGERPRINT_BLOCKS blocks evenly
    spaced between (about 5 MiB read, whatever the size): what a token file is pinned by, since
    hashing all of a corpus of billions of tokens would take minutes at every launch and load."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(size.to_bytes(8, "little"))
    inner = max(0, size - 2 * FINGERPRINT_EDGE - FINGERPRINT_BLOCK)
    offsets = [0, *(FINGERPRINT_EDGE + inner * i // max(1, FINGERPRINT_BLOCKS - 1) for i in range(FINGERPRINT_BLOCKS)),
               max(0, size - FINGERPRINT_EDGE)]
    with path.open("rb") as f:
        for i, at in enumerate(offsets):
            f.seek(at)
            h.update(f.read(FINGERPRINT_EDGE if i in (0, len(offsets) - 1) else FINGERPRINT_BLOCK))
    return h.hexdigest()


def recorded_file(spec: Mapping[str, Any]) -> Path:
    """The data file a study recorded, refused if it is missing here or changed since launch (its
    ``sha256``, or for a token file its ``fingerprint``)."""
    path = Path(spec["path"])
    if not path.is_file():
        raise DataError(f"Data file {path} does not exist on this machine; copy it there at the same path.")
    changed = (spec.get("sha256") and file_sha256(path) != spec["sha256"]) or (
        spec.get("fingerprint") and file_fingerprint(path) != spec["fingerprint"])
    if changed:
        raise DataError(f"Data file {path} has changed since the study recorded it; "
                        "restore the original file or start a new study.")
    return path
