"""Packing is safe, tested on a CPU with an injected out-of-memory error and
fake worker attributes: an OOM of a trial that shared its GPU (gpu_share < 1) is retried once on
a whole GPU (user attr whole_gpu), which workers sharing a GPU never claim; an OOM of a trial
alone on its GPU stays final with its reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from optuna.trial import TrialState

import archhpo.models.patchtst_spec
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._optuna_private import trial_id_of
from archhpo.search._space import PARAM_NAMES
from archhpo.workers import Worker
from tests.conftest import TINY_DATA


class _OutOfMemory(torch.nn.Module):
    def __init__(self, cfg) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


@pytest.fixture
def oom(monkeypatch: pytest.MonkeyPatch) -> None:
    fam = archhpo.models.patchtst_spec.FAMILY
    monkeypatch.setattr(archhpo.models.patchtst_spec, "FAMILY", dataclasses.replace(fam, build=_OutOfMemory))


def _one_trial_queue(url: str) -> TrialQueue:
    s = prepare_settings("oom", "200K", n_trials=4, data=TINY_DATA, quick=True, pruner="none")
    launch(url, dataclasses.replace(s, plan=s.plan[:1]))
    return TrialQueue(url, s.study_name)


def test_a_shared_gpu_oom_is_retried_once_on_a_whole_gpu(oom: None, storage_url: str) -> None:
    q = _one_trial_queue(storage_url)
    shared = Worker([q], device="cpu", threads=1, extra_attrs={"gpu_share": 0.25}).run()
    assert shared.failed == 1, "the shared worker failed it, then left the whole-GPU retry alone"
    first, retry = sorted(q.storage.get_all_trials(q.study_id), key=lambda t: t.number)
    assert first.state == TrialState.FAIL and first.user_attrs["oom_shared"] is True
    assert first.user_attrs["fail_reason"].startswith("out of memory")
    assert retry.state == TrialState.WAITING and retry.user_attrs["whole_gpu"] is True
    assert retry.user_attrs["attempt"] == 2 and retry.user_attrs["retry_of"] == first.number
    assert retry.system_attrs["fixed_params"] == {k: first.params[k] for k in PARAM_NAMES}, "the same parameters"
    st = q.maintain()
    assert not st.done and st.whole_gpu_waiting == 1
    assert q.claim({"gpu_share": 0.5}) is None, "a worker sharing its GPU never claims a whole-GPU trial"
    whole = Worker([q], device="cpu", threads=1, extra_attrs={"gpu_share": 1.0}).run()
    assert whole.failed == 1
    trials = q.storage.get_all_trials(q.study_id)
    assert len(trials) == 2, "retried once, not again"
    last = max(trials, key=lambda t: t.number)
    assert last.state == TrialState.FAIL and "oom_shared" not in last.user_attrs
    st = q.maintain()
    assert st.done and st.failed == 1


def test_an_oom_alone_on_a_gpu_stays_final(sqlite_url: str, oom: None, tmp_path: Path) -> None:
    q = _one_trial_queue(sqlite_url)
    for attrs in ({"gpu_share": 1.0}, {}):  # a whole GPU, or a plain worker (no Ray share)
        Worker([q], device="cpu", threads=1, extra_attrs=attrs).run()
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert trial.state == TrialState.FAIL and "oom_shared" not in trial.user_attrs
    assert q.maintain().done


def test_whole_gpu_trials_are_claimed_by_any_worker_but_a_sharing_one(sqlite_url: str, tmp_path: Path) -> None:
    q = _one_trial_queue(sqlite_url)
    (t,) = q.storage.get_all_trials(q.study_id)
    q.storage.set_trial_user_attr(trial_id_of(t), "whole_gpu", True)
    assert q.claim({"gpu_share": 0.5}) is None
    c = q.claim({"gpu_share": 0.0})  # a CPU task (Ray num_gpus 0) is not sharing a GPU
    assert c is not None and c.whole_gpu


@pytest.mark.ray
def test_run_starts_a_worker_with_a_whole_gpu_for_the_retry(sqlite_url: str, tmp_path: Path) -> None:
    """`run` with workers sharing a (logical) GPU: a waiting whole-GPU retry gets a worker task with
    num_gpus=1 of its own; the sharing worker leaves it alone and steps aside once only it is left."""
    import io

    from archhpo.cluster._run import RunOptions, run_workers

    url = sqlite_url
    s = prepare_settings("wg", "200K", n_trials=4, data=TINY_DATA, quick=True, pruner="none")
    launch(url, dataclasses.replace(s, plan=s.plan[:2]))
    q = TrialQueue(url, s.study_name)
    first = min(q.storage.get_all_trials(q.study_id), key=lambda t: t.number)
    q.storage.set_trial_user_attr(trial_id_of(first), "whole_gpu", True)  # as upkeep marks a shared OOM's retry
    out = io.StringIO()
    st = run_workers(url, [s.study_name], RunOptions(workers=1, gpus_per_trial=0.5,
                                                     refresh_s=0.5, local_gpus=1), out=out)[s.study_name]
    assert st.done and st.complete == 2, out.getvalue()
    assert "on a GPU of its own" in out.getvalue()
    shares = {t.number: t.user_attrs["gpu_share"] for t in q.storage.get_all_trials(q.study_id)}
    assert shares[first.number] == 1.0 and set(shares.values()) == {0.5, 1.0}, shares
