"""The worker loop of SPEC §6: take the next planned trial, build, train, report, finish, repeat.

The loop knows nothing about Optuna: it talks to queue objects (search.TrialQueue) through the
small protocol below, so data flows one way: search → workers → models.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from optuna.trial import TrialState

from archhpo.errors import ArchhpoError, MemoryRefused, NonFiniteLoss
from archhpo.models import TensorDataset, get_family
from archhpo.workers._memory import check_fits, estimate_training_bytes
from archhpo.workers._train import StopTraining, TrainConfig, resolve_device, train, trial_seed

log = logging.getLogger("archhpo.worker")


class QueueLike(Protocol):
    name: str
    settings: Any

    def next_trial(self, worker_attrs: dict[str, Any], should_stop: Callable[[], bool]) -> Any: ...
    def claim(self, worker_attrs: dict[str, Any]) -> Any: ...
    def maintain(self, blocking: bool = True) -> Any: ...
    def heartbeat(self, claim: Any) -> None: ...
    def report(self, claim: Any, step: int, value: float) -> bool: ...
    def finish(self, claim: Any, state: TrialState, value: float | None, attrs: dict[str, Any]) -> bool: ...
    def requeue(self, claim: Any, note: str = ...) -> bool: ...


@dataclass
class WorkerSummary:
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    lost: int = 0  # finished here but reaped meanwhile (the retry elsewhere counts)
    trials: list[int] = field(default_factory=list)


class _Heartbeat(threading.Thread):
    """Beats for the running trial from a side thread (Optuna only beats inside optimize()), and
    every `reap_s` runs the plan upkeep, so a dead worker's trial is reaped while everyone else
    is busy training rather than when the queue runs dry."""

    def __init__(self, queue: QueueLike, claim: Any, interval: float, reap_s: float) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{claim.number}")
        self.queue, self.claim, self.interval, self.reap_s = queue, claim, interval, reap_s
        self.stopped = threading.Event()

    def run(self) -> None:
        last_reap = time.monotonic()
        while not self.stopped.wait(self.interval):
            try:
                self.queue.heartbeat(self.claim)
                if time.monotonic() - last_reap >= self.reap_s:
                    last_reap = time.monotonic()
                    self.queue.maintain(blocking=False)
            except Exception as exc:  # a database blip must not kill the trial; the next beat retries
                log.warning("heartbeat for trial %s failed: %s", self.claim.number, exc)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _atomic_save(obj: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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
    ) -> None:
        self.queues = list(queues)
        self.device = resolve_device(device)
        if threads:
            torch.set_num_threads(threads)
        self.checkpoint_dir = Path(checkpoint_dir).resolve() if checkpoint_dir else None
        self.checkpoint_every = max(1, checkpoint_every)
        self.stop_event = threading.Event()
        self.attrs = {
            "host": socket.gethostname(), "device": self._device_name(), "pid": os.getpid(),
            **(extra_attrs or {}),
        }
        self._data: dict[str, tuple[TensorDataset, float]] = {}
        # torch's import leaves ~250k objects that every full GC pass would walk again (~150 ms a
        # trial, measured): move them to the permanent generation.
        gc.freeze()

    def _device_name(self) -> str:
        if self.device.type == "cuda":
            return f"cuda:{torch.cuda.get_device_name(self.device)}"
        return "cpu"

    def _dataset(self, queue: QueueLike) -> tuple[TensorDataset, float]:
        """Load each study's data once per worker, onto the device, with its baseline loss."""
        s = queue.settings
        key = repr((s.family, s.data, s.options))
        if key not in self._data:
            # The file loaders compare the file's sha256 with the study's: a worker whose copy
            # differs refuses to train on it.
            fam = get_family(s.family)
            data = fam.load_data(s.data, s.options)
            self._data[key] = (data.to(self.device), fam.baseline_loss(data))
        return self._data[key]

    def _checkpoint_path(self, queue: QueueLike, claim: Any) -> Path | None:
        if self.checkpoint_dir is None:
            return None
        return self.checkpoint_dir / queue.name / f"slot{claim.slot:05d}.pt"

    def _load_checkpoint(self, path: Path | None, claim: Any) -> dict[str, Any] | None:
        """The state a killed or interrupted attempt of the same planned trial left behind."""
        if path is None or not path.exists():
            return None
        try:
            state = torch.load(path, map_location=self.device, weights_only=False)
        except Exception as exc:  # a torn or foreign file: start over rather than fail
            log.warning("ignoring unreadable checkpoint %s: %s", path, exc)
            return None
        return state if state.get("params") == claim.params else None

    def run(self) -> WorkerSummary:
        summary = WorkerSummary()
        pending = list(self.queues)
        while pending and not self.stop_event.is_set():
            claim, queue = self._next(pending)
            if claim is None:
                break
            self._run_trial(queue, claim, summary)
        return summary

    def _next(self, pending: list[QueueLike]) -> tuple[Any, Any]:
        """First claim from any study with waiting work; drop studies whose plan is done."""
        while pending and not self.stop_event.is_set():
            for q in list(pending):
                claim = q.claim(self.attrs)
                if claim is not None:
                    return claim, q
            for q in list(pending):
                if q.maintain(blocking=False).done:
                    pending.remove(q)
                else:
                    claim = q.claim(self.attrs)
                    if claim is not None:
                        return claim, q
            if pending:
                self.stop_event.wait(2.0)
        return None, None

    def _run_trial(self, queue: QueueLike, claim: Any, summary: WorkerSummary) -> None:
        s = queue.settings
        fam = get_family(s.family)
        beat = _Heartbeat(queue, claim, getattr(queue, "heartbeat_s", 15.0), getattr(queue, "reap_s", 30.0))
        beat.start()
        attrs: dict[str, Any] = {}
        state, value = TrialState.FAIL, None
        start = time.perf_counter()
        try:
            try:
                data, baseline = self._dataset(queue)
                attrs["baseline_val_loss"] = baseline
                p = claim.params
                cfg = fam.config_for(claim.arch, s.info)
                tokens = fam.tokens(cfg) if fam.tokens else 64
                need = estimate_training_bytes(
                    int(claim.arch["param_count"]), int(p["batch_size"]), tokens, int(claim.arch["d_model"]),
                    int(claim.arch["n_layers"]), int(claim.arch["n_heads"]), int(claim.arch["d_ff"]),
                )
                attrs["memory_estimate_gib"] = round(need / 2**30, 3)
                check_fits(need, self.device, f"Trial {claim.number} ({claim.arch['param_count']:,} params)")
                torch.manual_seed(trial_seed(int(s.options.get("seed", 0)), claim.slot))
                model = fam.build(cfg).to(self.device)
                tcfg = TrainConfig(
                    learning_rate=float(p["learning_rate"]), epochs=int(p["epochs"]),
                    batch_size=int(p["batch_size"]), weight_decay=float(p["weight_decay"]),
                    warmup_steps=int(p["warmup_steps"]), seed=claim.slot,
                )
                best = {"val": float("inf")}
                ckpt = self._checkpoint_path(queue, claim)
                resume = self._load_checkpoint(ckpt, claim)
                if resume is not None:
                    attrs["resumed_from_epoch"] = int(resume["epoch"])
                    for h in resume["history"]:  # the retry carries the dead attempt's curve
                        queue.report(claim, int(h["epoch"]), float(h["val_loss"]))
                        best["val"] = min(best["val"], float(h["val_loss"]))

                def on_eval(epoch: int, val: float) -> None:
                    best["val"] = min(best["val"], val)
                    if queue.report(claim, epoch, val):
                        raise StopTraining(epoch)

                def save(state: dict[str, Any]) -> None:
                    if ckpt is not None and (state["epoch"] % self.checkpoint_every == 0):
                        _atomic_save({"params": claim.params, "arch": claim.arch, **state}, ckpt)

                try:
                    result = train(model, data, fam.loss, tcfg, metrics_fn=fam.metrics, on_eval=on_eval,
                                   checkpoint=save if ckpt is not None else None, resume=resume)
                    state, value = TrialState.COMPLETE, result.best_val_loss
                    attrs.update(train_loss=result.train_loss, best_epoch=result.best_epoch,
                                 samples_per_s=round(result.samples_per_s, 1),
                                 **{f"val_{k}": v for k, v in result.metrics.items()})
                except StopTraining as stop:
                    state, value = TrialState.PRUNED, best["val"]
                    attrs["pruned_at_epoch"] = stop.args[0]
            except (NonFiniteLoss, MemoryRefused) as exc:
                attrs["fail_reason"] = str(exc)
            except (ArchhpoError, ValueError) as exc:
                attrs["fail_reason"] = f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                if _is_oom(exc):
                    attrs["fail_reason"] = f"out of memory on {self.attrs['device']}: {str(exc)[:300]}"
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
                else:
                    attrs["fail_reason"] = f"{type(exc).__name__}: {exc}"[:1000]
                    log.error("trial %s crashed:\n%s", claim.number, traceback.format_exc())
        except BaseException:
            # Ctrl-C / SIGTERM / Ray cancel: give the trial back so it is neither lost nor RUNNING.
            beat.stopped.set()
            queue.requeue(claim, "worker stopped")
            raise
        finally:
            beat.stopped.set()
        attrs["duration_s"] = round(time.perf_counter() - start, 3)
        ckpt = self._checkpoint_path(queue, claim)
        if ckpt is not None:
            ckpt.unlink(missing_ok=True)  # finished (or failed for good): nothing left to resume
        if "fail_reason" in attrs:
            log.warning("trial %s failed: %s", claim.number, attrs["fail_reason"])
        if queue.finish(claim, state, value, attrs):
            summary.trials.append(claim.number)
            if state == TrialState.COMPLETE:
                summary.complete += 1
            elif state == TrialState.PRUNED:
                summary.pruned += 1
            else:
                summary.failed += 1
        else:
            summary.lost += 1
