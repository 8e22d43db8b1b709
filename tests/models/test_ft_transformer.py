"""FT-Transformer (sequence and tabular variants) and the shared pre-norm Block."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from archhpo.errors import ConfigError
from archhpo.models import ft_transformer as ft
from archhpo.models._blocks import Block, block_params
from archhpo.models.data import panel
from archhpo.models.patchtst import base_rate_loss, bce_loss


def _numel(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _inputs(cfg: ft.FTTransformerConfig, b: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(b, cfg.seq_len, cfg.num_numerical)
    cols = [torch.randint(0, c, (b,)) for c in cfg.cat_cardinalities]
    cat = torch.stack(cols, 1) if cols else torch.zeros(b, 0, dtype=torch.long)
    return x, cat


CONFIGS = [
    dict(d_model=64, n_layers=2, n_heads=4, d_ff=128),
    dict(d_model=32, n_layers=1, n_heads=2, d_ff=64, cat_cardinalities=(7,), seq_len=1),
    dict(d_model=96, n_layers=3, n_heads=8, d_ff=384, cat_cardinalities=(), num_numerical=3, seq_len=7),
    dict(d_model=128, n_layers=2, n_heads=16, d_ff=256, cat_cardinalities=(3, 1000, 2), out_dim=3),
    dict(d_model=8, n_layers=4, n_heads=2, d_ff=16, num_numerical=1, seq_len=40, cat_cardinalities=(1, 1)),
]


@pytest.mark.parametrize("variant", ["sequence", "tabular"])
@pytest.mark.parametrize("kw", CONFIGS)
def test_param_count_is_exact(variant: str, kw: dict) -> None:
    cfg = ft.FTTransformerConfig(variant=variant, **kw)
    assert ft.param_count(cfg) == _numel(ft.FTTransformer(cfg))


@pytest.mark.parametrize("variant", ["sequence", "tabular"])
def test_forward_shapes(variant: str) -> None:
    cfg = ft.FTTransformerConfig(32, 2, 4, 64, variant=variant, seq_len=6, num_numerical=3)
    m = ft.FTTransformer(cfg)
    assert m(*_inputs(cfg)).shape == (3,)
    cfg3 = ft.FTTransformerConfig(32, 2, 4, 64, variant=variant, seq_len=6, num_numerical=3, out_dim=3)
    assert ft.FTTransformer(cfg3)(*_inputs(cfg3)).shape == (3, 3)


def test_tabular_reads_the_last_step() -> None:
    cfg = ft.FTTransformerConfig(32, 2, 4, 64, variant="tabular", seq_len=6, num_numerical=3)
    m = ft.FTTransformer(cfg).eval()
    x, cat = _inputs(cfg)
    torch.testing.assert_close(m(x, cat), m(x[:, -1], cat))


def test_sequence_architecture() -> None:
    m = ft.FTTransformer(ft.FTTransformerConfig(64, 3, 4, 128))
    for block in m.blocks:
        assert block.attn.qkv.bias is None and block.attn.out.bias is None  # bias-free projections
        assert isinstance(block.attn_norm, nn.LayerNorm)
    assert isinstance(m.head, nn.Linear)  # no final norm
    # e = max(int(8·log2(card+1)), d//4): 100 → 53, 5 → max(20, 16) = 20
    assert [e.embedding_dim for e in m.cat_tokens.embed] == [53, 20]
    assert all(p.bias is None for p in m.cat_tokens.proj)
    assert ft.cat_embed_dim(5, 512) == 128


def test_tabular_architecture() -> None:
    m = ft.FTTransformer(ft.FTTransformerConfig(64, 3, 4, 128, variant="tabular"))
    assert isinstance(m.blocks[0].attn_norm, nn.Identity)  # first block: no attention LayerNorm
    assert not any(isinstance(x, nn.LayerNorm) for x in m.blocks[0].attn_norm.modules())
    for block in m.blocks[1:]:
        assert isinstance(block.attn_norm, nn.LayerNorm)
    for block in m.blocks:
        assert block.attn.qkv.bias is not None and block.attn.out.bias is not None
    assert [type(x) for x in m.head] == [nn.LayerNorm, nn.ReLU, nn.Linear]


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(variant="wide"), "variant must be one of"),
        (dict(n_heads=3), "must divide d_model"),
        (dict(cat_cardinalities="100,x"), "comma-separated integers"),
        (dict(cat_cardinalities=(100, 0)), "positive integers"),
        (dict(seq_len=0), "seq_len"),
        (dict(dropout=1.0), "dropout"),
    ],
)
def test_config_validation(kw: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ft.FTTransformerConfig(**kw)


def test_family_contract() -> None:
    fam = ft.FAMILY
    assert fam.name == "ft_transformer"
    flags = {f.name: f for f in fam.flags}
    assert set(flags) == {"variant", "num_numerical", "cat_cardinalities", "seq_len", "out_dim"}
    assert flags["cat_cardinalities"].type("100,5") == (100, 5)
    arch = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}
    options = {"quick": True}
    info = fam.data_info(fam.parse_data("synthetic", options), options)
    cfg = fam.config_for(arch, info)
    assert (cfg.variant, cfg.cat_cardinalities, cfg.seq_len) == ("sequence", (50, 5), 20)
    assert fam.config_for(arch, {**info, "variant": "tabular"}).variant == "tabular"
    assert fam.param_count(cfg) == _numel(fam.build(cfg))


@pytest.mark.parametrize("attn_bias", [True, False])
@pytest.mark.parametrize("first_norm", [True, False])
def test_block_params(attn_bias: bool, first_norm: bool) -> None:
    block = Block(48, 6, 96, attn_bias=attn_bias, first_norm=first_norm)
    assert block_params(48, 96, attn_bias, first_norm) == _numel(block)


def test_block_attention_matches_torch_and_masks() -> None:
    torch.manual_seed(0)
    block = Block(16, 4, 32).eval()
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    mha.in_proj_weight.data.copy_(block.attn.qkv.weight)
    mha.in_proj_bias.data.copy_(block.attn.qkv.bias)
    mha.out_proj.load_state_dict(block.attn.out.state_dict())
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    for kw in ({}, {"key_padding_mask": pad}, {"attn_mask": causal}):
        ref = mha(x, x, x, need_weights=False, **kw)[0]
        torch.testing.assert_close(block.attn(x, **kw), ref)
    # A padded token cannot change the other tokens' outputs.
    y = x.clone()
    y[1, 4] = 100.0
    torch.testing.assert_close(block(x, key_padding_mask=pad)[1, :3], block(y, key_padding_mask=pad)[1, :3])


def _train(model: nn.Module, data, steps: int, lr: float) -> float:
    """Plain AdamW on random batches; returns the best validation BCE of periodic evaluations."""
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    g = torch.Generator().manual_seed(0)
    best = float("inf")
    for step in range(1, steps + 1):
        model.train()
        idx = torch.randint(0, data.n_train, (128,), generator=g)
        loss = bce_loss(model(*(t[idx] for t in data.train_inputs)), data.train_target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            model.eval()
            with torch.no_grad():
                best = min(best, float(bce_loss(model(*data.val_inputs), data.val_target)))
    return best


@pytest.mark.parametrize(("variant", "seq_len", "steps"), [("sequence", 5, 150), ("tabular", 20, 200)])
def test_learns_on_quick_panel(variant: str, seq_len: int, steps: int) -> None:
    torch.set_num_threads(1)
    options = {"quick": True, "seed": 0, "seq_len": seq_len}
    data = panel.load_data(panel.parse_data("synthetic", options), options)
    arch = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64}
    torch.manual_seed(0)
    model = ft.FTTransformer(ft.config_for(arch, {**data.info, "variant": variant}))
    baseline = base_rate_loss(data)
    val = _train(model, data, steps, lr=3e-3)
    print(f"ft_transformer[{variant}] val BCE {val:.4f} vs base rate {baseline:.4f}")
    assert val < 0.8 * baseline
    # The trained model uses the categorical ids: shuffling them across samples hurts a lot.
    model.eval()
    with torch.no_grad():
        x, cat = data.val_inputs
        real = float(bce_loss(model(x, cat), data.val_target))
        perm = torch.randperm(len(cat), generator=torch.Generator().manual_seed(1))
        shuffled = float(bce_loss(model(x, cat[perm]), data.val_target))
    print(f"ft_transformer[{variant}] final val BCE {real:.4f}, with shuffled ids {shuffled:.4f}")
    assert shuffled > real + 0.1


def test_block_masks_under_autocast() -> None:
    block = Block(16, 4, 32)
    pad = torch.tensor([[False, False, True]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = block(torch.randn(1, 3, 16), key_padding_mask=pad)
    assert out.shape == (1, 3, 16) and torch.isfinite(out.float()).all()
