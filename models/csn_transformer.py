"""Dual-path categorical/numerical transformer (CSN) over panel data.

Path 1 reads who the sample is: [CLS₁] + one token per categorical feature (Embedding(card, e) →
Linear(e, d, bias=False)).  Path 2 reads what happened: [CLS₂] + one token per time step,
Linear(N, d)(x_t) plus a learned temporal position.  Each path has its own n_layers pre-norm blocks
with bias-free attention projections; the head Linear(2d, out_dim) reads [CLS₁, CLS₂].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from archhpo.errors import ConfigError
from archhpo.models._blocks import Block, block_params
from archhpo.models._family import Family, check_arch
from archhpo.models._flops import encoder_layer_flops, linear_flops
from archhpo.models.data import panel
from archhpo.models.ft_transformer import (
    PANEL_FLAGS,
    CategoricalTokens,
    categorical_tokens_flops,
    categorical_tokens_params,
    check_panel_fields,
    parse_cardinalities,
)
from archhpo.models.patchtst import base_rate_loss, bce_loss, binary_metrics


@dataclass
class CSNTransformerConfig:
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 256
    num_numerical: int = panel.DEFAULT_FEATURES
    cat_cardinalities: tuple[int, ...] = panel.DEFAULT_CARDINALITIES  # (symbol, sector)
    seq_len: int = panel.DEFAULT_SEQ_LEN
    out_dim: int = 1
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_arch(self.d_model, self.n_layers, self.n_heads, self.d_ff)
        self.cat_cardinalities = parse_cardinalities(self.cat_cardinalities)
        check_panel_fields(
            self.num_numerical, self.cat_cardinalities, self.seq_len, self.out_dim, self.dropout
        )
        if not self.cat_cardinalities:
            raise ConfigError("csn_transformer needs at least one categorical feature; "
                              "use ft_transformer without.")


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


def param_count(cfg: CSNTransformerConfig) -> int:
    """Exact count: equals sum(p.numel()) of CSNTransformer(cfg)."""
    d, o = cfg.d_model, cfg.out_dim
    path1 = d + categorical_tokens_params(cfg.cat_cardinalities, d)  # [CLS₁] + categorical tokens
    path2 = d + cfg.num_numerical * d + d + cfg.seq_len * d  # [CLS₂] + Linear(N, d) + time positions
    blocks = 2 * cfg.n_layers * block_params(d, cfg.d_ff, attn_bias=False, first_norm=True)
    return path1 + path2 + blocks + 2 * d * o + o


def flops_per_sample(cfg: CSNTransformerConfig) -> int:
    """Forward+backward FLOPs of one training sample: both paths (see ``archhpo.models._flops``)."""
    d, f, cards = cfg.d_model, cfg.d_ff, cfg.cat_cardinalities
    path1 = categorical_tokens_flops(cards, d) + cfg.n_layers * encoder_layer_flops(1 + len(cards), d, f)
    step = linear_flops(cfg.seq_len, cfg.num_numerical, d, input_grad=False)  # Linear(N, d) on the data
    path2 = step + cfg.n_layers * encoder_layer_flops(1 + cfg.seq_len, d, f)
    return path1 + path2 + linear_flops(1, 2 * d, cfg.out_dim)


def config_for(arch: Mapping[str, int], info: Mapping[str, Any]) -> CSNTransformerConfig:
    return CSNTransformerConfig(
        d_model=int(arch["d_model"]), n_layers=int(arch["n_layers"]),
        n_heads=int(arch["n_heads"]), d_ff=int(arch["d_ff"]),
        num_numerical=int(info.get("num_numerical", panel.DEFAULT_FEATURES)),
        cat_cardinalities=parse_cardinalities(info.get("cat_cardinalities", panel.DEFAULT_CARDINALITIES)),
        seq_len=int(info.get("seq_len", panel.DEFAULT_SEQ_LEN)),
        out_dim=int(info.get("out_dim", 1)),
        dropout=float(info.get("dropout", 0.0)),
    )


FAMILY = Family(
    name="csn_transformer",
    config_cls=CSNTransformerConfig,
    build=CSNTransformer,
    param_count=param_count,
    config_for=config_for,
    parse_data=panel.parse_data,
    data_info=panel.data_info,
    load_data=panel.load_data,
    loss=bce_loss,
    baseline_loss=base_rate_loss,
    metrics=binary_metrics,
    flags=PANEL_FLAGS,
    tokens=lambda c: 2 + len(c.cat_cardinalities) + c.seq_len,  # both paths' tokens, held together
    flops_per_sample=flops_per_sample,
    description="Dual-path transformer: categorical tokens and per-step numerical tokens, joint [CLS] head.",
)
