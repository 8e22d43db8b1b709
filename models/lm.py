"""A causal decoder-only language model in nanoGPT's manner (issue 16), the ``lm`` family.

Token + learned position embeddings, n_layers pre-norm ``Block``s (``archhpo.models._blocks``) with
a causal mask, a final LayerNorm and a linear head over the vocabulary whose weight is TIED to
the token embedding (nanoGPT's choice; the head has no bias).  Initialisation follows nanoGPT:
N(0, 0.02) weights, zero biases, and the residual projections (attention out, FFN second layer)
scaled by 1/sqrt(2·n_layers).  The loss is the mean next-token NLL in nats per token.

Data (``archhpo.models.data.language``): a synthetic language with an exact entropy rate
(``--data synthetic``), or any UTF-8 text file as bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.errors import ConfigError
from archhpo.models._blocks import Block, block_params
from archhpo.models._family import Family, FlagSpec, TensorDataset, check_arch
from archhpo.models._flops import encoder_layer_flops, linear_flops
from archhpo.models.data import language

__all__ = ["FAMILY", "LM", "LMConfig", "config_for", "flops_per_sample", "next_token_nll", "param_count"]


@dataclass
class LMConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    vocab_size: int = language.DEFAULT_VOCAB
    seq_len: int = language.DEFAULT_SEQ_LEN
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_arch(self.d_model, self.n_layers, self.n_heads, self.d_ff)
        for name, value, least in (("vocab_size", self.vocab_size, 2), ("seq_len", self.seq_len, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{name} must be an integer of at least {least}, got {value!r}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}.")


class LM(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.tok_embed = nn.Embedding(cfg.vocab_size, d)
        self.pos_embed = nn.Embedding(cfg.seq_len, d)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, cfg.d_ff, dropout=cfg.dropout) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(d)
        # True above the diagonal = a later token may not be attended to; not saved (derived).
        causal = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal", causal, persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # nanoGPT: each block adds two projections to the residual stream; keep its variance flat.
        for block in self.blocks:
            for proj in (block.attn.out, block.ff[-1]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.cfg.n_layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]  # ids: (B, L), L <= seq_len
        if length > self.cfg.seq_len:
            raise ValueError(f"input has {length} tokens but seq_len is {self.cfg.seq_len}.")
        pos = self.pos_embed(torch.arange(length, device=ids.device))  # (L, d)
        h = self.drop(self.tok_embed(ids) + pos)  # (B, L, d)
        mask = self.causal[:length, :length]  # (L, L)
        for block in self.blocks:
            h = block(h, attn_mask=mask)  # (B, L, d)
        return F.linear(self.norm(h), self.tok_embed.weight)  # (B, L, V): the tied head


def param_count(cfg: LMConfig) -> int:
    """Exact count: equals sum(p.numel()) of LM(cfg) (the tied head adds nothing)."""
    d = cfg.d_model
    embed = (cfg.vocab_size + cfg.seq_len) * d
    return embed + cfg.n_layers * block_params(d, cfg.d_ff) + 2 * d  # + final LayerNorm


def flops_per_sample(cfg: LMConfig) -> int:
    """Forward+backward FLOPs of one training window of seq_len tokens (see ``archhpo.models._flops``).

    The causal mask is applied, not exploited: attention multiplies the full seq_len² scores.
    """
    layers = cfg.n_layers * encoder_layer_flops(cfg.seq_len, cfg.d_model, cfg.d_ff)
    return layers + linear_flops(cfg.seq_len, cfg.d_model, cfg.vocab_size)  # the tied head


def config_for(arch: Mapping[str, int], info: Mapping[str, Any]) -> LMConfig:
    return LMConfig(
        d_model=int(arch["d_model"]), n_layers=int(arch["n_layers"]),
        n_heads=int(arch["n_heads"]), d_ff=int(arch["d_ff"]),
        vocab_size=int(info.get("vocab_size", language.DEFAULT_VOCAB)),
        seq_len=int(info.get("seq_len", language.DEFAULT_SEQ_LEN)),
        dropout=float(info.get("dropout", 0.0)),
    )


def next_token_nll(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean NLL in nats per predicted token; logits (B, L, V), target (B, L)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1).long())


def metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Top-1 next-token accuracy."""
    return {"accuracy": float((logits.argmax(-1) == target).float().mean()) if target.numel() else 0.0}


def baseline_loss(data: TensorDataset) -> float:
    """The unigram entropy: validation NLL of the training token frequencies."""
    return language.unigram_loss(data)


FAMILY = Family(
    name="lm",
    config_cls=LMConfig,
    build=LM,
    param_count=param_count,
    config_for=config_for,
    parse_data=language.parse_data,
    data_info=language.data_info,
    load_data=language.load_data,
    loss=next_token_nll,
    baseline_loss=baseline_loss,
    metrics=metrics,
    flags=(
        FlagSpec("vocab_size", int, language.DEFAULT_VOCAB,
                 "vocabulary of the synthetic language (a text file is read as bytes: 256)"),
        FlagSpec("order", int, language.DEFAULT_ORDER, "context length k of the synthetic language's n-gram source"),
        FlagSpec("seq_len", int, language.DEFAULT_SEQ_LEN, "tokens per training window (the model's context)"),
        FlagSpec("dropout", float, 0.0, "dropout on embeddings and in every block (nanoGPT's 0.0)"),
    ),
    tokens=lambda c: c.seq_len,
    flops_per_sample=flops_per_sample,
    description="Causal decoder-only language model (nanoGPT-style, tied head) predicting the next token.",
    train_defaults={
        # Small batches: on CPU budgets the count of optimizer steps, not tokens per step, decides
        # whether a model gets past the bigram level (measured: README, the lm family).
        "learning_rate": 3e-3, "weight_decay": 1e-4, "batch_size": 16, "warmup_steps": 50,
        "min_lr_ratio": 0.1, "eval_every": 1, "grad_clip": 1.0,
    },
)
