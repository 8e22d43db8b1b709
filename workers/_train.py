"""The trainer: batches gathered by index where the dataset is held (TensorDataset.train_batch:
on the device, or on the host and copied per step), AdamW with linear warm-up then cosine decay
(or WSD: constant, then a 1-sqrt cooldown), clipping at 1.0, best validation loss wins.

On CUDA: bf16 autocast, fused AdamW, and no host synchronisation inside an epoch (the loss is
summed on the device, clipping never reads the norm back, the stop check reads a Python flag).
The step itself (and gradient accumulation when memory asks for micro-batches) is
``workers._step``; validation, checkpoints and the database calls happen between epochs, outside
the time that ``samples_per_s`` and the step MFU divide by.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from archhpo.errors import ArchhpoError, NonFiniteLoss, TrialStopped
from archhpo.models import TensorDataset
from archhpo.schema import TrainingPlan, check_schedule
from archhpo.workers._distributed import sharded_ranks
from archhpo.workers._step import Stepper, adamw_options


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
    schedule: str = "cosine"  # cosine, or wsd (warm-up, stable, decay)
    cooldown: float = 0.2  # wsd: the fraction of the steps spent cooling down
    total_steps: int | None = None  # the schedule's length when not whole epochs (a cooldown branch)
    # A data-budget study (archhpo.schema.DataBudget): each "epoch" is an interval of this many
    # samples drawn from passes over the training set (see `interval_order`); None: one pass an epoch.
    epoch_samples: int | None = None
    # Samples per forward/backward when memory cannot hold the batch (workers._batch); the
    # optimizer still steps once per batch_size samples (gradient accumulation).  None: the batch.
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        if self.learning_rate <= 0 or self.epochs < 1 or self.batch_size < 1 or self.eval_every < 1:
            raise ArchhpoError("learning_rate, epochs, batch_size and eval_every must be positive.")
        if self.weight_decay < 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ArchhpoError("weight_decay and warmup_steps must be ≥ 0 and min_lr_ratio in [0, 1].")
        check_schedule(self.schedule, self.cooldown)
        if self.epoch_samples is not None and self.epoch_samples < 1:
            raise ArchhpoError(f"epoch_samples must be positive, got {self.epoch_samples}.")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ArchhpoError(f"micro_batch must be positive, got {self.micro_batch}.")

    def samples_per_epoch(self, n_train: int) -> int:
        """Samples one epoch (or validation interval) trains on."""
        return int(self.epoch_samples) if self.epoch_samples is not None else int(n_train)

    def steps_per_epoch(self, n_train: int) -> int:
        return math.ceil(self.samples_per_epoch(n_train) / self.batch_size)


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
    train_s: float = 0.0  # seconds in training steps only (not validation, checkpoints, database calls)

    def path_samples(self, epoch_samples: int) -> int:
        """The samples the model has trained on since epoch 1, whichever calls trained them
        (`epoch_samples`: TrainConfig.samples_per_epoch)."""
        return self.epochs_run * epoch_samples


def trial_seed(study_seed: int, slot: int) -> int:
    """The torch seed of a planned trial: the worker and `archhpo train --from` must agree, or a
    best JSON would not reproduce its trial."""
    return study_seed * 100_003 + slot


def interval_order(n_train: int, epoch_samples: int, epoch: int, seed: int) -> torch.Tensor:
    """The training-set indices of interval `epoch` (1-based) of a data-budget run.

    The intervals cut one stream of samples into pieces of `epoch_samples`: the stream is pass 0's
    order, then pass 1's, ..., each pass a permutation of the whole training set drawn from
    (`seed`, pass) alone. So every sample is seen once per pass, passes repeat only when the data
    hold fewer than D samples, and the order of any interval is known without replaying the
    earlier ones (a resumed run, a cooldown branch). A CPU generator: the same order on any device.
    """
    start, stop = (epoch - 1) * epoch_samples, epoch * epoch_samples
    parts = []
    for p in range(start // n_train, (stop - 1) // n_train + 1):
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + p)
        perm = torch.randperm(n_train, generator=gen)
        lo, hi = max(start - p * n_train, 0), min(stop - p * n_train, n_train)
        parts.append(perm[lo:hi])
    return torch.cat(parts)


def lr_lambda(warmup: int, total: int, min_ratio: float, schedule: str = "cosine",
              cooldown: float = 0.2) -> Callable[[int], float]:
    """The learning-rate factor of each step: linear warm-up, then cosine decay to `min_ratio`
    (cosine), or a constant rate and a cooldown over the last `cooldown` of the steps in a
    1-sqrt shape down to `min_ratio` (wsd; as epfml/schedules-and-scaling). Under WSD the factor
    before the cooldown does not depend on `total`: a longer run shares a shorter one's steps."""
    hold = total - round(cooldown * total)  # the first cooldown step (round: k/T of T*n is k*n)

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "wsd":
            if step < hold:
                return 1.0
            done = min(1.0, (step - hold) / max(1, total - hold))
            return min_ratio + (1 - min_ratio) * (1 - math.sqrt(done))
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


