"""PatchTST-style binary classifier over multivariate windows (docs/design.md §4), the default family."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.models._family import TensorDataset
from archhpo.models.patchtst_spec import (  # noqa: F401 - re-exported
    FAMILY,
    PatchTSTConfig,
    config_for,
    estimate,
    flops_per_sample,
    param_count,
)


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
