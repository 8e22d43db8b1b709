"""A worker's checkpoint files (docs/design.md §6).

Checkpoints belong to one attempt (``<checkpoint_dir>/<study>/slotNNNNN.attemptK.pt``); a retry
resumes from an earlier attempt's file (read only), and files are deleted only once the finish is
committed, or when the study's plan is done.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from archhpo._io import atomic_write
from archhpo.workers._claim import QueueLike

log = logging.getLogger("archhpo.worker")


def _atomic_save(obj: dict[str, Any], path: Path) -> None:
    for last in (False, True):
        try:
            atomic_write(path, lambda fh: torch.save(obj, fh))
            return
        except FileNotFoundError:  # another worker just removed the folder it found empty: once more
            if last:
                raise


def _remove_empty(*folders: Path) -> None:
    """Remove folders left empty (innermost first); one another worker is writing into stays."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty, or already gone
            return


class Checkpoints:
    """The checkpoint files under one folder (`root`; None: the worker keeps no checkpoints)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def path(self, queue: QueueLike, claim: Any, attempt: int | None = None) -> Path | None:
        """This attempt's own checkpoint file (slot AND attempt in the name)."""
        if self.root is None:
            return None
        attempt = claim.attempt if attempt is None else attempt
        return self.root / queue.name / f"slot{claim.slot:05d}.attempt{attempt}.pt"

    def load_resume(self, queue: QueueLike, claim: Any) -> dict[str, Any] | None:
        """Our own attempt's state (a requeued trial claimed again), else the newest earlier
        attempt's (a retry of a dead attempt), read only."""
        if self.root is None:
            return None
        for attempt in range(int(claim.attempt), 0, -1):
            path = self.path(queue, claim, attempt)
            if path is None or not path.exists():
                continue
            try:
                # To the CPU: train() copies it into the model and optimizer, and nothing of it is
                # left in the GPU allocator once the trial ends.
                state = torch.load(path, map_location="cpu", weights_only=False)
            except Exception as exc:  # a torn or foreign file: try an older one, else start over
                log.warning("ignoring unreadable checkpoint %s: %s", path, exc)
                continue
            if state.get("params") == claim.params:
                return state
        return None

    def remove(self, queue: QueueLike, claim: Any) -> None:
        """After the finish is committed: this attempt's file and the earlier attempts' files."""
        for attempt in range(int(claim.attempt), 0, -1):
            path = self.path(queue, claim, attempt)
            if path is not None:
                path.unlink(missing_ok=True)
        if self.root is not None:  # the demo leaves no empty checkpoints/ folders behind
            _remove_empty(self.root / queue.name, self.root)

    def remove_study(self, queue: QueueLike) -> None:
        """A study whose plan is done resumes nothing: drop what is left of its checkpoints (the
        states of trials successive halving held at a rung and then pruned)."""
        if self.root is None:
            return
        for path in (self.root / queue.name).glob("slot*.attempt*.pt"):
            path.unlink(missing_ok=True)
        _remove_empty(self.root / queue.name, self.root)
