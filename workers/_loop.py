"""The worker loop of docs/design.md §6: take the next planned trial, build, train, report, finish, repeat.

It talks to queue objects (search.TrialQueue) through the small protocol of workers/_claim.py,
never to Optuna; a trial becomes model, data and TrainConfig only through ``build_trial``.
Stopping and fencing (docs/cluster.md#crash-recovery-and-preemption): a signal or ``stop_event``
stops between two steps and gives the trial back (a second signal at once); a trial reaped
while this worker was cut off is dropped at the next beat and never written again; a full
checkpoint disk (``DiskFull``) gives the trial back and stops the worker. Checkpoints belong to
one attempt (``slotNNNNN.attemptK.pt``); a retry reads an earlier attempt's file, and files go only
once the finish is committed. Under torchrun or Ray Train (WORLD_SIZE > 1) the K processes are one
worker whose trials run across the K ranks (workers/_distributed.py, _ranked.py): rank 0 holds the
claim and writes once for the group, the others follow its broadcasts, every rank agrees before
each step whether to go on, and a rank that dies or stalls breaks the group: nothing more is
written, the claim is reaped and retried once, and the surviving ranks exit unhealthy.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from optuna.trial import TrialState

from archhpo.errors import DiskFull, GroupBroken, TrialLost, TrialStopped
from archhpo.models import get_family
from archhpo.schema import Attr, gpu_share
from archhpo.workers import _device
from archhpo.workers._batch import eval_batch, plan_batch, plan_eval_batch, use_plan, vocab_logits
from archhpo.workers._build import BuiltTrial, DataCache, build_trial
from archhpo.workers._checkpoints import Checkpoints, _atomic_save
from archhpo.workers._claim import (
    Following,
    IdleNotes,
    QueueLike,
    _Heartbeat,
    _record_spent,
    _Scorer,
    _starting,
    _TrialRun,
    claim_spec,
    classify_failure,
    only_whole_gpu_work,
    throughput,
)
from archhpo.workers._distributed import (
    Ranks,
    is_group_failure,
    join_group,
)
from archhpo.workers._divergence import mark_diverged
from archhpo.workers._memory import (
    estimate_training_bytes,
    host_build_slot,
    trial_shape,
)
from archhpo.workers._ranked import fits_group, group_resume, group_stop, rank_share
from archhpo.workers._train import StopTraining, TrainConfig, resolve_device, train

log = logging.getLogger("archhpo.worker")


@dataclass
class WorkerSummary:
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    lost: int = 0  # reaped while this worker held them (the retry elsewhere counts)
    requeued: int = 0  # given back to the queue because the worker was stopped
    parked: int = 0  # scored at a rung (its plan's stop_after) and held there for the rung's decision
    signal: int | None = None  # the signal that stopped the worker (SIGTERM 15, SIGINT 2), if any
    unhealthy: str | None = None  # a sticky CUDA fault stopped the worker: exit non-zero, never reuse
    disk_full: str | None = None  # no space for a checkpoint: its trial went back, the worker stopped
    trials: list[int] = field(default_factory=list)


class Worker:
    """Trains the planned trials of one or more studies (budgets) until all plans are done."""

    def __init__(
        self,
        queues: Sequence[QueueLike],
        device: str = "auto",
        threads: int | None = None,
        extra_attrs: dict[str, Any] | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 1,
        handle_signals: bool = False,
        on_idle: Callable[[str], None] | None = None,
    ) -> None:
        self.queues = list(queues)
        self.idle = IdleNotes(on_idle or (lambda note: log.info("idle: %s", note)))  # a standalone worker prints them
        self.group = join_group(device)  # None unless launched as K ranks (torchrun, Ray Train)
        self.device = resolve_device(device) if self.group is None else self.group.device
        self.broken = False  # the group lost a rank: nothing more is sent on it
        if threads:
            torch.set_num_threads(threads)
        if self.device.type == "cuda":
            _device.configure_cuda_speed()  # TF32 for the fp32 matmuls left outside bf16 autocast
        self.checkpoint_dir = Path(checkpoint_dir).resolve() if checkpoint_dir else None
        self.checkpoints = Checkpoints(self.checkpoint_dir)
        self.checkpoint_every = max(1, checkpoint_every)
        self.handle_signals = handle_signals
        self.stop_event = threading.Event()
        self.signal_received: int | None = None
        self.unhealthy: str | None = None  # a sticky CUDA fault: the worker stops, its process exits
        self.disk_full: str | None = None  # DiskFull's sentence: the worker stops, its trial went back
        self.attrs = {
            Attr.HOST: socket.gethostname(), Attr.DEVICE: self._device_name(), Attr.PID: os.getpid(),
            Attr.THREADS: torch.get_num_threads(),  # a CPU replay (`train --threads`) is exact with the same
            **_device.device_attrs(self.device),
            **(extra_attrs or {}),
            **({Attr.RANKS: self.group.world} if self.group is not None else {}),
        }
        self._data = DataCache()
        # torch's import leaves ~250k objects that every full GC pass would walk again (~150 ms a
        # trial, measured): move them to the permanent generation.
        gc.freeze()

    def _device_name(self) -> str:
        if self.device.type == "cuda":
            return f"cuda:{torch.cuda.get_device_name(self.device)}"
        return "cpu"

    def _gpu_share(self) -> float:
        """This worker's share of its GPU (Ray's num_gpus; 1 when it has the GPU to itself)."""
        return gpu_share(self.attrs)

    @property
    def shares_gpu(self) -> bool:
        return self._gpu_share() < 1

    # ------------------------------------------------------------------------ signals
    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT: stop between two steps and give the trial back; a second one: at once."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if self.stop_event.is_set():
                raise KeyboardInterrupt  # impatient: the BaseException path still requeues
            self.signal_received = signum
            self.stop_event.set()
            log.warning("%s received: giving the running trial back to the queue and stopping",
                        signal.Signals(signum).name)

        old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    # ------------------------------------------------------------------------ checkpoints
    def _checkpoint_path(self, queue: QueueLike, claim: Any, attempt: int | None = None) -> Path | None:
        """This attempt's own checkpoint file (slot AND attempt in the name)."""
        return self.checkpoints.path(queue, claim, attempt)

    def _load_resume(self, queue: QueueLike, claim: Any) -> dict[str, Any] | None:
        """Our own attempt's state, else the newest earlier attempt's (workers/_checkpoints.py)."""
        return self.checkpoints.load_resume(queue, claim)

    # ------------------------------------------------------------------------ the loop
    def run(self) -> WorkerSummary:
        summary = WorkerSummary()
        with self._signals():
            if self.group is not None and not self.group.lead:
                _follow(self, summary)
            else:
                self._lead(summary)
        summary.signal = self.signal_received
        summary.unhealthy, summary.disk_full = self.unhealthy, self.disk_full
        if self.group is not None and not self.broken:  # a broken group's peers are gone: nothing to leave
            self.group.leave()
            self.group = None
        return summary

    def _lead(self, summary: WorkerSummary) -> None:
        """Claim and run trials until the plans are done (rank 0 of a group tells the others)."""
        pending = [q for q in self.queues if fits_group(self.group, q)]
        try:
            while pending and not self._halted():
                claim, queue = self._next(pending)
                if claim is None:
                    break
                self.idle.claimed()
                self._tell(("trial", self.queues.index(queue), claim))
                self._run_trial(queue, claim, summary)
            if not self.broken:
                self._tell(("done",))
        except Exception as exc:
            if self.group is None or not is_group_failure(exc):
                raise
            _broken(self, exc)

    def _tell(self, msg: tuple[Any, ...]) -> None:
        """Rank 0's next move to the other ranks (a trial, an idle poll, done); alone: nothing."""
        if self.group is not None:
            self.group.broadcast(msg)

    def _halted(self) -> bool:
        """Asked to stop, or stopped by a CUDA fault or a full checkpoint disk: claim nothing more."""
        return self.stop_event.is_set() or self.unhealthy is not None or self.disk_full is not None

    def _next(self, pending: list[QueueLike]) -> tuple[Any, Any]:
        """First claim from any study with waiting work; drop studies whose plan is done."""
        while pending and not self.stop_event.is_set():
            for q in list(pending):
                claim = q.claim(self.attrs)
                if claim is not None:
                    return claim, q
            statuses: dict[str, Any] = {}
            for q in list(pending):
                status = statuses[q.name] = q.maintain(blocking=False)
                if status.done:
                    self.checkpoints.remove_study(q)
                if status.done or (self.shares_gpu and only_whole_gpu_work(status)):
                    pending.remove(q)
                else:
                    claim = q.claim(self.attrs)
                    if claim is not None:
                        return claim, q
            if pending:
                self.idle.waiting({q.name: statuses[q.name] for q in pending})
                self.stop_event.wait(2.0)
                self._tell(("idle",))  # the other ranks wait within the group's timeout
        return None, None

    # ------------------------------------------------------------------------ one trial
    def _run_trial(self, queue: QueueLike, claim: Any, summary: WorkerSummary) -> None:
        """Claimed -> built (after the fit check) -> trained -> concluded (finished, given back or lost)."""
        run = _TrialRun(queue, claim, _Heartbeat(queue, claim, getattr(queue, "heartbeat_s", 15.0),
                                                 getattr(queue, "reap_s", 30.0)))
        if not isinstance(queue, Following):  # rank 0 alone beats for the group
            run.beat.start()
        if run.spec_seed is not None:
            run.attrs[Attr.SEED] = run.spec_seed
        _device.reset_peak_memory(self.device)
        try:
            self._attempt(run)
        except TrialStopped as exc:
            run.outcome = "lost" if (isinstance(exc, TrialLost) or run.beat.lost.is_set()) else "requeue"
        except BaseException:
            # A second signal, a Ray cancel: give the trial back so it is neither lost nor RUNNING.
            run.beat.stopped.set()
            queue.requeue(claim, "worker stopped")
            raise
        finally:
            run.beat.stopped.set()
            self._release()
        if not isinstance(queue, Following):  # the group's result is written once, by rank 0
            _conclude(self, run, summary)

    def _attempt(self, run: _TrialRun) -> None:
        """Build and train; a failure the trial caused is recorded in run.attrs (fail_reason)."""
        try:
            built = self._build(run)
            self._train(run, built)
        except TrialStopped:
            raise
        except DiskFull as full:  # not the trial's fault: it goes back, and this worker stops
            run.outcome, self.disk_full = "disk_full", str(full)
            log.error("%s", full)
        except Exception as exc:  # noqa: BLE001 - every failure is classified below
            if self.group is not None and is_group_failure(exc):
                _broken(self, exc)
                raise GroupBroken(str(exc)) from exc  # lost: written by nobody, reaped, retried once
            self._classify_failure(run, exc)

    def _build(self, run: _TrialRun) -> BuiltTrial:
        """The model and data on the device, once the memory estimate says the trial fits."""
        spec = claim_spec(run.queue, run.claim)
        family = get_family(spec.family)

        def check_memory(cfg: Any, tcfg: TrainConfig, data: Any) -> None:
            logits = vocab_logits(family.name, cfg)  # an lm's (L, V) logits: the estimate leaves them out
            asked_eval = int(tcfg.eval_batch_size)
            tcfg.eval_batch_size = eval_batch(logits, asked_eval)
            on_device = data.device_bytes(self.device)  # none for an lm: its windows stay on the host
            shape = trial_shape(family, cfg, run.claim.arch, min(int(tcfg.batch_size), data.n_train),
                                min(int(tcfg.eval_batch_size), max(1, data.n_val)),
                                on_device, bool(spec.study_options.compile),
                                branch=tcfg.schedule == "wsd" and bool(getattr(run.claim.plan, "score_at", ())))
            shard = str(getattr(run.queue.settings.options, "shard", "auto"))  # the study's setting
            shape = rank_share(self.group, run.attrs, shard, shape, self.device)
            run.attrs[Attr.MEMORY_ESTIMATE_GIB] = round(estimate_training_bytes(shape, self.device.type) / 2**30, 3)
            # The largest micro-batch that fits; below the batch, gradients accumulate (workers/_batch.py).
            plan = plan_batch(shape, self.device, f"Trial {run.claim.number} ({shape.param_count:,} params)", logits)
            use_plan(plan, tcfg, run.attrs)
            # On CUDA, validation in the batches the plan leaves room for (on CPU: as before).
            tcfg.eval_batch_size = plan_eval_batch(plan, shape, self.device, logits, asked_eval)

        params = int(run.claim.arch["param_count"])
        with host_build_slot(params, self.device, f"trial {run.claim.number} ({params:,} params)"):
            built = build_trial(spec, self.device, data_cache=self._data, before_build=check_memory)
        run.attrs[Attr.BASELINE_VAL_LOSS] = built.baseline_loss
        if built.compile_s is not None:  # compiled on CUDA before the timed steps (workers._device)
            run.attrs[_device.COMPILE_S_ATTR] = built.compile_s
        if built.flops_per_sample is not None:
            run.attrs[Attr.FLOPS_PER_SAMPLE] = built.flops_per_sample
            # What training it to full length once costs (the plan's total is the halving baseline).
            run.attrs[Attr.FLOPS_FULL] = (int(built.flops_per_sample) * built.epoch_samples
                                          * int(built.train_config.epochs))
        return built

    def _train(self, run: _TrialRun, built: BuiltTrial) -> None:
        queue, claim = run.queue, run.claim
        ckpt = self._checkpoint_path(queue, claim)
        resume = group_resume(self.group, self.checkpoints, queue, claim)
        _starting(run, built, resume)
        scorer = _Scorer(run, built, resume)
        plan = scorer.plan
        lead = self.group is None or self.group.lead

        def on_eval(epoch: int, val: float) -> None:
            run.best = min(run.best, val)
            ask = lambda: queue.report(claim, epoch, val)  # noqa: E731 - raises TrialLost when fenced out
            if ask() if self.group is None else self.group.decide(ask):
                raise StopTraining(epoch)

        def save(st: dict[str, Any]) -> None:
            if ckpt is None or run.beat.lost.is_set() or not lead:
                return  # a fenced-out attempt never writes again; a group writes once, from rank 0
            # A rung's state is kept, and so is a stop's (it resumes between the two steps).
            if st["epoch"] % self.checkpoint_every and st["epoch"] not in plan.score_at and "partial" not in st:
                return
            _atomic_save({"params": claim.params, "arch": claim.arch, "attempt": int(claim.attempt),
                          "trial_number": claim.number, "pid": os.getpid(), "rung_scores": run.rung_scores,
                          "branch_epochs": run.branch_epochs, "elapsed_s": run.elapsed_s(), **st}, ckpt)

        try:
            result = train(built.model, built.data, built.family.loss, built.train_config,
                           metrics_fn=built.family.metrics,
                           on_eval=on_eval, checkpoint=save if ckpt is not None else None, resume=resume,
                           should_stop=group_stop(self.group, run, self.stop_event), plan=plan, on_score=scorer,
                           ranks=None if self.group is None else Ranks(self.group, str(run.attrs[Attr.SHARD])))
            samples, seconds, path = result.samples, result.train_s, result.path_samples(built.epoch_samples)
            scorer.settle(result, resume)
            mark_diverged(run, history=result.history)  # a loss that rose is the rate's failure
        except StopTraining as stop:
            run.state, run.value = TrialState.PRUNED, run.best
            run.attrs[Attr.PRUNED_AT_EPOCH] = stop.args[0]
            samples, seconds = int(getattr(stop, "samples", 0)), float(getattr(stop, "seconds", 0.0))
            path = int(stop.args[0]) * built.epoch_samples
        except TrialStopped as stop:  # given back: what this claim trained is spent all the same
            _record_spent(run, built, int(getattr(stop, "samples", 0)))
            raise
        run.attrs.update(self._throughput(built, samples, seconds, path, run.elapsed_s() - run.prior_s))
        scorer.record(samples)

    def _classify_failure(self, run: _TrialRun, exc: Exception) -> None:
        """The failure's reason in run.attrs; a sticky CUDA fault stops this worker (workers/_claim.py)."""
        unhealthy = classify_failure(run, exc, self.attrs)
        mark_diverged(run, exc)  # a non-finite loss: the reason names the rate, not the architecture
        if unhealthy is not None:
            self.unhealthy = unhealthy

    def _release(self) -> None:
        """Drop the trial's model, optimizer state and activations before the next trial."""
        if self.device.type != "cuda":
            return
        try:
            _device.release_memory(self.device)
        except RuntimeError as exc:  # a poisoned context fails here too; the worker is stopping
            log.warning("could not release GPU memory: %s", exc)

    def _throughput(self, built: BuiltTrial, samples: int, seconds: float, path: int,
                    wall_s: float) -> dict[str, Any]:
        """This claim's speed and the trial's training compute (workers/_claim.py's throughput),
        with step_mfu beside trial_mfu (``_mfus``)."""
        out = throughput(built, samples, seconds, path, self.device, self._gpu_share())
        return {**out, **_mfus(out, built, samples, wall_s, self.device, self._gpu_share())}


