"""The Ray side of `archhpo run`: the body of a worker task, its Ray options, and starting the tasks."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from archhpo.environment import Environment
from archhpo.schema import Attr
from archhpo.search._queue import TrialQueue


def worker_task(
    storage_url: str, names: list[str], device: str, threads: int, run_id: str, checkpoint_dir: str | None,
    gpu_share: float = 0.0, checkpoint_every: int = 1,
) -> dict[str, Any]:
    """Body of one Ray worker: the plain worker loop over the studies (importable by Ray).

    `storage_url` never holds a password (see take_password): workers read PGPASSWORD/.pgpass.
    `gpu_share` is the task's num_gpus; every trial records it (the OOM policy reads it).
    The task reads the ARCHHPO_* timing variables once, in its own process (a local Ray passes the
    driver's environment on; a cluster's nodes set their own).
    """
    import ray

    from archhpo.workers import Worker

    env = Environment.read()
    queues = [TrialQueue(storage_url, n, timing=env) for n in names]
    ctx = ray.get_runtime_context()
    attrs: dict[str, Any] = {"run_id": run_id, "ray_node_id": ctx.get_node_id(),
                             "ray_worker": ctx.get_worker_id()[:12], Attr.GPU_SHARE: float(gpu_share)}
    if gpu_share > 0:
        attrs["ray_gpu_ids"] = [str(i) for i in ctx.get_accelerator_ids().get("GPU", [])]
    elif device == "auto":
        device = "cpu"  # docs/design.md §10: a task without a GPU share sees every GPU of its node; use none of them
    # ray.cancel(ref) interrupts the task's main thread like SIGINT: with the worker's handlers the
    # trial stops between two steps and goes back to the queue (same attempt), and the task returns.
    worker = Worker(queues, device=device, threads=threads, extra_attrs=attrs, checkpoint_dir=checkpoint_dir,
                    checkpoint_every=checkpoint_every, handle_signals=True)
    return {**worker.run().__dict__, Attr.GPU_SHARE: float(gpu_share)}

def task_options(share: float, threads: int, cluster: bool) -> dict[str, Any]:
    """Ray options of a worker task: its CPUs (1 on a cluster, its threads locally) and GPU share.

    A task with a GPU share runs in a fresh process that exits after it (max_calls=1): a process
    that already ran a GPU task may hold another GPU's CUDA_VISIBLE_DEVICES, a CUDA context with
    its neighbours' cached blocks, or one poisoned by a sticky CUDA fault."""
    opts: dict[str, Any] = {"num_cpus": 1 if cluster else threads, "num_gpus": float(share), "max_retries": 3}
    if share > 0:
        opts["max_calls"] = 1
    return opts


def gpu_task(share: float, threads: int, cluster: bool) -> Any:
    """The Ray remote function of worker_task with these options (max_calls cannot be given to
    .options(), so every share gets its own RemoteFunction)."""
    import ray

    return ray.remote(**task_options(share, threads, cluster))(worker_task)


def start_by_share(
    remote: Callable[[float], Any], shares: list[float], args: Callable[[float], tuple[Any, ...]],
    wait_s: float = 60.0,
) -> list[Any]:
    """Start one task per share (`remote(share)`: its RemoteFunction), the largest shares first,
    each group once Ray has granted the GPUs of the one before (a smaller share started earlier
    would fill a GPU meant for a larger one)."""
    import ray

    refs: list[Any] = []
    groups = sorted(Counter(shares).items(), reverse=True)
    for i, (share, n) in enumerate(groups):
        before = float(ray.available_resources().get("GPU", 0.0))
        task = remote(share)  # the RemoteFunction of this share (max_calls=1 with a GPU share)
        refs += [task.remote(*args(share)) for _ in range(n)]
        if share > 0 and i + 1 < len(groups):
            deadline = time.monotonic() + wait_s
            while (time.monotonic() < deadline
                   and float(ray.available_resources().get("GPU", 0.0)) > before - n * share + 1e-6):
                time.sleep(0.1)
    return refs


def gang_loop(config: dict[str, Any]) -> None:
    """Body of every Ray Train worker of a gang: one rank of a K-rank trial group (Ray Train has set
    up the process group; workers/_distributed.py adopts it), the worker loop over the studies.
    A rank that leaves unhealthy (its group broke) raises, so FailureConfig restarts the gang."""
    import ray.train

    from archhpo.workers import Worker

    env = Environment.read()
    queues = [TrialQueue(config["storage_url"], n, timing=env) for n in config["names"]]
    ctx = ray.train.get_context()
    attrs: dict[str, Any] = {"run_id": config["run_id"], "ray_train_rank": ctx.get_world_rank()}
    worker = Worker(queues, device=config["device"], threads=config["threads"], extra_attrs=attrs,
                    checkpoint_dir=config["checkpoint_dir"], checkpoint_every=config["checkpoint_every"])
    summary = worker.run()
    if summary.unhealthy:
        raise RuntimeError(summary.unhealthy)


def gang_task(storage_url: str, names: list[str], device: str, threads: int, run_id: str,
              checkpoint_dir: str | None, ranks: int, checkpoint_every: int = 1) -> dict[str, Any]:
    """A Ray task (no resources of its own) that trains trials across `ranks` ranks through Ray Train
    V2's TorchTrainer: gang-placed (all ranks start together or none), its process group bounded by
    ARCHHPO_GROUP_TIMEOUT_S, the gang restarted once when a rank fails (FailureConfig)."""
    import os

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    gpu = device != "cpu"
    config = {"storage_url": storage_url, "names": names, "device": device, "threads": threads, "run_id": run_id,
              "checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every}
    trainer = TorchTrainer(
        gang_loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=ranks, use_gpu=gpu, resources_per_worker={"CPU": threads}),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo", timeout_s=int(Environment.read().group_timeout_s)),
        # Ray Train's own run folder stays in its default place: the trials' checkpoints are archhpo's.
        run_config=RunConfig(name=f"archhpo-{run_id}-{os.getpid()}", failure_config=FailureConfig(max_failures=1)))
    result = trainer.fit()
    return {"ranks": ranks, "error": None if result.error is None else str(result.error)[:500]}
