"""Dual-path categorical/numerical transformer (csn_transformer)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from archhpo.errors import ConfigError
from archhpo.models import csn_transformer as csn
from archhpo.models.data import panel
from archhpo.models.patchtst import base_rate_loss, bce_loss


def _numel(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _inputs(cfg: csn.CSNTransformerConfig, b: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(b, cfg.seq_len, cfg.num_numerical)
    return x, torch.stack([torch.randint(0, c, (b,)) for c in cfg.cat_cardinalities], 1)


@pytest.mark.parametrize(
    "kw",
    [
        dict(d_model=64, n_layers=2, n_heads=4, d_ff=128),
        dict(d_model=32, n_layers=1, n_heads=2, d_ff=64, cat_cardinalities=(7,), seq_len=1),
        dict(d_model=96, n_layers=3, n_heads=8, d_ff=384, num_numerical=3, seq_len=7),
        dict(d_model=128, n_layers=2, n_heads=16, d_ff=256, cat_cardinalities=(3, 1000, 2), out_dim=3),
        dict(d_model=8, n_layers=4, n_heads=2, d_ff=16, num_numerical=1, seq_len=40,
             cat_cardinalities=(1, 1)),
    ],
)
def test_param_count_is_exact(kw: dict) -> None:
    cfg = csn.CSNTransformerConfig(**kw)
    assert csn.param_count(cfg) == _numel(csn.CSNTransformer(cfg))


def test_forward_shapes_and_architecture() -> None:
    cfg = csn.CSNTransformerConfig(32, 2, 4, 64, seq_len=6, num_numerical=3)
    m = csn.CSNTransformer(cfg)
    assert m(*_inputs(cfg)).shape == (3,)
    cfg3 = csn.CSNTransformerConfig(32, 2, 4, 64, seq_len=6, num_numerical=3, out_dim=2)
    assert csn.CSNTransformer(cfg3)(*_inputs(cfg3)).shape == (3, 2)
    assert len(m.cat_blocks) == len(m.num_blocks) == 2
    for block in [*m.cat_blocks, *m.num_blocks]:
        assert block.attn.qkv.bias is None and block.attn.out.bias is None  # bias-free projections
    assert m.head.in_features == 64 and m.step_embed.in_features == 3
    assert all(p.bias is None for p in m.cat_tokens.proj)


def test_paths_are_separate() -> None:
    """Path 1 sees only categorical ids: changing the numbers leaves CLS₁ alone (checked via the head)."""
    cfg = csn.CSNTransformerConfig(32, 2, 4, 64, seq_len=6, num_numerical=3)
    m = csn.CSNTransformer(cfg).eval()
    x, cat = _inputs(cfg)
    seen: list[torch.Tensor] = []
    m.head.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    m(x, cat)
    m(x + 1.0, cat)
    torch.testing.assert_close(seen[0][:, :32], seen[1][:, :32])
    assert not torch.allclose(seen[0][:, 32:], seen[1][:, 32:])


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(cat_cardinalities=()), "at least one categorical"),
        (dict(n_heads=5), "must divide d_model"),
        (dict(num_numerical=0), "num_numerical"),
        (dict(out_dim=0), "out_dim"),
    ],
)
def test_config_validation(kw: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        csn.CSNTransformerConfig(**kw)


def test_family_contract() -> None:
    fam = csn.FAMILY
    assert fam.name == "csn_transformer"
    assert {f.name for f in fam.flags} == {"num_numerical", "cat_cardinalities", "seq_len", "out_dim"}
    options = {"quick": True}
    info = fam.data_info(fam.parse_data("synthetic", options), options)
    cfg = fam.config_for({"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}, info)
    assert cfg.cat_cardinalities == (50, 5) and cfg.num_numerical == 8
    assert fam.param_count(cfg) == _numel(fam.build(cfg))


def test_learns_and_uses_categorical_ids() -> None:
    torch.set_num_threads(1)
    options = {"quick": True, "seed": 0}
    data = panel.load_data(panel.parse_data("synthetic", options), options)
    torch.manual_seed(0)
    arch = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64}
    model = csn.CSNTransformer(csn.config_for(arch, data.info))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    g = torch.Generator().manual_seed(0)
    best, best_state = float("inf"), None
    for step in range(1, 301):
        model.train()
        idx = torch.randint(0, data.n_train, (128,), generator=g)
        loss = bce_loss(model(*(t[idx] for t in data.train_inputs)), data.train_target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            model.eval()
            with torch.no_grad():
                val = float(bce_loss(model(*data.val_inputs), data.val_target))
            if val < best:
                best, best_state = val, {k: v.clone() for k, v in model.state_dict().items()}
    baseline = base_rate_loss(data)
    print(f"csn_transformer val BCE {best:.4f} vs base rate {baseline:.4f}")
    assert best < 0.8 * baseline
    model.load_state_dict(best_state)
    model.eval()
    x, cat = data.val_inputs
    with torch.no_grad():
        shuffled = float(bce_loss(model(x, cat[torch.randperm(len(cat), generator=g)]), data.val_target))
    print(f"csn_transformer with shuffled ids {shuffled:.4f}")
    assert shuffled > best + 0.1
