"""The ft_transformer family without torch: config, exact parameter count, FLOPs, flags, the Family record.

The network (and the family's own loss and metrics, if any) is in ``archhpo.models.ft_transformer``,
imported on first use: counting parameters and the command line never import torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archhpo.errors import ConfigError
from archhpo.models._family import Family, FlagSpec, Lazy, check_arch
from archhpo.models._flops import block_params, encoder_layer_flops, linear_flops
from archhpo.models.data import panel

VARIANTS = ("sequence", "tabular")


def cat_embed_dim(card: int, d_model: int) -> int:
    """Width e of a categorical embedding before its projection to d_model."""
    return max(int(8 * math.log2(card + 1)), d_model // 4)


def parse_cardinalities(text: str | Any) -> tuple[int, ...]:
    """``"100,5"`` → (100, 5); also accepts a list/tuple (e.g. from JSON data info)."""
    items = [s.strip() for s in text.split(",") if s.strip()] if isinstance(text, str) else list(text)
    try:
        cards = tuple(int(c) for c in items)
    except (TypeError, ValueError):
        raise ConfigError(
            f"cat_cardinalities must be comma-separated integers like 100,5, got {text!r}."
        ) from None
    return cards


def check_panel_fields(
    num_numerical: int, cat_cardinalities: tuple[int, ...], seq_len: int, out_dim: int, dropout: float
) -> None:
    """Validation shared by the panel families' configs."""
    for name, value in (("num_numerical", num_numerical), ("seq_len", seq_len), ("out_dim", out_dim)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}.")
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in cat_cardinalities):
        raise ConfigError(f"cat_cardinalities must be positive integers, got {cat_cardinalities!r}.")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {dropout}.")


@dataclass
class FTTransformerConfig:
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 256
    variant: str = "sequence"
    num_numerical: int = panel.DEFAULT_FEATURES
    cat_cardinalities: tuple[int, ...] = panel.DEFAULT_CARDINALITIES  # (symbol, sector)
    seq_len: int = panel.DEFAULT_SEQ_LEN
    out_dim: int = 1
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_arch(self.d_model, self.n_layers, self.n_heads, self.d_ff)
        if self.variant not in VARIANTS:
            raise ConfigError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}.")
        self.cat_cardinalities = parse_cardinalities(self.cat_cardinalities)
        check_panel_fields(
            self.num_numerical, self.cat_cardinalities, self.seq_len, self.out_dim, self.dropout
        )


def categorical_tokens_params(cardinalities: tuple[int, ...], d_model: int) -> int:
    return sum(c * cat_embed_dim(c, d_model) + cat_embed_dim(c, d_model) * d_model for c in cardinalities)


def param_count(cfg: FTTransformerConfig) -> int:
    """Exact count: equals sum(p.numel()) of FTTransformer(cfg)."""
    d, f, o, n, cards = cfg.d_model, cfg.d_ff, cfg.out_dim, cfg.num_numerical, cfg.cat_cardinalities
    tokens = d + 2 * n * d  # [CLS] + W_j, b_j per numerical feature
    if cfg.variant == "tabular":
        tokens += sum(cards) * d + len(cards) * d  # embedding tables + per-feature bias
        layers = block_params(d, f, True, False) + (cfg.n_layers - 1) * block_params(d, f, True, True)
        return tokens + layers + 2 * d + d * o + o  # head: LayerNorm + Linear
    tokens += cfg.seq_len * d + categorical_tokens_params(cards, d)
    return tokens + cfg.n_layers * block_params(d, f, False, True) + d * o + o


def categorical_tokens_flops(cardinalities: tuple[int, ...], d_model: int) -> int:
    """Forward+backward FLOPs of CategoricalTokens for one sample: Linear(e, d) per feature
    (its input, an embedding row, needs a gradient; the look-up itself costs nothing)."""
    return sum(linear_flops(1, cat_embed_dim(c, d_model), d_model) for c in cardinalities)


def flops_per_sample(cfg: FTTransformerConfig) -> int:
    """Forward+backward FLOPs of one training sample (see ``archhpo.models._flops``).

    Numerical tokens (x·W_j + b_j) and the tabular categorical table are element-wise/look-ups:
    free.  Attention runs over every token, [CLS] included.
    """
    d, cards = cfg.d_model, cfg.cat_cardinalities
    if cfg.variant == "tabular":
        s, embed = 1 + cfg.num_numerical + len(cards), 0
    else:
        s = 1 + cfg.seq_len * cfg.num_numerical + len(cards)
        embed = categorical_tokens_flops(cards, d)
    return embed + cfg.n_layers * encoder_layer_flops(s, d, cfg.d_ff) + linear_flops(1, d, cfg.out_dim)


def config_for(arch: Mapping[str, int], info: Mapping[str, Any]) -> FTTransformerConfig:
    return FTTransformerConfig(
        d_model=int(arch["d_model"]), n_layers=int(arch["n_layers"]),
        n_heads=int(arch["n_heads"]), d_ff=int(arch["d_ff"]),
        variant=str(info.get("variant") or "sequence"),
        num_numerical=int(info.get("num_numerical", panel.DEFAULT_FEATURES)),
        cat_cardinalities=parse_cardinalities(info.get("cat_cardinalities", panel.DEFAULT_CARDINALITIES)),
        seq_len=int(info.get("seq_len", panel.DEFAULT_SEQ_LEN)),
        out_dim=int(info.get("out_dim", 1)),
        dropout=float(info.get("dropout", 0.0)),
    )


# The panel families' --data (models/data/panel.py) and the task options its labels read.
PANEL_DATA_HELP = ("synthetic[:symbols=N,sectors=N,features=N,steps=N,seed=S] or a CSV/Parquet panel "
                   "(symbol, sector, price, numeric feature columns, optional date)")
PANEL_TASK_OPTIONS = ("horizon", "threshold")  # the label: price[t+h]/price[t] - 1 > threshold
PANEL_FLAGS = (
    FlagSpec("num_numerical", int, panel.DEFAULT_FEATURES, "numerical features per time step N"),
    FlagSpec("cat_cardinalities", parse_cardinalities, panel.DEFAULT_CARDINALITIES,
             "categorical cardinalities, comma-separated (symbols,sectors)"),
    FlagSpec("seq_len", int, panel.DEFAULT_SEQ_LEN, "time steps per window T"),
    FlagSpec("out_dim", int, 1, "outputs of the head (1 = binary)"),
)

FAMILY = Family(
    name="ft_transformer",
    config_cls=FTTransformerConfig,
    build=Lazy("archhpo.models.ft_transformer", "FTTransformer"),
    param_count=param_count,
    config_for=config_for,
    parse_data=panel.parse_data,
    data_info=panel.data_info,
    load_data=panel.load_data,
    loss=Lazy("archhpo.models.patchtst", "bce_loss"),
    baseline_loss=Lazy("archhpo.models.patchtst", "base_rate_loss"),
    metrics=Lazy("archhpo.models.patchtst", "binary_metrics"),
    flags=(FlagSpec("variant", str, "sequence", "sequence (token per step and feature) or tabular"),
           *PANEL_FLAGS),
    tokens=lambda c: 1 + len(c.cat_cardinalities) + c.num_numerical * (c.seq_len if c.variant == "sequence" else 1),
    flops_per_sample=flops_per_sample,
    data_help=PANEL_DATA_HELP,
    task_options=PANEL_TASK_OPTIONS,
    description="FT-Transformer on panel data: a token per feature (and step) + categorical tokens, "
    "[CLS] head.",
)
