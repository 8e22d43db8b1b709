"""The worker pool of one `archhpo run` and the driver's supervision loop."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, TextIO

from archhpo.cluster._capacity import check_capacity, cluster_worker
from archhpo.cluster._options import DEFAULT_WORKERS, RunOptions
from archhpo.cluster._placement import Placement, _cluster_gpus, place_workers
from archhpo.cluster._progress import RunProgress
from archhpo.cluster._tasks import gpu_task, start_by_share
from archhpo.errors import OutputError
from archhpo.schema import Attr
from archhpo.search._queue import PlanStatus, TrialQueue

MAX_REPLACEMENTS = 3  # workers stopped by a sticky CUDA fault that are replaced in one run


class _Pool:
    """The worker tasks of one `run`, and the driver's supervision loop."""

    def __init__(self, storage_url: str, names: list[str], opts: RunOptions, out: TextIO, storage: Any) -> None:
        self.url, self.names, self.opts, self.out, self.storage = storage_url, names, opts, out, storage
        self.queues = {n: TrialQueue(storage_url, n, storage=storage, timing=opts.timing) for n in names}
        self.run_id = uuid.uuid4().hex[:12]
        self.ckpt = str(opts.checkpoint_dir.resolve()) if opts.checkpoint_dir else None
        self.threads = 1
        self.refs: list[Any] = []
        self.whole_gpu_ref: Any = None  # a worker with a GPU of its own, for retries of shared-GPU OOMs
        self.replaced = 0
        self.placement = Placement(0.0, "cpu", "")

    def args(self, share: float) -> tuple[Any, ...]:
        return (self.url, self.names, self.placement.device, self.threads, self.run_id, self.ckpt, share,
                self.opts.checkpoint_every)

    def task(self, share: float) -> Any:
        return gpu_task(share, self.threads, bool(self.opts.ray_address))

    def start(self) -> None:
        if self.opts.ray_address:  # a local run was checked before its studies were written
            check_capacity([q.settings for q in self.queues.values()], cluster_worker(self.opts))
        if self.opts.workers is None:  # one worker per GPU of the cluster, else DEFAULT_WORKERS
            self.opts.workers = _cluster_gpus() or DEFAULT_WORKERS
        self.placement = place_workers(list(self.queues.values()), self.opts)
        if self.placement.note:
            self.out.write(self.placement.note + "\n")
        self.refs = start_by_share(self.task, self.placement.worker_shares(self.opts.workers), self.args)

    def supervise(self) -> dict[str, PlanStatus]:
        out = self.out
        with RunProgress(out, self.queues, self.opts.workers or 1) as shown:
            self.out = shown.file  # on a terminal, messages print above the progress bar
            try:
                self._supervise(shown)
                statuses = {n: q.maintain() for n, q in self.queues.items()}
                shown.close(statuses)
                return statuses
            finally:
                self.out = out

    def _supervise(self, shown: RunProgress) -> None:
        import ray

        exported, next_export = -1, 0.0
        while True:
            ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=self.opts.refresh_s)
            statuses = {n: q.maintain(blocking=False) for n, q in self.queues.items()}  # also reaps
            self._whole_gpu_retry(ready, statuses)
            self._replace_unhealthy(ready, statuses)
            _stop_on_full_disk(ready)
            ready = [r for r in ready if r in self.refs]  # a replaced worker's ref is gone
            final = sum(s.final for s in statuses.values())
            if final != exported and time.monotonic() >= next_export:
                # Exporting is O(trials): at most ~10% of the driver's time goes to it in a large study.
                began = time.monotonic()
                self.progress()
                exported = final
                next_export = time.monotonic() + 9 * (time.monotonic() - began)
            shown.update(statuses)
            if len(ready) == len(self.refs):
                for ref in ready:
                    ray.get(ref)  # surface a worker that died with an error
                break

    def _whole_gpu_retry(self, ready: list[Any], statuses: dict[str, PlanStatus]) -> None:
        """A worker with a whole GPU (a fresh process) for retries of shared-GPU OOMs and refusals."""
        if not (0 < self.placement.share < 1 and (self.whole_gpu_ref is None or self.whole_gpu_ref in ready)
                and any(st.whole_gpu_waiting for st in statuses.values())):
            return
        self.whole_gpu_ref = self.task(1.0).remote(*self.args(1.0))
        self.refs.append(self.whole_gpu_ref)
        self.out.write("A trial ran out of memory on a shared GPU: retrying it on a GPU of its own.\n")

    def _replace_unhealthy(self, ready: list[Any], statuses: dict[str, PlanStatus]) -> None:
        """A worker stopped by a sticky CUDA fault gave its trial back and its process exited; while
        work is left, a fresh process takes its place (at most MAX_REPLACEMENTS times a run)."""
        import ray

        for ref in ready:
            try:
                result = ray.get(ref)
            except Exception:  # noqa: BLE001 - a task that died: surfaced once every task is done
                continue
            if not (isinstance(result, dict) and result.get("unhealthy")):
                continue
            self.refs.remove(ref)
            self.out.write(f"A worker stopped after a CUDA fault ({result['unhealthy'][:200]}); its trial "
                           "went back to the queue.\n")
            if self.replaced < MAX_REPLACEMENTS and not all(st.done for st in statuses.values()):
                share = float(result.get(Attr.GPU_SHARE, self.placement.share))
                self.refs.append(self.task(share).remote(*self.args(share)))
                self.replaced += 1

    def progress(self) -> None:
        if self.opts.progress is not None:
            self.opts.progress()

    def stop(self) -> None:
        """Ctrl-C, or results that cannot be written (OutputError from `progress`): cancel the tasks
        (each gives its trial back) and requeue what is left."""
        import ray

        self.out.write(f"\nStopping workers: each saves its trial where it stands and gives it back (waiting up "
                       f"to {self.opts.stop_wait_s:g} s; Ctrl-C again stops waiting, never the requeue)...\n")
        for ref in self.refs:
            ray.cancel(ref)  # interrupts the task (as SIGINT): it gives its trial back and returns
        ready: list[Any] = []
        try:
            ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=self.opts.stop_wait_s)
        except KeyboardInterrupt:  # an impatient second Ctrl-C (or SIGTERM) must not skip the requeue
            self.out.write("Not waiting for the workers' saves; requeueing their trials now.\n")
        requeued = sum(q.requeue_running(lambda a: a.get("run_id") == self.run_id) for q in self.queues.values())
        with contextlib.suppress(OutputError):  # the write that stopped the run would fail again
            self.progress()
        self.out.write(f"Stopped: the workers saved and gave back {given_back(ready)} trial(s) and the driver "
                       f"requeued {requeued} more. Run the same command to resume.\n")


def given_back(refs: list[Any]) -> int:
    """The trials the finished worker tasks `refs` gave back to the queue when stopped (each
    task's WorkerSummary.requeued); a task that died gave none back (the driver requeues its trial)."""
    import ray

    total = 0
    for ref in refs:
        try:
            result = ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - cancelled or dead: its trial is the driver's to requeue
            continue
        total += int(result.get("requeued", 0)) if isinstance(result, dict) else 0
    return total


def _stop_on_full_disk(ready: list[Any]) -> None:
    """A worker stopped by a full checkpoint disk gave its trial back: the run stops as on Ctrl-C
    (the others would stop the same way, one trial at a time) with that worker's one sentence."""
    import ray

    for ref in ready:
        try:
            result = ray.get(ref)
        except Exception:  # noqa: BLE001 - a task that died: surfaced once every task is done
            continue
        if isinstance(result, dict) and result.get("disk_full"):
            raise OutputError(str(result["disk_full"]))
