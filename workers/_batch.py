"""The micro-batch a trial trains with: its batch size when the memory estimate allows it, else
the largest even split of it that fits, with gradient accumulation keeping the study's batch.

The estimate is ``workers._memory``'s (one function for the fit check and GPU placement); this
module only asks it about smaller batches.  A trial that does not fit even one sample at a time
is refused as before, with the message and estimate of its full batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from archhpo.models import Family, get_family
from archhpo.schema import Attr
from archhpo.workers import _memory


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    batch_size: int  # the study's batch: samples per optimizer step
    micro_batch: int  # samples per forward/backward
    need_bytes: int  # the estimate at the micro-batch

    @property
    def accumulation(self) -> int:
        """Forward/backward passes per optimizer step."""
        return math.ceil(self.batch_size / self.micro_batch)


def micro_batches(batch: int) -> list[int]:
    """The candidate micro-batches, largest first: ceil(batch / k) for k = 1, 2, ... (each a
    split of the batch into k nearly equal parts), without repeats."""
    seen: list[int] = []
    for k in range(1, batch + 1):
        m = math.ceil(batch / k)
        if not seen or m < seen[-1]:
            seen.append(m)
    return seen


# Bytes per logit in a training step over a vocabulary, at the start of backward: log-softmax's
# saved fp32 output, the loss's fp32 gradient and log-softmax's (the bf16 logits and their fp32
# copy, 6 B, die with the loss's forward).  workers._memory's estimate counts the layers, not a
# (B, L, V) head (docs/gpu.md, "The memory plan": the estimate against measured peaks).
LOGIT_BYTES = {"cuda": 12, "cpu": 12}
EVAL_LOGITS_BYTES = 2**30  # an evaluation batch's logits (fp32 and bf16) stay under this
EVAL_LOGIT_BYTES = 6  # one evaluation logit: bf16 from the head, its fp32 copy
EVAL_PEAK_LOGIT_BYTES = 10  # and the loss's log-softmax output (fp32): a large batch's peak


def vocab_logits(family: str | Family, cfg: Any) -> int:
    """Logits per sample of a sequence head, as the family (or the family of that name) counts them
    (``Family.logits_per_sample``: an lm's seq_len x vocab_size); 0 for a family whose head is per
    sample (a class or a value), where the estimate already suffices."""
    fam = get_family(family) if isinstance(family, str) else family
    return int(fam.logits_per_sample(cfg)) if fam.logits_per_sample is not None else 0


def eval_batch(logits_per_sample: int, eval_batch_size: int) -> int:
    """The evaluation batch whose logits (fp32 + bf16: EVAL_LOGIT_BYTES each) stay under EVAL_LOGITS_BYTES."""
    if logits_per_sample <= 0:
        return eval_batch_size
    return max(1, min(eval_batch_size, EVAL_LOGITS_BYTES // (EVAL_LOGIT_BYTES * logits_per_sample)))


def plan_eval_batch(plan: BatchPlan, shape: _memory.TrialShape, device: torch.device, logits_per_sample: int,
                    eval_batch_size: int) -> int:
    """The evaluation batch on `device` once `plan` is known: `eval_batch`'s under EVAL_LOGITS_BYTES
    on CPU (its results stay as they were); on CUDA, as many as the free memory holds beyond the
    plan's training peak at EVAL_PEAK_LOGIT_BYTES a logit (never fewer than the cap's): fewer,
    larger validation batches, so fewer launches and host syncs. Validation runs between steps, so
    training's saved activations are gone then; they leave room for the layers' transients."""
    capped = eval_batch(logits_per_sample, eval_batch_size)
    if device.type != "cuda" or logits_per_sample <= 0:
        return capped
    room = int(_memory.SAFETY * (_memory.available_bytes(device) + shape.data_bytes)) - plan.need_bytes
    return max(capped, min(eval_batch_size, room // (EVAL_PEAK_LOGIT_BYTES * logits_per_sample)))


def need_bytes(shape: _memory.TrialShape, device_type: str, logits_per_sample: int = 0) -> int:
    """The estimate at ``shape.batch_size``: workers._memory's, plus the head's logits (LOGIT_BYTES
    each; ``logits_per_sample`` from `vocab_logits`)."""
    per_logit = LOGIT_BYTES["cuda" if device_type == "cuda" else "cpu"]
    return _memory.estimate_training_bytes(shape, device_type) + shape.batch_size * logits_per_sample * per_logit


def plan_batch(shape: _memory.TrialShape, device: torch.device, what: str, logits_per_sample: int = 0) -> BatchPlan:
    """The largest micro-batch (up to ``shape.batch_size``) whose `need_bytes` fits the device's
    free memory (the dataset ``shape.data_bytes`` already resident counts as free).  Raises
    MemoryRefused (``_memory.check_fits``'s sentence, at the full batch) when none fits."""
    free = _memory.available_bytes(device) + shape.data_bytes
    for m in micro_batches(shape.batch_size):
        need = need_bytes(dataclasses.replace(shape, batch_size=m), device.type, logits_per_sample)
        if _memory.fits(need, free):
            return BatchPlan(shape.batch_size, m, need)
    full = need_bytes(shape, device.type, logits_per_sample)
    _memory.check_fits(full, device, what, resident=shape.data_bytes)  # raises: not even one sample fits
    return BatchPlan(shape.batch_size, shape.batch_size, full)  # reached only if memory was freed meanwhile


def use_plan(plan: BatchPlan, train_config: Any, attrs: dict[str, Any]) -> None:
    """Train the trial as `plan` says: below its batch, set the TrainConfig's micro_batch (the built
    trial's own, which train() reads) and record micro_batch, accumulation_steps and the estimate
    at the micro-batch in the trial's attributes."""
    if plan.micro_batch >= plan.batch_size:
        return
    train_config.micro_batch = plan.micro_batch
    attrs.update({Attr.MICRO_BATCH: plan.micro_batch, Attr.ACCUMULATION_STEPS: plan.accumulation})
    attrs[Attr.MEMORY_ESTIMATE_GIB] = round(plan.need_bytes / 2**30, 3)
