"""`archhpo run`: launch, a pool of Ray workers, live progress, results written as trials finish."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from archhpo.cluster._ray_private import loopback_only, token_auth_without_advice
from archhpo.errors import ArchhpoError
from archhpo.schema import Attr
from archhpo.search._queue import PlanStatus, TrialQueue
from archhpo.search._storage import is_sqlite, mask_url, open_storage
from archhpo.workers._memory import CUDA_CONTEXT_BYTES, SAFETY

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def worker_task(
    storage_url: str, names: list[str], device: str, threads: int, run_id: str, checkpoint_dir: str | None,
    gpu_share: float = 0.0, checkpoint_every: int = 1,
) -> dict[str, Any]:
    """Body of one Ray worker: the plain worker loop over the studies (importable by Ray).

    `storage_url` never holds a password (see take_password): workers read PGPASSWORD/.pgpass.
    `gpu_share` is the task's num_gpus; every trial records it (the OOM policy reads it).
    """
    import ray

    from archhpo.workers import Worker

    queues = [TrialQueue(storage_url, n) for n in names]
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


# ----------------------------------------------------------------------------------- GPU placement
MAX_TRIALS_PER_GPU = 8  # the packing bench/gpu.py measures (1, 2, 4, 8 trials on one GPU)


def largest_trial_bytes(queues: list[TrialQueue]) -> int:
    """The training-memory estimate on a GPU of the largest trial the studies plan, at the largest
    batch size (workers._memory sizes it, as every worker's own fit check does).

    Plan entries whose architecture is not chosen yet (confirmation trials) count as any of the
    study's architectures."""
    from archhpo.models import get_family
    from archhpo.workers import TrainConfig, estimate_training_bytes, trial_shape

    need = 0
    for q in queues:
        s = q.settings
        fam = get_family(s.family)
        batches = list(s.search_space.batch_size)
        batches += [int(e["params"]["batch_size"]) for e in s.plan
                    if (e.get("params") or {}).get("batch_size")]
        idx = {e.get("arch_idx") for e in s.plan}
        rows = s.archs if None in idx else [s.archs[int(i)] for i in idx if i is not None]
        for a in rows:
            cfg = fam.config_for(a, {**s.info, **(a.get("choices") or {})})
            shape = trial_shape(fam, cfg, a, max(batches), TrainConfig.eval_batch_size)
            need = max(need, estimate_training_bytes(shape, "cuda"))
    return need


def _share(k: int) -> float:
    """1/k of a GPU as Ray keeps it (4 decimals, rounded down: k of them fit one GPU)."""
    return 1.0 if k <= 1 else (10_000 // k) / 10_000


@dataclass(frozen=True)
class Placement:
    share: float  # the smallest num_gpus of a worker task (< 1: some workers share a GPU)
    device: str  # what the workers are told (auto, cpu, cuda)
    note: str  # one line for the user
    shares: tuple[float, ...] = ()  # num_gpus of each worker, largest first (empty: all `share`)

    def worker_shares(self, workers: int) -> list[float]:
        return list(self.shares) if self.shares else [self.share] * workers


def choose_placement(
    requested: float | str | None, device: str, cluster_gpus: float, workers: int,
    need_bytes: int | None, gpu_bytes: int | None,
) -> Placement:
    """The GPU share of each worker task.

    `requested` is --gpus-per-trial (None or "auto": decide here).  Automatic placement packs as
    many trials on a GPU as the largest planned trial's estimate allows (plus a CUDA context each,
    at most MAX_TRIALS_PER_GPU), but never more than the workers need to cover every GPU: 8 workers
    on 8 GPUs get a whole GPU each, 32 on 8 GPUs four to a GPU.  Without GPUs, or with --device
    cpu, the share is 0 and the workers train on CPU (docs/design.md §10: a task without a share would
    otherwise see every GPU and crowd onto cuda:0).
    """
    gpus = int(cluster_gpus)
    if device == "cpu":
        return _cpu_placement(requested, gpus)
    if isinstance(requested, float | int):
        return _requested_placement(float(requested), device, gpus)
    if gpus < 1:
        if device.startswith("cuda"):
            raise ArchhpoError(
                "--device cuda was asked for but the Ray cluster has no GPU; use --device cpu or auto.")
        return Placement(0.0, "cpu", "")  # a CPU cluster: nothing to say
    fit, why = _trials_per_gpu(need_bytes, gpu_bytes)
    return _packed_placement(device, gpus, max(1, workers), fit,
                             f"; {why}; --gpus-per-trial overrides, --device cpu opts out")


def _unused(gpus: int) -> str:
    return f" (the cluster's {gpus} GPU(s) stay unused)" if gpus else ""


def _cpu_placement(requested: float | str | None, gpus: int) -> Placement:
    if isinstance(requested, float | int) and requested > 0:
        raise ArchhpoError(f"--device cpu trains on CPUs; drop --gpus-per-trial {requested:g} or the --device.")
    return Placement(0.0, "cpu", "--device cpu: trials train on CPU" + _unused(gpus))


def _requested_placement(share: float, device: str, gpus: int) -> Placement:
    """--gpus-per-trial F as given."""
    if share == 0:
        if device.startswith("cuda"):
            raise ArchhpoError("--device cuda needs a GPU share; drop --gpus-per-trial 0.")
        return Placement(0.0, "cpu", "--gpus-per-trial 0: trials train on CPU" + _unused(gpus))
    note = f"--gpus-per-trial {share:g}: {share:g} GPU per trial"
    if gpus < 1:
        note += " (the cluster has no GPU now: the workers wait until one joins)"
    return Placement(share, device, note)


def _trials_per_gpu(need_bytes: int | None, gpu_bytes: int | None) -> tuple[int, str]:
    """How many of the largest planned trial fit on one GPU (each with its CUDA context), and why."""
    if need_bytes is None or gpu_bytes is None:
        return 1, "GPU memory unknown: one trial per GPU"
    fit = max(1, min(int(SAFETY * gpu_bytes // (need_bytes + CUDA_CONTEXT_BYTES)), MAX_TRIALS_PER_GPU))
    return fit, (f"largest planned trial about {need_bytes / 2**30:.1f} GiB of {gpu_bytes / 2**30:.0f} GiB, "
                 f"{fit} fit on a GPU")


def _packed_placement(device: str, gpus: int, workers: int, fit: int, tail: str) -> Placement:
    """At most `fit` workers per GPU, but never fewer GPUs used than the workers could cover."""
    if workers >= gpus * fit:  # every GPU full; any further worker waits for a free share
        share = _share(fit)
        extra = f", {workers - gpus * fit} worker(s) wait for a free share" if workers > gpus * fit else ""
        return Placement(share, device, f"GPU placement: {share:g} GPU per trial, {fit} per GPU on each of "
                                        f"{gpus} GPU(s){extra}{tail}")
    q, r = divmod(workers, gpus)
    if q == 0:
        return Placement(1.0, device, f"GPU placement: 1 GPU per trial on {workers} of {gpus} GPU(s) "
                                      f"(--workers {gpus} or more uses them all){tail}")
    # Ray gives a fractional share the fullest GPU it fits on, so equal shares would leave GPUs
    # idle when the workers are not a multiple of the GPUs (5 workers at 0.5 on 4 GPUs: 2+2+1+0).
    # Instead gpus-r GPUs take q workers and r GPUs take q+1; the larger shares are placed first.
    shares = (_share(q),) * (q * (gpus - r)) + (_share(q + 1),) * ((q + 1) * r)
    per = f"{q}" if r == 0 else f"{q} or {q + 1}"
    sizes = " or ".join(f"{x:g}" for x in sorted(set(shares), reverse=True))
    return Placement(min(shares), device, f"GPU placement: {sizes} GPU per trial, {per} per GPU on each of "
                                          f"{gpus} GPU(s){tail}", shares)


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


def _probe_gpu_memory() -> int | None:
    """Memory of the smallest GPU this process can see, read without initialising CUDA here
    (nvidia-smi first): a Ray worker process that initialised CUDA with every GPU visible would
    ignore the CUDA_VISIBLE_DEVICES Ray gives a later task in the same process."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            mib = [int(float(x)) for x in out.split() if x.strip()]
            if mib:
                return min(mib) * 2**20
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    import torch

    if not torch.cuda.is_available():
        return None
    return min(int(torch.cuda.get_device_properties(i).total_memory) for i in range(torch.cuda.device_count()))


def _gpu_memory() -> int | None:
    """Memory of the smallest GPU of the cluster, or None without GPUs (or when it cannot be read).

    Probed by a task on every GPU node that asks for no GPU and no CPU, so it runs at once even on
    a busy cluster, and sees every GPU of its node (docs/design.md §10); max_calls=1: its process exits
    after it, so no later worker task inherits a process that has seen every GPU."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1]
    if not nodes:
        return None
    task = ray.remote(max_calls=1)(_probe_gpu_memory)  # max_calls cannot be given to .options()
    refs = [task.options(num_cpus=0, num_gpus=0,
                         scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
            for n in nodes]
    try:
        sizes = [m for m in ray.get(refs, timeout=300) if m]
    except Exception:  # a node that cannot run the probe: placement falls back to a GPU per trial
        return None
    return min(sizes) if sizes else None


def place_workers(queues: list[TrialQueue], opts: RunOptions) -> Placement:
    """choose_placement with the cluster's GPUs, their memory and the plans' largest trial."""
    import ray

    gpus = float(ray.cluster_resources().get("GPU", 0))
    need = mem = None
    if opts.device != "cpu" and gpus >= 1 and opts.gpus_per_trial in (None, "auto"):
        need, mem = largest_trial_bytes(queues), _gpu_memory()
    return choose_placement(opts.gpus_per_trial, opts.device, gpus, opts.workers or DEFAULT_WORKERS, need, mem)


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
    # the grace is longer and a large model's stop-time checkpoint takes longer to write.
    stop_wait_s: float = float(os.environ.get("ARCHHPO_STOP_WAIT_S", "20"))


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eta_s(statuses: dict[str, PlanStatus], workers: int, now: dt.datetime | None = None) -> float | None:
    """Seconds left: the trials not yet final at the mean trial duration, less what the running
    ones have done already (each counted up to that mean), over the workers; None before any finished."""
    total = sum(s.total for s in statuses.values())
    final = sum(s.final for s in statuses.values())
    if final >= total:
        return 0.0
    durations = [s.mean_duration_s for s in statuses.values() if s.mean_duration_s]
    if not durations:
        return None
    mean = sum(durations) / len(durations)
    now = now or dt.datetime.now()  # the database's datetime_start is the claiming host's local time
    done = sum(min(max(0.0, (now - t).total_seconds()), mean) for s in statuses.values() for t in s.running_since)
    return max(0.0, (total - final) * mean - done) / max(1, workers)


def progress_line(statuses: dict[str, PlanStatus], workers: int, elapsed: float) -> str:
    total = sum(s.total for s in statuses.values())
    final = sum(s.final for s in statuses.values())
    failed = sum(s.failed for s in statuses.values())
    running = sum(s.running for s in statuses.values())
    bests = {n: s.best_value for n, s in statuses.items() if s.best_value is not None}
    eta = eta_s(statuses, workers)
    best = "  ".join(f"{n}={v:.4f}" for n, v in bests.items()) or "-"
    held = sum(s.held for s in statuses.values())
    return (
        f"[{_fmt_eta(elapsed)}] trials {final}/{total} done, {running} running, {failed} failed"
        f"{f', {held} held at a rung' if held else ''} | "
        f"best {best} | ETA {_fmt_eta(eta)}"
    )


def check_run_options(storage_url: str, opts: RunOptions) -> None:
    """Every refusal of `archhpo run` that needs no database: called before anything is written."""
    if is_sqlite(storage_url) and opts.ray_address:
        raise ArchhpoError(
            "An SQLite file cannot be shared by workers on other machines; pass a PostgreSQL --storage "
            "(postgresql+psycopg2://user@host:5432/db) when using --ray-address."
        )
    if opts.checkpoint_every < 1:
        raise ArchhpoError(f"--checkpoint-every must be at least 1 epoch, got {opts.checkpoint_every}.")
    if opts.workers is not None and opts.workers < 1:
        raise ArchhpoError(f"--workers must be at least 1, got {opts.workers}.")
    if opts.threads is not None and opts.threads < 1:
        raise ArchhpoError(f"--threads must be at least 1, got {opts.threads}.")


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


def finished_plans(storage_url: str, names: list[str]) -> dict[str, PlanStatus] | None:
    """The studies' statuses when every plan is done (nothing for a worker to do), else None."""
    storage = open_storage(storage_url, create=False)
    statuses = {n: TrialQueue(storage_url, n, storage=storage).maintain() for n in names}
    return statuses if all(st.done for st in statuses.values()) else None


def run_workers(
    storage_url: str, names: list[str], opts: RunOptions, out: TextIO = sys.stderr
) -> dict[str, PlanStatus]:
    """Start the worker pool on Ray and supervise it until every plan is done."""
    import ray

    check_run_options(storage_url, opts)
    storage = open_storage(storage_url, create=False)
    pool = _Pool(storage_url, names, opts, out, storage)
    pool.threads = _start_ray(opts)
    try:
        pool.start()
        statuses = pool.supervise()
        pool.progress()
        return statuses
    except KeyboardInterrupt:
        pool.stop()
        raise
    finally:
        ray.shutdown()


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
    # so an explicit --threads never leaves a worker waiting for CPUs.
    token_auth_without_advice()
    need = (opts.workers or 1) * (opts.threads or 1)
    with loopback_only():  # every listener on 127.0.0.1, not just the dashboard
        ray.init(address="local", num_cpus=max(cpus, need), num_gpus=opts.local_gpus,
                 include_dashboard=False, logging_level=logging.WARNING, _node_ip_address="127.0.0.1",
                 configure_logging=True)
    workers = opts.workers or _cluster_gpus() or DEFAULT_WORKERS
    return worker_threads(workers, opts.threads, cpus, cluster=False)


def _cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


MAX_REPLACEMENTS = 3  # workers stopped by a sticky CUDA fault that are replaced in one run


class _Pool:
    """The worker tasks of one `run`, and the driver's supervision loop."""

    def __init__(self, storage_url: str, names: list[str], opts: RunOptions, out: TextIO, storage: Any) -> None:
        self.url, self.names, self.opts, self.out, self.storage = storage_url, names, opts, out, storage
        self.queues = {n: TrialQueue(storage_url, n, storage=storage) for n in names}
        self.run_id = uuid.uuid4().hex[:12]
        self.ckpt = str(opts.checkpoint_dir.resolve()) if opts.checkpoint_dir else None
        self.threads = 1
        self.refs: list[Any] = []
        self.whole_gpu_ref: Any = None  # a worker with a GPU of its own, for retries of shared-GPU OOMs
        self.replaced = 0
        self.placement = Placement(0.0, "cpu", "")

    def args(self, share: float) -> tuple[Any, ...]:
        return (self.url, self.names, self.placement.device, self.threads, self.run_id, self.ckpt, share,
                self.opts.checkpoint_every)

    def task(self, share: float) -> Any:
        return gpu_task(share, self.threads, bool(self.opts.ray_address))

    def start(self) -> None:
        if self.opts.workers is None:  # one worker per GPU of the cluster, else DEFAULT_WORKERS
            self.opts.workers = _cluster_gpus() or DEFAULT_WORKERS
        self.placement = place_workers(list(self.queues.values()), self.opts)
        if self.placement.note:
            self.out.write(self.placement.note + "\n")
        self.refs = start_by_share(self.task, self.placement.worker_shares(self.opts.workers), self.args)

    def supervise(self) -> dict[str, PlanStatus]:
        import ray

        start, last_final, exported, next_export, last_print = time.monotonic(), -1, -1, 0.0, 0.0
        tty = self.out.isatty()
        while True:
            ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=self.opts.refresh_s)
            statuses = {n: q.maintain(blocking=False) for n, q in self.queues.items()}  # also reaps
            self._whole_gpu_retry(ready, statuses)
            self._replace_unhealthy(ready, statuses)
            ready = [r for r in ready if r in self.refs]  # a replaced worker's ref is gone
            final = sum(s.final for s in statuses.values())
            if final != exported and time.monotonic() >= next_export:
                # Exporting is O(trials): at most ~10% of the driver's time goes to it in a large study.
                began = time.monotonic()
                self.progress()
                exported = final
                next_export = time.monotonic() + 9 * (time.monotonic() - began)
            now = time.monotonic()
            if tty or final != last_final or now - last_print > 10:  # piped: a line per change or every 10 s
                line = progress_line(statuses, self.opts.workers or 1, now - start)
                self.out.write(("\r" + line + "\x1b[K") if tty else line + "\n")
                self.out.flush()
                last_print = now
            last_final = final
            if len(ready) == len(self.refs):
                for ref in ready:
                    ray.get(ref)  # surface a worker that died with an error
                break
        if tty:
            self.out.write("\n")
        return {n: q.maintain() for n, q in self.queues.items()}

    def _whole_gpu_retry(self, ready: list[Any], statuses: dict[str, PlanStatus]) -> None:
        """A worker with a whole GPU (a fresh process) for retries of shared-GPU OOMs and refusals."""
        if not (0 < self.placement.share < 1 and (self.whole_gpu_ref is None or self.whole_gpu_ref in ready)
                and any(st.whole_gpu_waiting for st in statuses.values())):
            return
        self.whole_gpu_ref = self.task(1.0).remote(*self.args(1.0))
        self.refs.append(self.whole_gpu_ref)
        self.out.write("A trial ran out of memory on a shared GPU: retrying it on a GPU of its own.\n")

    def _replace_unhealthy(self, ready: list[Any], statuses: dict[str, PlanStatus]) -> None:
        """A worker stopped by a sticky CUDA fault gave its trial back and its process exited; while
        work is left, a fresh process takes its place (at most MAX_REPLACEMENTS times a run)."""
        import ray

        for ref in ready:
            try:
                result = ray.get(ref)
            except Exception:  # noqa: BLE001 - a task that died: surfaced once every task is done
                continue
            if not (isinstance(result, dict) and result.get("unhealthy")):
                continue
            self.refs.remove(ref)
            self.out.write(f"A worker stopped after a CUDA fault ({result['unhealthy'][:200]}); its trial "
                           "went back to the queue.\n")
            if self.replaced < MAX_REPLACEMENTS and not all(st.done for st in statuses.values()):
                share = float(result.get(Attr.GPU_SHARE, self.placement.share))
                self.refs.append(self.task(share).remote(*self.args(share)))
                self.replaced += 1

    def progress(self) -> None:
        if self.opts.progress is not None:
            self.opts.progress()

    def stop(self) -> None:
        """Ctrl-C: cancel the tasks (each gives its trial back) and requeue what is left."""
        import ray

        self.out.write(f"\nStopping workers: each saves its trial where it stands and gives it back (waiting up "
                       f"to {self.opts.stop_wait_s:g} s; Ctrl-C again stops waiting, never the requeue)...\n")
        for ref in self.refs:
            ray.cancel(ref)  # interrupts the task (as SIGINT): it gives its trial back and returns
        try:
            ray.wait(self.refs, num_returns=len(self.refs), timeout=self.opts.stop_wait_s)
        except KeyboardInterrupt:  # an impatient second Ctrl-C (or SIGTERM) must not skip the requeue
            self.out.write("Not waiting for the workers' saves; requeueing their trials now.\n")
        requeued = sum(q.requeue_running(lambda a: a.get("run_id") == self.run_id) for q in self.queues.values())
        self.progress()
        self.out.write(f"Stopped; {requeued} trial(s) requeued by the driver. Run the same command to resume.\n")


def describe_storage(url: str) -> str:
    return mask_url(url)
