"""char_cls family: exact parameter count, padding mask, metrics, baseline and a learning check."""

from __future__ import annotations

import math

import pytest
import torch

from archhpo.errors import ConfigError
from archhpo.models import TensorDataset
from archhpo.models.char_cls import (
    FAMILY,
    PAD_ID,
    VOCAB_SIZE,
    CharCls,
    CharClsConfig,
    baseline_loss,
    encode,
    metrics,
    param_count,
)


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# (d_model, n_layers, n_heads, d_ff, max_len, num_classes, vocab_size)
SMALL_CONFIGS = [
    (64, 2, 2, 128, 64, 2, 40),
    (64, 3, 8, 256, 32, 5, 40),
    (128, 2, 4, 512, 64, 2, 40),
    (192, 1, 16, 384, 16, 3, 40),
    (96, 4, 32, 192, 128, 10, 64),
    (8, 2, 1, 3, 2, 2, 40),
]


@pytest.mark.parametrize(("d", "n_layers", "heads", "d_ff", "max_len", "classes", "vocab"), SMALL_CONFIGS)
def test_param_count_matches_module(d, n_layers, heads, d_ff, max_len, classes, vocab):
    cfg = CharClsConfig(d, n_layers, heads, d_ff, vocab_size=vocab, max_len=max_len, num_classes=classes)
    assert param_count(cfg) == _n_params(FAMILY.build(cfg))


def test_param_count_formula_by_hand():
    # d=4, L=1, f=8, V=40, T=64, C=2: embeds (40+64)·4, layer 4·16+2·32+36+8, norm 8, head 8+2
    cfg = CharClsConfig(4, 1, 2, 8)
    assert param_count(cfg) == 416 + 172 + 8 + 10


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"n_heads": 3}, "must divide"),
        ({"num_classes": 1}, "num_classes"),
        ({"max_len": 1}, "max_len"),
        ({"vocab_size": 39}, "vocab_size"),
        ({"dropout": 1.0}, "dropout"),
        ({"d_model": 0}, "d_model"),
    ],
)
def test_config_validation(kwargs, fragment):
    base = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}
    with pytest.raises(ConfigError, match=fragment):
        CharClsConfig(**{**base, **kwargs})


def test_config_for_uses_data_info():
    info = FAMILY.data_info(FAMILY.parse_data("synthetic", {}), {})
    assert info == {"vocab_size": 40, "max_len": 64, "num_classes": 2}
    cfg = FAMILY.config_for({"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256}, {**info, "num_classes": 5})
    assert (cfg.vocab_size, cfg.max_len, cfg.num_classes) == (40, 64, 5)
    assert [f.name for f in FAMILY.flags] == ["vocab_size", "max_len", "num_classes"]
    assert [f.default for f in FAMILY.flags] == [VOCAB_SIZE, 64, 2]
    assert FAMILY.name == "char_cls"


def _tiny(dropout: float = 0.0, max_len: int = 16, classes: int = 3) -> CharCls:
    torch.manual_seed(0)
    return CharCls(CharClsConfig(16, 2, 4, 32, max_len=max_len, num_classes=classes, dropout=dropout))


def test_forward_shape_and_length_check():
    model = _tiny()
    ids = encode(["example.com", "x"], 16)  # (2, 16)
    assert model(ids).shape == (2, 3)
    assert model(ids[:, :5]).shape == (2, 3)  # shorter batches are fine
    with pytest.raises(ValueError, match="max_len"):
        model(encode(["a"], 17))


@pytest.mark.parametrize("train_mode", [False, True])
def test_appending_padding_does_not_change_logits(train_mode):
    # eval mode takes PyTorch's fused fast path, train mode (dropout 0) the plain one.
    model = _tiny().train(train_mode)
    short = encode(["abc.de"], 8)  # (1, 8)
    batch = encode(["abc.de", "a-much-longer_name42.org"], 16)  # (2, 16): row 0 has 8 more PADs
    assert torch.equal(batch[0, :8], short[0]) and (batch[0, 8:] == PAD_ID).all()
    with torch.no_grad():
        alone, padded = model(short), model(batch)
    torch.testing.assert_close(alone[0], padded[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("train_mode", [False, True])
def test_perturbing_padding_embeddings_does_not_change_logits(train_mode):
    model = _tiny().train(train_mode)
    ids = encode(["abc.de", "ab"], 16)  # longest text uses positions 0..5
    with torch.no_grad():
        before = model(ids)
        model.pos_embed.weight[6:] += 10 * torch.randn_like(model.pos_embed.weight[6:])
        model.tok_embed.weight[PAD_ID] += 10.0
        after = model(ids)
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)


def test_metrics_binary_by_hand():
    # target 1 1 1 0 0, predicted 1 0 1 1 0: tp=2 fp=1 fn=1 tn=1
    target = torch.tensor([1, 1, 1, 0, 0])
    pred = torch.tensor([1, 0, 1, 1, 0])
    logits = torch.nn.functional.one_hot(pred, 2).float()
    m = metrics(logits, target)
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)


def test_metrics_multiclass_macro_by_hand():
    target = torch.tensor([0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0, 1, 1, 1, 0, 2])
    m = metrics(torch.nn.functional.one_hot(pred, 3).float(), target)
    # per class precision 1/2, 2/3, 1; recall 1/2, 1, 1/2
    p = [1 / 2, 2 / 3, 1.0]
    r = [1 / 2, 1.0, 1 / 2]
    f = [2 * a * b / (a + b) for a, b in zip(p, r, strict=True)]
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["precision"] == pytest.approx(sum(p) / 3)
    assert m["recall"] == pytest.approx(sum(r) / 3)
    assert m["f1"] == pytest.approx(sum(f) / 3)


def test_metrics_no_positive_predictions_is_zero_not_nan():
    m = metrics(torch.tensor([[1.0, 0.0], [2.0, 0.0]]), torch.tensor([1, 0]))
    assert m == {"accuracy": 0.5, "precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_loss_and_baseline_loss():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    target = torch.tensor([0, 1])
    expected = -(math.log(math.exp(2) / (math.exp(2) + 1)) + math.log(math.e / (math.e + 1))) / 2
    assert float(FAMILY.loss(logits, target)) == pytest.approx(expected, rel=1e-6)
    ids = torch.ones(4, 3, dtype=torch.long)
    # training frequencies 3/4, 1/4; validation labels 0, 1
    data = TensorDataset((ids,), torch.tensor([0, 0, 0, 1]), (ids[:2],), torch.tensor([0, 1]), {"num_classes": 2})
    assert baseline_loss(data) == pytest.approx(-(math.log(0.75) + math.log(0.25)) / 2)


def test_tiny_model_learns_quick_synthetic_set():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = FAMILY.load_data(FAMILY.parse_data("synthetic", {}), {"quick": True, "seed": 0})
    cfg = FAMILY.config_for({"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64}, data.info)
    model = FAMILY.build(cfg)
    (x,), y = data.train_inputs, data.train_target
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        model.train()
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), 32):
            idx = perm[i : i + 32]
            loss = FAMILY.loss(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(data.val_inputs[0])
    val_loss = float(FAMILY.loss(logits, data.val_target))
    scores = FAMILY.metrics(logits, data.val_target)
    baseline = FAMILY.baseline_loss(data)
    assert baseline == pytest.approx(math.log(2), abs=0.01)  # balanced classes
    assert val_loss < 0.6 * baseline, (val_loss, baseline)
    assert scores["accuracy"] >= 0.8, scores
