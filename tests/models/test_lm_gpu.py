"""The lm family at GPU scale: GPT-2's vocabulary and context, exact counts and
FLOPs of the 124M, 200M and 2B rows, the class-structured synthetic language, and the causal path
that lets CUDA pick SDPA's flash kernel.  All on CPU (the big rows on the meta device)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from archhpo.budgets import build_grid, parse_budget
from archhpo.models import get_family
from archhpo.models.data import language
from archhpo.models.lm_spec import (
    GPU_DATA,
    GPU_ROWS,
    LMConfig,
    flops_per_sample,
    flops_per_token,
    gpu_config,
    param_count,
)

FAM = get_family("lm")
# The exact figures the docs quote (docs/gpu.md); a change to the model or the count shows here.
EXPECTED = {  # row: (params, FLOPs per token at context 1024)
    "124M": (124_439_808, 854_438_400),
    "200M": (203_668_480, 1_365_743_616),
    "2B": (1_716_492_288, 11_086_540_800),
}


def test_gpt2_small_is_counted_exactly_as_published() -> None:
    """nanoGPT's GPT-2 124M: vocab 50257, context 1024, 12 layers, d 768, tied head."""
    cfg = gpu_config("124M")
    assert (cfg.vocab_size, cfg.seq_len, cfg.n_layers, cfg.d_model) == (50257, 1024, 12, 768)
    assert param_count(cfg) == 124_439_808


@pytest.mark.parametrize("row", list(GPU_ROWS))
def test_gpu_rows_have_the_quoted_counts_and_flops(row: str) -> None:
    cfg = gpu_config(row)
    assert (param_count(cfg), flops_per_token(cfg)) == EXPECTED[row]
    assert flops_per_sample(cfg) == flops_per_token(cfg) * cfg.seq_len
    # nanoGPT's estimate_mfu per token: 6 x (matmul weights) + 12 L s d, the tied head's V x d included.
    d, n, s, f, v = cfg.d_model, cfg.n_layers, cfg.seq_len, cfg.d_ff, cfg.vocab_size
    matmul_weights = n * (4 * d * d + 2 * d * f) + v * d
    assert flops_per_token(cfg) == 6 * matmul_weights + 12 * n * s * d


def test_context_2048_doubles_the_attention_term_only() -> None:
    a, b = gpu_config("124M", 1024), gpu_config("124M", 2048)
    assert flops_per_token(b) - flops_per_token(a) == 12 * a.n_layers * 1024 * a.d_model
    assert param_count(b) - param_count(a) == 1024 * a.d_model  # the position table


@pytest.mark.parametrize("row", list(GPU_ROWS))
def test_the_rows_are_rows_of_the_lm_grid(row: str) -> None:
    """124M, 200M and 2B rows of `archhpo grid --family lm --vocab-size 50257 --seq-len 1024`
    (124M keeps GPT-2's 12 heads, which the grid does not list: the same count and FLOPs)."""
    rows = build_grid(FAM, parse_budget(row), {"vocab_size": 50257, "seq_len": 1024})
    arch = GPU_ROWS[row]
    assert any((r.d_model, r.n_layers, r.d_ff, r.param_count) == (arch["d_model"], arch["n_layers"], arch["d_ff"],
                                                                   EXPECTED[row][0]) for r in rows)


def test_the_gpu_data_spec_is_gpt2_sized_and_exact() -> None:
    spec = FAM.parse_data(GPU_DATA, {"seq_len": 1024})
    info = FAM.data_info(spec, {"seq_len": 1024})
    assert info["vocab_size"] == 50257 and info["classes"] == 32
    assert FAM.config_for(GPU_ROWS["124M"], info) == gpu_config("124M")
    assert info["entropy_rate"] < info["loss_floor"] < info["unigram_entropy"] < math.log(50257)


