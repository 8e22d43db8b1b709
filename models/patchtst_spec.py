"""The patchtst family without torch: config, exact parameter count, FLOPs, flags, the Family record.

The network, loss and metrics are in ``archhpo.models.patchtst``, imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archhpo.errors import ConfigError
from archhpo.models._family import Family, FlagSpec, Lazy, check_arch
from archhpo.models._flops import encoder_layer_flops, linear_flops
from archhpo.models.data import timeseries


@dataclass
class PatchTSTConfig:
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 256
    num_features: int = timeseries.DEFAULT_FEATURES
    patch_len: int = 10
    stride: int = 5
    context_length: int = 60
    num_classes: int = 1
    dropout: float = 0.1

    def __post_init__(self) -> None:
        check_arch(self.d_model, self.n_layers, self.n_heads, self.d_ff)
        if self.num_features < 1:
            raise ConfigError(f"num_features must be at least 1, got {self.num_features}.")
        if not 0 < self.patch_len <= self.context_length or self.stride < 1:
            raise ConfigError("patch_len must be in 1..context_length and stride at least 1.")
        if self.num_classes < 1:
            raise ConfigError(f"num_classes must be at least 1, got {self.num_classes}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}.")

    @property
    def n_patches(self) -> int:
        return (self.context_length - self.patch_len) // self.stride + 1


def param_count(cfg: PatchTSTConfig) -> int:
    """Exact count: equals sum(p.numel()) of PatchTST(cfg)."""
    d, f, p, c = cfg.d_model, cfg.d_ff, cfg.n_patches, cfg.num_classes
    embed = cfg.patch_len * cfg.num_features * d + d + p * d
    # in_proj 3d²+3d, out_proj d²+d, linear1 d·f+f, linear2 f·d+d, two LayerNorms 4d
    layer = 4 * d * d + 2 * d * f + 9 * d + f
    return embed + cfg.n_layers * layer + 2 * d + p * d * c + c


def flops_per_sample(cfg: PatchTSTConfig) -> int:
    """Forward+backward FLOPs of one training window (see ``archhpo.models._flops``)."""
    d, p = cfg.d_model, cfg.n_patches
    embed = linear_flops(p, cfg.patch_len * cfg.num_features, d, input_grad=False)  # reads the data
    head = linear_flops(1, p * d, cfg.num_classes)
    return embed + cfg.n_layers * encoder_layer_flops(p, d, cfg.d_ff) + head


def estimate(cfg: PatchTSTConfig) -> int:
    """The legacy design formula (ignores biases and norms), shown beside the exact count."""
    d, p = cfg.d_model, cfg.n_patches
    return (
        cfg.patch_len * cfg.num_features * d + p * d
        + cfg.n_layers * (4 * d * d + 2 * d * cfg.d_ff + 4 * d) + p * d * cfg.num_classes
    )


def config_for(arch: Mapping[str, int], info: Mapping[str, Any]) -> PatchTSTConfig:
    return PatchTSTConfig(
        d_model=int(arch["d_model"]), n_layers=int(arch["n_layers"]),
        n_heads=int(arch["n_heads"]), d_ff=int(arch["d_ff"]),
        num_features=int(info.get("num_features", timeseries.DEFAULT_FEATURES)),
        dropout=float(info.get("dropout", 0.1)),
    )


FAMILY = Family(
    name="patchtst",
    config_cls=PatchTSTConfig,
    build=Lazy("archhpo.models.patchtst", "PatchTST"),
    param_count=param_count,
    config_for=config_for,
    parse_data=timeseries.parse_data,
    data_info=timeseries.data_info,
    load_data=timeseries.load_data,
    loss=Lazy("archhpo.models.patchtst", "bce_loss"),
    baseline_loss=Lazy("archhpo.models.patchtst", "base_rate_loss"),
    metrics=Lazy("archhpo.models.patchtst", "binary_metrics"),
    flags=(FlagSpec("num_features", int, timeseries.DEFAULT_FEATURES, "number of input features F"),
           FlagSpec("price_column", timeseries.column_name, "price",
                    "the column of a CSV/Parquet --data file holding the price the labels come from")),
    estimate=estimate,
    tokens=lambda cfg: cfg.n_patches,
    flops_per_sample=flops_per_sample,
    data_help="synthetic[:features=N,steps=N,seed=S] or a CSV/Parquet path (a price column and numeric features)",
    task_options=("horizon", "threshold"),  # its labels: price[t+h]/price[t] - 1 > threshold
    description="PatchTST-style transformer classifying 60-step multivariate windows (binary).",
)
