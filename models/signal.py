"""Causal multi-channel signal transformer with swappable input encoders (docs/design.md §4).

Inputs x (B, T, C): C channels v(t).  An encoder turns them into d-wide tokens, fixed sinusoidal
positions p(t) are added, n_layers causal pre-norm ``nn.TransformerEncoderLayer`` blocks and a
final LayerNorm follow, and a head ``Linear(d, K)`` gives per-step logits over K quantile bins of
the NEXT step's target.  Encoders (``encoder``), v_k the k-th channel: ``sum`` (one shared W v_k plus
a channel embedding e_k), ``linear`` (W_k v_k + b_k per channel), ``linear-ortho`` (linear plus an
orthogonality penalty on the W_k, ``extra_loss``), ``linear-ppe`` (linear with p through
Linear(d, d)), ``mlp`` (an MLP over v), ``concat`` (C blocks of width d/C), ``ci`` (one shared
backbone per channel alone, the C final states into the head) and ``cat`` (a token per step and
channel, attention causal across steps and free within one).  Each encoder's formula and
initialisation: docs/encoder_audit.md.  Everything follows Lehtinen (2026), "An Empirical Audit of
Input Encoders for Multi-Channel Signal Transformers" (OssiLehtinen/channel-encoder-audit).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.errors import ConfigError
from archhpo.models._blocks import EncoderLayer
from archhpo.models._family import TensorDataset
from archhpo.models.data import multisignal
from archhpo.models.signal_spec import (  # noqa: F401 - re-exported
    DEFAULT_DROPOUT,
    ENCODERS,
    FAMILY,
    IGNORE_INDEX,
    ORTHO_LAMBDA,
    SignalConfig,
    batch_flops,
    config_for,
    flops_per_sample,
    param_count,
)


def sinusoidal_positions(length: int, d: int) -> torch.Tensor:
    """The fixed sin/cos table of "Attention is all you need": (length, d), odd d allowed."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (T, 1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))  # (ceil(d/2),)
    table = torch.zeros(length, d)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div[: d // 2])
    return table


def block_causal_mask(steps: int, per_step: int, device: torch.device | None = None) -> torch.Tensor:
    """(steps*per_step)² bool attention mask, True = may NOT attend, for tokens ordered step-major.

    Token i belongs to step i // per_step; it may attend to every token of its own or an earlier
    step.  per_step 1 is the usual causal mask; per_step C is cat's "causal across steps, free
    within a step".
    """
    step = torch.arange(steps, device=device).repeat_interleave(per_step)  # (N,)
    return step[None, :] > step[:, None]  # (N, N): blocked iff the key's step is later


# ---------------------------------------------------------------------------- encoders
# Each maps v (B, T, C) and the positions p (T, d) to tokens (B, T, d); ci/cat are handled by
# the model because they change the token layout.


class SumEncoder(nn.Module):
    """sum_k (W v_k + e_k) + p = W (sum_k v_k) + sum_k e_k + p: channel identity is thrown away."""

    def __init__(self, cfg: SignalConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.d_model))  # W, shared by all channels
        self.chan = nn.Parameter(torch.empty(cfg.channels, cfg.d_model))  # e_k
        nn.init.uniform_(self.weight, -1.0, 1.0)  # as the paper's Linear(1, d, bias=False) would
        nn.init.normal_(self.chan, std=1.0)  # as the paper's nn.Embedding(C, d) would

    def forward(self, v: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return v.sum(-1, keepdim=True) * self.weight + self.chan.sum(0) + p  # (B, T, d)


class LinearEncoder(nn.Module):
    """sum_k (W_k v_k + b_k) + p, optionally with p replaced by Linear(d, d)(p) ("ppe")."""

    def __init__(self, cfg: SignalConfig, ppe: bool = False) -> None:
        super().__init__()
        c, d = cfg.channels, cfg.d_model
        self.weight = nn.Parameter(torch.empty(c, d))  # row k is W_k
        self.bias = nn.Parameter(torch.empty(c, d))  # row k is b_k
        # The paper's: W ~ N(0, std 1/sqrt(d)) (a standard deviation, nn.init.normal_'s std), b = 0.
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(d))
        nn.init.zeros_(self.bias)
        self.pos_proj = nn.Linear(d, d) if ppe else None

    def forward(self, v: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        pos = self.pos_proj(p) if self.pos_proj is not None else p  # (T, d)
        return v @ self.weight + self.bias.sum(0) + pos  # (B, T, C) @ (C, d) -> (B, T, d)

    def ortho_penalty(self) -> torch.Tensor:
        """sum_{i != j} (W_i . W_j)^2 / 2, i.e. each unordered pair once."""
        gram = self.weight @ self.weight.T  # (C, C)
        off = gram - torch.diag_embed(torch.diagonal(gram))
        return off.pow(2).sum() / 2


class MLPEncoder(nn.Module):
    """W2 GELU(W1 v + b1) + b2 + p: channels mixed non-linearly before the backbone."""

    def __init__(self, cfg: SignalConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.channels, cfg.d_model)
        self.fc2 = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, v: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(v))) + p  # (B, T, d)


