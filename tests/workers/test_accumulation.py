"""The batch is the largest the memory estimate allows, up to the study's; below
it, gradient accumulation keeps the study's batch per optimizer step.  A trial records a step MFU
(timed steps) beside its trial MFU (wall clock)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from optuna.trial import TrialState

import archhpo.workers._loop as loop
from archhpo.errors import MemoryRefused
from archhpo.models import get_family
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import _device, _memory
from archhpo.workers._batch import micro_batches, plan_batch
from archhpo.workers._train import TrainConfig, train
from tests.conftest import TINY_DATA

SHAPE = _memory.TrialShape(param_count=1000, batch_size=64, eval_batch_size=8, tokens=16, sequences=1,
                           d_model=16, n_layers=2, n_heads=2, d_ff=32)
CPU = torch.device("cpu")


def _free_for(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Free memory that fits exactly `batch` samples (SAFETY included)."""
    need = _memory.estimate_training_bytes(dataclasses.replace(SHAPE, batch_size=batch), "cpu")
    monkeypatch.setattr(_memory, "available_bytes", lambda device: int(need / _memory.SAFETY) + 1)


def test_micro_batches_split_the_batch_evenly_largest_first() -> None:
    assert micro_batches(8) == [8, 4, 3, 2, 1]
    assert micro_batches(256)[:4] == [256, 128, 86, 64]


def test_the_whole_batch_when_it_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    _free_for(64, monkeypatch)
    plan = plan_batch(SHAPE, CPU, "t")
    assert (plan.micro_batch, plan.accumulation) == (64, 1)


def test_the_largest_micro_batch_that_fits_and_its_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    _free_for(20, monkeypatch)  # 22 (64/3) does not fit, 16 (64/4) does
    plan = plan_batch(SHAPE, CPU, "t")
    assert (plan.micro_batch, plan.accumulation) == (16, 4)
    assert plan.need_bytes == _memory.estimate_training_bytes(dataclasses.replace(SHAPE, batch_size=16), "cpu")


def test_refused_with_the_full_batch_sentence_when_one_sample_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "available_bytes", lambda device: 1000)
    full = _memory.estimate_training_bytes(SHAPE, "cpu") / 2**30
    with pytest.raises(MemoryRefused, match=f"needs about {full:.1f} GiB"):
        plan_batch(SHAPE, CPU, "t")


def _lm_run(micro: int | None) -> tuple[list[float], torch.nn.Module]:
    fam = get_family("lm")
    data = fam.load_data(fam.parse_data("synthetic:tokens=4000", {"seq_len": 8}), {"seq_len": 8})
    torch.manual_seed(0)
    model = fam.build(fam.config_for({"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32}, data.info))
    result = train(model, data, fam.loss, TrainConfig(epochs=3, batch_size=12, epoch_samples=96,
                                                       micro_batch=micro, warmup_steps=2))
    return [h["val_loss"] for h in result.history], model


def test_accumulated_micro_batches_train_as_the_whole_batch() -> None:
    """Same optimizer steps, same gradients up to float summation order (no dropout)."""
    whole, a = _lm_run(None)
    for micro in (5, 4):  # uneven (5, 5, 2) and even (4, 4, 4) splits of 12
        split, b = _lm_run(micro)
        assert split == pytest.approx(whole, rel=1e-5, abs=1e-5)
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-5)


def test_a_worker_accumulates_when_the_batch_does_not_fit(storage_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _memory.estimate_training_bytes

    def estimate(shape: _memory.TrialShape, device_type: str = "cuda") -> int:
        return 2**50 if shape.batch_size > 16 else real(shape, device_type)  # only 16 samples fit

    monkeypatch.setattr(_memory, "estimate_training_bytes", estimate)
    s = prepare_settings("acc", "200K", n_trials=3, data=TINY_DATA, quick=True)
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    loop.Worker([q], device="cpu", threads=1).run()
    for t in q.storage.get_all_trials(q.study_id):
        assert t.state == TrialState.COMPLETE, t.user_attrs.get("fail_reason")
        batch = int(t.params["batch_size"])
        assert t.user_attrs["micro_batch"] == 16 and t.user_attrs["accumulation_steps"] == -(-batch // 16)


def test_a_trial_records_step_mfu_beside_trial_mfu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "throughput", lambda *a: {"mfu": 0.4, "samples_per_s": 1.0})
    monkeypatch.setattr(_device, "device_peak_flops", lambda device: 1e12)
    me = types.SimpleNamespace(device=torch.device("cuda"), _gpu_share=lambda: 1.0)
    built = types.SimpleNamespace(flops_per_sample=10**9)
    out = loop.Worker._throughput(me, built, 1000, 2.5, 1000, 5.0)  # type: ignore[arg-type]
    assert out["step_mfu"] == out["mfu"] == 0.4
    assert out["trial_mfu"] == 0.2  # 1e12 FLOPs over 5 s of wall clock against a 1e12 FLOP/s peak


def test_an_lms_logits_bound_its_eval_batch_and_count_in_its_micro_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    from archhpo.models.lm_spec import gpu_config
    from archhpo.workers._batch import EVAL_LOGITS_BYTES, eval_batch, vocab_logits

    cfg = gpu_config("124M")
    logits = vocab_logits("lm", cfg)
    assert logits == 1024 * 50257 and vocab_logits("patchtst", cfg) == 0
    assert eval_batch(logits, 1024) == EVAL_LOGITS_BYTES // (6 * logits) == 3  # 1024 windows would be 294 GiB
    assert eval_batch(32 * 32, 1024) == 1024 and eval_batch(0, 1024) == 1024  # CPU-sized studies: unchanged
    _free_for(64, monkeypatch)
    assert plan_batch(SHAPE, CPU, "t").micro_batch == 64
    assert plan_batch(SHAPE, CPU, "t", logits_per_sample=10**5).micro_batch == 2  # the head's 1.2 MB a sample
    with pytest.raises(MemoryRefused):
        plan_batch(SHAPE, CPU, "t", logits_per_sample=10**6)  # 12 MB a sample: not even one fits


def test_validation_scored_batch_by_batch_equals_the_kept_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    import archhpo.workers._train as trainer

    fam = get_family("lm")
    data = fam.load_data(fam.parse_data("synthetic:tokens=4000", {"seq_len": 8}), {"seq_len": 8})
    torch.manual_seed(0)
    model = fam.build(fam.config_for({"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}, data.info))
    kept = trainer.evaluate(model, data, fam.loss, fam.metrics, 7, False)
    monkeypatch.setattr(trainer, "STREAM_LOGITS_BYTES", 0)
    streamed = trainer.evaluate(model, data, fam.loss, fam.metrics, 7, False)
    assert streamed[0] == pytest.approx(kept[0], rel=1e-6)
    assert streamed[1] == pytest.approx(kept[1], rel=1e-6)
