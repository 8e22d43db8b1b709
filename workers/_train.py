"""The trainer: whole datasets as tensors on the device, batches by index, AdamW with linear
warm-up then cosine decay, clipping at 1.0, best validation loss wins.

On CUDA: bf16 autocast, fused AdamW, and no host synchronisation inside an epoch (the loss is
summed on the device, clipping never reads the norm back, the stop check reads a Python flag).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from archhpo.errors import ArchhpoError, NonFiniteLoss, TrialStopped
from archhpo.models import TensorDataset


class StopTraining(Exception):
    """Raised by an on_eval callback to stop early (a pruned trial).

    On its way out of ``train`` it gets ``samples`` (trained by this call) and ``seconds``
    (training time) attributes, so a pruned trial still records its throughput."""


@dataclass
class TrainConfig:
    learning_rate: float = 3e-4
    epochs: int = 50
    batch_size: int = 64
    weight_decay: float = 1e-4
    warmup_steps: int = 100
    grad_clip: float = 1.0
    min_lr_ratio: float = 0.0  # cosine decays to this fraction of the peak
    eval_every: int = 1  # epochs between validations (the last epoch is always validated)
    eval_batch_size: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if self.learning_rate <= 0 or self.epochs < 1 or self.batch_size < 1 or self.eval_every < 1:
            raise ArchhpoError("learning_rate, epochs, batch_size and eval_every must be positive.")
        if self.weight_decay < 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ArchhpoError("weight_decay and warmup_steps must be ≥ 0 and min_lr_ratio in [0, 1].")


@dataclass
class TrainResult:
    best_val_loss: float
    train_loss: float  # mean training loss of the last epoch
    epochs_run: int
    best_epoch: int
    duration_s: float
    samples_per_s: float
    metrics: dict[str, float] = field(default_factory=dict)  # family metrics at the best epoch
    history: list[dict[str, float]] = field(default_factory=list)
    samples: int = 0  # training samples processed by this call (a resumed run counts its own)


def trial_seed(study_seed: int, slot: int) -> int:
    """The torch seed of a planned trial: the worker and `archhpo train --from` must agree, or a
    best JSON would not reproduce its trial."""
    return study_seed * 100_003 + slot


def lr_lambda(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ArchhpoError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu or auto.")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ArchhpoError(f"Unknown device {device!r}; use auto, cpu or cuda.")
    return torch.device(device)


@torch.no_grad()
def evaluate(
    model: nn.Module, data: TensorDataset, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    metrics_fn: Callable[[torch.Tensor, torch.Tensor], dict[str, float]] | None, batch_size: int,
    autocast: bool,
) -> tuple[float, dict[str, float]]:
    model.eval()
    logits = []
    for i in range(0, data.n_val, batch_size):
        inputs = tuple(t[i : i + batch_size] for t in data.val_inputs)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits.append(model(*inputs).float())
    out = torch.cat(logits)  # (N_val, ...)
    loss = float(loss_fn(out, data.val_target))
    return loss, (metrics_fn(out, data.val_target) if metrics_fn else {})


def train(
    model: nn.Module,
    data: TensorDataset,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    cfg: TrainConfig,
    *,
    metrics_fn: Callable[[torch.Tensor, torch.Tensor], dict[str, float]] | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train in place; `data` must already be on the model's device.

    ``checkpoint(state)`` is called after every validated epoch with everything needed to go on;
    ``resume=state`` continues from such a state (a retried trial picks up where it died).
    ``should_stop()`` is asked before every step and every validation (a Python flag: no device
    sync); when it says True, TrialStopped is raised (a worker being stopped or fenced out).
    """
    device = next(model.parameters()).device
    autocast = device.type == "cuda"
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    steps_per_epoch = math.ceil(data.n_train / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    # fused: one kernel for the whole update on CUDA (the CPU path keeps the default foreach).
    fused: dict[str, Any] = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay, **fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.warmup_steps, total, cfg.min_lr_ratio))
    extra = getattr(model, "extra_loss", None)
    best, best_epoch, best_metrics = math.inf, 0, {}
    history: list[dict[str, float]] = []
    train_loss = math.nan
    first = 1
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        sched.load_state_dict(resume["scheduler"])
        gen.set_state(resume["generator"].to(gen.get_state().device))
        best, best_epoch, best_metrics = resume["best"], resume["best_epoch"], resume["best_metrics"]
        history, train_loss = list(resume["history"]), resume["train_loss"]
        first = int(resume["epoch"]) + 1
    start = time.perf_counter()
    epoch = first - 1

    def check_stop() -> None:
        if should_stop is not None and should_stop():
            raise TrialStopped(f"training stopped in epoch {epoch}")

    for epoch in range(first, cfg.epochs + 1):
        model.train()
        perm = torch.randperm(data.n_train, device=device, generator=gen)
        loss_sum = torch.zeros((), device=device)
        for i in range(0, data.n_train, cfg.batch_size):
            check_stop()
            idx = perm[i : i + cfg.batch_size]
            inputs = tuple(t[idx] for t in data.train_inputs)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model(*inputs), data.train_target[idx])
            total_loss = loss + extra() if extra is not None else loss
            opt.zero_grad(set_to_none=True)
            total_loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            loss_sum += loss.detach() * idx.numel()
        # One host sync per epoch: a NaN anywhere in the epoch poisons the sum.
        train_loss = float(loss_sum) / data.n_train
        if not math.isfinite(train_loss):
            raise NonFiniteLoss(f"training loss became non-finite ({train_loss}) in epoch {epoch}")
        if epoch % cfg.eval_every and epoch != cfg.epochs:
            continue
        check_stop()
        val, metrics = evaluate(model, data, loss_fn, metrics_fn, cfg.eval_batch_size, autocast)
        if not math.isfinite(val):
            raise NonFiniteLoss(f"validation loss became non-finite ({val}) in epoch {epoch}")
        history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": val})
        if val < best:
            best, best_epoch, best_metrics = val, epoch, metrics
        if on_eval is not None:
            try:
                on_eval(epoch, val)  # may raise StopTraining
            except StopTraining as stop:
                stop.samples = (epoch - first + 1) * data.n_train  # type: ignore[attr-defined]
                stop.seconds = time.perf_counter() - start  # type: ignore[attr-defined]
                raise
        if checkpoint is not None:
            checkpoint({
                "epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "generator": gen.get_state(), "best": best,
                "best_epoch": best_epoch, "best_metrics": best_metrics, "history": history,
                "train_loss": train_loss,
            })
    duration = time.perf_counter() - start
    return TrainResult(
        best_val_loss=best, train_loss=train_loss, epochs_run=epoch, best_epoch=best_epoch,
        duration_s=duration, samples_per_s=(epoch - first + 1) * data.n_train / max(duration, 1e-9),
        metrics=best_metrics, history=history, samples=(epoch - first + 1) * data.n_train,
    )


def describe_result(result: TrainResult) -> dict[str, Any]:
    return {
        "val_loss": result.best_val_loss, "train_loss": result.train_loss, "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch, "duration_s": round(result.duration_s, 3),
        "samples_per_s": round(result.samples_per_s, 1), **result.metrics,
    }
