"""Refusing a run that no worker could train: checked when the plan is made, before anything starts.

Every worker refuses a trial whose training-memory estimate does not fit its device
(workers/_memory.py); when even the smallest planned architecture fits no worker, a run would
start Ray, fail every trial for good on that estimate and report nothing.  The same estimate is
known as soon as the plan is: `run` refuses it then, naming the smallest need and the largest
worker.  The bound is a lower one (the smallest batch size, no dataset counted): a run is never
refused that some worker could train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from archhpo.cluster._options import RunOptions
from archhpo.errors import BudgetError

GiB = 2**30


@dataclass(frozen=True)
class WorkerMemory:
    device_type: str  # "cuda" or "cpu": how the workers train, so how the estimate counts
    bytes: int  # the largest worker's memory (a GPU's total, or a host's free memory)
    what: str  # the worker in words, for the message


def smallest_need(settings: list[Any], device_type: str) -> tuple[int, str]:
    """The smallest training-memory estimate over every architecture of the studies (at the
    smallest batch size of the search space), and that architecture in words."""
    from archhpo.models import get_family
    from archhpo.workers import estimate_training_bytes, trial_shape

    best: tuple[int, str] | None = None
    for s in settings:
        fam = get_family(s.family)
        batch = min(s.search_space.batch_size)
        for a in s.archs:
            cfg = fam.config_for(a, {**s.info, **(a.get("choices") or {})})
            need = estimate_training_bytes(trial_shape(fam, cfg, a, batch, batch), device_type)
            if best is None or need < best[0]:
                best = (need, f"{int(a['param_count']):,} parameters, batch {batch}")
    return best if best is not None else (0, "")


def check_capacity(settings: list[Any], worker: WorkerMemory | None) -> None:
    """BudgetError when the smallest planned architecture fits no worker (None: memory unknown)."""
    from archhpo.workers._memory import CUDA_CONTEXT_BYTES, SAFETY, fits

    if worker is None or not settings:
        return
    need, arch = smallest_need(settings, worker.device_type)
    context = CUDA_CONTEXT_BYTES if worker.device_type == "cuda" else 0  # each GPU process holds one
    if fits(need + context, worker.bytes):
        return
    budgets = ", ".join(dict.fromkeys(s.budget for s in settings))
    raise BudgetError(
        f"No worker can train any architecture planned for {budgets}: the smallest needs at least about "
        f"{(need + context) / GiB:.1f} GiB ({arch}), but the largest worker, {worker.what}, can give a trial "
        f"{SAFETY * worker.bytes / GiB:.1f} GiB ({SAFETY:.0%} of {worker.bytes / GiB:.1f} GiB); plan a smaller "
        "--budget or run on workers with more memory."
    )


def _trains_on_cpu(opts: RunOptions) -> bool:
    return opts.device == "cpu" or opts.gpus_per_trial in (0, 0.0)


def local_worker(opts: RunOptions) -> WorkerMemory | None:
    """The largest worker of a private local Ray: this machine's largest GPU, else its free memory
    (None where it cannot be known: logical GPUs of a test, a --device cuda without a GPU)."""
    import torch

    from archhpo.cluster._placement import gpu_memories
    from archhpo.workers._memory import available_bytes

    if not _trains_on_cpu(opts):
        gpus = gpu_memories()
        if gpus:
            return WorkerMemory("cuda", max(gpus), f"this machine's largest GPU ({max(gpus) / GiB:.0f} GiB)")
        if opts.local_gpus or opts.device.startswith("cuda"):
            return None
    free = available_bytes(torch.device("cpu"))
    return WorkerMemory("cpu", free, f"this machine's CPU ({free / GiB:.1f} GiB of memory free)")


def check_local_capacity(settings: list[Any], opts: RunOptions) -> None:
    """`run` without --ray-address: refuse before the studies are written (called by the command
    line between planning and launching).  A cluster's workers are known once Ray is joined."""
    if not opts.ray_address:
        check_capacity(settings, local_worker(opts))


def cluster_worker(opts: RunOptions) -> WorkerMemory | None:
    """The largest worker of the Ray cluster joined: its largest GPU, else the largest memory a
    node offers its tasks (Ray's `memory` resource)."""
    import ray

    from archhpo.cluster._placement import _gpu_memory

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not _trains_on_cpu(opts) and any(n.get("Resources", {}).get("GPU", 0) >= 1 for n in nodes):
        largest = _gpu_memory(largest=True)
        return None if largest is None else WorkerMemory(
            "cuda", largest, f"the cluster's largest GPU ({largest / GiB:.0f} GiB)")
    # Ray's `memory` leaves out the object store's share, which a worker's own check (free memory,
    # the store mostly unused by trials) does see: both together, so no run is refused wrongly.
    sizes = [int(r.get("memory", 0) + r.get("object_store_memory", 0))
             for r in (n.get("Resources", {}) for n in nodes) if r.get("CPU", 0)]
    if not sizes or not max(sizes):
        return None
    return WorkerMemory("cpu", max(sizes), f"the cluster's largest CPU node ({max(sizes) / GiB:.1f} GiB for tasks)")


__all__ = ["WorkerMemory", "check_capacity", "check_local_capacity", "cluster_worker", "local_worker",
           "smallest_need"]