class ConcatEncoder(nn.Module):
    """C blocks Linear(1, d/C), one per channel, concatenated into d, + p."""

    def __init__(self, cfg: SignalConfig) -> None:
        super().__init__()
        c, w = cfg.channels, cfg.d_model // cfg.channels
        self.weight = nn.Parameter(torch.empty(c, w))  # block k's Linear(1, d/C) weight
        self.bias = nn.Parameter(torch.empty(c, w))
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(w))  # the paper's: N(0, std 1/sqrt(d/C)), b = 0
        nn.init.zeros_(self.bias)

    def forward(self, v: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        blocks = v.unsqueeze(-1) * self.weight + self.bias  # (B, T, C, d/C)
        return blocks.flatten(2) + p  # (B, T, d), channel k in columns k*d/C..(k+1)*d/C-1


# ---------------------------------------------------------------------------- model


class SignalTransformer(nn.Module):
    pos: torch.Tensor  # a buffer
    def __init__(self, cfg: SignalConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, c, k = cfg.d_model, cfg.channels, cfg.num_bins
        # Non-persistent: a pure function of the config, so checkpoints need not carry it.
        self.register_buffer("pos", sinusoidal_positions(cfg.seq_len, d), persistent=False)
        # Any: which of them is set depends on the encoder (forward reads only the one it set)
        self.encoder: Any = None
        self.scalar_embed: Any = None  # ci, cat: shared Linear(1, d)
        self.chan_embed: Any = None  # cat: (C, d)
        if cfg.encoder == "sum":
            self.encoder = SumEncoder(cfg)
        elif cfg.encoder in ("linear", "linear-ortho", "linear-ppe"):
            self.encoder = LinearEncoder(cfg, ppe=cfg.encoder == "linear-ppe")
        elif cfg.encoder == "mlp":
            self.encoder = MLPEncoder(cfg)
        elif cfg.encoder == "concat":
            self.encoder = ConcatEncoder(cfg)
        else:  # ci, cat
            self.scalar_embed = nn.Linear(1, d)
            if cfg.encoder == "cat":
                self.chan_embed = nn.Parameter(torch.empty(c, d))
                nn.init.normal_(self.chan_embed, std=1.0)  # as the paper's nn.Embedding(C, d)
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
        self.head = nn.Linear(c * d if cfg.encoder == "ci" else d, k)

    def _backbone(self, h: torch.Tensor, mask: torch.Tensor, causal: bool) -> torch.Tensor:
        for layer in self.layers:
            # is_causal is only a hint that mask is the square causal mask (lets SDPA pick a
            # causal kernel); the cat mask is not, so it goes without the hint.
            h = layer(h, src_mask=mask, is_causal=causal)
        return self.norm(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, t, c = x.shape  # x: (B, T, C)
        if c != cfg.channels or t > cfg.seq_len:
            raise ConfigError(
                f"Input has {c} channels and {t} steps but the model expects {cfg.channels} channels "
                f"and at most {cfg.seq_len} steps; build it with matching channels/seq_len."
            )
        p = self.pos[:t].to(x.dtype)  # (T, d)
        if cfg.encoder == "cat":
            tok = self.scalar_embed(x.unsqueeze(-1)) + self.chan_embed + p[:, None, :]  # (B, T, C, d)
            mask = block_causal_mask(t, c, x.device)  # (T*C, T*C), token i = step*C + channel
            h = self._backbone(tok.reshape(b, t * c, -1), mask, False)  # (B, T*C, d)
            return self.head(h.reshape(b, t, c, -1).mean(2))  # (B, T, d) -> (B, T, K)

        causal = block_causal_mask(t, 1, x.device)  # (T, T)
        if cfg.encoder == "ci":
            v = x.transpose(1, 2).reshape(b * c, t, 1)  # (B*C, T, 1): every channel its own sequence
            h = self._backbone(self.scalar_embed(v) + p, causal, True)  # (B*C, T, d)
            h = h.reshape(b, c, t, -1).transpose(1, 2).flatten(2)  # (B, T, C*d)
            return self.head(h)  # (B, T, K)

        h = self._backbone(self.encoder(x, p), causal, True)  # (B, T, d)
        return self.head(h)  # (B, T, K)

    def extra_loss(self) -> torch.Tensor:
        """Training-only penalty: the orthogonality term for linear-ortho, zero otherwise."""
        if self.cfg.encoder == "linear-ortho":
            return ORTHO_LAMBDA * self.encoder.ortho_penalty()
        return self.head.weight.new_zeros(())


def binned_nll(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over all B*T steps, mean over the non-ignored ones (logits (B, T, K), target (B, T))."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX
    )


def frequency_baseline(data: TensorDataset) -> float:
    """Validation NLL of predicting the training bin frequencies (about log K for quantile bins)."""
    k = int(data.info.get("num_bins", multisignal.DEFAULT_BINS))
    train = data.train_target[data.train_target != IGNORE_INDEX]
    val = data.val_target[data.val_target != IGNORE_INDEX]
    # +1 smoothing so a bin unseen in training does not give an infinite loss.
    counts = torch.bincount(train, minlength=k).double() + 1.0
    log_p = torch.log(counts / counts.sum())
    return float(-log_p[val].mean())


def accuracy(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    keep = target != IGNORE_INDEX
    hits = (logits.argmax(-1) == target) & keep
    return {"accuracy": float(hits.sum()) / max(float(keep.sum()), 1.0)}
