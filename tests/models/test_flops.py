"""Compute accounting: every family's closed-form flops_per_sample equals FlopCounterMode exactly.

count(B) = B * flops_per_sample(config) + batch_flops(config) for a training step (forward, loss,
extra_loss, backward) on built modules, for a spread of tiny configs per family and encoder.
"""

from __future__ import annotations

import pytest
import torch

from archhpo.models import count_flops, get_family
from archhpo.models import signal as signal_mod
from archhpo.models._flops import attention_flops, encoder_layer_flops, linear_flops
from archhpo.models.char_cls import CharClsConfig
from archhpo.models.csn_transformer import CSNTransformerConfig
from archhpo.models.ft_transformer import FTTransformerConfig
from archhpo.models.lm import LMConfig
from archhpo.models.patchtst import PatchTSTConfig
from archhpo.models.signal import ENCODERS, SignalConfig

BATCHES = (1, 3)


def _batch(name: str, cfg, b: int, gen: torch.Generator) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Random inputs and target of batch size b shaped as the family's data (full-length sequences)."""
    if name == "patchtst":
        x = torch.randn(b, cfg.context_length, cfg.num_features, generator=gen)
        shape = (b,) if cfg.num_classes == 1 else (b, cfg.num_classes)  # BCE per class
        return (x,), torch.randint(0, 2, shape, generator=gen).float()
    if name in ("ft_transformer", "csn_transformer"):
        num = torch.randn(b, cfg.seq_len, cfg.num_numerical, generator=gen)
        cat = torch.stack([torch.randint(0, c, (b,), generator=gen) for c in cfg.cat_cardinalities], 1) \
            if cfg.cat_cardinalities else torch.zeros(b, 0, dtype=torch.long)
        shape = (b,) if cfg.out_dim == 1 else (b, cfg.out_dim)
        return (num, cat), torch.randint(0, 2, shape, generator=gen).float()
    if name == "char_cls":
        ids = torch.randint(1, cfg.vocab_size, (b, cfg.max_len), generator=gen)
        ids[:, 0] = 1  # CLS
        ids[:, cfg.max_len // 2:] = 0  # padding: masked, still counted
        return (ids,), torch.randint(0, cfg.num_classes, (b,), generator=gen)
    if name == "lm":
        ids = torch.randint(0, cfg.vocab_size, (b, cfg.seq_len + 1), generator=gen)
        return (ids[:, :-1],), ids[:, 1:]  # next-token targets over the full window
    x = torch.randn(b, cfg.seq_len, cfg.channels, generator=gen)
    return (x,), torch.randint(0, cfg.num_bins, (b, cfg.seq_len), generator=gen)


def _check(name: str, cfg, batch_const: int = 0) -> None:
    family = get_family(name)
    torch.manual_seed(0)
    model = family.build(cfg)
    gen = torch.Generator().manual_seed(0)
    per_sample = family.flops_per_sample(cfg)
    assert isinstance(per_sample, int) and per_sample > 0
    for b in BATCHES:
        inputs, target = _batch(name, cfg, b, gen)
        assert count_flops(model, inputs, family.loss, target) == b * per_sample + batch_const, (name, cfg, b)


PATCHTST = [
    PatchTSTConfig(d_model=8, n_layers=1, n_heads=1, d_ff=16, num_features=1, dropout=0.0),
    PatchTSTConfig(d_model=12, n_layers=2, n_heads=3, d_ff=20, num_features=3, patch_len=7, stride=4,
                   context_length=30),
    PatchTSTConfig(d_model=16, n_layers=1, n_heads=4, d_ff=8, num_features=2, num_classes=3, dropout=0.1),
]


@pytest.mark.parametrize("cfg", PATCHTST, ids=range(len(PATCHTST)))
def test_patchtst(cfg: PatchTSTConfig) -> None:
    _check("patchtst", cfg)


FT = [
    FTTransformerConfig(d_model=8, n_layers=1, n_heads=2, d_ff=16, variant=v, num_numerical=n,
                        cat_cardinalities=cards, seq_len=t, out_dim=o, dropout=p)
    for v in ("sequence", "tabular")
    for n, cards, t, o, p in ((3, (5, 2), 4, 1, 0.0), (2, (), 3, 2, 0.1), (1, (40,), 2, 1, 0.0))
] + [FTTransformerConfig(d_model=12, n_layers=2, n_heads=3, d_ff=24, variant="tabular", num_numerical=4,
                         cat_cardinalities=(7, 3, 2), seq_len=5)]


@pytest.mark.parametrize("cfg", FT, ids=range(len(FT)))
def test_ft_transformer(cfg: FTTransformerConfig) -> None:
    _check("ft_transformer", cfg)


CSN = [
    CSNTransformerConfig(d_model=8, n_layers=1, n_heads=2, d_ff=16, num_numerical=3, cat_cardinalities=(5, 2),
                         seq_len=4),
    CSNTransformerConfig(d_model=12, n_layers=2, n_heads=4, d_ff=8, num_numerical=1, cat_cardinalities=(30,),
                         seq_len=6, out_dim=2, dropout=0.1),
]


@pytest.mark.parametrize("cfg", CSN, ids=range(len(CSN)))
def test_csn_transformer(cfg: CSNTransformerConfig) -> None:
    _check("csn_transformer", cfg)


CHAR = [
    CharClsConfig(d_model=8, n_layers=1, n_heads=2, d_ff=16, max_len=6, dropout=0.0),
    CharClsConfig(d_model=12, n_layers=2, n_heads=3, d_ff=20, max_len=9, num_classes=5, vocab_size=50),
]


@pytest.mark.parametrize("cfg", CHAR, ids=range(len(CHAR)))
def test_char_cls(cfg: CharClsConfig) -> None:
    _check("char_cls", cfg)


LM = [
    LMConfig(d_model=8, n_layers=1, n_heads=2, d_ff=16, vocab_size=5, seq_len=6),
    LMConfig(d_model=12, n_layers=2, n_heads=3, d_ff=20, vocab_size=256, seq_len=9, dropout=0.1),
]


@pytest.mark.parametrize("cfg", LM, ids=range(len(LM)))
def test_lm(cfg: LMConfig) -> None:
    _check("lm", cfg)


SIGNAL_SHAPES = [  # (d_model, n_layers, n_heads, d_ff, channels, num_bins, seq_len, dropout)
    (8, 1, 2, 16, 2, 3, 5, 0.0),
    (12, 2, 3, 8, 3, 4, 4, 0.1),
]


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("shape", SIGNAL_SHAPES, ids=range(len(SIGNAL_SHAPES)))
def test_signal(encoder: str, shape: tuple) -> None:
    d, layers, heads, ff, c, k, t, p = shape
    cfg = SignalConfig(d_model=d, n_layers=layers, n_heads=heads, d_ff=ff, encoder=encoder, channels=c,
                       num_bins=k, seq_len=t, dropout=p)
    _check("signal", cfg, batch_const=signal_mod.batch_flops(cfg))


def test_batch_flops_only_for_ppe_and_ortho() -> None:
    for encoder in ENCODERS:
        cfg = SignalConfig(d_model=8, n_layers=1, n_heads=2, d_ff=8, encoder=encoder, channels=2, seq_len=5)
        assert (signal_mod.batch_flops(cfg) > 0) == (encoder in ("linear-ppe", "linear-ortho"))


def test_closed_form_pieces() -> None:
    # The standard "6N + 12·L·s·d per token" for a bias-free stack: linear layers 3x forward.
    assert linear_flops(5, 7, 3) == 3 * 2 * 5 * 7 * 3
    assert linear_flops(5, 7, 3, input_grad=False) == 2 * 2 * 5 * 7 * 3
    assert attention_flops(10, 4) == 12 * 10 * 10 * 4
    s, d, f = 10, 8, 32
    assert encoder_layer_flops(s, d, f) == 6 * s * (4 * d * d + 2 * d * f) + 12 * s * s * d


def test_count_flops_restores_mode_and_clears_grads() -> None:
    family = get_family("char_cls")
    cfg = CharClsConfig(d_model=8, n_layers=1, n_heads=2, d_ff=16, max_len=6)
    model = family.build(cfg).eval()
    inputs, target = _batch("char_cls", cfg, 2, torch.Generator().manual_seed(1))
    assert count_flops(model, inputs, family.loss, target) == 2 * family.flops_per_sample(cfg)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


def test_params_and_grid_show_flops(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from archhpo.cli import main

    family = get_family("signal")
    arch = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}
    expected = family.flops_per_sample(family.config_for(arch, {"encoder": "ci"}))
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in arch.items()]
    assert main(["params", "--family", "signal", "--encoder", "ci", *flags, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["flops_per_sample"] == expected
    assert main(["params", "--family", "signal", "--encoder", "ci", *flags]) == 0
    assert f"{expected:,} training FLOPs per sample" in capsys.readouterr().out

    assert main(["grid", "--family", "char_cls", "--budget", "500K", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    char = get_family("char_cls")
    assert rows and all(r["flops_per_sample"] == char.flops_per_sample(char.config_for(r, {})) for r in rows)
    assert main(["grid", "--family", "char_cls", "--budget", "500K"]) == 0
    assert "flops/sample" in capsys.readouterr().out.splitlines()[0]
