"""The lm's tied head on CUDA runs its matmul over the vocabulary padded to HEAD_MULTIPLE: only the
kernel is padded (the weight and the logits keep the exact vocabulary), and on CPU nothing changes."""

from __future__ import annotations

import torch

from archhpo.models.lm import HEAD_MULTIPLE, LM, LMConfig, padded_vocab, param_count, tied_head


def test_the_padded_vocabulary_is_a_cuda_choice() -> None:
    assert HEAD_MULTIPLE == 64
    assert padded_vocab(50_257, "cuda") == 50_304 and padded_vocab(50_304, "cuda") == 50_304
    assert padded_vocab(50_257, "cpu") == 50_257 and padded_vocab(50_257, "cuda", multiple=1) == 50_257
    assert padded_vocab(256, "cuda") == 256


def test_a_padded_kernel_gives_the_exact_vocabularys_logits_and_gradients() -> None:
    torch.manual_seed(0)
    weight = torch.randn(1000, 32, requires_grad=True)
    x = torch.randn(2, 5, 32)
    padded = tied_head(x, weight, 1024)
    plain = torch.nn.functional.linear(x, weight)
    assert padded.shape == plain.shape == (2, 5, 1000)
    torch.testing.assert_close(padded, plain, rtol=0, atol=1e-5)
    (g_pad,) = torch.autograd.grad(padded.square().sum(), weight)
    (g_plain,) = torch.autograd.grad(plain.square().sum(), weight)
    torch.testing.assert_close(g_pad, g_plain, rtol=1e-5, atol=1e-4)
    assert torch.equal(tied_head(x, weight, 1000), plain)  # nothing to pad: the plain F.linear


def test_padding_adds_no_parameter_and_leaves_cpu_logits_bit_for_bit() -> None:
    cfg = LMConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=1001, seq_len=8)
    torch.manual_seed(0)
    model = LM(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)
    assert model.tok_embed.weight.shape == (1001, 32)
    ids = torch.randint(0, 1001, (2, 8))
    out = model(ids)
    model.head_multiple = 1  # what bench/gpu.py's unpadded-head variant sets
    assert out.shape == (2, 8, 1001) and torch.equal(out, model(ids))
