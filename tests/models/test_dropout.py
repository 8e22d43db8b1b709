"""CPU dropout from hashed masks: the drop rate, the 1/(1 - p) scaling,
reproducibility under a seed and across thread counts, attention dropout that is a dropout of the
attention probabilities, the fused C kernels against the tensor path that computes the same masks,
the fallback where no compiler builds them, PyTorch's own kernels off the CPU, and layers that
equal PyTorch's own wherever no dropout applies."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from archhpo.models import _cpu_kernels, family_names, get_family
from archhpo.models._blocks import Block, EncoderLayer
from archhpo.models._dropout import Dropout, attention, drop_rate, dropout

needs_kernels = pytest.mark.skipif(_cpu_kernels.lib() is None, reason="no C compiler built the CPU kernels")


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_and_scaling_match_p_within_binomial_noise(p: float) -> None:
    torch.manual_seed(0)
    n = 1_000_003  # odd: the last int64 draw is only partly used
    y = dropout(torch.ones(n), p, training=True)
    dropped = int((y == 0).sum())
    sd = math.sqrt(n * p * (1 - p))  # binomial standard deviation of the dropped count
    assert abs(dropped - n * p) < 5 * sd
    assert abs(drop_rate(p) - p) <= 2**-16
    # Every kept value is exactly 1/(1 - rate): the expectation of each value is kept.
    kept = y[y != 0]
    assert torch.equal(kept, torch.full_like(kept, 1.0 / (1.0 - drop_rate(p))))


def test_masks_are_independent_across_positions() -> None:
    # Lanes come four to an int64 word; neighbouring values must not be dropped together.
    torch.manual_seed(1)
    p, n = 0.5, 400_000
    d = (dropout(torch.ones(n), p, training=True) == 0).float()
    both = float((d[:-1] * d[1:]).mean())
    sd = math.sqrt(0.25 * 0.75 / n)
    assert abs(both - 0.25) < 5 * sd


def test_same_seed_same_mask_whatever_the_thread_count() -> None:
    x = torch.randn(64, 159, 64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(7)
        one = dropout(x, 0.1, training=True)
        torch.set_num_threads(2)
        torch.manual_seed(7)
        two = dropout(x, 0.1, training=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    torch.manual_seed(8)
    assert not torch.equal(one, dropout(x, 0.1, training=True))


def test_no_dropout_in_eval_or_at_p_zero_and_gradient_is_masked() -> None:
    x = torch.randn(10, 10)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    x.requires_grad_(True)
    torch.manual_seed(2)
    y = Dropout(0.3)(x)
    y.sum().backward()
    # d y / d x is the scaled mask itself: 0 where dropped, 1/(1 - rate) where kept.
    assert torch.equal(x.grad, (y != 0).float() / (1 - drop_rate(0.3)))


def test_attention_dropout_drops_the_attention_probabilities() -> None:
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, 7, 4) for _ in range(3))
    mask = torch.zeros(7, 7).masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    p = 0.4
    torch.manual_seed(4)
    got = attention(q, k, v, mask, p)
    probs = torch.softmax(q @ k.transpose(-2, -1) / 2.0 + mask, dim=-1)  # sqrt(d/h) = 2
    torch.manual_seed(4)  # the same random bits, drawn for a tensor of the probabilities' shape
    want = dropout(probs, p, training=True) @ v
    assert torch.allclose(got, want, atol=1e-6)
    # Without dropout it is SDPA itself.
    assert torch.equal(attention(q, k, v, mask, 0.0), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def _stock_pair(p: float) -> tuple[EncoderLayer, nn.TransformerEncoderLayer]:
    torch.manual_seed(5)
    ours = EncoderLayer(16, 4, 32, dropout=p, activation="gelu", batch_first=True, norm_first=True)
    stock = nn.TransformerEncoderLayer(16, 4, 32, dropout=p, activation="gelu", batch_first=True, norm_first=True)
    stock.load_state_dict(ours.state_dict())  # same keys: checkpoints of either load into the other
    return ours, stock


def test_encoder_layer_is_the_stock_layer_without_dropout() -> None:
    x = torch.randn(3, 9, 16)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)
    ours, stock = _stock_pair(0.1)
    ours.eval()
    stock.eval()
    assert torch.equal(ours(x, src_mask=causal, is_causal=True), stock(x, src_mask=causal, is_causal=True))
    ours, stock = _stock_pair(0.0)  # training, p = 0: the flash path, as PyTorch's layer takes it
    assert torch.equal(ours(x, src_mask=causal, is_causal=True), stock(x, src_mask=causal, is_causal=True))


def test_encoder_layer_explicit_attention_computes_the_stock_attention() -> None:
    # A p too small to drop anything (rate 0) still takes the explicit CPU path in training.
    x = torch.randn(3, 9, 16)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)
    ours, stock = _stock_pair(1e-9)
    assert drop_rate(1e-9) == 0.0
    stock.eval()
    got = ours(x, src_mask=causal, is_causal=True)
    assert torch.allclose(got, stock(x, src_mask=causal, is_causal=True), atol=1e-5)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[0, 7:] = True
    assert torch.allclose(ours(x, src_key_padding_mask=pad), stock(x, src_key_padding_mask=pad), atol=1e-5)


def test_block_and_encoder_layer_drop_in_training_and_repeat_under_a_seed() -> None:
    x = torch.randn(4, 11, 16)
    for layer in (Block(16, 4, 32, dropout=0.2), _stock_pair(0.2)[0]):
        layer.train()
        torch.manual_seed(6)
        a = layer(x)
        torch.manual_seed(6)
        b = layer(x)
        torch.manual_seed(9)
        c = layer(x)
        layer.eval()
        assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, layer(x))


def _qkv(b: int, h: int, n: int, dh: int) -> list[torch.Tensor]:
    torch.manual_seed(10)
    x = torch.randn(b, n, 3, h, dh)  # laid out as the layers make them: a permuted (B, L, 3, h, d/h) view
    return [t.clone().requires_grad_(True) for t in x.permute(2, 0, 3, 1, 4)]


def _attention_and_grads(qkv: list[torch.Tensor], mask: torch.Tensor | None, p: float) -> list[torch.Tensor]:
    for t in qkv:
        t.grad = None
    torch.manual_seed(11)
    out = attention(*qkv, mask, p)
    out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape))
    return [out.detach()] + [t.grad for t in qkv if t.grad is not None]


def _masks(b: int, n: int) -> dict[str, torch.Tensor | None]:
    causal = torch.zeros(n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    pad = torch.zeros(b, 1, 1, n)
    pad[0, ..., n // 2 :] = float("-inf")  # the first sample's second half is padding
    return {"none": None, "causal": causal, "padding": pad, "both": causal + pad}


@needs_kernels
@pytest.mark.parametrize("shape", [(2, 3, 7, 4), (3, 4, 37, 16), (2, 2, 21, 24), (1, 2, 70, 40)])
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding", "both"])
def test_fused_attention_equals_the_tensor_path(
    shape: tuple[int, int, int, int], mask_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sizes off the kernel's blocks (rows of 4, keys and features of 16) check its padding.
    qkv, mask = _qkv(*shape), _masks(shape[0], shape[2])[mask_name]
    fused = _attention_and_grads(qkv, mask, 0.3)
    monkeypatch.setattr(_cpu_kernels, "lib", lambda: None)
    plain = _attention_and_grads(qkv, mask, 0.3)  # the same masks, drawn with tensor operations
    for got, want in zip(fused, plain, strict=True):
        # Float rounding only: the kernel sums in another order and computes its own exp.
        assert torch.allclose(got, want, rtol=1e-5, atol=2e-6), (got - want).abs().max()


def _block_causal(steps: int, per_step: int) -> torch.Tensor:
    from archhpo.models._blocks import _sdpa_mask
    from archhpo.models.signal import block_causal_mask

    return _sdpa_mask(block_causal_mask(steps, per_step), None, torch.float32)  # as the layers pass it


@needs_kernels
@pytest.mark.parametrize(("name", "make", "b", "n"), [
    ("causal 159 (the signal encoders)", lambda: _block_causal(159, 1), 2, 159),
    ("block-causal 23 x 4 (cat)", lambda: _block_causal(23, 4), 2, 92),
    ("causal, shorter than a block", lambda: _block_causal(5, 1), 2, 5),
    ("causal + per-sample padding", lambda: _masks(3, 70)["both"], 3, 70),
])
def test_masked_keys_are_skipped_without_changing_a_bit(name: str, make: Any, b: int, n: int) -> None:
    # Keys hidden (-inf) from a whole block of query rows are not computed: their probability is
    # exactly 0. A mask of -1e30 hides the same keys (probability 0 too) but is computed in full:
    # output and gradients must agree bit for bit (signs of zero included).
    mask = make()
    qkv = _qkv(b, 4, n, 16)
    skipped = _attention_and_grads(qkv, mask, 0.1)
    computed = _attention_and_grads(qkv, mask.masked_fill(mask == float("-inf"), -1e30), 0.1)
    for got, want in zip(skipped, computed, strict=True):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), name


@needs_kernels
def test_fused_attention_drops_probabilities_at_the_rate_and_scales_the_rest() -> None:
    # q = k = 0: every probability is 1/L; v = the identity, so out[i, j] is P_ij's dropped value.
    b, h, n, p = 16, 4, 64, 0.25
    q = k = torch.zeros(b, h, n, n)
    v = torch.eye(n).expand(b, h, n, n).contiguous()
    torch.manual_seed(12)
    out = attention(q, k, v, None, p)
    dropped, total = int((out == 0).sum()), out.numel()
    assert abs(dropped - total * p) < 5 * math.sqrt(total * p * (1 - p))
    kept = out[out != 0]
    assert torch.equal(kept, torch.full_like(kept, 1.0 / (1.0 - drop_rate(p)) / n))


@needs_kernels
def test_fused_dropout_equals_the_tensor_path_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(33, 65, requires_grad=True)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        x.grad = None
        torch.manual_seed(13)
        y = dropout(x, 0.2, training=True)
        y.backward(torch.full_like(y, 3.0))
        assert x.grad is not None
        return y.detach(), x.grad

    fused = run()
    monkeypatch.setattr(_cpu_kernels, "lib", lambda: None)
    assert all(torch.equal(a, b) for a, b in zip(fused, run(), strict=True))


@needs_kernels
def test_fused_attention_repeats_exactly_whatever_the_thread_count() -> None:
    qkv, mask = _qkv(2, 4, 45, 16), _masks(2, 45)["both"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _attention_and_grads(qkv, mask, 0.1)
        torch.set_num_threads(3)
        three = _attention_and_grads(qkv, mask, 0.1)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, three, strict=True))


def test_without_a_compiler_the_tensor_path_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no library built before
    _cpu_kernels.lib.cache_clear()
    try:
        assert _cpu_kernels.lib() is None
        assert list(tmp_path.rglob("*.so")) == []
        qkv = _qkv(2, 2, 9, 4)
        out = _attention_and_grads(qkv, None, 0.5)
        assert all(torch.isfinite(t).all() for t in out) and (dropout(torch.ones(100), 0.5, True) == 0).any()
    finally:
        _cpu_kernels.lib.cache_clear()


def _spy_pytorch_kernels(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    calls: list[tuple[str, float]] = []
    sdpa, drop = F.scaled_dot_product_attention, F.dropout
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(("sdpa", k["dropout_p"])) or sdpa(*a, **k))
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append(("dropout", p)) or drop(x, p, training))
    return calls


def test_off_the_cpu_pytorchs_fused_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # On CUDA (here the meta device stands in for it) dropout is F.dropout and attention is SDPA
    # with dropout_p: PyTorch's fused kernels, not this module's.
    calls = _spy_pytorch_kernels(monkeypatch)
    q = torch.empty(2, 2, 5, 4, device="meta")
    assert attention(q, q, q, None, 0.1).device.type == "meta"
    assert dropout(torch.empty(3, device="meta"), 0.2, training=True).device.type == "meta"
    assert calls == [("sdpa", 0.1), ("dropout", 0.2)]


def test_under_torch_compile_pytorchs_own_dropout_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    # A compiled graph cannot call the kernels (data pointers) nor read a seed back per call.
    calls = _spy_pytorch_kernels(monkeypatch)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q = torch.randn(2, 2, 5, 4)
    attention(q, q, q, None, 0.1)
    dropout(q, 0.2, training=True)
    assert calls == [("sdpa", 0.1), ("dropout", 0.2)]


_FUSED_SDPA = {
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")
@pytest.mark.parametrize("name", family_names())
def test_on_cuda_a_training_step_keeps_pytorchs_fused_dropout_and_attention(name: str) -> None:
    """On a real GPU, under the trainer's bf16 autocast, a training step with dropout 0.1 runs
    SDPA's fused kernels with their own dropout (never the math path) and ``native_dropout``,
    and none of this module's CPU functions."""
    from torch.profiler import ProfilerActivity, profile

    family = get_family(name)
    quick = {"quick": True, "seed": 0}
    data = family.load_data(family.parse_data("synthetic", quick), quick)
    row = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}
    torch.manual_seed(0)
    model = family.build(family.config_for(row, {**data.info, "dropout": 0.1})).cuda().train()
    inputs = tuple(t[:8].cuda() for t in data.train_inputs)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = family.loss(model(*inputs), data.train_target[:8].cuda())
        loss.backward()
        torch.cuda.synchronize()
    ops = {e.key for e in prof.key_averages()}
    assert ops & _FUSED_SDPA, sorted(o for o in ops if "attention" in o)
    assert "aten::_scaled_dot_product_attention_math" not in ops
    assert "aten::native_dropout" in ops and "aten::bernoulli_" not in ops
    assert not [o for o in ops if "_Fused" in o], ops  # _FusedDropout / _FusedAttention: CPU only