STREAM_LOGITS_BYTES = 2**30  # validation logits above this are scored batch by batch, not kept


@torch.no_grad()
def evaluate(
    model: nn.Module, data: TensorDataset, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    metrics_fn: Callable[[torch.Tensor, torch.Tensor], dict[str, float]] | None, batch_size: int,
    autocast: bool,
) -> tuple[float, dict[str, float]]:
    """The validation loss (and metrics) over the whole validation split.

    The logits are kept and scored at once, unless all of them would pass STREAM_LOGITS_BYTES (an
    lm at GPT-2's vocabulary: 64 windows of 1024 tokens hold 13 GiB of fp32 logits): then each
    batch is scored alone and the batches are averaged by their sample counts (exact for mean
    losses and metrics, up to float summation order)."""
    model.eval()
    device = next(model.parameters()).device
    logits: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    sums: dict[str, float] = {}
    loss_sum: torch.Tensor | None = None
    for i in range(0, data.n_val, batch_size):
        inputs, target = data.val_batch(i, i + batch_size, device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = model(*inputs).float()
        if loss_sum is None and out.numel() * 4 * math.ceil(data.n_val / batch_size) <= STREAM_LOGITS_BYTES:
            logits.append(out)
            targets.append(target)
            continue
        part = loss_fn(out, target) * len(target)
        loss_sum = part if loss_sum is None else loss_sum + part
        for k, v in (metrics_fn(out, target) if metrics_fn else {}).items():
            sums[k] = sums.get(k, 0.0) + v * len(target)
    if loss_sum is not None:
        return float(loss_sum) / data.n_val, {k: v / data.n_val for k, v in sums.items()}
    out, target = torch.cat(logits), (targets[0] if len(targets) == 1 else torch.cat(targets))  # (N_val, ...)
    loss = float(loss_fn(out, target))
    return loss, (metrics_fn(out, target) if metrics_fn else {})


@dataclass
class _Run:
    """The state of one training run: what a checkpoint holds and `train`'s steps share."""

    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    gen: torch.Generator
    autocast: bool
    stepper: Stepper
    best: float = math.inf
    best_epoch: int = 0
    best_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    train_loss: float = math.nan
    first: int = 1  # the first epoch this call trains
    samples: int = 0  # trained by this call
    # The epoch in progress, so that a stop between two of its steps can be saved and resumed there:
    epoch_gen: torch.Tensor | None = None  # the batch-order generator at the epoch's start
    steps_done: int = 0  # its batches trained so far
    loss_sum: torch.Tensor | None = None  # their summed loss (the epoch's mean training loss needs it)
    skip: int = 0  # a run resumed between two steps: batches of its first epoch already trained
    ranks: Any = None  # a trial across K ranks (workers/_distributed.Ranks); None: this process alone

    def state(self, epoch: int) -> dict[str, Any]:
        # The global RNG (dropout) is saved too: a resumed run repeats an uninterrupted one bit for bit.
        model, opt = (self.model.state_dict(), self.opt.state_dict()) if self.ranks is None else (
            self.ranks.states(self.opt))  # whole, as one process holds it: it resumes at any world size
        return {
            "epoch": epoch, "model": model, "optimizer": opt,
            "scheduler": self.sched.state_dict(), "generator": self.gen.get_state(), "best": self.best,
            "best_epoch": self.best_epoch, "best_metrics": self.best_metrics, "history": self.history,
            "train_loss": self.train_loss, "torch_rng": torch.get_rng_state(),
            **({"cuda_rng": torch.cuda.get_rng_state()} if self.autocast else {}),
        }

    def stopped_state(self, epoch: int) -> dict[str, Any]:
        """The state between two steps of `epoch`: the last whole epoch, the model, optimiser,
        schedule and RNG as they are now, and where in `epoch` it stopped (`partial`). Resumed, it
        trains the rest of `epoch` in the same order, so a stopped run loses no step and repeats an
        uninterrupted one bit for bit. The generator is the epoch's start: resuming redraws the
        epoch's batch order from it."""
        st = self.state(epoch - 1)
        if self.epoch_gen is not None:
            st["generator"] = self.epoch_gen
        loss_sum = self.loss_sum.detach().clone() if self.loss_sum is not None else None
        if loss_sum is not None and self.ranks is not None:
            loss_sum = self.ranks.total(loss_sum)  # the group's, resumed on rank 0 (Ranks.own)
        st["partial"] = {"steps": self.steps_done if loss_sum is not None else 0, "loss_sum": loss_sum}
        return st


def _start(model: nn.Module, data: TensorDataset, cfg: TrainConfig, resume: dict[str, Any] | None,
           loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ranks: Any = None) -> _Run:
    """The optimiser, schedule and batch-order generator, fresh or from a checkpoint; with `ranks`
    the model is wrapped first (DDP, or FSDP2 in place, before the optimizer sees its parameters)."""
    net = model if ranks is None else ranks.wrap(model)
    device = next(model.parameters()).device  # after wrapping: a branch's FSDP2 copy is made on meta
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    total = cfg.total_steps or cfg.steps_per_epoch(data.n_train) * cfg.epochs
    # A family with its own groups (lm under µP: per-group rate, decay and eps) gives them; else one group.
    groups = getattr(model, "optimizer_groups", lambda lr, wd: None)(cfg.learning_rate, cfg.weight_decay)
    opt = torch.optim.AdamW(model.parameters() if groups is None else groups, lr=cfg.learning_rate,
                            weight_decay=cfg.weight_decay, **adamw_options(device))
    if ranks is not None:
        ranks.optimizer = opt  # a cooldown branch of an FSDP2 run copies its moments (Ranks.fork)
    shape = lr_lambda(cfg.warmup_steps, total, cfg.min_lr_ratio, cfg.schedule, cfg.cooldown)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, shape)
    stepper = Stepper(net, opt, sched, loss_fn if ranks is None else ranks.loss(loss_fn), device.type == "cuda",
                      cfg.grad_clip, cfg.micro_batch)
    stepper.extra = getattr(model, "extra_loss", None)  # DDP's wrapper does not pass attributes on
    run = _Run(net, opt, sched, gen, device.type == "cuda", stepper, ranks=ranks)
    if resume is None:
        return run
    if ranks is None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
    else:
        ranks.load(opt, resume)
    # Only the step count comes back: the shape is this call's (a WSD cooldown resumes a constant run).
    run.sched.load_state_dict(resume["scheduler"])
    for group, base in zip(opt.param_groups, run.sched.base_lrs, strict=True):
        group["lr"] = base * shape(run.sched.last_epoch)  # what LambdaLR would set with this shape
    gen.set_state(resume["generator"].to(gen.get_state().device))
    # RNG states are CPU byte tensors, whatever map_location the checkpoint was loaded with.
    if "torch_rng" in resume:
        torch.set_rng_state(resume["torch_rng"].cpu())
    if "cuda_rng" in resume and run.autocast:
        torch.cuda.set_rng_state(resume["cuda_rng"].cpu())
    run.best, run.best_epoch, run.best_metrics = resume["best"], resume["best_epoch"], resume["best_metrics"]
    run.history, run.train_loss = list(resume["history"]), resume["train_loss"]
    run.first = int(resume["epoch"]) + 1
    partial = resume.get("partial")
    if partial is not None and partial["loss_sum"] is not None:  # stopped between two steps of epoch `first`
        run.skip, run.loss_sum = int(partial["steps"]), partial["loss_sum"].to(device)
        if ranks is not None:
            run.loss_sum = ranks.own(run.loss_sum)
    return run


