"""One claimed trial on its way through the worker loop (workers/_loop.py): the queue protocol
it comes from, its heartbeat, its record (_TrialRun), the stopping rule's scorer, and what the
claim records besides its value (failure reason, throughput, compute spent)."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from optuna.trial import TrialState

from archhpo.errors import ArchhpoError, MemoryRefused, NonFiniteLoss, TrialLost
from archhpo.schema import Attr, TrainingPlan, gpu_share
from archhpo.workers import _device
from archhpo.workers._build import BuiltTrial, TrialSpec
from archhpo.workers._memory import is_oom, is_sticky_cuda_error
from archhpo.workers._train import cooldown_branch

log = logging.getLogger("archhpo.worker")


class QueueLike(Protocol):
    name: str
    settings: Any

    def claim(self, worker_attrs: dict[str, Any]) -> Any: ...
    def maintain(self, blocking: bool = True) -> Any: ...
    def heartbeat(self, claim: Any) -> bool | None: ...  # False: the trial is no longer ours
    def started(self, claim: Any, flops_from: int) -> bool: ...  # the claim's starting point, for the ETA
    def report(self, claim: Any, step: int, value: float) -> bool: ...  # may raise TrialLost
    def finish(self, claim: Any, state: TrialState, value: float | None, attrs: dict[str, Any]) -> bool: ...
    def requeue(self, claim: Any, note: str = ..., attrs: dict[str, Any] | None = ...) -> bool: ...
    # A claim whose plan stops early (TrainingPlan.stop_after): hold the trial where it stopped.
    def park(self, claim: Any, score: float, attrs: dict[str, Any]) -> bool: ...


class _Heartbeat(threading.Thread):
    """Beats for the running trial from a side thread, and every `reap_s` runs the plan upkeep,
    so a dead worker's trial is reaped while everyone else is busy training.  A beat refused
    because the trial is no longer ours sets `lost`: the trainer stops at its next step."""

    def __init__(self, queue: QueueLike, claim: Any, interval: float, reap_s: float) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{claim.number}")
        self.queue, self.claim, self.interval, self.reap_s = queue, claim, interval, reap_s
        self.stopped = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        last_reap = time.monotonic()
        while not self.stopped.wait(self.interval):
            try:
                if self.queue.heartbeat(self.claim) is False:
                    log.warning("trial %s was reaped while this worker held it (paused or cut off "
                                "from the database); dropping it, its retry runs elsewhere", self.claim.number)
                    self.lost.set()
                    return
                if time.monotonic() - last_reap >= self.reap_s:
                    last_reap = time.monotonic()
                    self.queue.maintain(blocking=False)
            except TrialLost:
                self.lost.set()
                return
            except Exception as exc:  # a database blip must not kill the trial; the next beat retries
                log.warning("heartbeat for trial %s failed: %s", self.claim.number, exc)


@dataclass
class _TrialRun:
    """One claimed trial on its way through the loop, and what its conclusion writes."""

    queue: QueueLike
    claim: Any
    beat: _Heartbeat
    attrs: dict[str, Any] = field(default_factory=dict)
    state: TrialState = TrialState.FAIL
    value: float | None = None
    outcome: str = "finish"  # finish | park (held at a rung) | requeue (stopped) | lost | unhealthy
    best: float = float("inf")
    start: float = field(default_factory=time.perf_counter)
    prior_s: float = 0.0  # wall time of the earlier claims the resumed checkpoint carries
    rung_scores: list[float] = field(default_factory=list)  # the stopping rule's scores so far (rungs)
    branch_epochs: list[float] = field(default_factory=list)
    branch_samples: int = 0  # trained by this claim's cooldown branches (they count as compute)

    @property
    def spec_seed(self) -> int | None:
        return getattr(self.claim, "seed", None)

    def should_stop(self, stop_event: threading.Event) -> bool:
        return stop_event.is_set() or self.beat.lost.is_set()

    def elapsed_s(self) -> float:
        """The trial's wall time so far, over every claim that trained the state it goes on from."""
        return self.prior_s + time.perf_counter() - self.start


