"""The cluster: a pool of worker processes on Ray (a private local Ray or an existing cluster),
GPU placement, whole-GPU retries, supervision and the progress line of `archhpo run`.

Private parts of Ray are touched only in `_ray_private.py`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from archhpo.cluster._options import RunOptions, check_run_options
    from archhpo.cluster._run import run_workers

# Loaded on first use (PEP 562): `archhpo run`'s option checks (cluster/_options.py) refuse bad input
# before torch and Ray, which run_workers needs, are imported (about 1.3 s of a refusal).
_LAZY = {"RunOptions": "_options", "check_run_options": "_options", "run_workers": "_run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"archhpo.cluster.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'archhpo.cluster' has no attribute {name!r}")


__all__ = ["RunOptions", "check_run_options", "run_workers"]
