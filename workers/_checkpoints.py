"""A worker's checkpoint files (docs/design.md §6, docs/cluster.md).

Checkpoints belong to one attempt (``<checkpoint_dir>/<study>/slotNNNNN.attemptK.pt``); a retry
resumes from an earlier attempt's file (read only), and files are deleted only once the finish is
committed, or when the study's plan is done.

A file is a fixed header (`MAGIC`, then the sha256 of the rest) and then what ``torch.save``
wrote. The checksum is verified before anything is read, and the state is read with
``weights_only=True``, which builds tensors and plain values only: a file someone crafted cannot
run code, and one with a flipped bit is not resumed. A refused file is set aside as
``<file>.bad`` (for inspection, never deleted) and the next older attempt's file is tried.
The checksum sits in the header rather than beside the file, so one rename replaces both: a
reader never sees new data with an old checksum.
"""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import re
from pathlib import Path
from typing import Any, BinaryIO

import torch

from archhpo._io import atomic_write
from archhpo.errors import DiskFull
from archhpo.workers._claim import QueueLike

log = logging.getLogger("archhpo.worker")

MAGIC = b"archhpo-ckpt-v1\n"  # 16 bytes; a file without it was written before checksums, or not by us
_DIGEST = hashlib.sha256().digest_size
HEADER = len(MAGIC) + _DIGEST


class CheckpointRefused(Exception):
    """A checkpoint file that must not be resumed; the message says why (one clause)."""


class _Hashing:
    """A write-only file that hashes what passes through: torch.save writes its zip sequentially."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.sha = fh, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _write(obj: dict[str, Any], fh: BinaryIO) -> None:
    """The header with a placeholder digest, the state, then the digest in its place."""
    fh.write(MAGIC + bytes(_DIGEST))
    hashing = _Hashing(fh)
    torch.save(obj, hashing)  # type: ignore[arg-type]  # anything with write() will do
    fh.seek(len(MAGIC))
    fh.write(hashing.sha.digest())
    fh.seek(0, io.SEEK_END)


def _atomic_save(obj: dict[str, Any], path: Path) -> None:
    """Write `obj` to `path` whole or not at all; a write that fails for lack of space raises
    DiskFull (the worker gives the trial back and stops) rather than torch's opaque error."""
    for last in (False, True):
        try:
            atomic_write(path, lambda fh: _write(obj, fh))
            return
        except FileNotFoundError:  # another worker just removed the folder it found empty: once more
            if last:
                raise
        except (OSError, RuntimeError) as exc:
            full = DiskFull.of(exc, path, HEADER + _state_bytes(obj))
            if full is None:
                raise
            raise full from exc


def _state_bytes(obj: Any) -> int:
    """The bytes of the tensors in a state (what torch.save writes, less its small zip records)."""
    if isinstance(obj, torch.Tensor):
        return obj.nelement() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_state_bytes(v) for v in obj)
    return 0


def _unsafe_reason(exc: pickle.UnpicklingError) -> str:
    """The line of torch's weights_only refusal that names what the file tried to build."""
    found = re.search(r"^.*(?:GLOBAL|[Uu]nsupported).*$", str(exc), re.MULTILINE)
    what = found.group(0).strip().rstrip(".") if found else str(exc).splitlines()[0]
    return f"it holds more than tensors and plain values, which could run code ({what})"


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The state in `path`, verified and read with weights_only=True (to the CPU: train() copies it
    into the model and optimizer, and nothing of it is left in the GPU allocator once the trial
    ends). Raises CheckpointRefused for a file without our header, with a checksum that does
    not match, that would build anything but tensors and plain values, or that is not a state."""
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise CheckpointRefused("it carries no checksum (written by an older archhpo, or not by archhpo)")
    if len(data) < HEADER or hashlib.sha256(memoryview(data)[HEADER:]).digest() != data[len(MAGIC):HEADER]:
        raise CheckpointRefused("its sha256 does not match its contents (corrupted or truncated)")
    payload = io.BytesIO(data[HEADER:])
    del data  # one copy in memory at a time, besides the tensors
    try:
        state = torch.load(payload, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointRefused(_unsafe_reason(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - a checksummed file torch cannot read is refused all the same
        raise CheckpointRefused(f"torch cannot read it ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict):
        raise CheckpointRefused(f"it holds a {type(state).__name__}, not a checkpoint's state")
    return state


def _set_aside(path: Path, reason: str) -> None:
    """Rename a refused file to ``<file>.bad`` (kept for inspection) and say so in one sentence."""
    bad = path.with_name(path.name + ".bad")
    try:
        path.replace(bad)
    except OSError as exc:  # a read-only folder: it stays, and is refused again next time
        log.warning("checkpoint %s refused and left in place (%s): %s; trying an older checkpoint, else "
                    "training from scratch", path, exc.strerror or exc, reason)
        return
    log.warning("checkpoint %s set aside as %s: %s; trying an older checkpoint, else training from scratch",
                path, bad.name, reason)


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
        attempt's (a retry of a dead attempt), read only; a refused file is set aside and the next
        older one tried; None: the trial trains from scratch."""
        found = self.find_resume(queue, claim)
        return None if found is None else found[1]

    def find_resume(self, queue: QueueLike, claim: Any) -> tuple[Path, dict[str, Any]] | None:
        """load_resume's file and state (a group's rank 0 tells the other ranks which file to read)."""
        if self.root is None:
            return None
        for attempt in range(int(claim.attempt), 0, -1):
            path = self.path(queue, claim, attempt)
            if path is None or not path.exists():
                continue
            try:
                state = read_checkpoint(path)
            except CheckpointRefused as refused:
                _set_aside(path, str(refused))
                continue
            except OSError as exc:  # gone or unreadable right now (removed by a finish): not set aside
                log.warning("ignoring unreadable checkpoint %s: %s", path, exc)
                continue
            if state.get("params") == claim.params:
                return path, state
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
