"""Dropout and attention dropout at the cost of their arithmetic on CPU.

On CPU, PyTorch's dropout draws a Bernoulli per value, and SDPA with ``dropout_p > 0`` leaves the
flash kernel for a math path that materialises the (B, h, L, L) probabilities.  Here, on CPU, in
float32, the mask is a hash: element e is kept iff the top 15 bits of ``mix32(mix32(e ^ s0) + s1)``
are at least ``round(p · 2^15)``, (s0, s1) one int64 draw from PyTorch's CPU generator per call.  So
``torch.manual_seed`` and a checkpoint's RNG state repeat a run, backward recomputes the mask
instead of storing it, and it does not depend on the thread count; kept values are scaled by
1/(1 − drop_rate(p)), so the expectation is kept exactly.  ``attention`` with dropout runs a fused
kernel (``_cpu_kernels.c``) that computes one query row at a time like flash attention: the same
dropout of the probabilities as SDPA's, not an approximation; without dropout it is SDPA itself.
Without the kernels (no C compiler; ``ARCHHPO_CPU_KERNELS=0``) or for other dtypes the same masks
come from tensor operations (``_keep_scale``), slower; off the CPU both are PyTorch's own.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from archhpo.models import _cpu_kernels

_LANE_BITS = 15  # random bits compared per value (LANE_SHIFT = 32 - 15 in _cpu_kernels.c)
_U32 = 0xFFFFFFFF
_MAX_ELEMENTS = 2**32  # mask indices are uint32: a larger tensor takes F.dropout


def drop_rate(p: float) -> float:
    """The drop probability actually applied on CPU for a requested p: p rounded to a multiple of
    2^-15 (|error| <= 2^-16, e.g. 0.1 -> 3277/32768 = 0.100006)."""
    return round(p * 2**_LANE_BITS) / 2**_LANE_BITS


class _Mask:
    """One call's mask: its seeds (one draw from the default generator) and threshold."""

    def __init__(self, p: float) -> None:
        word = int(torch.empty((), dtype=torch.int64).random_())
        self.s0, self.s1 = word & _U32, (word >> 32) & _U32
        rate = drop_rate(p)
        self.thr = round(rate * 2**_LANE_BITS)
        self.scale = 1.0 / (1.0 - rate)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # _cpu_kernels.c's mix32 on uint32 values held in int64 (products stay below 2^63).
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _U32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _U32
    return x ^ (x >> 16)


def _keep_scale(shape: torch.Size, m: _Mask, dtype: torch.dtype) -> torch.Tensor:
    """The kernels' mask as a tensor: 0 where dropped, 1/(1 − rate) where kept."""
    e = torch.arange(math.prod(shape), dtype=torch.int64)
    h = _mix32((_mix32(e ^ m.s0) + m.s1) & _U32)
    keep = (h >> (32 - _LANE_BITS)) >= m.thr
    return (keep.to(dtype) * m.scale).view(shape)


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class _FusedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, m: _Mask) -> torch.Tensor:
        ctx.m = m
        return _apply(x, m)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _apply(grad, ctx.m), None  # d(x·mask)/dx = mask, recomputed from the seeds


def _apply(x: torch.Tensor, m: _Mask) -> torch.Tensor:
    so = _cpu_kernels.lib()
    assert so is not None
    x = x.contiguous()
    y = torch.empty_like(x)
    so.dropout_apply(_ptr(x), _ptr(y), x.numel(), m.s0, m.s1, m.thr, m.scale, torch.get_num_threads())
    return y


def _traced() -> bool:
    """Under torch.compile or a dispatch mode (FlopCounterMode, fake tensors) PyTorch's own ops run:
    the kernels read memory through data pointers those tools cannot follow, and a per-call seed
    read back as a Python int would break or re-specialise a compiled graph at every call."""
    return torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None


