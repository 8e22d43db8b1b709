"""Dual-path categorical/numerical transformer (CSN) over panel data.

Path 1 reads who the sample is: [CLS₁] + one token per categorical feature (Embedding(card, e) →
Linear(e, d, bias=False)).  Path 2 reads what happened: [CLS₂] + one token per time step,
Linear(N, d)(x_t) plus a learned temporal position.  Each path has its own n_layers pre-norm blocks
with bias-free attention projections; the head Linear(2d, out_dim) reads [CLS₁, CLS₂].
"""

from __future__ import annotations

import torch
from torch import nn

from archhpo.models._blocks import Block
from archhpo.models.csn_transformer_spec import (  # noqa: F401 - re-exported
    FAMILY,
    CSNTransformerConfig,
    config_for,
    flops_per_sample,
    param_count,
)
from archhpo.models.ft_transformer import (
    CategoricalTokens,
)


def _path(cfg: CSNTransformerConfig) -> nn.ModuleList:
    return nn.ModuleList(
        Block(cfg.d_model, cfg.n_heads, cfg.d_ff, attn_bias=False, dropout=cfg.dropout)
        for _ in range(cfg.n_layers)
    )


class CSNTransformer(nn.Module):
    def __init__(self, cfg: CSNTransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.cls_cat = nn.Parameter(torch.zeros(d))
        self.cls_num = nn.Parameter(torch.zeros(d))
        self.time_pos = nn.Parameter(torch.zeros(cfg.seq_len, d))
        for p in (self.cls_cat, self.cls_num, self.time_pos):
            nn.init.normal_(p, std=0.02)
        self.cat_tokens = CategoricalTokens(cfg.cat_cardinalities, d)
        self.step_embed = nn.Linear(cfg.num_numerical, d)
        self.cat_blocks = _path(cfg)
        self.num_blocks = _path(cfg)
        self.head = nn.Linear(2 * d, cfg.out_dim)

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        b = numerical.shape[0]  # numerical: (B, T, N), categorical: (B, M)
        h1 = torch.cat([self.cls_cat.expand(b, 1, -1), self.cat_tokens(categorical)], dim=1)  # (B, 1+M, d)
        h2 = self.step_embed(numerical) + self.time_pos  # (B, T, d)
        h2 = torch.cat([self.cls_num.expand(b, 1, -1), h2], dim=1)  # (B, 1+T, d)
        for block in self.cat_blocks:
            h1 = block(h1)
        for block in self.num_blocks:
            h2 = block(h2)
        logits = self.head(torch.cat([h1[:, 0], h2[:, 0]], dim=-1))  # (B, out_dim) from [CLS₁, CLS₂]
        return logits.squeeze(-1) if self.cfg.out_dim == 1 else logits
