"""`archhpo run`: launch, a pool of Ray workers, live progress, results written as trials finish."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from archhpo.errors import ArchhpoError
from archhpo.search._export import export_studies
from archhpo.search._queue import PlanStatus, TrialQueue
from archhpo.search._storage import is_sqlite, mask_url, open_storage

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def worker_task(
    storage_url: str, names: list[str], device: str, threads: int, run_id: str, checkpoint_dir: str | None
) -> dict[str, Any]:
    """Body of one Ray worker: the plain worker loop over the studies (importable by Ray).

    `storage_url` never holds a password (see take_password): workers read PGPASSWORD/.pgpass.
    """
    import ray

    from archhpo.workers import Worker

    queues = [TrialQueue(storage_url, n) for n in names]
    ctx = ray.get_runtime_context()
    attrs = {"run_id": run_id, "ray_node_id": ctx.get_node_id(), "ray_worker": ctx.get_worker_id()[:12]}
    worker = Worker(queues, device=device, threads=threads, extra_attrs=attrs, checkpoint_dir=checkpoint_dir)
    return worker.run().__dict__


def auto_gpu_fraction(queues: list[TrialQueue], gpu_bytes: int) -> float:
    """The GPU share the largest planned trial needs, in steps of 1/20 (at least 0.05)."""
    from archhpo.models import get_family
    from archhpo.workers import estimate_training_bytes

    need = 0
    for q in queues:
        fam = get_family(q.settings.family)
        batch = max(q.settings.search_space.batch_size)
        for entry in q.settings.plan:
            a = q.settings.archs[entry["arch_idx"]]
            cfg = fam.config_for(a, q.settings.info)
            tokens = fam.tokens(cfg) if fam.tokens else 64
            need = max(need, estimate_training_bytes(a["param_count"], batch, tokens, a["d_model"], a["n_layers"],
                                                     a["n_heads"], a["d_ff"]))
    share = need / (0.85 * gpu_bytes)
    return float(min(1.0, max(0.05, -(-share * 20 // 1) / 20)))


def _gpu_memory() -> int | None:
    """Total memory of one GPU of the cluster (probed on a GPU node), or None without GPUs."""
    import ray

    if ray.cluster_resources().get("GPU", 0) < 1:
        return None

    def probe() -> int:
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)

    return int(ray.get(ray.remote(probe).options(num_gpus=1, num_cpus=0).remote()))


_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Keep a local Ray instance on 127.0.0.1 while it starts.

    On Linux ray.init(_node_ip_address="127.0.0.1") swaps loopback for the machine's routable
    address, and GCS, raylet, workers, dashboard and agents then listen on every interface.
    Ray's "no cluster" mode (the env switch below, read by Ray's processes as they start, and
    the constant it sets in this one) keeps the node address, and so every listener, on
    loopback.  Restored afterwards so a later ray.init(address=...) can join a real cluster.
    """
    from ray._private import ray_constants

    old_env, old_flag = os.environ.get(_LOCAL_ONLY_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_flag
        if old_env is None:
            os.environ.pop(_LOCAL_ONLY_ENV, None)
        else:
            os.environ[_LOCAL_ONLY_ENV] = old_env


@dataclass
class RunOptions:
    workers: int = 2
    ray_address: str | None = None
    device: str = "auto"
    gpus_per_trial: float | str = 0.0  # a fraction, or "auto" (from the memory estimate)
    out_dir: Path = Path("results")
    checkpoint_dir: Path | None = None
    refresh_s: float = 1.0


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_line(statuses: dict[str, PlanStatus], workers: int, elapsed: float) -> str:
    total = sum(s.total for s in statuses.values())
    final = sum(s.final for s in statuses.values())
    failed = sum(s.failed for s in statuses.values())
    running = sum(s.running for s in statuses.values())
    bests = {n: s.best_value for n, s in statuses.items() if s.best_value is not None}
    durations = [s.mean_duration_s for s in statuses.values() if s.mean_duration_s]
    eta = None
    if durations and final < total:
        eta = (total - final) * (sum(durations) / len(durations)) / max(1, workers)
    elif final >= total:
        eta = 0.0
    best = "  ".join(f"{n}={v:.4f}" for n, v in bests.items()) or "-"
    return (
        f"[{_fmt_eta(elapsed)}] trials {final}/{total} done, {running} running, {failed} failed | "
        f"best {best} | ETA {_fmt_eta(eta)}"
    )


def run_workers(
    storage_url: str, names: list[str], opts: RunOptions, out: TextIO = sys.stderr
) -> dict[str, PlanStatus]:
    """Start the worker pool on Ray and supervise it until every plan is done."""
    import ray

    if is_sqlite(storage_url) and opts.ray_address:
        raise ArchhpoError(
            "An SQLite file cannot be shared by workers on other machines; pass a PostgreSQL --storage "
            "(postgresql+psycopg2://user@host:5432/db) when using --ray-address."
        )
    if opts.workers < 1:
        raise ArchhpoError(f"--workers must be at least 1, got {opts.workers}.")
    storage = open_storage(storage_url)
    queues = {n: TrialQueue(storage_url, n, storage=storage) for n in names}
    run_id = uuid.uuid4().hex[:12]
    cpus = os.cpu_count() or 1
    if opts.ray_address:
        ray.init(address=opts.ray_address, logging_level="WARNING",
                 runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0"}})
        threads = 1
    else:
        # A private local instance: random ports, bound to loopback, no dashboard.
        # address="local": never attach to some other Ray already running on this machine.
        with _loopback_only():  # every listener on 127.0.0.1, not just the dashboard
            ray.init(address="local", num_cpus=max(cpus, opts.workers), include_dashboard=False,
                     logging_level="WARNING", _node_ip_address="127.0.0.1", configure_logging=True)
        threads = max(1, cpus // opts.workers)
    gpus = opts.gpus_per_trial
    if gpus == "auto":
        mem = _gpu_memory()
        gpus = auto_gpu_fraction(list(queues.values()), mem) if mem else 0.0
        out.write(f"--gpus-per-trial auto: {gpus:g} GPU per worker\n")
    task = ray.remote(worker_task).options(
        num_cpus=threads if not opts.ray_address else 1, num_gpus=float(gpus), max_retries=3,
    )
    ckpt = str(opts.checkpoint_dir.resolve()) if opts.checkpoint_dir else None
    refs = [task.remote(storage_url, names, opts.device, threads, run_id, ckpt) for _ in range(opts.workers)]
    start = time.monotonic()
    last_final = -1
    last_print = 0.0
    tty = out.isatty()
    statuses: dict[str, PlanStatus] = {}
    try:
        while True:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=opts.refresh_s)
            statuses = {n: q.maintain(blocking=False) for n, q in queues.items()}  # also reaps stale trials
            final = sum(s.final for s in statuses.values())
            changed = final != last_final
            if final != last_final:
                export_studies(storage, names, opts.out_dir)
                last_final = final
            now = time.monotonic()
            if tty or changed or now - last_print > 10:  # piped: a line per change or every 10 s
                line = progress_line(statuses, opts.workers, now - start)
                out.write(("\r" + line + "\x1b[K") if tty else line + "\n")
                out.flush()
                last_print = now
            if len(ready) == len(refs):
                for ref in ready:
                    ray.get(ref)  # surface a worker that died with an error
                break
        if tty:
            out.write("\n")
        statuses = {n: q.maintain() for n, q in queues.items()}
        export_studies(storage, names, opts.out_dir)
        return statuses
    except KeyboardInterrupt:
        out.write("\nStopping workers; their running trials go back to the queue...\n")
        for ref in refs:
            ray.cancel(ref)  # raises KeyboardInterrupt in the task: it requeues its trial
        ray.wait(refs, num_returns=len(refs), timeout=15)
        requeued = sum(
            q.requeue_running(lambda a: a.get("run_id") == run_id) for q in queues.values()
        )  # safety net for a task that could not clean up
        export_studies(storage, names, opts.out_dir)
        out.write(f"Stopped; {requeued} trial(s) requeued by the driver. Run the same command to resume.\n")
        raise
    finally:
        ray.shutdown()


def describe_storage(url: str) -> str:
    return mask_url(url)
