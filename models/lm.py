"""A causal decoder-only language model in nanoGPT's manner, the ``lm`` family.

Token + learned position embeddings, n_layers pre-norm ``Block``s (``archhpo.models._blocks``) with
a causal mask, a final LayerNorm and a linear head over the vocabulary whose weight is TIED to
the token embedding (nanoGPT's choice; the head has no bias).  Initialisation follows nanoGPT:
N(0, 0.02) weights, zero biases, and the residual projections (attention out, FFN second layer)
scaled by 1/sqrt(2·n_layers).  The loss is the mean next-token NLL in nats per token.

Under µP (``parametrization="mup"``, docs/mup.md) with m = d_model / mup_base_width: the blocks'
matrices start with variance /m, the head's input is scaled by 1/m, attention scores by
sqrt(d_head_base)/d_head, and ``optimizer_groups`` gives AdamW the matrices' rate /m and eps /m.
With CompleteP's t = n_layers / ``mup_base_depth`` too: each residual branch ×1/t, the residual
projections' init the base depth's, and the blocks' eps /(m·t).  Data
(``archhpo.models.data.language``): a synthetic language with an exact entropy rate (``--data
synthetic``), or any UTF-8 text file as bytes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archhpo.models._blocks import Block
from archhpo.models._family import TensorDataset
from archhpo.models.data import language
from archhpo.models.lm_spec import FAMILY, LMConfig, config_for, flops_per_sample, param_count

__all__ = ["ADAM_EPS", "FAMILY", "HEAD_MULTIPLE", "LM", "LMConfig", "config_for", "flops_per_sample", "next_token_nll",
           "padded_vocab", "param_count", "tied_head"]


# AdamW's own default eps, the one every standard-parametrization trial trains with; µP divides it by m.
ADAM_EPS = 1e-8
# On CUDA the tied head's matmul runs over the vocabulary padded to a multiple of this (50,257 ->
# 50,304, as nanoGPT pads it): only the kernel; the weight, the count and the logits stay exact.
HEAD_MULTIPLE = 64


def padded_vocab(vocab: int, device_type: str, multiple: int = HEAD_MULTIPLE) -> int:
    """The rows the head's kernel runs over on `device_type`: `vocab` up to a multiple of `multiple`
    on CUDA; `vocab` itself elsewhere (CPU logits stay bit for bit)."""
    if device_type != "cuda" or multiple <= 1:
        return vocab
    return -(-vocab // multiple) * multiple


def tied_head(x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    """x @ weight.T with the weight padded by zero rows to `rows` for the kernel, the logits sliced
    back to the weight's own rows (the padding's gradient is dropped with it)."""
    vocab = weight.shape[0]
    if rows <= vocab:
        return F.linear(x, weight)
    return F.linear(x, F.pad(weight, (0, 0, 0, rows - vocab)))[..., :vocab]


class LM(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, m = cfg.d_model, cfg.width_multiplier
        self.tok_embed = nn.Embedding(cfg.vocab_size, d)
        self.pos_embed = nn.Embedding(cfg.seq_len, d)
        self.drop = nn.Dropout(cfg.dropout)
        # Scores q·k/sqrt(d_head) times 1/sqrt(m) = sqrt(d_head_base)/d_head at a fixed head count.
        qk = 1.0 if m == 1.0 else 1.0 / math.sqrt(m)
        residual = 1.0 / cfg.depth_multiplier
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, cfg.d_ff, dropout=cfg.dropout, qk_scale=qk,
                                          residual_scale=residual) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(d)
        # True above the diagonal = a later token may not be attended to; not saved (derived).
        causal = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
        self.causal: torch.Tensor
        self.register_buffer("causal", causal, persistent=False)
        self.head_multiple = HEAD_MULTIPLE  # 1: the head's kernel over the bare vocabulary (a bench variant)
        self._init_weights()

    def _init_weights(self) -> None:
        # µP: a hidden matrix's variance /m (std /sqrt(m)); the embeddings keep theirs.  m = 1 draws
        # exactly the standard model's numbers (the same calls on the same generator).
        hidden = 0.02 / math.sqrt(self.cfg.width_multiplier)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=hidden if isinstance(module, nn.Linear) else 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # nanoGPT: each block adds two projections to the residual stream; keep its variance flat.
        # CompleteP scales the branches by 1/t instead, so the projections start as the base depth's.
        depth = self.cfg.n_layers if self.cfg.mup_base_depth is None or self.cfg.depth_multiplier == 1.0 \
            else self.cfg.mup_base_depth
        for block in self.blocks:
            assert isinstance(block, Block)  # for the type checker: a ModuleList holds Modules
            for proj in (block.attn.out, block.ff[-1]):
                assert isinstance(proj, nn.Linear)
                nn.init.normal_(proj.weight, std=hidden / math.sqrt(2 * depth))

    def hidden_matrices(self) -> list[torch.Tensor]:
        """The blocks' Linear weights: µP's hidden matrices (embeddings, biases and norms are not)."""
        return [mod.weight for mod in self.blocks.modules() if isinstance(mod, nn.Linear)]

    def optimizer_groups(self, lr: float, weight_decay: float) -> list[dict[str, Any]] | None:
        """AdamW's parameter groups under µP: the hidden matrices at lr/m, every group at eps/m,
        and the matrices' decay ×m so that the per-step shrink lr·wd is the same at every width;
        with CompleteP's depth multiplier t != 1 every block parameter at eps/(m·t) (three groups);
        None under the standard parametrization (one group, the trainer's defaults)."""
        if self.cfg.parametrization != "mup":
            return None
        m, t = self.cfg.width_multiplier, self.cfg.depth_multiplier
        hidden = self.hidden_matrices()
        ids = {id(p) for p in hidden}
        groups = [{"params": hidden, "lr": lr / m, "weight_decay": weight_decay * m, "eps": ADAM_EPS / (m * t)}]
        if t != 1.0:  # CompleteP: the blocks' biases and norms at eps/(m·t) too; embeddings and final norm at eps/m
            vectors = [p for p in self.blocks.parameters() if id(p) not in ids]
            ids |= {id(p) for p in vectors}
            groups.append({"params": vectors, "lr": lr, "weight_decay": weight_decay, "eps": ADAM_EPS / (m * t)})
        rest = [p for p in self.parameters() if id(p) not in ids]
        return [*groups, {"params": rest, "lr": lr, "weight_decay": weight_decay, "eps": ADAM_EPS / m}]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]  # ids: (B, L), L <= seq_len
        if length > self.cfg.seq_len:
            raise ValueError(f"input has {length} tokens but seq_len is {self.cfg.seq_len}.")
        pos = self.pos_embed(torch.arange(length, device=ids.device))  # (L, d)
        h = self.drop(self.tok_embed(ids) + pos)  # (B, L, d)
        # Off the CPU, SDPA masks causally itself (is_causal), which lets CUDA run the flash kernel;
        # on the CPU the explicit mask stays: archhpo's dropout kernels take it, and CPU studies keep
        # their losses bit for bit.
        mask = self.causal[:length, :length] if ids.device.type == "cpu" else None  # (L, L)
        for block in self.blocks:
            h = block(h, attn_mask=mask, is_causal=True)  # (B, L, d)
        out = self.norm(h)  # (B, L, d)
        m = self.cfg.width_multiplier
        if m != 1.0:  # µP: the tied head's input ×1/m (nanoGPT-mup scales x, not the shared weight)
            out = out / m
        rows = padded_vocab(self.cfg.vocab_size, ids.device.type, self.head_multiple)
        return tied_head(out, self.tok_embed.weight, rows)  # (B, L, V): the tied head


def next_token_nll(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean NLL in nats per predicted token; logits (B, L, V), target (B, L)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1).long())


def metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Top-1 next-token accuracy."""
    return {"accuracy": float((logits.argmax(-1) == target).float().mean()) if target.numel() else 0.0}


def baseline_loss(data: TensorDataset) -> float:
    """The unigram entropy: validation NLL of the training token frequencies."""
    return language.unigram_loss(data)