# ------------------------------------------------------------------ what a claim records
def claim_spec(queue: QueueLike, claim: Any) -> TrialSpec:
    """What build_trial builds for this claim: the study's settings and the claim's architecture,
    training parameters, slot and seed."""
    s = queue.settings
    return TrialSpec(
        family=s.family, data=dict(s.data), options=s.options.as_dict(), info=dict(s.info),
        arch=dict(claim.arch), params=dict(claim.params), slot=int(claim.slot),
        seed=getattr(claim, "seed", None),
    )


def classify_failure(run: _TrialRun, exc: Exception, worker_attrs: dict[str, Any]) -> str | None:
    """Final failures name their reason; a shared-GPU OOM or refusal is retried once on a whole
    GPU; a sticky CUDA fault is not the trial's: it goes back, and the message returned (else None)
    stops the worker.  Called inside the `except` that caught `exc` (its traceback is logged)."""
    attrs, where = run.attrs, worker_attrs[Attr.DEVICE]
    unhealthy = None
    if is_sticky_cuda_error(exc):
        run.outcome = "unhealthy"
        unhealthy = f"CUDA fault on {where} in trial {run.claim.number}: {str(exc)[:300]}"
        log.error("%s; giving the trial back and stopping this worker (its CUDA context is unusable)",
                  unhealthy)
    elif isinstance(exc, MemoryRefused) or is_oom(exc):
        attrs[Attr.FAIL_REASON] = (str(exc) if isinstance(exc, MemoryRefused)
                                   else f"out of memory on {where}: {str(exc)[:300]}")
        if gpu_share(worker_attrs) < 1:  # neighbours' memory may be to blame: retried once on a GPU of its own
            attrs[Attr.OOM_SHARED] = True
    elif isinstance(exc, NonFiniteLoss):
        attrs[Attr.FAIL_REASON] = str(exc)
    elif isinstance(exc, ArchhpoError | ValueError):
        attrs[Attr.FAIL_REASON] = f"{type(exc).__name__}: {exc}"
    else:
        attrs[Attr.FAIL_REASON] = f"{type(exc).__name__}: {exc}"[:1000]
        log.error("trial %s crashed:\n%s", run.claim.number, traceback.format_exc())
    return unhealthy


def throughput(built: BuiltTrial, samples: int, seconds: float, path: int, device: torch.device,
               share: float) -> dict[str, Any]:
    """This claim's speed (samples/s, MFU: what it trained in its training time, against the
    worker's `share` of its GPU) and the trial's training compute (train_flops: every sample the
    model trained on since epoch 1, whichever claims trained them, so a resumed trial counts as an
    uninterrupted one)."""
    out: dict[str, Any] = built.data_attrs(int(path))
    if seconds > 0:
        out["samples_per_s"] = round(samples / seconds, 1)
    if built.flops_per_sample is not None:
        out["train_flops"] = int(built.flops_per_sample) * int(path)
        if device.type == "cuda":
            value = _device.mfu(int(built.flops_per_sample) * int(samples), seconds, device, share=share)
            if value is not None:  # 3 significant figures: a tiny model's MFU on an H100 is ~1e-5
                out[Attr.MFU] = float(f"{value:.3g}")
    return out


# ------------------------------------------------------------------ resuming and the rule's scores
def _starting(run: _TrialRun, built: BuiltTrial, resume: dict[str, Any] | None) -> None:
    """Before a claim trains: go on from its checkpoint (`resume`, None: none was found) and tell
    the queue where its training starts (Attr.FLOPS_FROM), so the ETA counts the work a lost or
    missing checkpoint takes again (FLOPS_SPENT keeps counting what the earlier claims trained)."""
    if resume is not None:
        _resumed(run, resume)
    if built.flops_per_sample is not None:
        run.queue.started(run.claim, int(built.flops_per_sample) * _resumed_samples(built, resume))


