"""The lm family without torch: config, exact parameter count, FLOPs, flags, the Family record.

The network (a causal decoder-only transformer with a tied head), its loss and metrics are in
``archhpo.models.lm``, imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archhpo.config import PARAMETRIZATIONS  # sp (nanoGPT's) and µP (docs/mup.md)
from archhpo.errors import ConfigError
from archhpo.models._family import Family, FlagSpec, Lazy, check_arch
from archhpo.models._flops import block_params, encoder_layer_flops, linear_flops
from archhpo.models.data import language

__all__ = ["FAMILY", "GPU_DATA", "GPU_ROWS", "LMConfig", "config_for", "flops_per_sample", "flops_per_token",
           "gpu_config", "loss_per", "param_count"]

# GPU scale (issue 33): a GPT-2-sized vocabulary over the synthetic language (see
# archhpo.models.data.language: 32 classes written as 50,257 tokens) at GPT-2's context of 1024
# (2048 works the same).  Bytes (vocabulary 256) would make the head 0.3% of a 124M model's FLOPs
# instead of 22%: the step a GPU would time would not be the step a GPT-2-style model takes.
GPU_SEQ_LEN = 1024
GPU_DATA = f"synthetic:vocab={language.GPT2_VOCAB},classes={language.DEFAULT_VOCAB}"
# Rows of the lm grid at these budgets (`archhpo grid --family lm --budget B --vocab-size 50257
# --seq-len 1024`), except 124M's 12 heads: GPT-2 small itself (the grid's d768/L12/ff3072 rows have
# 2..32 heads, the same count and FLOPs).  Head widths 64, 64, 128: what the flash kernel likes.
GPU_ROWS: dict[str, dict[str, int]] = {
    "124M": {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072},  # 124,439,808 (GPT-2 small)
    "200M": {"d_model": 1024, "n_layers": 12, "n_heads": 16, "d_ff": 4096},  # 203,668,480
    "2B": {"d_model": 2048, "n_layers": 32, "n_heads": 16, "d_ff": 8192},  # 1,716,492,288 (d_model and d_ff at the grid top)
}


@dataclass
class LMConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    vocab_size: int = language.DEFAULT_VOCAB
    seq_len: int = language.DEFAULT_SEQ_LEN
    dropout: float = 0.0
    parametrization: str = "sp"
    mup_base_width: int | None = None  # µP's base d_model; None: this model's own (m = 1)
    # CompleteP's base depth under µP (docs/mup.md): residual branches ×base/n_layers; None: no depth scaling
    mup_base_depth: int | None = None

    def __post_init__(self) -> None:
        check_arch(self.d_model, self.n_layers, self.n_heads, self.d_ff)
        if self.parametrization not in PARAMETRIZATIONS:
            raise ConfigError(f"parametrization must be one of {', '.join(PARAMETRIZATIONS)}, "
                              f"got {self.parametrization!r}.")
        base = self.mup_base_width
        if base is not None and (not isinstance(base, int) or isinstance(base, bool) or base < 1):
            raise ConfigError(f"mup_base_width must be a positive integer d_model, got {base!r}.")
        depth = self.mup_base_depth
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise ConfigError(f"mup_base_depth must be a positive integer n_layers, got {depth!r}.")
        for name, value, least in (("vocab_size", self.vocab_size, 2), ("seq_len", self.seq_len, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{name} must be an integer of at least {least}, got {value!r}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}.")

    @property
    def width_multiplier(self) -> float:
        """µP's m = d_model / base width; 1.0 under the standard parametrization."""
        if self.parametrization != "mup" or self.mup_base_width is None:
            return 1.0
        return self.d_model / self.mup_base_width

    @property
    def depth_multiplier(self) -> float:
        """CompleteP's n_layers / base depth under µP with a base depth; 1.0 otherwise."""
        if self.parametrization != "mup" or self.mup_base_depth is None:
            return 1.0
        return self.n_layers / self.mup_base_depth


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


def flops_per_token(cfg: LMConfig) -> int:
    """Training FLOPs per token, attention included: flops_per_sample / seq_len, exact (every
    term of a window is a multiple of seq_len).  Per token this is 6·(matmul weights) + 12·L·s·d,
    nanoGPT's ``estimate_mfu`` with its N counted as the matrices (biases, norms and the position
    table cost no matmul)."""
    total = flops_per_sample(cfg)
    assert total % cfg.seq_len == 0
    return total // cfg.seq_len


def loss_per(kind: str | None) -> str:
    """The loss is a mean over predicted tokens: a text file's tokens are its bytes (``kind`` "text"),
    and on data of unknown or mixed kind the report says both."""
    if kind == "text":
        return "byte"
    if kind in ("synthetic", "tokens"):
        return "token"
    return "token (a byte, on a text file)"


def gpu_config(row: str, seq_len: int = GPU_SEQ_LEN, vocab_size: int = language.GPT2_VOCAB) -> LMConfig:
    """A GPU-scale configuration: a row of ``GPU_ROWS`` at GPT-2's vocabulary and a context of 1024."""
    r = GPU_ROWS[row]
    return LMConfig(d_model=r["d_model"], n_layers=r["n_layers"], n_heads=r["n_heads"], d_ff=r["d_ff"],
                    vocab_size=vocab_size, seq_len=seq_len)


def config_for(arch: Mapping[str, int], info: Mapping[str, Any]) -> LMConfig:
    return LMConfig(
        d_model=int(arch["d_model"]), n_layers=int(arch["n_layers"]),
        n_heads=int(arch["n_heads"]), d_ff=int(arch["d_ff"]),
        vocab_size=int(info.get("vocab_size", language.DEFAULT_VOCAB)),
        seq_len=int(info.get("seq_len", language.DEFAULT_SEQ_LEN)),
        dropout=float(info.get("dropout", 0.0)),
        parametrization=str(info.get("parametrization") or "sp"),
        mup_base_width=None if info.get("mup_base_width") is None else int(info["mup_base_width"]),
        mup_base_depth=None if info.get("mup_base_depth") is None else int(info["mup_base_depth"]),
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
    data_help=("synthetic[:vocab=V,order=K,tokens=T,...], a UTF-8 text file (read as bytes), or "
               "tokens:PATH[,vocab=V][,val=PATH][,dtype=uint32] (token ids: nanoGPT's train.bin, or a .npy)"),
    logits_per_sample=lambda c: c.seq_len * c.vocab_size,  # a next-token head: (L, V) logits a window
    loss_per=loss_per,
    description="Causal decoder-only language model (nanoGPT-style, tied head) predicting the next token.",
    train_defaults={
        # Small batches: on CPU budgets the count of optimizer steps, not tokens per step, decides
        # whether a model gets past the bigram level (measured: docs/guide.md, the lm family).
        "learning_rate": 3e-3, "weight_decay": 1e-4, "batch_size": 16, "warmup_steps": 50,
        "min_lr_ratio": 0.1, "eval_every": 1, "grad_clip": 1.0,
    },
)