def _train_epoch(run: _Run, data: TensorDataset, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 cfg: TrainConfig, check_stop: Callable[[], None], epoch: int, max_steps: int | None = None) -> float:
    """One pass over the training set in the generator's order (its first `max_steps` batches
    only, for a cooldown branch that ends inside an epoch); the mean loss of what was trained."""
    model = run.model
    device = next(model.parameters()).device
    model.train()
    run.epoch_gen = run.gen.get_state()
    where = data.index_device(device)  # the indices go where the data are (one copy an epoch, if any)
    if cfg.epoch_samples is None:
        perm = torch.randperm(data.n_train, device=device, generator=run.gen).to(where)
    else:
        perm = interval_order(data.n_train, cfg.epoch_samples, epoch, cfg.seed).to(where)
    skip, run.skip = run.skip, 0
    loss_sum = run.loss_sum if skip and run.loss_sum is not None else torch.zeros((), device=device)
    run.loss_sum = loss_sum  # summed in place below: a stop saves a copy
    size = cfg.samples_per_epoch(data.n_train)
    n = size if max_steps is None else min(size, max_steps * cfg.batch_size)
    for i in range(skip * cfg.batch_size, n, cfg.batch_size):
        run.steps_done = i // cfg.batch_size
        check_stop()
        idx = perm[i : i + cfg.batch_size]  # gathered where the data are: no host round trip on the device
        if run.ranks is not None:  # this rank's share; the samples counted are the group's
            part = run.ranks.share(idx)
            run.samples, idx = run.samples + len(idx) - len(part), part
        inputs, target = data.train_batch(idx, device)
        run.samples += run.stepper.step(inputs, target, loss_sum)
    run.steps_done = math.ceil(n / cfg.batch_size)
    # One host sync per epoch: a NaN anywhere in the epoch poisons the sum.
    train_loss = float(loss_sum if run.ranks is None else run.ranks.total(loss_sum)) / n
    if not math.isfinite(train_loss):
        raise NonFiniteLoss(f"training loss became non-finite ({train_loss}) in epoch {epoch}")
    return train_loss


