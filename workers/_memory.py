"""A conservative training-memory estimate, so a trial that cannot fit is refused with a reason
instead of taking the machine down (a 2B model on a 24 GiB CPU host, say)."""

from __future__ import annotations

import os

import torch

from archhpo.errors import MemoryRefused

SAFETY = 0.85  # never plan to use more than this share of what is free



def estimate_training_bytes(
    param_count: int, batch_size: int, tokens: int, d_model: int, n_layers: int, n_heads: int, d_ff: int
) -> int:
    """fp32 weights + grads + AdamW's two moments (16 B/param) plus saved activations.

    Per layer and token a pre-norm encoder layer keeps roughly 12·d + 2·d_ff floats for
    backward, plus 2 attention maps of heads·tokens² (scores and softmax) per sample.
    """
    states = 16 * param_count
    per_sample = n_layers * (tokens * (12 * d_model + 2 * d_ff) + 2 * n_heads * tokens * tokens) * 4
    return states + batch_size * per_sample


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


def check_fits(needed: int, device: torch.device, what: str) -> None:
    free = available_bytes(device)
    if needed > SAFETY * free:
        raise MemoryRefused(
            f"{what} needs about {needed / 2**30:.1f} GiB to train but {device.type} has "
            f"{free / 2**30:.1f} GiB free; run it on a larger device or lower the batch size"
        )
