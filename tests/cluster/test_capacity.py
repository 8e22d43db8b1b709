"""A run no worker could train is refused when the plan is made (one sentence,
exit 2, nothing written); a study whose trials all failed exits non-zero and says why first."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from archhpo.cluster._capacity import WorkerMemory, check_capacity, cluster_worker, smallest_need
from archhpo.cluster._options import RunOptions
from archhpo.errors import BudgetError
from archhpo.search import TrialQueue, launch, prepare_settings
from tests.conftest import TINY_DATA, run_cli

GiB = 2**30


@pytest.fixture
def twenty_gib_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's machine: no GPU, 20 GiB of memory free."""
    from archhpo.cluster import _placement
    from archhpo.workers import _memory

    monkeypatch.setattr(_placement, "gpu_memories", lambda: [])
    monkeypatch.setattr(_memory, "available_bytes", lambda device: 20 * GiB)


def test_run_refuses_a_budget_no_worker_can_hold(
        twenty_gib_free: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from archhpo.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["run", "--experiment", "big", "--family", "lm", "--budget", "3B", "--quick"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("archhpo: error: No worker can train any architecture "
                                                   "planned for 3B: the smallest needs at least about "), err
    assert "GiB (2,417,332,224 parameters, batch 32)" in lines[0]  # the smallest need, named
    assert "the largest worker, this machine's CPU (20.0 GiB of memory free)" in lines[0]  # the largest worker
    assert "--budget" in lines[0]
    assert not list(tmp_path.iterdir()), "refused means nothing written: no database, no results"


def test_run_that_fits_is_not_refused(twenty_gib_free: None) -> None:
    settings = [prepare_settings("small", "200K", family="patchtst", data=TINY_DATA, quick=True, n_trials=4)]
    need, _ = smallest_need(settings, "cpu")
    assert 0 < need < GiB
    check_capacity(settings, WorkerMemory("cpu", 20 * GiB, "a CPU"))  # fits: no error


def test_a_gpu_worker_counts_its_cuda_context() -> None:
    settings = [prepare_settings("small", "200K", family="patchtst", data=TINY_DATA, quick=True, n_trials=4)]
    need, _ = smallest_need(settings, "cuda")
    with pytest.raises(BudgetError, match=r"the largest worker, a GPU,"):
        check_capacity(settings, WorkerMemory("cuda", int(need / 0.85), "a GPU"))  # no room for the context
    check_capacity(settings, WorkerMemory("cuda", int((need + GiB) / 0.85) + 1, "a GPU"))
    check_capacity(settings, None)  # memory unknown: never refused


def test_the_cluster_worker_is_its_largest_node(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    nodes = [{"Alive": True, "Resources": {"CPU": 4, "memory": 10 * GiB, "object_store_memory": 2 * GiB}},
             {"Alive": True, "Resources": {"CPU": 8, "memory": 30 * GiB, "object_store_memory": 6 * GiB}},
             {"Alive": False, "Resources": {"CPU": 8, "memory": 300 * GiB}},
             {"Alive": True, "Resources": {"memory": 90 * GiB}}]  # a head with no CPU runs no trial
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    worker = cluster_worker(RunOptions(ray_address="127.0.0.1:6380"))
    assert worker is not None and worker.device_type == "cpu" and worker.bytes == 36 * GiB
    assert "largest CPU node" in worker.what


def _fail_every_trial(url: str) -> None:
    """Workers that fail every trial on the memory estimate, as in the issue."""
    settings = prepare_settings("allfail", "200K", family="patchtst", data=TINY_DATA, quick=True, n_trials=4)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    for _ in range(50):
        claim = q.claim({"host": "test", "device": "cpu"})
        if claim is None:
            if q.maintain().done:
                return
            continue
        reason = (f"Trial {claim.number} ({claim.arch['param_count']:,} params) needs about 49.8 GiB to train but "
                  "cpu has 19.8 GiB free; run it on a larger device or lower the batch size")
        q.finish(claim, TrialState.FAIL, None, {"fail_reason": reason})
    raise AssertionError("the plan did not finish")


def test_a_run_whose_trials_all_failed_exits_non_zero_and_says_why(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    _fail_every_trial(url)
    res = run_cli("run", "--experiment", "allfail", "--budget", "200K", "--trials", "4", "--quick", "--data",
                  TINY_DATA, "--storage", url, "--out", str(tmp_path / "results"), cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    why = [line for line in res.stderr.splitlines() if line.startswith("archhpo: every trial")]
    assert len(why) == 1, res.stderr
    assert why[0].startswith("archhpo: every trial of allfail_200K failed (all 4), so the report has no result; "
                             "allfail_200K trial 0: Trial 0 (")
    assert "needs about 49.8 GiB to train" in why[0] and "(as did 3 other trial(s))" in why[0]
    lines = res.stderr.splitlines()
    assert lines.index(why[0]) < min(i for i, ln in enumerate(lines) if ln.startswith(("scaling", "report:")))
    # `archhpo report` leads with the same sentence (and still writes the report)
    rep = run_cli("report", "--experiment", "allfail", "--storage", url, "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert rep.stderr.splitlines()[0] == why[0]
    # and so does the page: the reason is the first thing under "The answer"
    page = next((tmp_path / "r").glob("*.html")).read_text()
    reason = why[0].removeprefix("archhpo: ").replace("'", "&#x27;")
    assert page.index("<p class='failed'><b>No result.</b> ") < page.index("<ul>", page.index("The answer"))
    assert reason.split(";")[0] in page


def test_why_all_failed_is_silent_when_a_trial_finished(tmp_path: Path) -> None:
    from archhpo.report._failures import why_all_failed

    url = f"sqlite:///{tmp_path / 'study.db'}"
    settings = prepare_settings("some", "200K", family="patchtst", data=TINY_DATA, quick=True, n_trials=4)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    assert why_all_failed(url, [settings.study_name]) is None  # nothing failed yet
    first, second = q.claim({"host": "t"}), q.claim({"host": "t"})
    assert first is not None and second is not None
    q.finish(first, TrialState.FAIL, None, {"fail_reason": "NonFiniteLoss: loss is nan at epoch 1"})
    assert "loss is nan" in (why_all_failed(url, experiment="some") or "")
    q.report(second, 1, 0.5)
    q.finish(second, TrialState.COMPLETE, 0.5, {})
    assert why_all_failed(url, [settings.study_name]) is None


def test_the_local_worker_is_the_largest_gpu_else_the_free_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from archhpo.cluster._capacity import local_worker

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '81559\\n40960\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpu = local_worker(RunOptions())
    assert gpu is not None and gpu.device_type == "cuda" and gpu.bytes == 81559 * 2**20
    cpu = local_worker(RunOptions(device="cpu"))  # --device cpu: the host's free memory, GPUs or not
    assert cpu is not None and cpu.device_type == "cpu" and "memory free" in cpu.what
    assert local_worker(RunOptions(gpus_per_trial=0.0)).device_type == "cpu"  # type: ignore[union-attr]