def _resumed_samples(built: BuiltTrial, resume: dict[str, Any] | None) -> int:
    """The training samples a checkpoint holds: its whole epochs and the steps into the next (a
    trial stopped between two steps); 0 without one."""
    if resume is None:
        return 0
    steps = int((resume.get("partial") or {}).get("steps", 0))
    within = min(built.epoch_samples, steps * int(built.train_config.batch_size))
    return int(resume["epoch"]) * built.epoch_samples + within


def _resumed(run: _TrialRun, resume: dict[str, Any]) -> None:
    """A claim going on from a checkpoint: where from, the earlier claims' time, their curve."""
    run.attrs[Attr.RESUMED_FROM_EPOCH] = int(resume["epoch"])
    partial = resume.get("partial")
    if partial is not None:
        run.attrs[Attr.RESUMED_FROM_STEP] = int(partial["steps"])
    run.prior_s = float(resume.get("elapsed_s", 0.0))
    for h in resume["history"]:  # the retry carries the dead attempt's curve
        run.queue.report(run.claim, int(h["epoch"]), float(h["val_loss"]))
        run.best = min(run.best, float(h["val_loss"]))


class _Scorer:
    """The stopping rule's side of one claim (the claim's TrainingPlan): where the trainer scores
    it (on_score for train(): the loss there, or under WSD after a cooldown branched from the
    constant-rate state there, its steps counted as compute) and what the claim records."""

    def __init__(self, run: _TrialRun, built: BuiltTrial, resume: dict[str, Any] | None) -> None:
        claim_plan = getattr(run.claim, "plan", None)
        self.plan: TrainingPlan = TrainingPlan() if claim_plan is None else claim_plan
        self.run, self.built = run, built
        run.rung_scores, run.branch_epochs = list(self.plan.scores), list(self.plan.branch_epochs)
        if self.plan.scores_from_checkpoint and resume is not None:  # scored before its checkpoint
            run.rung_scores = [float(v) for v in resume.get("rung_scores", [])]
            run.branch_epochs = [float(v) for v in resume.get("branch_epochs", [])]

    def __call__(self, epoch: int, val: float, state: dict[str, Any]) -> None:
        run, built, cfg = self.run, self.built, self.built.train_config
        times = max(1, self.plan.score_at.count(epoch))  # a short trial: rungs at one epoch
        if cfg.schedule == "wsd":
            branch = cooldown_branch(built.model, built.data, built.family.loss, cfg, state)
            val, cooled = branch.val_loss, branch.epochs
            run.branch_samples += branch.samples
        else:
            cooled = 0.0
        run.rung_scores += [val] * times
        run.branch_epochs += [cooled] * times

    def settle(self, result: Any, resume: dict[str, Any] | None) -> None:
        """The trial's outcome once its claim trained as planned (`result`: train()'s TrainResult):
        ended at its rung (`plan.ends`, a confirmation run under --confirm-at-rung: PRUNED, its score
        there its value), held where it stopped (parked with its score), or COMPLETE at full length.
        A claim killed after its last checkpoint but before it ended or was held scores it now."""
        run, plan = self.run, self.plan
        if plan.stop_after is not None and resume is not None and (
                len(run.rung_scores) < len(plan.score_at) if plan.ends else len(run.rung_scores) == len(plan.scores)):
            self(int(resume["epoch"]), float(resume["history"][-1]["val_loss"]), resume)
        if plan.ends:
            run.state, run.value = TrialState.PRUNED, run.rung_scores[-1]
            run.attrs[Attr.PRUNED_AT_EPOCH] = plan.stop_after
        elif plan.stop_after is not None:
            run.outcome, run.value = "park", run.rung_scores[len(plan.scores)]
        else:
            run.state, run.value = TrialState.COMPLETE, result.best_val_loss
            run.attrs.update(train_loss=result.train_loss, best_epoch=result.best_epoch,
                             **{f"val_{k}": v for k, v in result.metrics.items()})

    def record(self, samples: int) -> None:
        """This claim's FLOPs (training and branches; the queue adds the trial's earlier claims) and,
        when the rule scores the trial, its scoring epochs and the scores of a trial at full length."""
        run = self.run
        _record_spent(run, self.built, samples)
        if not self.plan.scored:
            return
        run.attrs[Attr.RUNG_EPOCHS] = list(self.plan.scored)
        if run.outcome == "park":  # the queue stores the rung and its score with the hold
            run.attrs[Attr.BRANCH_EPOCHS] = run.branch_epochs
        elif self.plan.ends:  # ended at its rung: the scores up to it, the last its value
            run.attrs.update({Attr.RUNG: len(run.rung_scores) - 1, Attr.RUNG_SCORES: run.rung_scores,
                              Attr.BRANCH_EPOCHS: run.branch_epochs})
        elif run.state == TrialState.COMPLETE:
            run.attrs.update({Attr.RUNG_SCORES: [*run.rung_scores, run.value],
                              Attr.BRANCH_EPOCHS: [*run.branch_epochs, 0.0]})


