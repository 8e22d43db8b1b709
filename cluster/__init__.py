"""The cluster: a pool of worker processes on Ray (a private local Ray or an existing cluster),
GPU placement, whole-GPU retries, supervision and the progress line of `archhpo run`.

Private parts of Ray are touched only in `_ray_private.py`."""

from archhpo.cluster._run import RunOptions, check_run_options, run_workers

__all__ = ["RunOptions", "check_run_options", "run_workers"]
