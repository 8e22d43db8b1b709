"""Dropout and attention dropout at the cost of their arithmetic on CPU.

On CPU, PyTorch's dropout draws a Bernoulli per value (``bernoulli_``), which costs about 12× the
32 random bits of an int32 ``random_()`` (SPEC §10), and SDPA with ``dropout_p > 0`` leaves the
CPU flash kernel for a math path that does the same Bernoulli draws on every T×T probability.
Here, on CPU:

- ``dropout`` keeps each value iff 15 random bits (an integer uniform on [0, 2^15), cut from int64
  ``random_()`` draws) are at least ``round(p · 2^15)``: the drop rate is ``drop_rate(p)``, p to
  within 2^-16, and kept values are scaled by 1/(1 − drop_rate(p)), so the expectation is kept
  exactly, as ``F.dropout`` does.  The bits come from the default CPU generator, drawn serially,
  so a run is the same under the same seed whatever the thread count.
- ``attention`` with dropout computes softmax(q kᵀ/√d + mask) explicitly and drops those
  probabilities with ``dropout``: the same dropout of the attention probabilities that SDPA's
  ``dropout_p`` applies, not an approximation.  Without dropout (eval, p = 0) it is SDPA itself,
  so the flash kernel still serves inference and dropout-free training.

On CUDA (and any non-CPU device) both are PyTorch's fused kernels (``F.dropout``, SDPA's
``dropout_p``), unchanged.  The random stream differs from ``F.dropout``'s, so a CPU run of this
version does not repeat, draw for draw, a CPU run made before it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LANE_BITS = 15  # random bits used per value (see _cpu_dropout)


def drop_rate(p: float) -> float:
    """The drop probability actually applied on CPU for a requested p: p rounded to a multiple of
    2^-15 (|error| <= 2^-16, e.g. 0.1 -> 3277/32768 = 0.100006)."""
    return round(p * 2**_LANE_BITS) / 2**_LANE_BITS


def _cpu_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    # int64 random_() fills 8 bytes per draw far faster than int32 or uint8 draws fill the same
    # bytes (4.7 ms against 12.2 / 16 ms for 6.4 MB, 1 thread); values are uniform on [0, 2^63),
    # so each 16-bit lane has 15 uniform low bits (the top lane's sign bit is always 0).
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_()
    lanes = words.view(torch.int16)[:n].view(x.shape) & (2**_LANE_BITS - 1)  # uniform on [0, 2^15)
    rate = drop_rate(p)
    keep = lanes >= round(rate * 2**_LANE_BITS)  # P(drop) = rate
    # One float mask already scaled by 1/(1 - rate): forward and backward are then one product
    # each (measured faster, with backward, than where(), masked_fill or a bool product).
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - rate))


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout: cheap random bits on CPU, ``F.dropout`` elsewhere."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return _cpu_dropout(x, p)


class Dropout(nn.Dropout):
    """A drop-in ``nn.Dropout`` (same state, same repr) that uses ``dropout`` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
) -> torch.Tensor:
    """softmax(q kᵀ/√d + mask) v with dropout p on the probabilities; q, k, v (B, h, L, d/h).

    ``mask`` is additive (float, broadcastable to (B, h, L, L)) or None.  p = 0 or a non-CPU
    tensor goes to SDPA.
    """
    if p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=False)
    scores = torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))  # (B, h, L, L)
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(_cpu_dropout(probs, p), v)  # (B, h, L, d/h)
