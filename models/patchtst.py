"""PatchTST-style binary classifier over multivariate windows (SPEC §4), the default family."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.errors import ConfigError
from archhpo.models._family import Family, FlagSpec, TensorDataset, check_arch
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


class PatchTST(nn.Module):
    def __init__(self, cfg: PatchTSTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, p = cfg.d_model, cfg.n_patches
        self.patch_embed = nn.Linear(cfg.patch_len * cfg.num_features, d)
        self.pos_embed = nn.Parameter(torch.zeros(p, d))
        nn.init.normal_(self.pos_embed, std=0.02)
        # A ModuleList rather than nn.TransformerEncoder: same parameters, no nested-tensor
        # warning for norm_first layers.
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d, cfg.n_heads, cfg.d_ff, dropout=cfg.dropout, activation="gelu",
                batch_first=True, norm_first=True,
            )
            for _ in range(cfg.n_layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(p * d, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b = x.shape[0]  # x: (B, T, F)
        patches = x.unfold(1, cfg.patch_len, cfg.stride)  # (B, P, F, patch_len)
        patches = patches.reshape(b, cfg.n_patches, -1)  # (B, P, F*patch_len)
        h = self.patch_embed(patches) + self.pos_embed  # (B, P, d)
        for layer in self.layers:
            h = layer(h)  # (B, P, d)
        h = self.norm(h).reshape(b, -1)  # (B, P*d)
        logits = self.head(h)  # (B, classes)
        return logits.squeeze(-1) if cfg.num_classes == 1 else logits


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


def bce_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits.float(), target.float())


def base_rate_loss(data: TensorDataset) -> float:
    """Validation BCE of always predicting the training base rate."""
    p = float(data.train_target.float().mean().clamp(1e-6, 1 - 1e-6))
    y = data.val_target.float()
    return float(-(y * math.log(p) + (1 - y) * math.log(1 - p)).mean())


def binary_metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    pred = logits.float() > 0
    y = target > 0.5
    tp = float((pred & y).sum())
    precision = tp / max(float(pred.sum()), 1.0)
    recall = tp / max(float(y.sum()), 1.0)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return {"accuracy": float((pred == y).float().mean()), "precision": precision, "recall": recall, "f1": f1}


FAMILY = Family(
    name="patchtst",
    config_cls=PatchTSTConfig,
    build=PatchTST,
    param_count=param_count,
    config_for=config_for,
    parse_data=timeseries.parse_data,
    data_info=timeseries.data_info,
    load_data=timeseries.load_data,
    loss=bce_loss,
    baseline_loss=base_rate_loss,
    metrics=binary_metrics,
    flags=(FlagSpec("num_features", int, timeseries.DEFAULT_FEATURES, "number of input features F"),
           FlagSpec("price_column", timeseries.column_name, "price",
                    "the column of a CSV/Parquet --data file holding the price the labels come from")),
    estimate=estimate,
    tokens=lambda cfg: cfg.n_patches,
    flops_per_sample=flops_per_sample,
    description="PatchTST-style transformer classifying 60-step multivariate windows (binary).",
)
