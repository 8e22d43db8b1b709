"""The lm family without torch: config, exact parameter count, FLOPs, flags, the Family record.

The network (a causal decoder-only transformer with a tied head), its loss and metrics are in
``archhpo.models.lm``, imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archhpo.errors import ConfigError
from archhpo.models._family import Family, FlagSpec, Lazy, check_arch
from archhpo.models._flops import block_params, encoder_layer_flops, linear_flops
from archhpo.models.data import language

__all__ = ["FAMILY", "LMConfig", "config_for", "flops_per_sample", "param_count"]


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


FAMILY = Family(
    name="lm",
    config_cls=LMConfig,
    build=Lazy("archhpo.models.lm", "LM"),
    param_count=param_count,
    config_for=config_for,
    parse_data=language.parse_data,
    data_info=language.data_info,
    load_data=language.load_data,
    loss=Lazy("archhpo.models.lm", "next_token_nll"),
    baseline_loss=Lazy("archhpo.models.lm", "baseline_loss"),
    metrics=Lazy("archhpo.models.lm", "metrics"),
    flags=(
        FlagSpec("vocab_size", int, language.DEFAULT_VOCAB,
                 "vocabulary of the synthetic language (a text file is read as bytes: 256)"),
        FlagSpec("order", int, language.DEFAULT_ORDER, "context length k of the synthetic language's n-gram source"),
        FlagSpec("seq_len", int, language.DEFAULT_SEQ_LEN, "tokens per training window (the model's context)"),
        FlagSpec("dropout", float, 0.0, "dropout on embeddings and in every block (nanoGPT's 0.0)"),
    ),
    tokens=lambda c: c.seq_len,
    flops_per_sample=flops_per_sample,
    data_unit="tokens",
    description="Causal decoder-only language model (nanoGPT-style, tied head) predicting the next token.",
    train_defaults={
        # Small batches: on CPU budgets the count of optimizer steps, not tokens per step, decides
        # whether a model gets past the bigram level (measured: docs/guide.md, the lm family).
        "learning_rate": 3e-3, "weight_decay": 1e-4, "batch_size": 16, "warmup_steps": 50,
        "min_lr_ratio": 0.1, "eval_every": 1, "grad_clip": 1.0,
    },
)
