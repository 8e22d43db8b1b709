"""The one training-memory estimate and the one GPU-fault classifier.

The estimate sizes a trial before anything is built, so a trial that cannot fit is refused with
a reason instead of taking the machine down (a 2B model on a 24 GiB CPU host, say); cluster
placement sizes GPU shares with the same function and the same SAFETY factor.

What it counts, and the measured peaks it is checked against (`tests/workers/test_gpu_faults.py`
for the `signal` family, `tests/workers/test_memory_plan.py` for the lm rows), are in docs/gpu.md
("The memory plan"). In short: CPU training keeps attention maps for backward only on the tensor
path that stands in for the fused kernels (`archhpo.models._cpu_kernels`), SDPA on CUDA keeps
none; bf16 autocast keeps the residual stream's LayerNorm inputs in fp32, the rest in bf16, and a
bf16 copy of every weight; a WSD trial's cooldown branch trains copies of model and optimizer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from archhpo.errors import MemoryRefused

SAFETY = 0.85  # never plan to use more than this share of what is free (one factor for every check)
CUDA_CONTEXT_BYTES = 2**30  # per process: CUDA context, cuBLAS workspace, allocator slack (an allowance)
CPU_ALLOWANCE_BYTES = 2**28  # thread pools and oneDNN workspace beyond the tensors (~0.2 GiB measured)
TRAIN_MAPS_CPU = 4  # attention maps per layer kept for backward on CPU without the kernels (3.4 measured)
EVAL_MAPS_CPU = 3  # scores, masked scores, softmax of the layer being evaluated (2.9 measured)
ACT_FLOATS_D, ACT_FLOATS_FF = 20, 4  # saved floats per token and layer: 20*d_model + 4*d_ff (1.24x measured)
# CUDA, bytes per token and layer under bf16 autocast: two fp32 LayerNorm inputs (8d), the bf16
# inputs of qkv, out and the first FFN matrix (6d), q, k, v and SDPA's output (8d), dropout's 1-byte
# masks (2d + d_ff, counted with dropout off too), GELU's input and output (4*d_ff).
ACT_BYTES_CUDA_D, ACT_BYTES_CUDA_FF = 24, 5
STATE_BYTES_PER_PARAM = 16  # fp32 weights + grads + AdamW's two moments
AUTOCAST_BYTES_PER_PARAM = 2  # autocast's bf16 copy of each weight, cached through a forward (CUDA)

# Errors after which the CUDA context is unusable: every later kernel of the process fails too.
_STICKY = ("illegal memory access", "device-side assert", "xid", "cublas_status_execution_failed",
           "unspecified launch failure", "misaligned address", "illegal instruction",
           "uncorrectable ecc error", "cuda error: an illegal", "device not ready", "gpu is lost",
           "cudaerrorlaunchfailure", "cuda error: unknown error")
_OOM = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


def is_oom(exc: BaseException) -> bool:
    """An allocation refused by the device or the host (a cuBLAS workspace allocation included)."""
    if isinstance(exc, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(k in text for k in _OOM)


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """A CUDA fault that poisons the process (illegal access, device-side assert, Xid): the trial
    is not to blame, and nothing more can run in this process."""
    if is_oom(exc) or not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(k in text for k in _STICKY)


@dataclass(frozen=True)
class TrialShape:
    """What sizes one trial's memory."""

    param_count: int
    batch_size: int
    eval_batch_size: int
    tokens: int  # tokens per sample, all attention sequences together
    sequences: int  # independent attention sequences per sample (ci: one per channel)
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    data_bytes: int = 0  # the dataset held on the device
    compiled: bool = False  # torch.compile traces PyTorch's own dropout: CPU keeps its attention maps
    branch: bool = False  # a WSD trial: its cooldown branches train a copy of model and optimizer


def trial_shape(family: Any, cfg: Any, arch: dict[str, Any], batch_size: int, eval_batch_size: int,
                data_bytes: int = 0, compiled: bool = False, branch: bool = False) -> TrialShape:
    tokens = int(family.tokens(cfg)) if family.tokens else 64
    sequences = int(family.sequences(cfg)) if getattr(family, "sequences", None) else 1
    return TrialShape(int(arch["param_count"]), int(batch_size), int(eval_batch_size), tokens, max(1, sequences),
                      int(arch["d_model"]), int(arch["n_layers"]), int(arch["n_heads"]), int(arch["d_ff"]),
                      int(data_bytes), compiled, branch)


