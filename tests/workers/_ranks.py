"""Rank processes for the K-rank tests: a tiny lm trained by train() on a gloo group of spawned
processes (torch.multiprocessing), each process's result written to a JSON file by rank."""

from __future__ import annotations

import copy
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from archhpo.models import get_family
from archhpo.workers import TrainConfig, train
from archhpo.workers._distributed import Ranks, join_group

DATA, OPTS = "synthetic:tokens=6000", {"seq_len": 16}
ARCH = {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lm_run(epochs: int = 3, batch: int = 16) -> tuple[Any, Any, Any, TrainConfig]:
    """The family, a freshly seeded model, the data and the config: the same on every rank."""
    fam = get_family("lm")
    spec = fam.parse_data(DATA, OPTS)
    data = fam.load_data(spec, OPTS)
    cfg = fam.config_for(ARCH, fam.data_info(spec, OPTS))
    torch.manual_seed(0)
    model = fam.build(cfg)
    return fam, model, data, TrainConfig(learning_rate=3e-3, epochs=epochs, batch_size=batch, warmup_steps=2,
                                         seed=5)


def train_losses(ranks: Ranks | None, resume: dict[str, Any] | None = None, save_at: int | None = None,
                 epochs: int = 3) -> tuple[list[dict[str, float]], dict[str, Any] | None]:
    """train() on this process's share; the history and, at epoch `save_at`, the saved state."""
    fam, model, data, tcfg = lm_run(epochs)
    saved: dict[str, Any] = {}

    def checkpoint(state: dict[str, Any]) -> None:
        if state["epoch"] == save_at:  # a copy: the state holds the live tensors and history
            saved.update(copy.deepcopy(state))

    result = train(model, data, fam.loss, tcfg, resume=resume, checkpoint=checkpoint, ranks=ranks)
    return result.history, (saved or None)


def _init_env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def _entry(rank: int, world: int, port: int, out: str, job: Callable[..., Any], args: tuple[Any, ...]) -> None:
    _init_env(rank, world, port)
    result = job(rank, *args)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def spawn(job: Callable[..., Any], world: int, out: Path, *args: Any, timeout_s: float = 120) -> list[Any]:
    """Run `job(rank, *args)` on `world` spawned processes of one group; their JSON results by rank."""
    ctx = mp.start_processes(_entry, args=(world, free_port(), str(out), job, args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"the {world} ranks did not finish within {timeout_s} s")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


# ---------------------------------------------------------------------------------- rank jobs
def ddp_history(rank: int, mode: str, epochs: int) -> list[dict[str, float]]:
    group = join_group("cpu", timeout_s=30)
    assert group is not None
    history, _ = train_losses(Ranks(group, mode), epochs=epochs)
    return history


def stalled_collective(rank: int, timeout_s: float) -> dict[str, Any]:
    """Rank 1 joins and then never takes part; rank 0's agreement must fail within the timeout."""
    group = join_group("cpu", timeout_s=timeout_s)
    assert group is not None
    if rank == 1:
        time.sleep(4 * timeout_s)
        return {"rank": 1}
    start = time.monotonic()
    try:
        group.agree(0)
    except Exception as exc:  # noqa: BLE001 - the failure's type is what the test checks
        from archhpo.workers._distributed import is_group_failure

        return {"elapsed": time.monotonic() - start, "group_failure": is_group_failure(exc),
                "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"elapsed": time.monotonic() - start, "group_failure": False, "error": ""}


def two_rank_run(rank: int, mode: str, epochs: int, ckpt: str) -> list[dict[str, float]]:
    """A 2-rank run's history; rank 0 writes its epoch-1 state as the worker does (checksummed)."""
    from archhpo.workers._checkpoints import _atomic_save

    group = join_group("cpu", timeout_s=60)
    assert group is not None
    history, saved = train_losses(Ranks(group, mode), save_at=1, epochs=epochs)
    if group.lead:
        assert saved is not None
        _atomic_save(saved, Path(ckpt))
    return history


def worker_leaves_its_group(rank: int) -> dict[str, Any]:
    """A worker of a 2-rank group with nothing to run: rank 0 says done, and each rank's run()
    destroys the groups it made before returning (a finished rank then exits cleanly)."""
    import torch.distributed as dist

    from archhpo.workers import Worker

    worker = Worker([], device="cpu", threads=1)
    joined = worker.group is not None and worker.group.owned and dist.is_initialized()
    worker.run()
    return {"rank": rank, "joined": joined, "initialised_after_run": dist.is_initialized(),
            "group_after_run": worker.group is not None}
