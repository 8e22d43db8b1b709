"""The worker loop of SPEC §6: take the next planned trial, build, train, report, finish, repeat.

The loop knows nothing about Optuna: it talks to queue objects (search.TrialQueue) through the
small protocol below, so data flows one way: search → workers → models.  A trial becomes a
model, data and TrainConfig only through ``workers._build.build_trial`` (as in `archhpo train`).

Stopping and fencing:

- SIGTERM / SIGINT (``handle_signals``, the `archhpo worker` command) or ``stop_event``: the
  trainer stops between two steps and the trial goes back to the queue (WAITING, same attempt);
  a second signal stops at once (KeyboardInterrupt), still giving the trial back.
- A trial reaped while this worker was paused or cut off from the database is no longer ours:
  the heartbeat (fenced on the claim) notices within one beat, the trainer stops, and the worker
  never writes to that trial or to its retry's checkpoint again.
- Checkpoints belong to one attempt (``slotNNNNN.attemptK.pt``); a retry resumes from an earlier
  attempt's file (read only), and files are deleted only once the finish is committed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from optuna.trial import TrialState

from archhpo._io import atomic_write
from archhpo.errors import ArchhpoError, MemoryRefused, NonFiniteLoss, TrialLost, TrialStopped
from archhpo.models import get_family
from archhpo.workers import _device
from archhpo.workers._build import BuiltTrial, DataCache, TrialSpec, build_trial
from archhpo.workers._memory import check_fits, estimate_training_bytes
from archhpo.workers._train import StopTraining, TrainConfig, resolve_device, train

log = logging.getLogger("archhpo.worker")


class QueueLike(Protocol):
    name: str
    settings: Any

    def claim(self, worker_attrs: dict[str, Any]) -> Any: ...
    def maintain(self, blocking: bool = True) -> Any: ...
    def heartbeat(self, claim: Any) -> bool | None: ...  # False: the trial is no longer ours
    def report(self, claim: Any, step: int, value: float) -> bool: ...  # may raise TrialLost
    def finish(self, claim: Any, state: TrialState, value: float | None, attrs: dict[str, Any]) -> bool: ...
    def requeue(self, claim: Any, note: str = ...) -> bool: ...


@dataclass
class WorkerSummary:
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    lost: int = 0  # reaped while this worker held them (the retry elsewhere counts)
    requeued: int = 0  # given back to the queue because the worker was stopped
    signal: int | None = None  # the signal that stopped the worker (SIGTERM 15, SIGINT 2), if any
    trials: list[int] = field(default_factory=list)


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


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _atomic_save(obj: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda fh: torch.save(obj, fh))


def _device_fn(name: str) -> Callable[..., Any] | None:
    """A function of workers._device (the GPU helpers), or None where this version lacks it."""
    return getattr(_device, name, None)


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
    ) -> None:
        self.queues = list(queues)
        self.device = resolve_device(device)
        if threads:
            torch.set_num_threads(threads)
        if self.device.type == "cuda" and (speed := _device_fn("configure_cuda_speed")) is not None:
            speed()  # TF32 for the fp32 matmuls left outside bf16 autocast
        self.checkpoint_dir = Path(checkpoint_dir).resolve() if checkpoint_dir else None
        self.checkpoint_every = max(1, checkpoint_every)
        self.handle_signals = handle_signals
        self.stop_event = threading.Event()
        self.signal_received: int | None = None
        dev_attrs = _device_fn("device_attrs")
        self.attrs = {
            "host": socket.gethostname(), "device": self._device_name(), "pid": os.getpid(),
            "threads": torch.get_num_threads(),  # a CPU replay (`train --threads`) is exact with the same
            **(dev_attrs(self.device) if dev_attrs is not None else {}),
            **(extra_attrs or {}),
        }
        self._data = DataCache()
        # torch's import leaves ~250k objects that every full GC pass would walk again (~150 ms a
        # trial, measured): move them to the permanent generation.
        gc.freeze()

    def _device_name(self) -> str:
        if self.device.type == "cuda":
            return f"cuda:{torch.cuda.get_device_name(self.device)}"
        return "cpu"

    @property
    def shares_gpu(self) -> bool:
        try:
            return 0 < float(self.attrs.get("gpu_share", 1.0)) < 1
        except (TypeError, ValueError):
            return False

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
        if self.checkpoint_dir is None:
            return None
        attempt = claim.attempt if attempt is None else attempt
        return self.checkpoint_dir / queue.name / f"slot{claim.slot:05d}.attempt{attempt}.pt"

    def _load_resume(self, queue: QueueLike, claim: Any) -> dict[str, Any] | None:
        """Our own attempt's state (a requeued trial claimed again), else the newest earlier
        attempt's (a retry of a dead attempt), read only."""
        if self.checkpoint_dir is None:
            return None
        for attempt in range(int(claim.attempt), 0, -1):
            path = self._checkpoint_path(queue, claim, attempt)
            if path is None or not path.exists():
                continue
            try:
                state = torch.load(path, map_location=self.device, weights_only=False)
            except Exception as exc:  # a torn or foreign file: try an older one, else start over
                log.warning("ignoring unreadable checkpoint %s: %s", path, exc)
                continue
            if state.get("params") == claim.params:
                return state
        return None

    def _remove_checkpoints(self, queue: QueueLike, claim: Any) -> None:
        """After the finish is committed: this attempt's file and the earlier attempts' files."""
        for attempt in range(int(claim.attempt), 0, -1):
            path = self._checkpoint_path(queue, claim, attempt)
            if path is not None:
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------------------ the loop
    def run(self) -> WorkerSummary:
        summary = WorkerSummary()
        with self._signals():
            pending = list(self.queues)
            while pending and not self.stop_event.is_set():
                claim, queue = self._next(pending)
                if claim is None:
                    break
                self._run_trial(queue, claim, summary)
        summary.signal = self.signal_received
        return summary

    def _next(self, pending: list[QueueLike]) -> tuple[Any, Any]:
        """First claim from any study with waiting work; drop studies whose plan is done."""
        while pending and not self.stop_event.is_set():
            for q in list(pending):
                claim = q.claim(self.attrs)
                if claim is not None:
                    return claim, q
            for q in list(pending):
                status = q.maintain(blocking=False)
                if status.done or self._only_whole_gpu_work(status):
                    pending.remove(q)
                else:
                    claim = q.claim(self.attrs)
                    if claim is not None:
                        return claim, q
            if pending:
                self.stop_event.wait(2.0)
        return None, None

    def _only_whole_gpu_work(self, status: Any) -> bool:
        """A worker sharing its GPU leaves a study whose only work left is a retry that needs a
        whole GPU (a shared-GPU OOM), freeing its share for the worker that will run it."""
        whole = int(getattr(status, "whole_gpu_waiting", 0) or 0)
        if not (self.shares_gpu and whole):
            return False
        if status.waiting == whole and status.running == 0:
            log.info("only whole-GPU retries are left in %s; leaving them to a worker with a GPU of its own",
                     getattr(status, "name", "the study"))
            return True
        return False

    def _spec(self, queue: QueueLike, claim: Any) -> TrialSpec:
        s = queue.settings
        return TrialSpec(
            family=s.family, data=dict(s.data), options=dict(s.options), info=dict(s.info),
            arch=dict(claim.arch), params=dict(claim.params), slot=int(claim.slot),
            seed=getattr(claim, "seed", None),
        )

    def _run_trial(self, queue: QueueLike, claim: Any, summary: WorkerSummary) -> None:
        beat = _Heartbeat(queue, claim, getattr(queue, "heartbeat_s", 15.0), getattr(queue, "reap_s", 30.0))
        beat.start()
        attrs: dict[str, Any] = {}
        spec = self._spec(queue, claim)
        if spec.seed is not None:
            attrs["seed"] = spec.seed
        state, value = TrialState.FAIL, None
        outcome = "finish"
        start = time.perf_counter()
        built: BuiltTrial | None = None
        if (reset := _device_fn("reset_peak_memory")) is not None:
            reset(self.device)

        def should_stop() -> bool:
            return self.stop_event.is_set() or beat.lost.is_set()

        try:
            try:
                def check_memory(cfg: Any, tcfg: TrainConfig, data: Any) -> None:
                    a = claim.arch
                    tokens = built_family.tokens(cfg) if built_family.tokens else 64
                    need = estimate_training_bytes(
                        int(a["param_count"]), int(tcfg.batch_size), tokens, int(a["d_model"]),
                        int(a["n_layers"]), int(a["n_heads"]), int(a["d_ff"]),
                    )
                    attrs["memory_estimate_gib"] = round(need / 2**30, 3)
                    check_fits(need, self.device, f"Trial {claim.number} ({int(a['param_count']):,} params)")

                built_family = get_family(spec.family)
                built = build_trial(spec, self.device, data_cache=self._data, before_build=check_memory)
                attrs["baseline_val_loss"] = built.baseline_loss
                if built.flops_per_sample is not None:
                    attrs["flops_per_sample"] = built.flops_per_sample
                ckpt = self._checkpoint_path(queue, claim)
                resume = self._load_resume(queue, claim)
                best = {"val": float("inf")}
                if resume is not None:
                    attrs["resumed_from_epoch"] = int(resume["epoch"])
                    for h in resume["history"]:  # the retry carries the dead attempt's curve
                        queue.report(claim, int(h["epoch"]), float(h["val_loss"]))
                        best["val"] = min(best["val"], float(h["val_loss"]))

                def on_eval(epoch: int, val: float) -> None:
                    best["val"] = min(best["val"], val)
                    if queue.report(claim, epoch, val):  # raises TrialLost when fenced out
                        raise StopTraining(epoch)

                def save(st: dict[str, Any]) -> None:
                    if ckpt is None or should_stop() or st["epoch"] % self.checkpoint_every:
                        return  # a fenced-out attempt never writes again
                    _atomic_save({"params": claim.params, "arch": claim.arch, "attempt": int(claim.attempt),
                                  "trial_number": claim.number, "pid": os.getpid(), **st}, ckpt)

                fam = built.family
                try:
                    result = train(built.model, built.data, fam.loss, built.train_config, metrics_fn=fam.metrics,
                                   on_eval=on_eval, checkpoint=save if ckpt is not None else None,
                                   resume=resume, should_stop=should_stop)
                    state, value = TrialState.COMPLETE, result.best_val_loss
                    attrs.update(train_loss=result.train_loss, best_epoch=result.best_epoch,
                                 **{f"val_{k}": v for k, v in result.metrics.items()})
                    samples, seconds = result.samples, result.duration_s
                except StopTraining as stop:
                    state, value = TrialState.PRUNED, best["val"]
                    attrs["pruned_at_epoch"] = stop.args[0]
                    samples, seconds = int(getattr(stop, "samples", 0)), float(getattr(stop, "seconds", 0.0))
                attrs.update(self._throughput(built, samples, seconds))
            except TrialStopped:
                raise
            except (NonFiniteLoss, MemoryRefused) as exc:
                attrs["fail_reason"] = str(exc)
            except (ArchhpoError, ValueError) as exc:
                attrs["fail_reason"] = f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                if _is_oom(exc):
                    attrs["fail_reason"] = f"out of memory on {self.attrs['device']}: {str(exc)[:300]}"
                    if self.shares_gpu:  # retried once on a GPU of its own (plan upkeep)
                        attrs["oom_shared"] = True
                else:
                    attrs["fail_reason"] = f"{type(exc).__name__}: {exc}"[:1000]
                    log.error("trial %s crashed:\n%s", claim.number, traceback.format_exc())
        except TrialStopped as exc:
            outcome = "lost" if (isinstance(exc, TrialLost) or beat.lost.is_set()) else "requeue"
        except BaseException:
            # A second signal, a Ray cancel: give the trial back so it is neither lost nor RUNNING.
            beat.stopped.set()
            queue.requeue(claim, "worker stopped")
            raise
        finally:
            beat.stopped.set()
            built = None  # drop the model, optimizer state and activations before the next trial
            if self.device.type == "cuda":
                release = _device_fn("release_memory")
                if release is not None:
                    release(self.device)
                else:
                    gc.collect()
                    torch.cuda.empty_cache()
        if outcome == "lost":
            summary.lost += 1  # never write to it again; its files now belong to the retry
            return
        if outcome == "requeue":
            why = signal.Signals(self.signal_received).name if self.signal_received else "worker stopped"
            if queue.requeue(claim, why):
                summary.requeued += 1
                log.warning("trial %s given back to the queue (%s)", claim.number, why)
            else:
                summary.lost += 1
            return
        attrs["duration_s"] = round(time.perf_counter() - start, 3)
        if (peak := _device_fn("peak_memory_attrs")) is not None:
            attrs.update(peak(self.device))
        if "fail_reason" in attrs:
            log.warning("trial %s failed: %s", claim.number, attrs["fail_reason"])
        if queue.finish(claim, state, value, attrs):
            self._remove_checkpoints(queue, claim)  # committed: nothing left to resume
            summary.trials.append(claim.number)
            if state == TrialState.COMPLETE:
                summary.complete += 1
            elif state == TrialState.PRUNED:
                summary.pruned += 1
            else:
                summary.failed += 1
        else:
            summary.lost += 1

    def _throughput(self, built: BuiltTrial, samples: int, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if seconds > 0:
            out["samples_per_s"] = round(samples / seconds, 1)
        if built.flops_per_sample is not None:
            out["train_flops"] = int(built.flops_per_sample) * int(samples)
            mfu = _device_fn("mfu")
            if mfu is not None and self.device.type == "cuda":
                value = mfu(out["train_flops"], seconds, self.device)
                if value is not None:
                    out["mfu"] = round(float(value), 4)
        return out
