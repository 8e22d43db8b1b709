"""µP in the lm family: the standard model at m = 1, the per-group AdamW settings at m > 1, and
the same parameter count and FLOPs as the standard parametrization."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from archhpo.errors import ConfigError
from archhpo.models import TensorDataset, count_flops, get_family
from archhpo.models.data import language
from archhpo.models.lm import ADAM_EPS, LM, LMConfig, flops_per_sample, next_token_nll, param_count
from archhpo.workers import TrainConfig, train

BASE = LMConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, seq_len=16)


def _data() -> TensorDataset:
    options = {"seq_len": BASE.seq_len, "seed": 0}
    spec = language.parse_data("synthetic:tokens=4096", options)
    return language.load_data(spec, options)


def _history(cfg: LMConfig) -> list[tuple[float, float]]:
    torch.manual_seed(0)
    model = LM(cfg)
    tcfg = TrainConfig(learning_rate=3e-3, epochs=2, batch_size=32, warmup_steps=2, weight_decay=0.1, seed=0)
    result = train(model, _data(), next_token_nll, tcfg)
    return [(h["train_loss"], h["val_loss"]) for h in result.history]


def test_mup_at_its_base_width_trains_bit_for_bit_as_the_standard_model() -> None:
    mup = replace(BASE, parametrization="mup", mup_base_width=BASE.d_model)
    torch.manual_seed(0)
    groups = LM(mup).optimizer_groups(3e-3, 0.1)
    assert groups is not None and len(groups) == 2  # the µP path is taken, with its own groups
    sp_history = _history(BASE)
    assert len(sp_history) == 2
    assert _history(mup) == sp_history


def test_mup_at_its_base_width_computes_the_standard_logits_exactly() -> None:
    ids = torch.randint(0, BASE.vocab_size, (3, BASE.seq_len), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    sp = LM(BASE)
    torch.manual_seed(0)
    mup = LM(replace(BASE, parametrization="mup", mup_base_width=BASE.d_model))
    assert torch.equal(sp(ids), mup(ids))


@pytest.mark.parametrize("m", [2, 4])
def test_mup_groups_scale_the_matrices_rate_and_every_eps_by_the_width_multiplier(m: int) -> None:
    cfg = replace(BASE, d_model=BASE.d_model * m, parametrization="mup", mup_base_width=BASE.d_model)
    assert cfg.width_multiplier == m
    model = LM(cfg)
    groups = model.optimizer_groups(1e-3, 0.1)
    assert groups is not None
    hidden, rest = groups
    assert {id(p) for p in hidden["params"]} == {id(p) for p in model.hidden_matrices()}
    assert len(hidden["params"]) == 4 * cfg.n_layers  # qkv, out and the two FFN matrices a block
    assert (hidden["lr"], hidden["eps"], hidden["weight_decay"]) == (1e-3 / m, ADAM_EPS / m, 0.1 * m)
    assert (rest["lr"], rest["eps"], rest["weight_decay"]) == (1e-3, ADAM_EPS / m, 0.1)
    # The per-step decay lr·wd of a matrix does not depend on the width.
    assert math.isclose(hidden["lr"] * hidden["weight_decay"], 1e-3 * 0.1, rel_tol=1e-12)
    every = [p for g in groups for p in g["params"]]
    assert len(every) == len({id(p) for p in every}) == len(list(model.parameters()))


@pytest.mark.parametrize("m", [2, 4])
def test_mup_divides_the_matrices_init_variance_and_the_attention_scale(m: int) -> None:
    cfg = replace(BASE, d_model=256 * m, d_ff=256 * m, parametrization="mup", mup_base_width=256)
    torch.manual_seed(0)
    model = LM(cfg)
    qkv = model.blocks[0].attn.qkv.weight
    assert qkv.std().item() == pytest.approx(0.02 / math.sqrt(m), rel=0.02)
    assert model.tok_embed.weight.std().item() == pytest.approx(0.02, rel=0.02)
    # q·k/sqrt(d_head) × qk_scale = sqrt(d_head_base)/d_head with the head count fixed.
    d_head, d_base = cfg.d_model // cfg.n_heads, 256 // cfg.n_heads
    assert model.blocks[0].attn.qk_scale / math.sqrt(d_head) == pytest.approx(math.sqrt(d_base) / d_head)


def test_the_standard_model_gives_the_trainer_no_groups() -> None:
    assert LM(BASE).optimizer_groups(1e-3, 0.1) is None
    assert replace(BASE, mup_base_width=16).width_multiplier == 1.0  # a base width alone is not µP


@pytest.mark.parametrize("m", [1, 2, 4])
def test_mup_keeps_the_parameter_count_and_flops(m: int) -> None:
    sp = replace(BASE, d_model=32 * m)
    mup = replace(sp, parametrization="mup", mup_base_width=32)
    model = LM(mup)
    assert param_count(mup) == param_count(sp) == sum(p.numel() for p in model.parameters())
    assert flops_per_sample(mup) == flops_per_sample(sp)
    ids = torch.zeros(2, mup.seq_len, dtype=torch.long)
    fam = get_family("lm")

    def count(b: int) -> int:
        return count_flops(model, (ids[:b],), fam.loss, ids[:b])

    assert count(2) - count(1) == flops_per_sample(mup)


def test_config_for_reads_the_parametrization_and_refuses_an_unknown_one() -> None:
    arch = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}
    cfg = get_family("lm").config_for(arch, {"parametrization": "mup", "mup_base_width": 16})
    assert (cfg.parametrization, cfg.width_multiplier) == ("mup", 4.0)
    assert get_family("lm").config_for(arch, {}).parametrization == "sp"
    with pytest.raises(ConfigError, match="parametrization must be one of sp, mup"):
        replace(BASE, parametrization="ntk")
    with pytest.raises(ConfigError, match="mup_base_width must be a positive integer"):
        replace(BASE, parametrization="mup", mup_base_width=0)


# CompleteP (depth scaling under µP, mup_base_depth): the µP model at its base depth, the branches
# scaled by base/n_layers above it, the block parameters' eps divided by the depth multiplier too.
def test_completep_at_its_base_depth_is_the_mup_model_exactly() -> None:
    mup = replace(BASE, d_model=64, d_ff=128, parametrization="mup", mup_base_width=32)
    cp = replace(mup, mup_base_depth=mup.n_layers)
    assert cp.depth_multiplier == 1.0
    ids = torch.randint(0, BASE.vocab_size, (3, BASE.seq_len), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    a = LM(mup)
    torch.manual_seed(0)
    b = LM(cp)
    assert torch.equal(a(ids), b(ids))
    assert [(g["lr"], g["eps"], g["weight_decay"]) for g in a.optimizer_groups(1e-3, 0.1) or []] == \
        [(g["lr"], g["eps"], g["weight_decay"]) for g in b.optimizer_groups(1e-3, 0.1) or []]
    assert _history(replace(cp, d_model=32, d_ff=64)) == _history(replace(mup, d_model=32, d_ff=64))


@pytest.mark.parametrize("t", [2, 4])
def test_completep_scales_each_branch_and_the_blocks_eps_by_the_depth_multiplier(t: int) -> None:
    cfg = replace(BASE, d_model=64, d_ff=128, n_layers=2 * t, parametrization="mup", mup_base_width=32,
                  mup_base_depth=2)
    assert (cfg.width_multiplier, cfg.depth_multiplier) == (2.0, t)
    torch.manual_seed(0)
    model = LM(cfg)
    assert all(block.residual_scale == 1 / t for block in model.blocks)
    # The projections start as the base depth's (0.02/sqrt(m)/sqrt(2·2)), not 1/sqrt(2·n_layers)'s.
    outs = torch.cat([b.attn.out.weight.flatten() for b in model.blocks])
    assert outs.std().item() == pytest.approx(0.02 / math.sqrt(2) / math.sqrt(4), rel=0.05)
    hidden, vectors, rest = model.optimizer_groups(1e-3, 0.1) or []
    assert (hidden["lr"], hidden["eps"], hidden["weight_decay"]) == (1e-3 / 2, ADAM_EPS / (2 * t), 0.1 * 2)
    assert (vectors["lr"], vectors["eps"]) == (1e-3, ADAM_EPS / (2 * t))
    assert {id(p) for p in vectors["params"]} == {id(p) for p in model.blocks.parameters()} - \
        {id(p) for p in hidden["params"]}
    assert (rest["lr"], rest["eps"]) == (1e-3, ADAM_EPS / 2)  # embeddings and the final norm: width only
    every = [p for g in (hidden, vectors, rest) for p in g["params"]]
    assert len(every) == len({id(p) for p in every}) == len(list(model.parameters()))


def test_a_branch_joins_the_stream_scaled_by_base_over_depth() -> None:
    """One block's output minus its input is its two branches; ×1/t under CompleteP, exactly."""
    from archhpo.models._blocks import Block

    torch.manual_seed(0)
    plain = Block(32, 4, 64)
    scaled = Block(32, 4, 64, residual_scale=0.25)
    scaled.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 32)
    a = plain.attn(plain.attn_norm(x), None, None, False)
    y = x + 0.25 * a
    expected = y + 0.25 * scaled.ff(scaled.ff_norm(y))
    assert torch.equal(scaled(x), expected)


def test_completep_keeps_the_parameter_count_and_flops_and_refuses_a_bad_base_depth() -> None:
    cfg = replace(BASE, n_layers=8, parametrization="mup", mup_base_width=32, mup_base_depth=2)
    assert param_count(cfg) == param_count(BASE.__class__(**{**BASE.__dict__, "n_layers": 8}))
    assert flops_per_sample(cfg) == flops_per_sample(replace(BASE, n_layers=8))
    assert replace(BASE, mup_base_depth=2).depth_multiplier == 1.0  # a base depth alone is not CompleteP
    with pytest.raises(ConfigError, match="mup_base_depth must be a positive integer n_layers, got 0"):
        replace(cfg, mup_base_depth=0)
