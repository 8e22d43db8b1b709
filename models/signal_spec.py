"""The signal family without torch: config, exact parameter count, FLOPs, flags, the Family record.

The network (and the family's own loss and metrics, if any) is in ``archhpo.models.signal``,
imported on first use: counting parameters and the command line never import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archhpo.errors import ConfigError
from archhpo.models._family import Family, FlagSpec, Lazy, check_arch
from archhpo.models._flops import encoder_layer_flops, linear_flops
from archhpo.models.data import multisignal

ENCODERS = ("sum", "linear", "linear-ortho", "linear-ppe", "mlp", "concat", "ci", "cat")
ORTHO_LAMBDA = 0.01
DEFAULT_DROPOUT = 0.1  # the paper's, in every transformer layer
IGNORE_INDEX = multisignal.IGNORE_INDEX


@dataclass
class SignalConfig:
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 256
    encoder: str = "linear"
    channels: int = multisignal.DEFAULT_CHANNELS
    num_bins: int = multisignal.DEFAULT_BINS
    seq_len: int = multisignal.DEFAULT_LENGTH  # longest sequence accepted (sizes the position buffer)
    dropout: float = DEFAULT_DROPOUT

    def __post_init__(self) -> None:
        check_arch(self.d_model, self.n_layers, self.n_heads, self.d_ff)
        if self.encoder not in ENCODERS:
            raise ConfigError(f"encoder must be one of {', '.join(ENCODERS)}, got {self.encoder!r}.")
        for name in ("channels", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}.")
        if not isinstance(self.num_bins, int) or isinstance(self.num_bins, bool) or self.num_bins < 2:
            raise ConfigError(f"num_bins must be an integer of at least 2, got {self.num_bins!r}.")
        if self.encoder == "concat" and self.d_model % self.channels:
            raise ConfigError(
                f"The concat encoder needs channels ({self.channels}) to divide d_model "
                f"({self.d_model}); pick another d_model or encoder."
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}.")


def param_count(cfg: SignalConfig) -> int:
    """Exact count: equals sum(p.numel()) of SignalTransformer(cfg) for every encoder."""
    d, f, c, k = cfg.d_model, cfg.d_ff, cfg.channels, cfg.num_bins
    encoder = {
        "sum": d + c * d,  # W + e_k
        "linear": 2 * c * d,  # W_k + b_k
        "linear-ortho": 2 * c * d,
        "linear-ppe": 2 * c * d + d * d + d,  # + Linear(d, d) on p
        "mlp": c * d + d + d * d + d,  # Linear(C, d) + Linear(d, d)
        "concat": 2 * d,  # C blocks of Linear(1, d/C): C * 2 * d/C
        "ci": 2 * d,  # Linear(1, d)
        "cat": 2 * d + c * d,  # Linear(1, d) + channel embedding
    }[cfg.encoder]
    # in_proj 3d²+3d, out_proj d²+d, linear1 d·f+f, linear2 f·d+d, two LayerNorms 4d
    layer = 4 * d * d + 2 * d * f + 9 * d + f
    head_in = c * d if cfg.encoder == "ci" else d
    return encoder + cfg.n_layers * layer + 2 * d + head_in * k + k


def flops_per_sample(cfg: SignalConfig) -> int:
    """Forward+backward FLOPs of one training sequence of seq_len steps (see ``archhpo.models._flops``).

    sum and concat encoders are element-wise (free); linear/mlp/ci/cat read the data, so their
    first product has no input gradient.  ci runs the backbone C times; cat attends over T·C tokens.
    Batch-size-independent work (linear-ppe's Linear(d, d) on the position table, linear-ortho's
    penalty) is not per sample: see ``batch_flops``.
    """
    d, f, c, k, t = cfg.d_model, cfg.d_ff, cfg.channels, cfg.num_bins, cfg.seq_len
    enc = cfg.encoder
    if enc in ("sum", "concat"):
        encoder = 0
    elif enc in ("linear", "linear-ortho", "linear-ppe"):
        encoder = linear_flops(t, c, d, input_grad=False)  # v @ W
    elif enc == "mlp":
        encoder = linear_flops(t, c, d, input_grad=False) + linear_flops(t, d, d)
    else:  # ci, cat: Linear(1, d) on every (step, channel) value
        encoder = linear_flops(t * c, 1, d, input_grad=False)
    if enc == "ci":
        backbone = c * cfg.n_layers * encoder_layer_flops(t, d, f)
        head = linear_flops(t, c * d, k)
    else:
        backbone = cfg.n_layers * encoder_layer_flops(t * c if enc == "cat" else t, d, f)
        head = linear_flops(t, d, k)
    return encoder + backbone + head


def batch_flops(cfg: SignalConfig) -> int:
    """FLOPs of one training step that do not depend on the batch size (0 for most encoders).

    linear-ppe: Linear(d, d) on the fixed (T, d) position table (a buffer: weight gradient only);
    linear-ortho: the penalty's Gram matrix W Wᵀ, (C, d)·(d, C), with both operands' gradients.
    """
    d, c = cfg.d_model, cfg.channels
    if cfg.encoder == "linear-ppe":
        return linear_flops(cfg.seq_len, d, d, input_grad=False)
    if cfg.encoder == "linear-ortho":
        return linear_flops(c, d, c)
    return 0


def config_for(arch: Mapping[str, int], info: Mapping[str, Any]) -> SignalConfig:
    return SignalConfig(
        d_model=int(arch["d_model"]), n_layers=int(arch["n_layers"]),
        n_heads=int(arch["n_heads"]), d_ff=int(arch["d_ff"]),
        encoder=str(info.get("encoder", "linear")),
        channels=int(info.get("channels", multisignal.DEFAULT_CHANNELS)),
        num_bins=int(info.get("num_bins", multisignal.DEFAULT_BINS)),
        seq_len=int(info.get("seq_len", multisignal.DEFAULT_LENGTH)),
        dropout=float(info.get("dropout", DEFAULT_DROPOUT)),
    )


FAMILY = Family(
    name="signal",
    config_cls=SignalConfig,
    build=Lazy("archhpo.models.signal", "SignalTransformer"),
    param_count=param_count,
    config_for=config_for,
    parse_data=multisignal.parse_data,
    data_info=multisignal.data_info,
    load_data=multisignal.load_data,
    loss=Lazy("archhpo.models.signal", "binned_nll"),
    baseline_loss=Lazy("archhpo.models.signal", "frequency_baseline"),
    metrics=Lazy("archhpo.models.signal", "accuracy"),
    flags=(
        FlagSpec("encoder", str, "linear", f"input encoder: {', '.join(ENCODERS)}"),
        FlagSpec("channels", int, multisignal.DEFAULT_CHANNELS, "number of input channels C"),
        FlagSpec("num_bins", int, multisignal.DEFAULT_BINS, "number of quantile bins K of the target"),
        FlagSpec("dropout", float, DEFAULT_DROPOUT, "dropout in every transformer layer (the paper's 0.1)"),
        FlagSpec(
            "positions", str, multisignal.DEFAULT_POSITIONS,
            "scored next-step positions: 'all' (the paper's 159) or 'predictable' (the 153 with a target)",
        ),
    ),
    # cat: a token per (step, channel); ci: the backbone runs C times (C× the activations).
    tokens=lambda c: c.seq_len * (c.channels if c.encoder in ("cat", "ci") else 1),
    sequences=lambda c: c.channels if c.encoder == "ci" else 1,  # ci attends within each channel
    flops_per_sample=flops_per_sample,
    logits_per_sample=lambda c: c.seq_len * c.num_bins,  # (T, K) bin logits a window, T <= seq_len
    data_help="multisignal (or synthetic)[:series=N,length=N,channels=N,seed=S,num_bins=N] (embedded data only)",
    description="Causal multi-channel signal transformer predicting the next step's quantile bin.",
    train_defaults={
        "learning_rate": 3e-4, "weight_decay": 1e-4, "batch_size": 32, "warmup_steps": 0,
        "min_lr_ratio": 0.01, "eval_every": 20, "grad_clip": 1.0,
    },
)