def _cpu_train_maps(compiled: bool) -> int:
    """Attention maps per layer that CPU training keeps for backward (see the module docstring); a
    compiled model cannot call the kernels, so it is counted as their tensor path is."""
    from archhpo.models._cpu_kernels import lib  # builds the kernels on first use (about a second)

    return 0 if lib() is not None and not compiled else TRAIN_MAPS_CPU


def state_bytes(shape: TrialShape, device_type: str = "cuda") -> int:
    """What the parameters hold: weights, grads and AdamW's moments (twice for a WSD trial, whose
    cooldown branch trains copies beside them), and autocast's bf16 weight copies on CUDA."""
    copies = 2 if shape.branch else 1
    cast = AUTOCAST_BYTES_PER_PARAM if device_type == "cuda" else 0
    return (copies * STATE_BYTES_PER_PARAM + cast) * shape.param_count


def estimate_training_bytes(shape: TrialShape, device_type: str = "cuda") -> int:
    """`state_bytes`, the dataset, and the larger of training's saved activations and one
    evaluation batch's transients (a sequence head's logits: `workers._batch.need_bytes`)."""
    cuda = device_type == "cuda"
    seq = max(1, shape.tokens // shape.sequences)
    map_floats = shape.n_heads * shape.sequences * seq * seq  # one attention map of one sample
    if cuda:
        per_token = ACT_BYTES_CUDA_D * shape.d_model + ACT_BYTES_CUDA_FF * shape.d_ff
        train = shape.batch_size * shape.n_layers * shape.tokens * per_token
    else:
        per_token = 4 * (ACT_FLOATS_D * shape.d_model + ACT_FLOATS_FF * shape.d_ff)
        train = shape.batch_size * shape.n_layers * (
            shape.tokens * per_token + _cpu_train_maps(shape.compiled) * map_floats * 4)
    act = 2 if cuda else 4  # bf16 under autocast on CUDA
    evaluate = shape.eval_batch_size * (  # one layer alive at a time under no_grad
        shape.tokens * (4 * shape.d_model + shape.d_ff) * act + (0 if cuda else EVAL_MAPS_CPU) * map_floats * 4)
    fixed = 0 if cuda else CPU_ALLOWANCE_BYTES  # a GPU process's context: CUDA_CONTEXT_BYTES, by placement
    return state_bytes(shape, device_type) + shape.data_bytes + max(train, evaluate) + fixed


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(int(t.numel()) * t.element_size() for t in tensors)


def available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def fits(needed: int, free: int) -> bool:
    return needed <= SAFETY * free


def check_fits(needed: int, device: torch.device, what: str, resident: int = 0) -> None:
    """Refuse `needed` bytes unless they fit the device's free memory; `resident` is the part of
    `needed` already allocated (the dataset loaded before the check), so it counts as free."""
    free = available_bytes(device) + resident
    if not fits(needed, free):
        raise MemoryRefused(
            f"{what} needs about {needed / 2**30:.1f} GiB to train but {device.type} has "
            f"{free / 2**30:.1f} GiB free; run it on a larger device or lower the batch size"
        )


LARGE_MODEL_PARAMS = 50_000_000  # models from here on are built one at a time per host
HOST_BUILD_LOCK = Path(tempfile.gettempdir()) / f"archhpo-build-{os.getuid()}.lock"


@contextlib.contextmanager
def host_build_slot(param_count: int, device: torch.device, what: str) -> Iterator[None]:
    """Build a large model only once the host has the RAM for it, one build at a time per host.

    A model is built in host memory (4 B/param) before it moves to the GPU, and workers on one
    node (8 GPUs, 8 workers) start together: each reading the free RAM alone would see it all and
    all build at once.  Under a host-wide lock the check and the build are one step, so the next
    worker's check sees what the previous build took."""
    if param_count < LARGE_MODEL_PARAMS:
        yield
        return
    with open(HOST_BUILD_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if device.type != "cpu":  # on CPU the trial's own check counts the weights
                check_fits(4 * param_count, torch.device("cpu"), f"Building {what} in host memory")
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
