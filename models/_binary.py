"""Loss, baseline and metrics shared by the binary (BCE-with-logits) families."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models._family import TensorDataset


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
