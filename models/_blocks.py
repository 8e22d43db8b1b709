"""A shared pre-norm transformer block with hand-written attention, so projections can drop biases.

``Block`` = x + Attn(LN(x)), then x + FFN(LN(x)); FFN = Linear(d, d_ff) → GELU → Linear(d_ff, d)
with biases.  ``nn.TransformerEncoderLayer`` cannot remove the q/k/v/out biases or the first
LayerNorm alone, which FT-Transformer-style families need; ``block_params`` is its exact count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.models._dropout import Dropout, attention
from archhpo.models._flops import block_params

__all__ = ["Attention", "Block", "EncoderLayer", "block_params"]  # block_params lives with the closed forms (no torch)


class Attention(nn.Module):
    """Multi-head self-attention: fused q,k,v projection, out projection, F.scaled_dot_product_attention."""

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
                 qk_scale: float = 1.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        # A factor on q over SDPA's 1/sqrt(d_head): µP's attention (docs/mup.md) at width multiplier
        # m is 1/sqrt(m); 1.0 multiplies nothing, so the standard model keeps its numbers bit for bit.
        self.qk_scale = qk_scale
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Masks follow nn.MultiheadAttention: a bool ``attn_mask`` (L, L) or ``key_padding_mask``
        (B, L) is True where attention is NOT allowed; a float ``attn_mask`` is added to the scores.
        ``is_causal`` with no mask: SDPA's own causal masking, which lets CUDA pick the flash
        kernel (any explicit mask rules flash out and costs an (L, L) tensor)."""
        b, n, d = x.shape  # (B, L, d)
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.qk_scale != 1.0:
            q = q * self.qk_scale
        if is_causal and attn_mask is None and key_padding_mask is None:
            p = self.dropout if self.training else 0.0
            h = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, h, L, d/h)
            return self.out(h.transpose(1, 2).reshape(b, n, d))  # (B, L, d)
        # q's dtype, not x's: under autocast q is bf16/fp16 and SDPA wants the mask to match it.
        mask = _sdpa_mask(attn_mask, key_padding_mask, q.dtype)  # broadcastable to (B, h, L, L)
        p = self.dropout if self.training else 0.0
        h = attention(q, k, v, mask, p)  # (B, h, L, d/h)
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
        qk_scale: float = 1.0,
        residual_scale: float = 1.0,
    ) -> None:
        super().__init__()
        # CompleteP (lm under µP with a base depth): each branch ×base/n_layers before it joins the stream
        self.residual_scale = residual_scale
        self.attn_norm: nn.Module = nn.LayerNorm(d_model) if first_norm else nn.Identity()
        self.attn = Attention(d_model, n_heads, bias=attn_bias, dropout=dropout, qk_scale=qk_scale)
        self.ff_norm = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), Dropout(dropout), nn.Linear(d_ff, d_model)
        )
        self.drop = Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        a = self.drop(self.attn(self.attn_norm(x), attn_mask, key_padding_mask, is_causal))  # (B, L, d)
        x = x + (a if self.residual_scale == 1.0 else self.residual_scale * a)
        f = self.drop(self.ff(self.ff_norm(x)))  # (B, L, d)
        return x + (f if self.residual_scale == 1.0 else self.residual_scale * f)


class EncoderLayer(nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` (same parameters and state-dict keys) whose dropouts are
    ``archhpo.models._dropout``'s: cheap random bits on CPU, and attention dropout that keeps the
    flash kernel whenever no dropout applies.  Off the CPU, or without dropout, it is the stock layer."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        p = self.dropout.p
        self.dropout, self.dropout1, self.dropout2 = Dropout(p), Dropout(p), Dropout(p)

    def _sa_block(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        attn = self.self_attn
        p = attn.dropout if self.training else 0.0
        if p == 0.0 or x.device.type != "cpu" or not attn.batch_first or not attn._qkv_same_embed_dim:
            return super()._sa_block(x, attn_mask, key_padding_mask, is_causal)
        b, n, d = x.shape  # (B, L, d)
        qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)  # (B, L, 3d)
        q, k, v = qkv.view(b, n, 3, attn.num_heads, d // attn.num_heads).permute(2, 0, 3, 1, 4)
        # The layer's forward has already made attn_mask additive (float); padding mask likewise.
        mask = _sdpa_mask(attn_mask, key_padding_mask, q.dtype)  # broadcastable to (B, h, L, L)
        h = attention(q, k, v, mask, p).transpose(1, 2).reshape(b, n, d)  # (B, L, d)
        return self.dropout1(attn.out_proj(h))

