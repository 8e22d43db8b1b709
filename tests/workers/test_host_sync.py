"""A training step never waits for the device.

A TorchFunctionMode spy counts every call that would make the host wait for a GPU (``.item()``,
``.cpu()``, ``.tolist()``, ``.numpy()``, and ``bool``/``float``/``int`` of a tensor, which is
also what a Python ``if`` on a tensor calls) while ``workers._step.Stepper.step`` runs, per step.
The optimizer is the one CUDA gets (fused AdamW: device-side step counters; fused AdamW runs on the
CPU too), so the CPU sees the calls CUDA would.  The loss is read once an epoch, outside the steps.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

import archhpo.workers._train as trainer
from archhpo.models import family_names, get_family
from archhpo.workers._step import Stepper
from archhpo.workers._train import TrainConfig, train

SYNCS = {"item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"}


class SyncSpy(TorchFunctionMode):
    """Counts host-sync calls, split by whether a training step was running."""

    def __init__(self) -> None:
        super().__init__()
        self.in_step = False
        self.steps = 0
        self.inside: collections.Counter[str] = collections.Counter()
        self.outside: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in SYNCS:
            (self.inside if self.in_step else self.outside)[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncSpy]:
    monkeypatch.setattr(trainer, "adamw_options", lambda device: {"fused": True})
    s = SyncSpy()
    real = Stepper.step

    def step(self: Stepper, *args: Any) -> int:
        s.in_step, s.steps = True, s.steps + 1
        try:
            return real(self, *args)
        finally:
            s.in_step = False

    monkeypatch.setattr(Stepper, "step", step)
    with s:
        yield s


def _lm(micro: int | None = None, samples: int = 64) -> tuple[Any, ...]:
    fam = get_family("lm")
    data = fam.load_data(fam.parse_data("synthetic:tokens=4000", {"seq_len": 8}), {"seq_len": 8})
    cfg = fam.config_for({"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32}, data.info)
    torch.manual_seed(0)
    model = fam.build(cfg)
    tcfg = TrainConfig(epochs=2, batch_size=8, eval_every=1, epoch_samples=samples, micro_batch=micro)
    return model, data, fam.loss, tcfg


@pytest.mark.parametrize("micro", [None, 3], ids=["batch", "micro-batches"])
def test_a_training_step_makes_no_host_sync(spy: SyncSpy, micro: int | None) -> None:
    model, data, loss, cfg = _lm(micro)
    result = train(model, data, loss, cfg)
    assert spy.steps == 2 * 64 // 8 == result.samples // 8
    assert sum(spy.inside.values()) == 0, f"host syncs inside the step: {dict(spy.inside)}"


def test_the_epochs_syncs_do_not_grow_with_its_steps(spy: SyncSpy) -> None:
    """What is read back (the epoch's summed loss, validation) is read per epoch, not per step."""
    counts = []
    for samples in (32, 128):
        spy.outside.clear()
        train(*_lm(samples=samples))
        counts.append(sum(spy.outside.values()))
    assert counts[0] == counts[1] > 0


def test_every_family_steps_without_a_host_sync(spy: SyncSpy) -> None:
    """Without dropout: the CPU's dropout kernels draw their seed with int() of a CPU tensor, a
    path CUDA never takes (it runs PyTorch's fused dropout, tests/models/test_dropout.py)."""
    for name in family_names():
        fam = get_family(name)
        opts = {"quick": True, "seed": 0}
        data = fam.load_data(fam.parse_data("synthetic", opts), opts)
        cfg = fam.config_for({"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}, data.info)
        model = fam.build(dataclasses.replace(cfg, dropout=0.0) if hasattr(cfg, "dropout") else cfg)
        train(model, data, fam.loss, TrainConfig(epochs=1, batch_size=16, epoch_samples=48))
        assert sum(spy.inside.values()) == 0, (name, dict(spy.inside))