def _validate(run: _Run, data: TensorDataset, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              metrics_fn: Callable[[torch.Tensor, torch.Tensor], dict[str, float]] | None, cfg: TrainConfig,
              epoch: int) -> float:
    """Validate, record the epoch in the history and keep the best."""
    val, metrics = evaluate(run.model, data, loss_fn, metrics_fn, cfg.eval_batch_size, run.autocast)
    if not math.isfinite(val):
        raise NonFiniteLoss(f"validation loss became non-finite ({val}) in epoch {epoch}")
    run.history.append({"epoch": epoch, "train_loss": run.train_loss, "val_loss": val})
    if val < run.best:
        run.best, run.best_epoch, run.best_metrics = val, epoch, metrics
    return val


@dataclass
class _Hooks:
    """What a validated epoch calls back: the stopping rule's report, its score, the checkpoint."""

    on_eval: Callable[[int, float], None] | None
    checkpoint: Callable[[dict[str, Any]], None] | None
    plan: TrainingPlan
    on_score: Callable[[int, float, dict[str, Any]], None] | None

    def validated(self, run: _Run, epoch: int, val: float, samples: int, train_s: float) -> None:
        try:
            if self.on_eval is not None:
                self.on_eval(epoch, val)  # may raise StopTraining
        except StopTraining as stop:
            stop.samples, stop.seconds = samples, train_s  # type: ignore[attr-defined]
            raise
        if self.on_score is not None and epoch in self.plan.score_at:
            self.on_score(epoch, val, run.state(epoch))
        if self.checkpoint is not None:
            self.checkpoint(run.state(epoch))


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
    plan: TrainingPlan | None = None,
    on_score: Callable[[int, float, dict[str, Any]], None] | None = None,
    ranks: Any = None,  # a trial across K ranks (workers/_distributed.Ranks): each trains its share
) -> TrainResult:
    """Train in place; `data` as `data.to(device)` returns it for the model's device (there, or on the host).

    ``checkpoint(state)``: after every validated epoch, and when a stop ends the run between two
    steps (``_Run.stopped_state``); ``resume=state`` goes on from such a state (a retry where it
    died, a stopped run where it stopped, a constant-rate WSD run into its cooldown).
    ``should_stop()``: asked before every step and validation (a Python flag, no device sync); True
    raises TrialStopped (a worker stopped or fenced out) with ``samples``, what this call trained.
    ``plan`` (archhpo.schema.TrainingPlan, the stopping rule's): ``validate_at`` always validated, at
    ``score_at`` ``on_score(epoch, val, state)`` before the checkpoint, stop after ``stop_after``."""
    plan = TrainingPlan() if plan is None else plan
    run = _start(model, data, cfg, resume, loss_fn, ranks)
    hooks = _Hooks(on_eval, checkpoint, plan, on_score)
    first, start, epoch = run.first, time.perf_counter(), run.first - 1
    train_s = 0.0  # samples/s and MFU time the training steps only

    def check_stop() -> None:
        if should_stop is not None and should_stop():
            _stop(run, epoch, checkpoint)

    last = cfg.epochs if plan.stop_after is None else min(plan.stop_after, cfg.epochs)
    for epoch in range(first, last + 1):
        epoch_start = time.perf_counter()
        run.train_loss = _train_epoch(run, data, loss_fn, cfg, check_stop, epoch)
        train_s += time.perf_counter() - epoch_start  # _train_epoch ends on a host sync: the work is done
        if epoch % cfg.eval_every and epoch not in (cfg.epochs, last) and epoch not in plan.validate_at:
            continue
        check_stop()
        val = _validate(run, data, loss_fn, metrics_fn, cfg, epoch)
        hooks.validated(run, epoch, val, run.samples, train_s)
    duration = time.perf_counter() - start
    return TrainResult(
        best_val_loss=run.best, train_loss=run.train_loss, epochs_run=epoch, best_epoch=run.best_epoch,
        duration_s=duration, samples_per_s=run.samples / max(train_s, 1e-9), metrics=run.best_metrics,
        history=run.history, samples=run.samples, train_s=train_s,
    )


