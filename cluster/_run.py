"""`archhpo run`: launch, a pool of Ray workers, live progress, results written as trials finish."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

from archhpo.cluster._options import DEFAULT_WORKERS, RunOptions, check_run_options
from archhpo.cluster._placement import (
    MAX_TRIALS_PER_GPU,
    Placement,
    _cluster_gpus,
    _gpu_memory,
    _probe_gpu_memory,
    _trials_per_gpu,
    choose_placement,
    gang_count,
    largest_trial_bytes,
    place_workers,
    study_ranks,
)
from archhpo.cluster._pool import MAX_REPLACEMENTS, _Pool
from archhpo.cluster._progress import _fmt_eta, eta_s, plain_ray_logs, progress_line
from archhpo.cluster._ray_private import loopback_only, token_auth_without_advice
from archhpo.cluster._tasks import gang_task, gpu_task, start_by_share, task_options, worker_task
from archhpo.environment import Environment
from archhpo.errors import OutputError
from archhpo.search._queue import PlanStatus, TrialQueue
from archhpo.search._storage import mask_url, open_storage
from archhpo.workers._memory import CUDA_CONTEXT_BYTES

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# Moved to _options, _placement, _tasks, _progress and _pool; importable from here as before.
__all__ = [
    "CUDA_CONTEXT_BYTES", "DEFAULT_WORKERS", "MAX_REPLACEMENTS", "MAX_TRIALS_PER_GPU", "Placement", "RunOptions",
    "_Pool", "_cluster_gpus", "_fmt_eta", "_gpu_memory", "_probe_gpu_memory", "_trials_per_gpu",
    "check_run_options", "choose_placement", "describe_storage", "eta_s", "finished_plans", "gpu_task",
    "largest_trial_bytes", "place_workers", "progress_line", "run_workers", "start_by_share", "task_options",
    "usable_cores", "worker_task", "worker_threads",
]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's cpuset), not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def worker_threads(workers: int, threads: int | None, cores: int, cluster: bool) -> int:
    """Torch threads per worker: --threads if given; on a cluster 1 (each task holds one Ray CPU);
    locally the cores split evenly, cores // workers (at least 1), so N workers never oversubscribe."""
    if threads is not None:
        return threads
    return 1 if cluster else max(1, cores // workers)


def finished_plans(
    storage_url: str, names: list[str], timing: Environment | None = None
) -> dict[str, PlanStatus] | None:
    """The studies' statuses when every plan is done (nothing for a worker to do), else None."""
    storage = open_storage(storage_url, create=False, timing=timing)
    statuses = {n: TrialQueue(storage_url, n, storage=storage, timing=timing).maintain() for n in names}
    return statuses if all(st.done for st in statuses.values()) else None


def run_workers(
    storage_url: str, names: list[str], opts: RunOptions, out: TextIO = sys.stderr
) -> dict[str, PlanStatus]:
    """Start the worker pool on Ray and supervise it until every plan is done."""
    import ray

    check_run_options(storage_url, opts)
    storage = open_storage(storage_url, create=False, timing=opts.timing)
    pool = _Pool(storage_url, names, opts, out, storage)
    if study_ranks(list(pool.queues.values())) > 1:
        pool = _Gangs(storage_url, names, opts, out, storage)
    plain_ray_logs(sys.stdout, sys.stderr)  # Ray's copies of the workers' lines: no colour codes off a terminal
    pool.threads = _start_ray(opts)
    try:
        pool.start()
        statuses = pool.supervise()
        pool.progress()
        return statuses
    except (KeyboardInterrupt, OutputError):  # Ctrl-C, or the results cannot be written: stop cleanly
        pool.stop()
        raise
    finally:
        ray.shutdown()


class _Gangs(_Pool):
    """The pool of a run whose trials span K ranks: Ray Train gangs of K workers instead of one Ray
    task per worker, as many as the cluster holds at once (gang_count); the driver supervises them
    as it does worker tasks."""

    def start(self) -> None:
        import ray

        ranks = study_ranks(list(self.queues.values()))
        gangs = gang_count(ranks, self.opts.device, float(ray.cluster_resources().get("GPU", 0)), self.opts.workers)
        device = "cpu" if self.opts.device == "cpu" or not _cluster_gpus() else "cuda"
        self.out.write(f"Ray Train: {gangs} trial(s) at a time, each across {ranks} ranks ({device})\n")
        task = ray.remote(num_cpus=0)(gang_task)
        self.refs = [task.remote(self.url, self.names, device, self.threads, self.run_id, self.ckpt, ranks,
                                 self.opts.checkpoint_every) for _ in range(gangs)]


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """ray.init replaces the caller's SIGTERM handler (with sys.exit, and in the driver's core worker
    with a C++ failure handler that aborts): `run` stopped by a scheduler's SIGTERM then died with
    its trials still RUNNING instead of giving them back as on Ctrl-C. Put the caller's back."""
    on_main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if on_main else None
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _start_ray(opts: RunOptions) -> int:
    """Join the cluster at --ray-address, else start a private local one; the threads per worker."""
    with _keep_sigterm_handler():
        return _init_ray(opts)


def _init_ray(opts: RunOptions) -> int:
    import ray

    cpus = usable_cores()
    if opts.ray_address:
        ray.init(address=opts.ray_address, logging_level=logging.WARNING,
                 runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0"}})
        return worker_threads(opts.workers or 1, opts.threads, cpus, cluster=True)
    # A private local instance: random ports, bound to loopback, no dashboard; address="local":
    # never attach to some other Ray already running on this machine. Sized for workers x threads,
    # so an explicit --threads never leaves a worker waiting for CPUs. Ray starts its workers 15 nice
    # levels below their driver, so `nice -n 10 archhpo run` beside other niced work would starve the
    # training itself (nice 19): worker_niceness 0 gives the workers the priority the run was given.
    token_auth_without_advice()
    need = (opts.workers or 1) * (opts.threads or 1)
    with loopback_only():  # every listener on 127.0.0.1, not just the dashboard
        ray.init(address="local", num_cpus=max(cpus, need), num_gpus=opts.local_gpus,
                 include_dashboard=False, logging_level=logging.WARNING, _node_ip_address="127.0.0.1",
                 configure_logging=True, _system_config={"worker_niceness": 0})
    workers = opts.workers or _cluster_gpus() or DEFAULT_WORKERS
    return worker_threads(workers, opts.threads, cpus, cluster=False)


def describe_storage(url: str) -> str:
    return mask_url(url)
