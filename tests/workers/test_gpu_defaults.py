"""The GPU defaults as pure choices of the device type: compiled by default on CUDA where compiling
wins, never unasked on CPU (CPU trials stay bit for bit what they were)."""

from __future__ import annotations

import pytest
import torch

from archhpo.workers._device import COMPILE_MIN_STEPS, EAGER_ENV, compile_by_default, compile_model


def test_cuda_compiles_unasked_only_where_the_planned_steps_pay_for_it() -> None:
    assert compile_by_default("cuda", False, COMPILE_MIN_STEPS, {})
    assert not compile_by_default("cuda", False, COMPILE_MIN_STEPS - 1, {})
    assert not compile_by_default("cuda", False, 10 * COMPILE_MIN_STEPS, {EAGER_ENV: "1"})
    assert compile_by_default("cuda", False, COMPILE_MIN_STEPS, {EAGER_ENV: "0"})


def test_cpu_never_compiles_unasked_and_an_asked_compile_is_kept_everywhere() -> None:
    assert not compile_by_default("cpu", False, 10**9, {})
    assert compile_by_default("cpu", True, 1, {}) and compile_by_default("cuda", True, 1, {EAGER_ENV: "1"})


def test_a_cpu_compile_stays_lazy_and_touches_no_random_state() -> None:
    model = torch.nn.Linear(4, 2)
    rng = torch.get_rng_state()
    calls: list[int] = []

    def warm(m: torch.nn.Module) -> torch.Tensor:
        calls.append(1)
        return m(torch.ones(1, 4)).sum()

    assert compile_model(model, torch.device("cpu"), warm) is None
    assert calls == [] and torch.equal(torch.get_rng_state(), rng)
    assert model._compiled_call_impl is not None  # compiled in place: the state_dict keys stay eager's
    assert list(model.state_dict()) == ["weight", "bias"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_compile_happens_before_the_steps_and_leaves_rng_and_grads_as_they_were() -> None:
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to(device)
    rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state(device)
    seconds = compile_model(model, device, lambda m: m(torch.ones(4, 8, device=device)).sum())
    assert seconds is not None and seconds > 0
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(torch.cuda.get_rng_state(device), cuda_rng)
    assert all(p.grad is None for p in model.parameters())
