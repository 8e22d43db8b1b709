"""Character-level [CLS] classifier for short strings such as domain names (docs/design.md §4).

Input: ``[CLS] + characters`` as ids (see ``models.data.domains.encode``: lower-cased, dots and
every other character outside a-z 0-9 '-' '_' dropped, padded with PAD=0 or cut to max_len).
Token + learned position embeddings, n_layers pre-norm ``nn.TransformerEncoderLayer`` with
padding masked out of attention, a LayerNorm on the [CLS] output and a linear head over
num_classes logits trained with cross-entropy (binary tasks use two logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.models._blocks import EncoderLayer
from archhpo.models._family import TensorDataset
from archhpo.models.char_cls_spec import (  # noqa: F401 - re-exported
    FAMILY,
    CharClsConfig,
    config_for,
    flops_per_sample,
    param_count,
)
from archhpo.models.data.domains import ALPHABET, CLS_ID, MAX_LEN, PAD_ID, VOCAB_SIZE, encode

__all__ = [
    "ALPHABET", "CLS_ID", "FAMILY", "MAX_LEN", "PAD_ID", "VOCAB_SIZE", "CharCls", "CharClsConfig",
    "baseline_loss", "config_for", "cross_entropy_loss", "encode", "flops_per_sample", "metrics",
    "param_count",
]


class CharCls(nn.Module):
    def __init__(self, cfg: CharClsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.tok_embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)
        self.pos_embed = nn.Embedding(cfg.max_len, d)
        # Small embeddings as in GPT-style pre-norm stacks (the default N(0, 1) would swamp
        # the residual stream that the layers add to); the PAD row stays zero.
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed.weight, std=0.02)
        with torch.no_grad():
            self.tok_embed.weight[PAD_ID].zero_()
        # A ModuleList of EncoderLayer rather than nn.TransformerEncoder: same parameters, no nested-tensor
        # warning for norm_first layers.
        self.layers = nn.ModuleList(
            EncoderLayer(
                d, cfg.n_heads, cfg.d_ff, dropout=cfg.dropout, activation="gelu",
                batch_first=True, norm_first=True,
            )
            for _ in range(cfg.n_layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]  # ids: (B, L), L <= max_len (shorter batches are fine)
        if length > self.cfg.max_len:
            raise ValueError(f"input has {length} positions but max_len is {self.cfg.max_len}.")
        pos = self.pos_embed(torch.arange(length, device=ids.device))  # (L, d)
        h = self.tok_embed(ids) + pos  # (B, L, d)
        # True = ignored as a key.  The CLS token at position 0 is never PAD, so no row has
        # every key masked (which would give NaN attention).
        pad_mask = ids == PAD_ID  # (B, L)
        for layer in self.layers:
            h = layer(h, src_key_padding_mask=pad_mask)  # (B, L, d)
        cls = self.norm(h[:, 0])  # (B, d)
        return self.head(cls)  # (B, num_classes)


def cross_entropy_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # float(): under bf16 autocast the logits arrive in bf16; the loss wants fp32.
    return F.cross_entropy(logits.float(), target.long())


def baseline_loss(data: TensorDataset) -> float:
    """Validation cross-entropy of always predicting the training class frequencies."""
    k = int(data.info.get("num_classes", 0)) or int(max(data.train_target.max(), data.val_target.max())) + 1
    counts = torch.bincount(data.train_target.long().cpu(), minlength=k).double()
    # A class absent from training would get probability 0 and an infinite loss; floor it.
    p = (counts / counts.sum()).clamp_min(1e-6)
    p = p / p.sum()
    return float(-p.log()[data.val_target.long().cpu()].mean())


def metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Accuracy, precision, recall and F1 of the argmax prediction.

    Binary (two logits): precision/recall/F1 of the positive class 1.  More classes: macro
    averages of the per-class scores over the classes present in the target or the
    predictions (sklearn's default labels); an undefined ratio (no predictions / no support)
    counts as 0, as sklearn's zero_division default does.
    """
    pred = logits.float().argmax(-1)
    y = target.long()
    accuracy = float((pred == y).float().mean()) if y.numel() else 0.0
    if logits.shape[-1] == 2:
        classes = torch.tensor([1], device=y.device)
    else:
        classes = torch.unique(torch.cat([y, pred]))
    onehot_pred = pred[:, None] == classes[None, :]  # (N, C')
    onehot_true = y[:, None] == classes[None, :]  # (N, C')
    tp = (onehot_pred & onehot_true).sum(0).double()
    n_pred = onehot_pred.sum(0).double()
    n_true = onehot_true.sum(0).double()
    precision = torch.where(n_pred > 0, tp / n_pred.clamp_min(1), torch.zeros_like(tp))
    recall = torch.where(n_true > 0, tp / n_true.clamp_min(1), torch.zeros_like(tp))
    denom = precision + recall
    f1 = torch.where(denom > 0, 2 * precision * recall / denom.clamp_min(1e-12), torch.zeros_like(tp))
    return {
        "accuracy": accuracy,
        "precision": float(precision.mean()) if classes.numel() else 0.0,
        "recall": float(recall.mean()) if classes.numel() else 0.0,
        "f1": float(f1.mean()) if classes.numel() else 0.0,
    }
