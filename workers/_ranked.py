"""The worker loop's side of a trial across K ranks (workers/_loop.py, workers/_distributed.py):
which studies a group works, one rank's memory and sharding, the checkpoint every rank resumes
from, and the stop every rank agrees on before each step. `group` None: a worker alone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from archhpo.schema import Attr
from archhpo.workers._checkpoints import Checkpoints, read_checkpoint
from archhpo.workers._claim import QueueLike, _TrialRun
from archhpo.workers._distributed import Group, choose_shard, rank_shape
from archhpo.workers._memory import SAFETY, available_bytes, estimate_training_bytes

log = logging.getLogger("archhpo.worker")


def fits_group(group: Group | None, queue: QueueLike) -> bool:
    """A study set to run its trials on R > 1 ranks is left to workers of R ranks; any worker,
    alone or a group, trains a study at one rank per trial (each trial records its ranks)."""
    want = int(getattr(queue.settings.options, "ranks_per_trial", 1) or 1)  # the study's setting
    have = 1 if group is None else group.world
    if want > 1 and want != have:
        log.warning("study %s runs its trials on %d rank(s) and this worker has %d; leaving it to a "
                    "worker launched with torchrun --nproc-per-node %d", queue.name, want, have, want)
        return False
    return True


def rank_share(group: Group | None, attrs: dict[str, Any], asked: str, shape: Any, device: torch.device) -> Any:
    """One rank's share of the trial's memory (`shape`: workers/_memory.TrialShape), its sharding
    chosen and recorded in `attrs` (auto: DDP while one rank holds the state, else FSDP2)."""
    if group is None:
        return shape
    ddp_bytes = estimate_training_bytes(rank_shape(shape, group.world, "ddp"), device.type)
    mode = choose_shard(asked, ddp_bytes, shape.param_count, group.world, available_bytes(device), SAFETY)
    attrs.update({Attr.RANKS: group.world, Attr.SHARD: mode})
    return rank_shape(shape, group.world, mode)


def group_resume(group: Group | None, checkpoints: Checkpoints, queue: QueueLike, claim: Any
                 ) -> dict[str, Any] | None:
    """The checkpoint to go on from: rank 0 finds it (and sets refused files aside), then every
    rank reads the file rank 0 chose (a shared checkpoint folder)."""
    if group is None:
        return checkpoints.load_resume(queue, claim)
    found = checkpoints.find_resume(queue, claim) if group.lead else None
    path = group.broadcast(None if found is None else str(found[0]))
    if group.lead or path is None:
        return None if found is None else found[1]
    return read_checkpoint(Path(path))


def group_stop(group: Group | None, run: _TrialRun, stop_event: threading.Event) -> Callable[[], bool]:
    """Asked before every step: alone, this worker's flags; in a group, the group's agreement
    (2: a rank was asked to stop: all stop and rank 0 gives the trial back; 1: rank 0 was fenced out)."""
    if group is None:
        return lambda: run.should_stop(stop_event)

    def agreed() -> bool:
        code = group.agree(2 if stop_event.is_set() else 1 if run.beat.lost.is_set() else 0)
        if code == 2:
            stop_event.set()
        elif code == 1:
            run.beat.lost.set()
        return code > 0

    return agreed
