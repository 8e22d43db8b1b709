"""The char_cls family without torch: config, exact parameter count, FLOPs, flags, the Family record.

The network (and the family's own loss and metrics, if any) is in ``archhpo.models.char_cls``,
imported on first use: counting parameters and the command line never import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archhpo.errors import ConfigError
from archhpo.models._family import Family, FlagSpec, Lazy, check_arch
from archhpo.models._flops import encoder_layer_flops, linear_flops
from archhpo.models.data import domains
from archhpo.models.data.domains import MAX_LEN, VOCAB_SIZE


def _check_int(name: str, value: Any, minimum: int, why: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer of at least {minimum} ({why}), got {value!r}.")


@dataclass
class CharClsConfig:
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 256
    vocab_size: int = VOCAB_SIZE
    max_len: int = MAX_LEN
    num_classes: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        check_arch(self.d_model, self.n_layers, self.n_heads, self.d_ff)
        # Larger vocabularies are allowed (for counting what-ifs); smaller ones could not
        # embed the ids the encoder produces.
        _check_int("vocab_size", self.vocab_size, VOCAB_SIZE, "the encoder uses ids 0..39")
        _check_int("max_len", self.max_len, 2, "the CLS token plus at least one character")
        _check_int("num_classes", self.num_classes, 2, "binary tasks use two logits")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}.")


def param_count(cfg: CharClsConfig) -> int:
    """Exact count: equals sum(p.numel()) of CharCls(cfg)."""
    d, f, c = cfg.d_model, cfg.d_ff, cfg.num_classes
    # token embedding V·d (the PAD row counts: it is a parameter, just never updated) and
    # position embedding max_len·d
    embed = (cfg.vocab_size + cfg.max_len) * d
    # in_proj 3d²+3d, out_proj d²+d, linear1 d·f+f, linear2 f·d+d, two LayerNorms 4d
    layer = 4 * d * d + 2 * d * f + 9 * d + f
    # final LayerNorm 2d, head d·c+c
    return embed + cfg.n_layers * layer + 2 * d + d * c + c


def flops_per_sample(cfg: CharClsConfig) -> int:
    """Forward+backward FLOPs of one training string of max_len ids (see ``archhpo.models._flops``).

    Padding is masked, not skipped: attention still multiplies the full max_len² scores.
    """
    layers = cfg.n_layers * encoder_layer_flops(cfg.max_len, cfg.d_model, cfg.d_ff)
    return layers + linear_flops(1, cfg.d_model, cfg.num_classes)


def config_for(arch: Mapping[str, int], info: Mapping[str, Any]) -> CharClsConfig:
    return CharClsConfig(
        d_model=int(arch["d_model"]), n_layers=int(arch["n_layers"]),
        n_heads=int(arch["n_heads"]), d_ff=int(arch["d_ff"]),
        vocab_size=int(info.get("vocab_size", VOCAB_SIZE)),
        max_len=int(info.get("max_len", MAX_LEN)),
        num_classes=int(info.get("num_classes", 2)),
        dropout=float(info.get("dropout", 0.1)),
    )


FAMILY = Family(
    name="char_cls",
    config_cls=CharClsConfig,
    build=Lazy("archhpo.models.char_cls", "CharCls"),
    param_count=param_count,
    config_for=config_for,
    parse_data=domains.parse_data,
    data_info=domains.data_info,
    load_data=domains.load_data,
    loss=Lazy("archhpo.models.char_cls", "cross_entropy_loss"),
    baseline_loss=Lazy("archhpo.models.char_cls", "baseline_loss"),
    metrics=Lazy("archhpo.models.char_cls", "metrics"),
    flags=(
        FlagSpec("vocab_size", int, VOCAB_SIZE, "token vocabulary size (40: PAD, CLS, a-z, 0-9, '-', '_')"),
        FlagSpec("max_len", int, MAX_LEN, "sequence length in ids, counting the [CLS] token"),
        FlagSpec("num_classes", int, 2, "number of classes (2 for binary)"),
    ),
    tokens=lambda c: c.max_len,
    flops_per_sample=flops_per_sample,
    data_unit="tokens",
    data_help="synthetic[:n=N,seed=S] or a CSV path with text and label columns",
    description="Character-level [CLS] transformer classifying short strings such as domain names.",
)
