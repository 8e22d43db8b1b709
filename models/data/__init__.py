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


def recorded_file(spec: Mapping[str, Any]) -> Path:
    """The data file a study recorded, refused if it is missing here or changed since launch."""
    path = Path(spec["path"])
    if not path.is_file():
        raise DataError(f"Data file {path} does not exist on this machine; copy it there at the same path.")
    if spec.get("sha256") and file_sha256(path) != spec["sha256"]:
        raise DataError(f"Data file {path} has changed since the study recorded it; "
                        "restore the original file or start a new study.")
    return path
