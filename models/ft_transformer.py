"""FT-Transformer over panel data: every feature becomes a token, [CLS] gives the prediction.

Two variants share one config:
- ``sequence`` (default): one token per (time step, numerical feature), x·W_j + b_j plus a learned
  temporal position shared by the step's features; categorical tokens Embedding(card, e) →
  Linear(e, d, bias=False); blocks with bias-free attention projections; no final norm;
  head Linear(d, out_dim) on [CLS].
- ``tabular`` (Gorishniy et al. 2021): the last step's numerical features, one token each;
  categorical Embedding(card, d) + a per-feature bias; standard blocks, the first without its
  attention LayerNorm; head LayerNorm → ReLU → Linear on [CLS].
"""

from __future__ import annotations

import torch
from torch import nn

from archhpo.models._blocks import Block
from archhpo.models.ft_transformer_spec import (  # noqa: F401 - re-exported
    FAMILY,
    PANEL_FLAGS,
    VARIANTS,
    FTTransformerConfig,
    cat_embed_dim,
    categorical_tokens_flops,
    categorical_tokens_params,
    check_panel_fields,
    config_for,
    flops_per_sample,
    param_count,
    parse_cardinalities,
)


class CategoricalTokens(nn.Module):
    """One token per categorical feature: Embedding(card, e) → Linear(e, d, bias=False)."""

    def __init__(self, cardinalities: tuple[int, ...], d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        dims = [cat_embed_dim(c, d_model) for c in cardinalities]
        self.embed = nn.ModuleList(nn.Embedding(c, e) for c, e in zip(cardinalities, dims, strict=True))
        self.proj = nn.ModuleList(nn.Linear(e, d_model, bias=False) for e in dims)

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        if not self.embed:  # no categorical features: zero tokens
            return torch.zeros(categorical.shape[0], 0, self.d_model, device=categorical.device)
        tokens = [p(e(categorical[:, j])) for j, (e, p) in enumerate(zip(self.embed, self.proj, strict=True))]
        return torch.stack(tokens, dim=1)  # (B, M, d)


def _uniform(*shape: int, d: int) -> nn.Parameter:
    # FT-Transformer's tokenizer init: U(-1/√d, 1/√d).
    return nn.Parameter(torch.empty(*shape).uniform_(-(d**-0.5), d**-0.5))


class FTTransformer(nn.Module):
    head: nn.Module
    cat_offsets: torch.Tensor  # a buffer (tabular)
    def __init__(self, cfg: FTTransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, n, cards = cfg.d_model, cfg.num_numerical, cfg.cat_cardinalities
        self.cls = _uniform(d, d=d)
        self.num_weight = _uniform(n, d, d=d)  # W_j: feature j's value times its own vector
        self.num_bias = _uniform(n, d, d=d)
        tabular = cfg.variant == "tabular"
        if tabular:
            # One table for all categorical features (ids offset per feature) = Σ Embedding(card_j, d).
            offsets = torch.tensor([0, *cards[:-1]], dtype=torch.long).cumsum(0) if cards else torch.zeros(0)
            self.register_buffer("cat_offsets", offsets.long(), persistent=False)
            self.cat_embed = nn.Embedding(sum(cards), d) if cards else None
            if self.cat_embed is not None:
                nn.init.uniform_(self.cat_embed.weight, -(d**-0.5), d**-0.5)
            self.cat_bias = _uniform(len(cards), d, d=d)
        else:
            self.time_pos = nn.Parameter(torch.zeros(cfg.seq_len, d))
            nn.init.normal_(self.time_pos, std=0.02)
            self.cat_tokens = CategoricalTokens(cards, d)
        self.blocks = nn.ModuleList(
            Block(d, cfg.n_heads, cfg.d_ff, attn_bias=tabular, first_norm=not (tabular and i == 0),
                  dropout=cfg.dropout)
            for i in range(cfg.n_layers)
        )
        if tabular:
            self.head = nn.Sequential(nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, cfg.out_dim))
        else:
            self.head = nn.Linear(d, cfg.out_dim)

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        b = numerical.shape[0]
        if self.cfg.variant == "tabular":
            x = numerical[:, -1] if numerical.dim() == 3 else numerical  # (B, N): the last step
            num = x.unsqueeze(-1) * self.num_weight + self.num_bias  # (B, N, d)
            if self.cat_embed is not None:
                cat = self.cat_embed(categorical + self.cat_offsets) + self.cat_bias  # (B, M, d)
            else:
                cat = num.new_zeros(b, 0, self.cfg.d_model)
        else:
            num = numerical.unsqueeze(-1) * self.num_weight + self.num_bias  # (B, T, N, d)
            num = (num + self.time_pos[:, None, :]).flatten(1, 2)  # (B, T·N, d)
            cat = self.cat_tokens(categorical)  # (B, M, d)
        h = torch.cat([self.cls.expand(b, 1, -1), num, cat], dim=1)  # (B, 1+tokens, d)
        for block in self.blocks:
            h = block(h)
        logits = self.head(h[:, 0])  # (B, out_dim) from [CLS]
        return logits.squeeze(-1) if self.cfg.out_dim == 1 else logits