def _fused_ok(*ts: torch.Tensor) -> bool:
    return (
        all(type(t) is torch.Tensor and t.dtype == torch.float32 for t in ts)
        and ts[0].numel() < _MAX_ELEMENTS
        and _cpu_kernels.lib() is not None
    )


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout: hashed masks on CPU (fused where the kernels build), ``F.dropout`` elsewhere."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or x.numel() >= _MAX_ELEMENTS or _traced():
        return F.dropout(x, p, True)
    m = _Mask(p)
    if _fused_ok(x):
        out: torch.Tensor = _FusedDropout.apply(x, m)
        return out
    return x * _keep_scale(x.shape, m, x.dtype)


class Dropout(nn.Dropout):
    """A drop-in ``nn.Dropout`` (same state, same repr) that uses ``dropout`` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("the CPU attention kernel could not allocate its per-thread buffers")


def _view(t: torch.Tensor) -> tuple[torch.Tensor, _cpu_kernels.View]:
    """A (B, h, L, d/h) tensor as the kernels read it: in place, unless its last dim is strided."""
    t = t if t.stride(-1) == 1 else t.contiguous()
    return t, _cpu_kernels.View(_ptr(t), t.stride(0), t.stride(1), t.stride(2))


def _heads_last(b: int, h: int, n: int, dh: int, like: torch.Tensor) -> torch.Tensor:
    # (B, h, L, d/h) over (B, L, h, d/h) memory: the caller's transpose(1, 2).reshape(B, L, d) is free.
    return torch.empty(b, n, h, dh, dtype=like.dtype).permute(0, 2, 1, 3)


class _FusedAttention(torch.autograd.Function):
    """softmax(q kᵀ/√d + mask) with dropout, times v, a block of query rows at a time (``_cpu_kernels.c``)."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, m: _Mask
    ) -> torch.Tensor:
        b, h, n, dh = q.shape  # (B, h, L, d/h), usually views into the (B, L, 3, h, d/h) projection
        full = None if mask is None else mask.to(q.dtype).expand(b, h, n, n)
        if full is not None and full.stride(-1) != 1:
            full = full.contiguous()  # the kernel reads mask rows contiguously
        args = _cpu_kernels.AttnArgs(
            b, h, n, dh, *(full.stride()[:3] if full is not None else (0, 0, 0)),
            None if full is None else _ptr(full), 1.0 / math.sqrt(dh), m.s0, m.s1, m.thr, m.scale,
        )  # fmt: skip
        (q, vq), (k, vk), (v, vv) = _view(q), _view(k), _view(v)
        out, lse = _heads_last(b, h, n, dh, q), torch.empty(b, h, n, dtype=q.dtype)
        so = _cpu_kernels.lib()
        assert so is not None
        _check(so.attn_dropout_fwd(vq, vk, vv, _view(out)[1], _ptr(lse), args, torch.get_num_threads()))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args, ctx.full = args, full  # full keeps the mask's memory alive for args.mask
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        b, h, n, dh = q.shape
        grads = torch.empty(b, n, 3, h, dh, dtype=q.dtype).permute(2, 0, 3, 1, 4)  # as the projection lays them
        held = [_view(t) for t in (q, k, v, out, grad, *grads)]  # keeps any contiguous copy alive
        so = _cpu_kernels.lib()
        assert so is not None
        vq, vk, vv, vo, vg, dq, dk, dv = (view for _, view in held)
        _check(so.attn_dropout_bwd(vq, vk, vv, vo, vg, _ptr(lse), dq, dk, dv, ctx.args, torch.get_num_threads()))
        return grads[0], grads[1], grads[2], None, None


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
    numel = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
    if p == 0.0 or q.device.type != "cpu" or numel >= _MAX_ELEMENTS or _traced():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=False)
    m = _Mask(p)
    no_mask_grad = mask is None or not mask.requires_grad
    if _fused_ok(q, k, v) and no_mask_grad and q.shape[2] == k.shape[2]:
        out: torch.Tensor = _FusedAttention.apply(q, k, v, mask, m)
        return out
    scores = torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))  # (B, h, L, L)
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs * _keep_scale(probs.shape, m, probs.dtype), v)  # (B, h, L, d/h)
