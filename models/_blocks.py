"""A shared pre-norm transformer block with hand-written attention, so projections can drop biases.

``Block`` = x + Attn(LN(x)), then x + FFN(LN(x)); FFN = Linear(d, d_ff) → GELU → Linear(d_ff, d)
with biases.  ``nn.TransformerEncoderLayer`` cannot remove the q/k/v/out biases or the first
LayerNorm alone, which FT-Transformer-style families need; ``block_params`` is its exact count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.models._flops import block_params

__all__ = ["Attention", "Block", "block_params"]  # block_params lives with the closed forms (no torch)


class Attention(nn.Module):
    """Multi-head self-attention: fused q,k,v projection, out projection, F.scaled_dot_product_attention."""

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Masks follow nn.MultiheadAttention: a bool ``attn_mask`` (L, L) or ``key_padding_mask``
        (B, L) is True where attention is NOT allowed; a float ``attn_mask`` is added to the scores."""
        b, n, d = x.shape  # (B, L, d)
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        # q's dtype, not x's: under autocast q is bf16/fp16 and SDPA wants the mask to match it.
        mask = _sdpa_mask(attn_mask, key_padding_mask, q.dtype)  # broadcastable to (B, h, L, L)
        p = self.dropout if self.training else 0.0
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, h, L, d/h)
        return self.out(h.transpose(1, 2).reshape(b, n, d))  # (B, L, d)


def _sdpa_mask(
    attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    # SDPA's bool masks mean "may attend", the opposite of nn.MultiheadAttention's; convert both
    # masks to one additive float mask so they can be combined.
    def additive(m: torch.Tensor) -> torch.Tensor:
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    mask = None if attn_mask is None else additive(attn_mask)  # (L, L)
    if key_padding_mask is not None:
        pad = additive(key_padding_mask)[:, None, None, :]  # (B, 1, 1, L)
        mask = pad if mask is None else mask + pad
    return mask


class Block(nn.Module):
    """Pre-norm block; ``first_norm=False`` drops the attention LayerNorm (FT-Transformer's first block)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        attn_bias: bool = True,
        first_norm: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn_norm: nn.Module = nn.LayerNorm(d_model) if first_norm else nn.Identity()
        self.attn = Attention(d_model, n_heads, bias=attn_bias, dropout=dropout)
        self.ff_norm = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), attn_mask, key_padding_mask))  # (B, L, d)
        return x + self.drop(self.ff(self.ff_norm(x)))  # (B, L, d)