def _stop(run: _Run, epoch: int, checkpoint: Callable[[dict[str, Any]], None] | None) -> None:
    """End the run between two steps of `epoch`: save where it stopped, then raise TrialStopped."""
    if checkpoint is not None:
        checkpoint(run.stopped_state(epoch))
    stop = TrialStopped(f"training stopped in epoch {epoch}")
    stop.samples = run.samples  # type: ignore[attr-defined]
    raise stop


@dataclass
class Branch:
    """A WSD rung score: the validation loss after a cooldown branched from a constant-rate state."""

    val_loss: float
    steps: int  # the branch's own optimizer steps (compute spent on top of the constant-rate run)
    epochs: float  # the same in epochs
    samples: int


def cooldown_branch(
    model: nn.Module, data: TensorDataset, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    cfg: TrainConfig, state: dict[str, Any],
) -> Branch:
    """Cool down a copy of `model` from `state` (a constant-rate checkpoint after epoch e) as a WSD
    run ending there would: cooldown/(1-cooldown) of its e epochs' steps (at least one step; the
    last epoch may be cut short), then validate. The model and the state are left as they were, so
    the constant-rate run goes on from the state.

    A model FSDP2 sharded over K ranks: every rank cools down its shard of a copy sharded alike,
    filled from its own shard of the run (Ranks.fork), so no rank holds more than 1/K of the copy
    and the gathered state (whole on rank 0 only) is read for its schedule, order and RNG alone."""
    live = sharded_ranks(model)
    per_epoch = cfg.steps_per_epoch(data.n_train)
    hold = int(state["epoch"]) * per_epoch
    steps = max(1, round(hold * cfg.cooldown / (1 - cfg.cooldown)))
    branch_cfg = replace(cfg, epochs=int(state["epoch"]) + math.ceil(steps / per_epoch),
                         total_steps=hold + steps, cooldown=steps / (hold + steps))
    # The branch must leave the run it branches from exactly as it was: a copy of the state (loading
    # it into an optimizer would alias its moment tensors) and the global RNG (dropout) put back.
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state() if "cuda_rng" in state else None
    try:
        if live is None:
            run = _start(copy.deepcopy(model), data, branch_cfg, copy.deepcopy(state), loss_fn)
        else:
            light = copy.deepcopy({k: v for k, v in state.items() if k not in ("model", "optimizer")})
            copied, fork = live.fork()
            run = _start(copied, data, branch_cfg, light, loss_fn, fork)
        left, epoch = steps, run.first
        while left > 0:  # the epochs a continued run would train next (an interval's own samples)
            _train_epoch(run, data, loss_fn, branch_cfg, lambda: None, epoch, max_steps=left)
            left, epoch = left - min(left, per_epoch), epoch + 1
        val, _ = evaluate(run.model, data, loss_fn, None, cfg.eval_batch_size, run.autocast)
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng)
    size = cfg.samples_per_epoch(data.n_train)
    samples = size * (steps // per_epoch) + min(size, (steps % per_epoch) * cfg.batch_size)
    return Branch(val_loss=val, steps=steps, epochs=round(steps / per_epoch, 4), samples=samples)


def describe_result(result: TrainResult) -> dict[str, Any]:
    return {
        "val_loss": result.best_val_loss, "train_loss": result.train_loss, "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch, "duration_s": round(result.duration_s, 3),
        "samples_per_s": round(result.samples_per_s, 1), **result.metrics,
    }