def _token_chain(v: int, c: int, lang: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute force: the token-level order-1 chain of a class language (v tokens, c classes)."""
    probs = language.source_probs(c, 1, lang)
    bounds = language.class_bounds(v, c)
    cls = np.searchsorted(bounds, np.arange(v), side="right") - 1
    within = np.concatenate([language.member_probs(bounds[i + 1] - bounds[i]) for i in range(c)])
    m = probs[cls][:, cls] * within[None, :]  # P(tok' | tok) = P(class' | class) q(tok')
    values, vectors = np.linalg.eig(m.T)
    pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    return m, pi / pi.sum()


def test_a_class_languages_facts_equal_the_token_chains() -> None:
    v, c, lang = 11, 3, 5
    m, pi = _token_chain(v, c, lang)
    rate = float(-(pi[:, None] * m * np.log(m)).sum())
    unigram = float(-(pi * np.log(pi)).sum())
    facts = language.language_facts(v, 1, lang, 4, c)
    assert facts["entropy_rate"] == pytest.approx(rate, abs=1e-12)
    assert facts["unigram_entropy"] == pytest.approx(unigram, abs=1e-12)
    # order 1 from the stationary start: the first target already has a full context
    assert facts["loss_floor"] == pytest.approx(rate, abs=1e-12)


def test_a_class_language_samples_its_token_chain() -> None:
    v, c, lang = 11, 3, 5
    m, pi = _token_chain(v, c, lang)
    seed = np.random.SeedSequence([lang, 0, 0])
    windows = language.expand_classes(language.sample_windows(c, 1, lang, 20000, 6, seed), v, c, seed)
    assert windows.min() >= 0 and windows.max() < v
    pairs = np.zeros((v, v))
    np.add.at(pairs, (windows[:, 2], windows[:, 3]), 1)
    expected = pi[:, None] * m
    assert np.abs(pairs / len(windows) - expected).max() < 4 * math.sqrt(expected.max() / len(windows))


def test_classes_equal_to_the_vocabulary_is_the_plain_language() -> None:
    plain = FAM.parse_data("synthetic:tokens=4000", {"seq_len": 8})
    assert FAM.parse_data("synthetic:tokens=4000,classes=32", {"seq_len": 8}) == plain
    a, b = (FAM.load_data(s, {"seq_len": 8, "seed": 0}) for s in (plain, dict(plain)))
    assert torch.equal(a.train_target, b.train_target)
    with pytest.raises(Exception, match="classes=32"):
        FAM.parse_data("synthetic:vocab=50257", {})


def test_off_the_cpu_attention_is_sdpa_causal_without_a_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """What lets CUDA run the flash kernel: is_causal=True and no attn_mask (the meta device stands
    in for CUDA here); on the CPU the explicit mask stays, so CPU losses do not change."""
    calls: list[dict[str, object]] = []
    real = F.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append({"is_causal": kwargs.get("is_causal"), "mask": kwargs.get("attn_mask")})
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    cfg = gpu_config("124M", 64, 100)
    with torch.device("meta"):
        model = FAM.build(cfg)
        model(torch.zeros(2, 64, dtype=torch.long))
    assert len(calls) == cfg.n_layers and all(c["is_causal"] is True and c["mask"] is None for c in calls)
    calls.clear()
    small = FAM.build(LMConfig(d_model=16, n_heads=2, d_ff=32, vocab_size=16, seq_len=8))
    small(torch.zeros(1, 8, dtype=torch.long))
    assert calls and all(c["mask"] is not None for c in calls)


def test_the_causal_kernel_path_matches_the_masked_path() -> None:
    cfg = LMConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, vocab_size=16, seq_len=8)
    torch.manual_seed(0)
    model = FAM.build(cfg).eval()
    ids = torch.randint(0, 16, (3, 8))
    h = model.tok_embed(ids) + model.pos_embed.weight
    for block in model.blocks:
        masked = block(h, attn_mask=model.causal)
        assert torch.allclose(block(h, is_causal=True), masked, atol=1e-6)
        h = masked