def _follow(worker: Worker, summary: WorkerSummary) -> None:
    """A rank other than 0: train each trial rank 0 broadcasts, write nothing, until it is done."""
    assert worker.group is not None
    readers = [Following(q) for q in worker.queues]
    try:
        while worker.unhealthy is None:
            msg = worker.group.broadcast()
            if msg[0] == "done":
                return
            if msg[0] == "trial":
                worker._run_trial(readers[int(msg[1])], msg[2], summary)
    except Exception as exc:
        if not is_group_failure(exc):
            raise
        _broken(worker, exc)


def _broken(worker: Worker, exc: BaseException) -> None:
    """The group cannot go on: this process stops, non-zero, so its launcher restarts the group."""
    assert worker.group is not None
    worker.broken = True
    worker.unhealthy = (f"rank {worker.group.rank} of {worker.group.world}: the trial's group broke "
                        f"({type(exc).__name__}: {str(exc)[:300]})")
    log.error("%s; nothing more is written from this group, its trial is retried once", worker.unhealthy)


def _conclude(worker: Worker, run: _TrialRun, summary: WorkerSummary) -> None:
    """What the claim's outcome writes: nothing (lost), the trial given back, held at its rung, or finished."""
    queue, claim = run.queue, run.claim
    if run.outcome == "lost":
        summary.lost += 1  # never write to it again; its files now belong to the retry
        return
    if run.outcome in ("requeue", "unhealthy", "disk_full"):
        why = {"unhealthy": worker.unhealthy, "disk_full": worker.disk_full}.get(run.outcome) or (
            signal.Signals(worker.signal_received).name if worker.signal_received else "worker stopped")
        spent = {k: run.attrs[k] for k in (Attr.FLOPS_SPENT,) if k in run.attrs}
        if queue.requeue(claim, str(why)[:500], spent):  # same attempt; its compute is counted
            summary.requeued += 1
            log.warning("trial %s given back to the queue (%s)", claim.number,
                        "no space for its checkpoint" if run.outcome == "disk_full" else why)
        else:
            summary.lost += 1
        return
    attrs = run.attrs
    attrs[Attr.DURATION_S] = round(run.elapsed_s(), 3)
    if Attr.FLOPS_SPENT in attrs:  # still this claim's alone: the queue adds the earlier claims'
        attrs[Attr.CLAIM_WORK] = [int(attrs[Attr.FLOPS_SPENT]), round(run.elapsed_s() - run.prior_s, 3)]
    attrs.update(_device.peak_memory_attrs(worker.device))
    if run.outcome == "park":
        if not queue.park(claim, float(run.value), attrs):  # type: ignore[arg-type]
            summary.lost += 1
            return
        summary.parked += 1
        queue.maintain()  # this may have completed the rung: decide it now (else the next upkeep does)
        return
    if Attr.FAIL_REASON in attrs:
        log.warning("trial %s failed: %s", claim.number, attrs[Attr.FAIL_REASON])
    if not queue.finish(claim, run.state, run.value, attrs):
        summary.lost += 1
        return
    worker.checkpoints.remove(queue, claim)  # committed: nothing left to resume
    summary.trials.append(claim.number)
    if run.state == TrialState.COMPLETE:
        summary.complete += 1
    elif run.state == TrialState.PRUNED:
        summary.pruned += 1
    else:
        summary.failed += 1


def _mfus(out: dict[str, Any], built: BuiltTrial, samples: int, wall_s: float, device: torch.device,
          share: float) -> dict[str, Any]:
    """``step_mfu`` over the timed training steps only (what ``mfu`` has always been) and
    ``trial_mfu`` over this claim's wall clock (building, data, validation, checkpoints and
    database calls included), both from the exact FLOPs; {} where no MFU is measured."""
    if Attr.MFU not in out:
        return {}
    mfus = {Attr.STEP_MFU: out[Attr.MFU]}
    whole = _device.mfu(int(built.flops_per_sample or 0) * int(samples), wall_s, device, share=share)
    if whole is not None:
        mfus[Attr.TRIAL_MFU] = float(f"{whole:.3g}")
    return mfus

