"""The csn_transformer family without torch: config, exact parameter count, FLOPs, flags, the Family record.

The network (and the family's own loss and metrics, if any) is in ``archhpo.models.csn_transformer``,
imported on first use: counting parameters and the command line never import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archhpo.errors import ConfigError
from archhpo.models._family import Family, Lazy, check_arch
from archhpo.models._flops import block_params, encoder_layer_flops, linear_flops
from archhpo.models.data import panel
from archhpo.models.ft_transformer_spec import (
    PANEL_DATA_HELP,
    PANEL_FLAGS,
    PANEL_TASK_OPTIONS,
    categorical_tokens_flops,
    categorical_tokens_params,
    check_panel_fields,
    parse_cardinalities,
)


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
    build=Lazy("archhpo.models.csn_transformer", "CSNTransformer"),
    param_count=param_count,
    config_for=config_for,
    parse_data=panel.parse_data,
    data_info=panel.data_info,
    load_data=panel.load_data,
    loss=Lazy("archhpo.models.patchtst", "bce_loss"),
    baseline_loss=Lazy("archhpo.models.patchtst", "base_rate_loss"),
    metrics=Lazy("archhpo.models.patchtst", "binary_metrics"),
    flags=PANEL_FLAGS,
    tokens=lambda c: 2 + len(c.cat_cardinalities) + c.seq_len,  # both paths' tokens, held together
    flops_per_sample=flops_per_sample,
    data_help=PANEL_DATA_HELP,
    task_options=PANEL_TASK_OPTIONS,
    description="Dual-path transformer: categorical tokens and per-step numerical tokens, joint [CLS] head.",
)
