"""GPU placement of the worker tasks: the share of a GPU each gets, from the cluster's GPUs, their
memory and the plans' largest trial."""

from __future__ import annotations

from dataclasses import dataclass

from archhpo.cluster._options import DEFAULT_WORKERS, RunOptions
from archhpo.errors import ArchhpoError
from archhpo.search._queue import TrialQueue
from archhpo.workers._memory import CUDA_CONTEXT_BYTES, SAFETY

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
        batches += [int(e.params["batch_size"]) for e in s.plan if e.params and e.params.get("batch_size")]
        idx = {e.arch_idx for e in s.plan}
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



def gpu_memories() -> list[int]:
    """Memory of each GPU this process can see, read without initialising CUDA here (nvidia-smi
    first): a Ray worker process that initialised CUDA with every GPU visible would ignore the
    CUDA_VISIBLE_DEVICES Ray gives a later task in the same process."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            mib = [int(float(x)) for x in out.split() if x.strip()]
            if mib:
                return [m * 2**20 for m in mib]
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    import torch

    if not torch.cuda.is_available():
        return []
    return [int(torch.cuda.get_device_properties(i).total_memory) for i in range(torch.cuda.device_count())]


def _probe_gpu_memory() -> int | None:
    """Memory of the smallest GPU this process can see (None without one)."""
    return min(gpu_memories(), default=None)


def _probe_largest_gpu_memory() -> int | None:
    return max(gpu_memories(), default=None)


def _gpu_memory(largest: bool = False) -> int | None:
    """Memory of the smallest GPU of the cluster (the largest with `largest`), or None without GPUs
    (or when it cannot be read).

    Probed by a task on every GPU node that asks for no GPU and no CPU, so it runs at once even on
    a busy cluster, and sees every GPU of its node (docs/design.md §10); max_calls=1: its process exits
    after it, so no later worker task inherits a process that has seen every GPU."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1]
    if not nodes:
        return None
    probe = _probe_largest_gpu_memory if largest else _probe_gpu_memory
    task = ray.remote(max_calls=1)(probe)  # max_calls cannot be given to .options()
    refs = [task.options(num_cpus=0, num_gpus=0,
                         scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
            for n in nodes]
    try:
        sizes = [m for m in ray.get(refs, timeout=300) if m]
    except Exception:  # a node that cannot run the probe: placement falls back to a GPU per trial
        return None
    return (max(sizes) if largest else min(sizes)) if sizes else None


def place_workers(queues: list[TrialQueue], opts: RunOptions) -> Placement:
    """choose_placement with the cluster's GPUs, their memory and the plans' largest trial."""
    import ray

    gpus = float(ray.cluster_resources().get("GPU", 0))
    need = mem = None
    if opts.device != "cpu" and gpus >= 1 and opts.gpus_per_trial in (None, "auto"):
        need, mem = largest_trial_bytes(queues), _gpu_memory()
    return choose_placement(opts.gpus_per_trial, opts.device, gpus, opts.workers or DEFAULT_WORKERS, need, mem)


def _cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def study_ranks(queues: list[TrialQueue]) -> int:
    """The ranks per trial the studies ask for (`ranks_per_trial`, 1 where unset); one run trains
    all its studies at one K."""
    ranks = {int(getattr(q.settings.options, "ranks_per_trial", 1) or 1) for q in queues}
    if len(ranks) > 1:
        raise ArchhpoError(f"These studies ask for {sorted(ranks)} ranks per trial; run each number of ranks "
                           "with its own `archhpo run`, or give them one --ranks-per-trial.")
    return ranks.pop() if ranks else 1


def gang_count(ranks: int, device: str, cluster_gpus: float, workers: int | None) -> int:
    """How many trials of `ranks` ranks `run` trains at once, each gang-placed by Ray Train: on GPUs
    one GPU per rank, so the cluster's whole GPUs // ranks (at most --workers when given); on CPU
    --workers // ranks, at least one. A cluster too small for one gang is refused."""
    gpus = int(cluster_gpus)
    if device != "cpu" and gpus >= 1:
        if gpus < ranks:
            raise ArchhpoError(f"A trial on {ranks} ranks needs {ranks} GPUs, but the Ray cluster has {gpus}; "
                               f"add GPUs or lower --ranks-per-trial to {gpus}.")
        gangs = gpus // ranks
        return min(gangs, workers) if workers else gangs
    return max(1, (workers or DEFAULT_WORKERS) // ranks)
