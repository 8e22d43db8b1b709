"""What a trial records about the device it trained on, and the CUDA speed switches.

Everything here is safe on a CPU-only host (it returns {} / None there) and imports Ray only
when Ray is already imported and initialised by the process, so plain workers run where only
PyTorch is installed.  The GPU defaults (`compile_by_default`, `compile_model`) are pure choices
of the device type: on CPU each is off, so CPU trials stay bit for bit what they were.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

PEAK_ENV = "ARCHHPO_PEAK_BF16_FLOPS"  # overrides the table below (FLOP/s), for GPUs it lacks
EAGER_ENV = "ARCHHPO_EAGER"  # "1": CUDA trials train eager unless their study says --compile
# Compiling paid for itself after 800-1,200 steps of the lm rows on the H100 (docs/benchmarks.md
# §13: 23-145 s of compiling, +30-66% a step); below this many planned steps a trial trains eager.
COMPILE_MIN_STEPS = 2_000
COMPILE_S_ATTR = "compile_s"  # what a compiled CUDA trial records: the compile, apart from step time

# Dense (no structured sparsity) bf16 tensor-core peak in FLOP/s, with fp32 accumulation.
# NVIDIA's datasheets quote the sparse figure first ("with sparsity"); the dense one is half.
# First matching pattern wins, so the more specific names come first.
_PEAK_BF16: list[tuple[str, float]] = [
    # H100 datasheet: SXM 1,979 TFLOPS with sparsity -> 989.4 dense; PCIe 1,513 -> 756;
    # NVL 1,671 -> 835.5.  torch names the SXM part "NVIDIA H100 80GB HBM3".
    (r"h100.*nvl", 835.5e12),
    (r"h100.*pcie", 756e12),
    (r"h100|h800", 989.4e12),
    # H200 datasheet: SXM 1,979 with sparsity -> 989.4 dense; NVL 1,671 -> 835.5.
    (r"h200.*nvl", 835.5e12),
    (r"h200", 989.4e12),
    # GH200 (Grace Hopper) datasheet: 1,979 with sparsity -> 989.4 dense.
    (r"gh200", 989.4e12),
    # HGX B200 datasheet: FP16/BF16 36 PFLOPS with sparsity for 8 GPUs -> 2.25e15 dense per GPU.
    (r"b200", 2250e12),
    # A100 datasheet (SXM and PCIe, 40 and 80 GB): 312 dense, 624 with sparsity.  A800 the same.
    (r"a100|a800", 312e12),
    # L40S datasheet: 362.05 dense, 733 with sparsity.  L40 datasheet: 181.05 dense, 362.1 sparse.
    (r"l40s", 362.05e12),
    (r"l40\b", 181.05e12),
    # L4 datasheet: BF16 242 TFLOPS with sparsity -> 121 dense.
    (r"\bl4\b", 121e12),
    # A10 datasheet: BF16 125 dense, 250 with sparsity.  (The AWS A10G has no NVIDIA datasheet
    # figure; it is left out rather than guessed: set ARCHHPO_PEAK_BF16_FLOPS for it.)
    (r"\ba10\b", 125e12),
    # RTX 6000 Ada datasheet / Ada whitepaper: 364.2 dense FP16/BF16 with fp32 accumulate.
    (r"rtx 6000 ada", 364.2e12),
    # Ada whitepaper (AD102), GeForce RTX 4090: FP16/BF16 tensor with fp32 accumulate 165.2 dense.
    (r"rtx 4090", 165.2e12),
    # Ampere GA102 whitepaper, GeForce RTX 3090: FP16/BF16 tensor with fp32 accumulate 71 dense.
    (r"rtx 3090", 71e12),
    # A6000 datasheet (RTX A6000): 154.8 dense TF16/BF16 (309.7 with sparsity).
    (r"rtx a6000", 154.8e12),
]


def dense_bf16_peak_flops(name: str) -> float | None:
    """The dense bf16 tensor-core peak (FLOP/s) of a GPU by its torch name; None when unknown
    (or when the GPU has no bf16 tensor cores, as the V100).  ARCHHPO_PEAK_BF16_FLOPS overrides."""
    override = os.environ.get(PEAK_ENV)
    if override:
        try:
            value = float(override)
        except ValueError:
            value = 0.0
        if value > 0:
            return value
    low = name.lower()
    for pattern, flops in _PEAK_BF16:
        if re.search(pattern, low):
            return flops
    return None


def _ray_gpu_ids() -> list[str] | None:
    """Ray's GPU ids of this task, when the process runs under Ray (never imports Ray itself)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    except Exception:  # an old or partial Ray: the attribute is a nicety, not a reason to fail
        return None
    return [str(i) for i in ids]