def _record_spent(run: _TrialRun, built: BuiltTrial, samples: int) -> None:
    """This claim's FLOPs: its training and its cooldown branches (the queue adds earlier claims')."""
    if built.flops_per_sample is not None:
        run.attrs[Attr.FLOPS_SPENT] = int(built.flops_per_sample) * (int(samples) + run.branch_samples)


def only_whole_gpu_work(status: Any) -> bool:
    """Whether a study's only work left is a retry that needs a whole GPU (a shared-GPU OOM): a worker
    sharing its GPU then leaves the study, freeing its share for the worker that will run it."""
    whole = int(getattr(status, "whole_gpu_waiting", 0) or 0)
    if whole and status.waiting == whole and status.running == 0:
        log.info("only whole-GPU retries are left in %s; leaving them to a worker with a GPU of its own",
                 getattr(status, "name", "the study"))
        return True
    return False


def idle_note(statuses: Mapping[str, Any]) -> str:
    """Why a worker finds nothing to claim in studies that are not done, from their plan statuses
    (search/_status.PlanStatus): each idle budget's `waits_for` (a ladder budget before its smaller
    ones, a confirmation's later wave), else the trials other workers run or that wait at a rung."""
    waits = [f"{name}: {w}" for name, st in statuses.items() if (w := getattr(st, "waits_for", ""))]
    running = sum(int(getattr(st, "running", 0) or 0) for st in statuses.values())
    held = sum(int(getattr(st, "held", 0) or 0) for st in statuses.values())
    busy = [f"{running} trial(s) running on other workers" if running else "",
            f"{held} held at a rung until its decision" if held else ""]
    return "; ".join([*waits, *(b for b in busy if b)]) or "nothing to claim yet"


class IdleNotes:
    """What an idle worker says: `idle_note` when it changes, not every poll; after a claim the next
    wait is said again, even for the same reason."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.last = say, ""

    def waiting(self, statuses: Mapping[str, Any]) -> None:
        note = idle_note(statuses)
        if note != self.last:
            self.last = note
            self.say(note)

    def claimed(self) -> None:
        self.last = ""


class Following:
    """A study's queue as a rank other than 0 of a trial group sees it (workers/_distributed.py):
    its name and settings, and no write at all: rank 0 holds the claim and writes for the group."""

    def __init__(self, queue: QueueLike) -> None:
        self.queue = queue
        self.name, self.settings = queue.name, queue.settings

    def claim(self, worker_attrs: dict[str, Any]) -> Any:
        return None

    def maintain(self, blocking: bool = True) -> Any:
        return None

    def heartbeat(self, claim: Any) -> bool | None:
        return None

    def started(self, claim: Any, flops_from: int) -> bool:
        return True

    def report(self, claim: Any, step: int, value: float) -> bool:
        return False  # the decision is rank 0's, broadcast to every rank (Group.decide)

    def finish(self, claim: Any, state: TrialState, value: float | None, attrs: dict[str, Any]) -> bool:
        return True

    def requeue(self, claim: Any, note: str = "", attrs: dict[str, Any] | None = None) -> bool:
        return True

    def park(self, claim: Any, score: float, attrs: dict[str, Any]) -> bool:
        return True
