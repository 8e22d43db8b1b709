"""The signal family: exact counts for every encoder, causality, encoder specifics, loss, learning."""

from __future__ import annotations

import math

import pytest
import torch

from archhpo.errors import ConfigError
from archhpo.models import TensorDataset
from archhpo.models.data import multisignal
from archhpo.models.signal import (
    ENCODERS,
    FAMILY,
    IGNORE_INDEX,
    ORTHO_LAMBDA,
    SignalConfig,
    block_causal_mask,
    param_count,
    sinusoidal_positions,
)

# (d_model, n_layers, n_heads, d_ff, channels, num_bins); every d is divisible by its C so that
# concat runs on all of them.
SMALL_CONFIGS = [
    (8, 1, 1, 16, 1, 2),
    (12, 2, 3, 24, 3, 7),
    (16, 1, 2, 32, 4, 8),
    (32, 2, 4, 64, 8, 32),
    (64, 3, 8, 128, 16, 10),
]


def _cfg(encoder: str, d: int = 16, layers: int = 2, heads: int = 2, ff: int = 32, c: int = 4, k: int = 8,
         seq_len: int = 32) -> SignalConfig:
    return SignalConfig(d_model=d, n_layers=layers, n_heads=heads, d_ff=ff, encoder=encoder, channels=c,
                        num_bins=k, seq_len=seq_len)


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- counting


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("d,layers,heads,ff,c,k", SMALL_CONFIGS)
def test_param_count_is_exact(encoder: str, d: int, layers: int, heads: int, ff: int, c: int, k: int) -> None:
    cfg = _cfg(encoder, d, layers, heads, ff, c, k)
    assert param_count(cfg) == _n_params(FAMILY.build(cfg))


def test_param_count_differences_between_encoders() -> None:
    """Spot-check the closed form against the encoder definitions (d 32, C 8, K 32)."""
    base = param_count(_cfg("linear", d=32, c=8, k=32))
    assert param_count(_cfg("linear-ortho", d=32, c=8, k=32)) == base
    assert param_count(_cfg("linear-ppe", d=32, c=8, k=32)) - base == 32 * 32 + 32  # Linear(d, d)
    assert base - param_count(_cfg("concat", d=32, c=8, k=32)) == 2 * 8 * 32 - 2 * 32
    # ci's head reads C·d features instead of d.
    assert param_count(_cfg("ci", d=32, c=8, k=32)) - param_count(_cfg("concat", d=32, c=8, k=32)) == 7 * 32 * 32


# ---------------------------------------------------------------------------- causality


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("train_mode", [False, True])
def test_future_inputs_do_not_change_past_logits(encoder: str, train_mode: bool) -> None:
    torch.manual_seed(0)
    model = FAMILY.build(_cfg(encoder))
    model.train(train_mode)  # eval mode takes the fused fast path of TransformerEncoderLayer
    x = torch.randn(2, 12, 4)
    t = 6
    x2 = x.clone()
    x2[:, t + 1 :] = torch.randn(2, 12 - t - 1, 4)
    with torch.no_grad():  # the same dropout masks for both calls (the seed before each)
        a = torch.manual_seed(1) and model(x)
        b = torch.manual_seed(1) and model(x2)
    assert a.shape == (2, 12, 8)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-5)
    assert (a[:, t + 1] - b[:, t + 1]).abs().max() > 1e-4  # and the model does read step t+1


@pytest.mark.parametrize("encoder", ENCODERS)
def test_every_channel_at_the_current_step_reaches_its_logits(encoder: str) -> None:
    torch.manual_seed(0)
    model = FAMILY.build(_cfg(encoder)).eval()
    x = torch.randn(1, 5, 4)
    for k in range(4):
        x2 = x.clone()
        x2[0, 3, k] += 1.0
        with torch.no_grad():
            diff = (model(x) - model(x2))[0]
        assert diff[:3].abs().max() < 1e-5
        assert diff[3].abs().max() > 1e-5


