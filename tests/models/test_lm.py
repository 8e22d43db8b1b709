"""The `lm` family: a causal nanoGPT-style decoder and the languages it learns.

The synthetic language's entropy rate and loss floor are checked against independent brute-force
computations on a tiny source and against a long sample; the model is causal, its head is tied
and counted once; a text file is read as bytes and refused with a sentence when it cannot be used.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from archhpo.errors import ConfigError, DataError
from archhpo.models import get_family
from archhpo.models.data import language
from archhpo.models.lm import LMConfig
from archhpo.search import prepare_settings

FAM = get_family("lm")


def _chain(probs: np.ndarray) -> np.ndarray:
    """The full transition matrix over contexts (brute force: one row per context tuple)."""
    v, k = probs.shape[-1], probs.ndim - 1
    contexts = list(itertools.product(range(v), repeat=k))
    index = {c: i for i, c in enumerate(contexts)}
    m = np.zeros((len(contexts), len(contexts)))
    for c in contexts:
        for x in range(v):
            m[index[c], index[c[1:] + (x,)]] += probs[c + (x,)]
    return m


def _stationary_by_eigenvector(m: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eig(m.T)
    pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    return pi / pi.sum()


def test_entropy_rate_equals_a_brute_force_computation_on_a_tiny_source() -> None:
    probs = language.source_probs(3, 2, 7)
    pi = _stationary_by_eigenvector(_chain(probs))
    rows = probs.reshape(-1, 3)
    brute = float(sum(p * -(r * np.log(r)).sum() for p, r in zip(pi, rows, strict=True)))
    facts = language.language_facts(3, 2, 7, 3)
    assert facts["entropy_rate"] == pytest.approx(brute, abs=1e-12)
    assert np.allclose(language.stationary(probs).ravel(), pi, atol=1e-14)


def test_loss_floor_equals_the_enumerated_conditional_entropies() -> None:
    """Windows of 4 tokens (seq_len 3) of a V=3 order-2 source, every sequence enumerated."""
    probs = language.source_probs(3, 2, 7)
    pi = language.stationary(probs)
    joint = {}
    for x in itertools.product(range(3), repeat=4):
        joint[x] = pi[x[0], x[1]] * probs[x[0], x[1], x[2]] * probs[x[1], x[2], x[3]]

    def block_entropy(j: int) -> float:
        marg: dict[tuple[int, ...], float] = {}
        for x, p in joint.items():
            marg[x[:j]] = marg.get(x[:j], 0.0) + p
        return -sum(p * math.log(p) for p in marg.values())

    # mean over targets t = 1..3 of H(X_t | X_<t) telescopes to (H(X_0..X_3) - H(X_0)) / 3
    brute = (block_entropy(4) - block_entropy(1)) / 3
    facts = language.language_facts(3, 2, 7, 3)
    assert facts["loss_floor"] == pytest.approx(brute, abs=1e-12)
    assert facts["unigram_entropy"] == pytest.approx(block_entropy(1), abs=1e-12)
    assert facts["entropy_rate"] < facts["loss_floor"] < facts["unigram_entropy"]


def test_entropy_rate_matches_a_long_sample_within_its_standard_error() -> None:
    v, k, lang = 32, 3, 0
    probs = language.source_probs(v, k, lang)
    windows = language.sample_windows(v, k, lang, 4000, 40, 123)  # 4000 x 37 full-context targets
    ctx = windows[:, :-1]
    nll = []
    for t in range(k, windows.shape[1]):
        p = probs[tuple(ctx[:, t - k + i] for i in range(k)) + (windows[:, t],)]
        nll.append(-np.log(p))
    sample = np.concatenate(nll)
    # Windows are independent; within a window the NLLs are weakly dependent, so use per-window means.
    per_window = np.stack(nll, 1).mean(1)
    se = per_window.std(ddof=1) / math.sqrt(len(per_window))
    rate = language.language_facts(v, k, lang, 64)["entropy_rate"]
    assert abs(sample.mean() - rate) < 4 * se, (sample.mean(), rate, se)
    assert se < 0.01


def test_samples_are_deterministic_and_start_from_the_stationary_distribution() -> None:
    a = language.sample_windows(4, 2, 1, 20000, 5, 9)
    assert np.array_equal(a, language.sample_windows(4, 2, 1, 20000, 5, 9))
    assert not np.array_equal(a, language.sample_windows(4, 2, 1, 20000, 5, 10))
    pi = language.stationary(language.source_probs(4, 2, 1))
    for t in (0, 3):  # the first context and a later one follow pi (stationary process)
        counts = np.zeros((4, 4))
        np.add.at(counts, (a[:, t], a[:, t + 1]), 1)
        assert np.abs(counts / len(a) - pi).max() < 4 * math.sqrt(0.25 / len(a))


def test_the_model_is_causal_and_its_head_is_tied() -> None:
    cfg = LMConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, vocab_size=11, seq_len=8)
    torch.manual_seed(0)
    model = FAM.build(cfg).eval()
    ids = torch.randint(0, 11, (2, 8))
    changed = ids.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 11
    a, b = model(ids), model(changed)
    assert a.shape == (2, 8, 11)
    assert torch.equal(a[:, :5], b[:, :5]), "a later token changed an earlier prediction"
    assert not torch.allclose(a[:, 5:], b[:, 5:])
    h = model.norm(model.blocks[-1](model.blocks[0](model.tok_embed(ids) + model.pos_embed.weight, model.causal),
                                    model.causal)) if len(model.blocks) == 2 else None
    assert h is not None and torch.allclose(a, h @ model.tok_embed.weight.T, atol=1e-6), "head = embedding^T"
    assert "causal" not in model.state_dict()


@pytest.mark.parametrize("shape", [(16, 1, 2, 32, 11, 8), (24, 3, 3, 40, 256, 5), (8, 2, 1, 8, 2, 1)])
def test_param_count_is_the_number_of_distinct_parameters(shape: tuple[int, ...]) -> None:
    d, n, h, f, v, s = shape
    cfg = LMConfig(d_model=d, n_layers=n, n_heads=h, d_ff=f, vocab_size=v, seq_len=s)
    model = FAM.build(cfg)
    assert FAM.param_count(cfg) == sum(p.numel() for p in model.parameters())
    # tied: the token embedding is the only (V, d) matrix, and the logits are its products
    assert [n for n, p in model.named_parameters() if p.shape == (v, d)] == ["tok_embed.weight"]


@pytest.mark.parametrize("kwargs, match", [
    ({"vocab_size": 1}, "vocab_size"), ({"seq_len": 0}, "seq_len"), ({"dropout": 1.0}, "dropout"),
    ({"n_heads": 3}, "must divide d_model"),
])
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        LMConfig(**{"d_model": 16, "n_heads": 4, **kwargs})


def test_synthetic_data_windows_targets_and_baseline() -> None:
    spec = FAM.parse_data("synthetic:tokens=64000", {"seq_len": 16})
    data = FAM.load_data(spec, {"seq_len": 16, "seed": 1})
    (x,), y = data.train_inputs, data.train_target
    assert x.shape == y.shape == (4000, 16)
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"
    info = FAM.data_info(spec, {"seq_len": 16})
    assert {k: data.info[k] for k in info} == info
    # the baseline is the unigram entropy, measured: within a few standard errors of the exact value
    assert abs(FAM.baseline_loss(data) - info["unigram_entropy"]) < 0.02
    same = FAM.load_data(spec, {"seq_len": 16, "seed": 1})
    assert torch.equal(same.val_target, data.val_target)
    assert not torch.equal(FAM.load_data(spec, {"seq_len": 16, "seed": 2}).val_target, data.val_target)


def test_a_text_file_is_read_as_bytes_with_a_contiguous_split(tmp_path: Path) -> None:
    text = "".join(f"line {i}: héllo wörld\n" for i in range(200))
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    spec = FAM.parse_data(str(path), {"seq_len": 8})
    assert spec["kind"] == "text" and len(spec["sha256"]) == 64
    data = FAM.load_data(spec, {"seq_len": 8})
    raw = text.encode("utf-8")
    assert FAM.data_info(spec, {})["vocab_size"] == 256
    assert bytes(data.train_inputs[0][0].tolist()) == raw[:8]
    assert bytes(data.train_target[1].tolist()) == raw[9:17]
    cut = round(len(raw) * 0.9)
    assert bytes(data.val_inputs[0][0].tolist()) == raw[cut:cut + 8]


def test_bad_text_data_is_refused_with_a_sentence(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café au lait\n".encode("latin-1") * 50)
    with pytest.raises(DataError, match="is not UTF-8 text"):
        FAM.parse_data(str(latin), {})
    short = tmp_path / "short.txt"
    short.write_text("too short")
    with pytest.raises(DataError, match="too few for a training and a validation window"):
        FAM.parse_data(str(short), {})
    with pytest.raises(DataError, match="does not exist"):
        FAM.parse_data(str(tmp_path / "missing.txt"), {})
    with pytest.raises(DataError, match="keys: vocab, order, language, tokens"):
        FAM.parse_data("synthetic:words=3", {})
    with pytest.raises(DataError, match="lower the vocabulary or the order"):
        FAM.parse_data("synthetic:vocab=64,order=4", {})


def test_the_study_stores_the_exact_entropy_rate() -> None:
    s = prepare_settings("lmrate", "100K", family="lm", n_trials=2, data="synthetic", quick=True, pruner="none",
                         family_options={"seq_len": 32})
    facts = language.language_facts(32, 3, 0, 32)
    assert s.info["entropy_rate"] == facts["entropy_rate"]
    assert s.info["loss_floor"] == facts["loss_floor"]
    assert s.info["seq_len"] == 32 and s.data["language"] == 0


def test_the_report_shows_the_entropy_rate_beside_the_fitted_e(sqlite_url: str, tmp_path: Path) -> None:
    import dataclasses
    import json

    from archhpo.report._page import write_report
    from archhpo.search import TrialQueue, launch
    from archhpo.workers import Worker

    url = sqlite_url
    s = prepare_settings("truth", "100K", family="lm", n_trials=2, data="synthetic:tokens=2000", quick=True,
                         pruner="none", family_options={"seq_len": 8}, fixed_params={"epochs": 1})
    launch(url, dataclasses.replace(s, plan=s.plan[:1]))
    assert Worker([TrialQueue(url, s.study_name)], device="cpu", threads=1).run().complete == 1
    report = write_report("truth", url, out=tmp_path / "out", n_boot=10)
    fit = json.loads((tmp_path / "out" / "truth_scaling_fit.json").read_text())
    facts = language.language_facts(32, 3, 0, 8)
    assert fit["entropy_rate"] == facts["entropy_rate"] and fit["loss_floor"] == facts["loss_floor"]
    assert f"entropy rate is {facts['entropy_rate']:.4f} nats/token" in report.html.read_text()


def test_truth_text_says_where_the_fitted_e_lies() -> None:
    from archhpo.report._truth import known_truth, truth_text

    fit = {"entropy_rate": 1.85, "loss_floor": 1.86, "E": {"estimate": 1.9, "ci95": [1.8, 2.0]}}
    assert "interval that contains the floor" in truth_text(fit)
    assert "lies above the floor" in truth_text({**fit, "E": {"estimate": 2.1, "ci95": [2.0, 2.2]}})
    assert "no law was fitted" in truth_text({"entropy_rate": 1.85})
    from archhpo.report._truth import below_floor
    low = {**fit, "E": {"estimate": 1.5, "ci95": [1.2, 1.6]}}
    assert "lies below the floor" in truth_text(low) and "Warning: E below the floor" in truth_text(low)
    assert below_floor(low) and not below_floor(fit)
    assert truth_text({"E": fit["E"]}) == ""
    unresolved = truth_text({**fit, "status": "unresolved", "E": {"estimate": 1.81, "ci95": [9.4e-14, 1.92]}})
    assert "; E of the fit, which is no law (unresolved), is 1.8100 [0.0000, 1.9200], an interval that contains" in unresolved
    assert "the fitted E" in truth_text({**fit, "status": "fitted"})
    assert known_truth([{"entropy_rate": 1.0}, {"entropy_rate": 1.0}]) == {"entropy_rate": 1.0}
    assert known_truth([{"entropy_rate": 1.0}, {"entropy_rate": 2.0}]) == {}, "mixed truths: none"
    assert known_truth([{"entropy_rate": 1.0}, {}]) == {}
