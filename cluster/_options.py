"""The options of `archhpo run` and the refusals that need no database."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from archhpo.environment import Environment
from archhpo.errors import ArchhpoError
from archhpo.search._storage import is_sqlite

DEFAULT_WORKERS = 2  # workers on a cluster without GPUs (with GPUs: one per GPU)


@dataclass
class RunOptions:
    workers: int | None = None  # None: one per GPU of the cluster, else DEFAULT_WORKERS
    ray_address: str | None = None
    device: str = "auto"
    gpus_per_trial: float | str | None = None  # a share; None or "auto": from the memory estimate
    # Called as trials become final (at most ~10% of the driver's time), when a stop has requeued
    # what was left, and at the end: the command line writes the results there (the cluster itself
    # writes no file, so it imports nothing from the report).
    progress: Callable[[], None] | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 1  # validated epochs between two checkpoints of a trial
    refresh_s: float = 1.0
    local_gpus: int | None = None  # GPUs of a local Ray instance (default: detected; tests: logical)
    threads: int | None = None  # torch threads per worker (default: see worker_threads)
    # On Ctrl-C or SIGTERM, how long the driver waits for its workers to save their trials where
    # they stand before it requeues what is left (the wait ends as soon as all have returned).
    # 20 s keeps the requeue inside the 30 s a scheduler (Slurm, Kubernetes) usually gives before
    # SIGKILL: a trial left RUNNING would be reaped as lost and spend an attempt. Raise it where
    # the grace is longer and a large model's stop-time checkpoint takes longer to write
    # (`archhpo run` passes $ARCHHPO_STOP_WAIT_S from its Environment).
    stop_wait_s: float = Environment().stop_wait_s
    # The driver's heartbeat, grace and database patience (its storage and queues): the command
    # line's Environment, read once; the worker tasks read their own in their processes.
    timing: Environment = field(default_factory=Environment)


def check_run_options(storage_url: str, opts: RunOptions) -> None:
    """Every refusal of `archhpo run` that needs no database: called before anything is written."""
    if is_sqlite(storage_url) and opts.ray_address:
        raise ArchhpoError(
            "An SQLite file cannot be shared by workers on other machines; pass a PostgreSQL --storage "
            "(postgresql://user@host:5432/db) when using --ray-address."
        )
    if opts.checkpoint_every < 1:
        raise ArchhpoError(f"--checkpoint-every must be at least 1 epoch, got {opts.checkpoint_every}.")
    if opts.workers is not None and opts.workers < 1:
        raise ArchhpoError(f"--workers must be at least 1, got {opts.workers}.")
    if opts.threads is not None and opts.threads < 1:
        raise ArchhpoError(f"--threads must be at least 1, got {opts.threads}.")