def test_block_causal_mask() -> None:
    assert torch.equal(block_causal_mask(4, 1), torch.ones(4, 4, dtype=torch.bool).triu(1))
    mask = block_causal_mask(3, 2)  # tokens (step, channel): (0,0) (0,1) (1,0) (1,1) (2,0) (2,1)
    for i in range(6):
        for j in range(6):
            assert bool(mask[i, j]) == (j // 2 > i // 2)


def test_cat_attends_freely_within_a_step() -> None:
    """Channel 0's token at step t reads channel C-1 at step t (a later token in the flat order)."""
    torch.manual_seed(0)
    model = FAMILY.build(_cfg("cat", layers=1)).eval()
    seen: list[torch.Tensor] = []
    model.layers[0].register_forward_hook(lambda mod, args, out: seen.append(out.detach()))
    x = torch.randn(1, 5, 4)
    x2 = x.clone()
    t, c = 2, 4
    x2[0, t, c - 1] += 1.0
    with torch.no_grad():
        model(x)
        model(x2)
    a, b = seen  # (1, T*C, d) each, token step*C + channel
    assert (a[0, : t * c] - b[0, : t * c]).abs().max() < 1e-6  # earlier steps untouched
    assert (a[0, t * c] - b[0, t * c]).abs().max() > 1e-4  # (t, channel 0) sees (t, channel C-1)


# ---------------------------------------------------------------------------- encoder specifics


@pytest.mark.parametrize("encoder", ENCODERS)
def test_positions_are_a_fixed_buffer(encoder: str) -> None:
    model = FAMILY.build(_cfg(encoder, d=16, seq_len=20))
    buffers = dict(model.named_buffers())
    assert "pos" in buffers and "pos" not in dict(model.named_parameters())
    torch.testing.assert_close(buffers["pos"], sinusoidal_positions(20, 16))
    assert not buffers["pos"].requires_grad
    assert "pos" not in model.state_dict()  # recomputed from the config, not checkpointed


def test_sinusoidal_positions_values() -> None:
    table = sinusoidal_positions(7, 5)  # odd d: sin in columns 0, 2, 4, cos in 1, 3
    assert table.shape == (7, 5)
    assert table[3, 0] == pytest.approx(math.sin(3.0))
    assert table[3, 1] == pytest.approx(math.cos(3.0))
    assert table[3, 2] == pytest.approx(math.sin(3.0 / 10000 ** (2 / 5)))
    assert table[3, 3] == pytest.approx(math.cos(3.0 / 10000 ** (2 / 5)))


def test_concat_rejects_channels_not_dividing_d_model() -> None:
    with pytest.raises(ConfigError, match="divide d_model"):
        _cfg("concat", d=32, c=6)
    with pytest.raises(ConfigError, match="divide d_model"):
        FAMILY.config_for({"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128},
                          {"channels": 5, "encoder": "concat"})
    _cfg("linear", d=32, c=6)  # other encoders do not care


def test_ortho_penalty_is_zero_for_orthogonal_weights_and_positive_otherwise() -> None:
    torch.manual_seed(0)
    model = FAMILY.build(_cfg("linear-ortho", d=16, c=4))
    w = model.encoder.weight  # (C, d), row k is W_k
    with torch.no_grad():
        w.copy_(3.0 * torch.eye(16)[:4])  # orthogonal (not orthonormal) rows
    assert model.extra_loss().item() == 0.0
    with torch.no_grad():
        w.copy_(torch.randn(4, 16))
    expected = ORTHO_LAMBDA * sum((w[i] @ w[j]).item() ** 2 for i in range(4) for j in range(4) if i != j) / 2
    penalty = model.extra_loss()
    assert penalty.item() > 0
    assert penalty.item() == pytest.approx(expected, rel=1e-5)
    penalty.backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


@pytest.mark.parametrize("encoder", [e for e in ENCODERS if e != "linear-ortho"])
def test_other_encoders_have_no_extra_loss(encoder: str) -> None:
    assert FAMILY.build(_cfg(encoder)).extra_loss().item() == 0.0


def test_sum_encoder_ignores_channel_identity() -> None:
    """Swapping two channels changes nothing for sum (shared W), but does for linear."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 4)
    swapped = x[..., [1, 0, 2, 3]]
    with torch.no_grad():
        s = FAMILY.build(_cfg("sum")).eval()
        torch.testing.assert_close(s(x), s(swapped))
        lin = FAMILY.build(_cfg("linear")).eval()
        assert (lin(x) - lin(swapped)).abs().max() > 1e-4


# ---------------------------------------------------------------------------- the paper's settings


@pytest.mark.parametrize("encoder", ENCODERS)
def test_dropout_is_in_every_transformer_layer(encoder: str) -> None:
    """The paper's 0.1 by default, in attention, after attention, in and after the feed-forward."""
    arch = {"d_model": 16, "n_layers": 3, "n_heads": 2, "d_ff": 32}
    model = FAMILY.build(FAMILY.config_for(arch, {"encoder": encoder, "channels": 4}))
    assert len(model.layers) == 3
    for layer in model.layers:
        assert isinstance(layer, torch.nn.TransformerEncoderLayer)
        assert [layer.dropout.p, layer.dropout1.p, layer.dropout2.p, layer.self_attn.dropout] == [0.1] * 4
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(drops) == 3 * 3  # nowhere else (the encoders and the head have none)
    off = FAMILY.build(FAMILY.config_for(arch, {"encoder": encoder, "channels": 4, "dropout": 0.0}))
    assert all(m.p == 0.0 for m in off.modules() if isinstance(m, torch.nn.Dropout))
    assert SignalConfig().dropout == 0.1


def test_dropout_changes_training_outputs_only() -> None:
    torch.manual_seed(0)
    model = FAMILY.build(_cfg("linear"))
    x = torch.randn(2, 10, 4)
    with torch.no_grad():
        assert not torch.equal(model.train()(x), model(x))  # two different dropout masks
        model.eval()
        torch.testing.assert_close(model(x), model(x))


def test_encoder_initialisation_follows_the_paper() -> None:
    """linear: W_k ~ N(0, std 1/sqrt(d)), b_k = 0; sum: W ~ U(-1, 1), e_k ~ N(0, 1); concat:
    N(0, std 1/sqrt(d/C)), 0; cat: channel embedding N(0, 1) (nn.Embedding's)."""
    torch.manual_seed(0)
    d, c = 256, 16
    for enc in ("linear", "linear-ortho", "linear-ppe"):
        lin = FAMILY.build(_cfg(enc, d=d, heads=4, ff=64, c=c)).encoder
        assert lin.weight.std().item() == pytest.approx(1 / math.sqrt(d), rel=0.05)  # a std, not a variance
        assert lin.weight.mean().abs().item() < 0.01
        assert torch.count_nonzero(lin.bias) == 0
    s = FAMILY.build(_cfg("sum", d=d, heads=4, ff=64, c=c)).encoder
    assert s.chan.std().item() == pytest.approx(1.0, rel=0.05)
    assert s.weight.abs().max().item() <= 1.0 and s.weight.std().item() == pytest.approx(1 / math.sqrt(3), rel=0.15)
    cc = FAMILY.build(_cfg("concat", d=d, heads=4, ff=64, c=c)).encoder
    assert cc.weight.std().item() == pytest.approx(1 / math.sqrt(d // c), rel=0.08)
    assert torch.count_nonzero(cc.bias) == 0
    cat = FAMILY.build(_cfg("cat", d=d, heads=4, ff=64, c=c))
    assert cat.chan_embed.std().item() == pytest.approx(1.0, rel=0.05)


def test_positions_flag_sets_the_scored_positions() -> None:
    """'all' (default): the loss averages over all 159 next-step positions, as the paper's tables;
    'predictable': over the 153 whose target is defined."""
    arch = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}
    torch.manual_seed(0)
    for positions, scored in (("all", 159), ("predictable", 153)):
        options = {"positions": positions, "channels": 4}
        spec = FAMILY.parse_data("multisignal:series=12", options)
        data = FAMILY.load_data(spec, options)
        info = {**options, **FAMILY.data_info(spec, options)}
        assert info["positions"] == positions
        model = FAMILY.build(FAMILY.config_for(arch, info)).eval()
        with torch.no_grad():
            logits = model(*data.val_inputs)
        target = data.val_target
        per = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten().clamp(min=0),
                                                reduction="none").view(target.shape)
        keep = target != IGNORE_INDEX
        assert int(keep[0].sum()) == scored
        assert float(FAMILY.loss(logits, target)) == pytest.approx(float(per[keep].mean()), rel=1e-5)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"encoder": "conv"}, "encoder must be one of"),
        ({"channels": 0}, "channels"),
        ({"num_bins": 1}, "num_bins"),
        ({"seq_len": 0}, "seq_len"),
        ({"dropout": 1.0}, "dropout"),
        ({"n_heads": 3}, "divide d_model"),
    ],
)
def test_config_validation(changes: dict, match: str) -> None:
    fields = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, **changes}
    with pytest.raises(ConfigError, match=match):
        SignalConfig(**fields)


