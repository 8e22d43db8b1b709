"""One training step, the unit that is timed: forward, backward (in micro-batches when memory
asks for them), clipping, the optimizer and the schedule, with no host synchronisation.

Nothing in a step reads a device value back: the loss is added to a device tensor
(``loss_sum``) that is read once an epoch, outside the steps; clipping never reads the norm; the
step count is a Python int; there is no Python ``if`` on a tensor.  On CUDA the optimizer is the
fused AdamW, whose step counters live on the device (the CPU's single-tensor AdamW reads its
CPU-side counters with ``.item()``: no device is waited for there, and CPU studies keep their
losses).  ``tests/workers/test_host_sync.py`` spies on every call that would wait for a device.

Gradient accumulation (``micro_batch`` < the batch): the batch is cut into equal micro-batches
whose losses are weighted by their share of the batch, so the gradient is the whole batch's mean
loss gradient, as one step at the full batch would compute it (up to float summation order and
dropout draws); the optimizer steps once per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def adamw_options(device: torch.device) -> dict[str, Any]:
    """fused: one kernel for the whole update and device-side step counters on CUDA (the CPU keeps
    PyTorch's default, so CPU results do not change)."""
    return {"fused": True} if device.type == "cuda" else {}


@dataclass
class Stepper:
    """What every step of a run shares."""

    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    loss_fn: LossFn
    autocast: bool
    grad_clip: float
    micro_batch: int | None = None  # None: the whole batch at once

    def __post_init__(self) -> None:
        self.extra: Callable[[], torch.Tensor] | None = getattr(self.model, "extra_loss", None)

    def _loss(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
            return self.loss_fn(self.model(*inputs), target)

    def step(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor, loss_sum: torch.Tensor) -> int:
        """Train on one batch; add its summed loss (mean × samples) to ``loss_sum`` in place.
        Returns the batch's sample count (a Python int: the shape, never a device value)."""
        n = int(target.shape[0])
        micro = self.micro_batch or n
        if micro >= n:  # the step as it always was, operation for operation
            loss = self._loss(inputs, target)
            total = loss + self.extra() if self.extra is not None else loss
            self.opt.zero_grad(set_to_none=True)
            total.backward()
            loss_sum += loss.detach() * n
        else:
            self.opt.zero_grad(set_to_none=True)
            for lo in range(0, n, micro):
                part = slice(lo, lo + micro)
                m = min(micro, n - lo)
                loss = self._loss(tuple(t[part] for t in inputs), target[part])
                total = loss + self.extra() if self.extra is not None else loss
                (total * (m / n)).backward()  # grads add up to the batch's mean-loss gradient
                loss_sum += loss.detach() * m
        nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.sched.step()
        return n