def _physical_index(index: int) -> int:
    """The GPU's index as nvidia-smi numbers it, through CUDA_VISIBLE_DEVICES when that lists
    integers (Ray sets it so for a task with a GPU share)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if index < len(parts) and parts[index].isdigit():
        return int(parts[index])
    return index


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_attrs(device: torch.device) -> dict[str, Any]:
    """gpu_name, gpu_index (as nvidia-smi numbers it) and ray_gpu_ids of a CUDA device; {} on CPU."""
    if device.type != "cuda":
        return {}
    index = _cuda_index(device)
    attrs: dict[str, Any] = {"gpu_name": torch.cuda.get_device_name(index), "gpu_index": _physical_index(index)}
    ids = _ray_gpu_ids()
    if ids is not None:
        attrs["ray_gpu_ids"] = ids
    return attrs


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_attrs(device: torch.device) -> dict[str, Any]:
    """`peak_memory_gib`: the most memory PyTorch allocated on the GPU since the last reset; {} on CPU."""
    if device.type != "cuda":
        return {}
    return {"peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}


def release_memory(device: torch.device) -> None:
    """Give a finished trial's cached GPU blocks back, so the next trial (or a trial packed on the
    same GPU) starts from a clean allocator."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_peak_flops(device: torch.device | str) -> float | None:
    """The dense bf16 peak of a CUDA device (or of a GPU name); None on CPU or when unknown."""
    if isinstance(device, str):
        return dense_bf16_peak_flops(device)
    if device.type != "cuda":
        return None
    return dense_bf16_peak_flops(torch.cuda.get_device_name(_cuda_index(device)))


def mfu(train_flops: float, seconds: float, device: torch.device | str, share: float = 1.0) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the device's dense bf16 peak.

    `device` is a torch device or a GPU name; None on CPU, for an unknown GPU or without time.
    `share` is the part of the GPU the trial was given (0.25: four packed on it): its MFU is
    measured against that part of the peak, so four packed trials at full speed each read 1."""
    peak = device_peak_flops(device)
    if peak is None or seconds <= 0 or train_flops < 0 or not 0 < share <= 1:
        return None
    return float(train_flops) / float(seconds) / (peak * share)


def configure_cuda_speed() -> None:
    """TF32 tensor cores for the fp32 matmuls and convolutions left outside bf16 autocast.

    A no-op without CUDA.  Uses set_float32_matmul_precision("high"), which sets the legacy and
    the new (torch >= 2.9 `fp32_precision`) switches consistently: setting only the new one makes
    torch.get_float32_matmul_precision() raise ("mix of the legacy and new APIs")."""
    if not torch.cuda.is_available():
        return
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


def driver_version() -> str | None:
    """The NVIDIA driver version (from nvidia-smi), or None where it cannot be read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def compile_by_default(device_type: str, asked: bool, planned_steps: int,
                       environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a trial's model is compiled: whenever its study asks (``--compile``); on CUDA also
    unasked once its planned optimizer steps reach COMPILE_MIN_STEPS (where compiling wins),
    unless ARCHHPO_EAGER=1; never unasked on CPU."""
    if asked:
        return True
    if device_type != "cuda" or environ.get(EAGER_ENV, "").strip() not in ("", "0"):
        return False
    return planned_steps >= COMPILE_MIN_STEPS


def compile_model(model: torch.nn.Module, device: torch.device,
                  warm: Callable[[torch.nn.Module], torch.Tensor] | None = None) -> float | None:
    """Compile `model` in place (its state_dict keys stay the eager model's).  On CUDA, with
    `warm` (one training micro-batch's loss), the compile happens here, timed, so that the
    trial's step time holds none of it: the seconds are returned (COMPILE_S_ATTR), the RNG
    states and the gradients put back as they were.  On CPU compiling stays lazy (None)."""
    model.compile()
    if device.type != "cuda" or warm is None:
        return None
    rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state(device)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    try:
        warm(model).backward()
        torch.cuda.synchronize(device)
    finally:
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        torch.cuda.set_rng_state(cuda_rng, device)
    return round(time.perf_counter() - start, 2)