def test_forward_rejects_mismatched_inputs() -> None:
    model = FAMILY.build(_cfg("linear", c=4, seq_len=10))
    with pytest.raises(ConfigError, match="channels"):
        model(torch.randn(1, 5, 3))
    with pytest.raises(ConfigError, match="steps"):
        model(torch.randn(1, 11, 4))


# ---------------------------------------------------------------------------- family glue


def test_config_for_uses_data_info() -> None:
    spec = FAMILY.parse_data("multisignal:channels=6", {"num_bins": 16})
    info = FAMILY.data_info(spec, {})
    cfg = FAMILY.config_for({"d_model": 48, "n_layers": 2, "n_heads": 4, "d_ff": 96}, {**info, "encoder": "cat"})
    assert (cfg.channels, cfg.num_bins, cfg.seq_len, cfg.encoder) == (6, 16, 159, "cat")
    assert FAMILY.config_for({"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}, {}).encoder == "linear"
    assert {f.name for f in FAMILY.flags} == {"encoder", "channels", "num_bins", "dropout", "positions"}
    flags = {f.name: f.default for f in FAMILY.flags}
    assert flags["dropout"] == 0.1 and flags["positions"] == "all"
    assert FAMILY.train_defaults["learning_rate"] == 3e-4 and FAMILY.train_defaults["eval_every"] == 20


def test_loss_ignores_unlabelled_steps_and_accuracy_counts_labelled_ones() -> None:
    logits = torch.zeros(1, 3, 4)
    logits[0, 1, 2] = 10.0  # confident and right
    logits[0, 2, 0] = 10.0  # confident and wrong
    target = torch.tensor([[IGNORE_INDEX, 2, 3]])
    expected = (torch.log1p(3 * torch.exp(torch.tensor(-10.0))) + (10 + torch.log1p(3 * torch.exp(torch.tensor(-10.0))))) / 2
    assert float(FAMILY.loss(logits, target)) == pytest.approx(float(expected), rel=1e-5)
    assert FAMILY.metrics(logits, target) == {"accuracy": 0.5}


def test_baseline_is_log_k_for_uniform_bins() -> None:
    k = 8
    train = torch.arange(k).repeat(10).reshape(4, 20)
    train[:, :3] = IGNORE_INDEX
    val = torch.arange(k).repeat(2).reshape(1, 16)
    data = TensorDataset((torch.zeros(4, 20, 4),), train, (torch.zeros(1, 16, 4),), val, {"num_bins": k})
    # Training counts are not exactly uniform (the ignored steps), so allow a little slack.
    assert FAMILY.baseline_loss(data) == pytest.approx(math.log(k), abs=0.02)


# ---------------------------------------------------------------------------- learning


def _train_and_validate(encoder: str, data: TensorDataset, steps: int, lr: float, batch: int,
                        eval_every: int) -> float:
    """A minimal copy of the project's loop (AdamW, clip 1.0, extra_loss in training only): best val NLL."""
    torch.manual_seed(0)
    cfg = FAMILY.config_for({"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64}, {**data.info, "encoder": encoder})
    model = FAMILY.build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(0)  # same batches for every encoder
    (x,), y = data.train_inputs, data.train_target
    best = math.inf
    for step in range(1, steps + 1):
        idx = torch.randint(0, data.n_train, (batch,), generator=gen)
        loss = FAMILY.loss(model(x[idx]), y[idx]) + model.extra_loss()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % eval_every == 0:
            model.eval()
            with torch.no_grad():
                best = min(best, float(FAMILY.loss(model(*data.val_inputs), data.val_target)))
            model.train()
    return best


def test_linear_learns_clearly_better_than_sum_and_both_beat_the_baseline() -> None:
    # The full 512-series data, not quick: generating it costs ~0.1 s and training cost does not
    # depend on it, but with quick's 115 training series the sum model overfits (to positions)
    # before it finds its small signal, whereas here it does not.
    torch.set_num_threads(1)
    data = FAMILY.load_data(FAMILY.parse_data("multisignal", {}), {})
    baseline = FAMILY.baseline_loss(data)
    # The paper's bins ('all'): the zeros of the 6 undefined steps fill the bin of 0 past 1/K, so the
    # base rates are a little better than uniform.
    assert math.log(multisignal.DEFAULT_BINS) - 0.05 < baseline < math.log(multisignal.DEFAULT_BINS)
    runs = {enc: _train_and_validate(enc, data, steps=200, lr=2e-3, batch=16, eval_every=25)
            for enc in ("sum", "linear")}
    print(f"baseline {baseline:.4f}  sum {runs['sum']:.4f}  linear {runs['linear']:.4f}")
    # sum only sees the channel total, whose linear share of the target's variance is ~2%: it
    # beats the base rates, but only just (~0.008 nats); linear reads each channel.
    assert runs["sum"] < baseline - 0.003
    assert runs["linear"] < baseline - 0.2
    assert runs["linear"] < runs["sum"] - 0.2
