"""Exactly-once and crash recovery: concurrent workers never duplicate or lose a
planned trial; a SIGKILLed worker's trial is reaped within the grace period, retried once with
the same parameters and resumed from its checkpoint; a killed driver resumes without duplicates."""

from __future__ import annotations

import csv
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from archhpo.environment import Environment
from tests.conftest import TINY_DATA, run_cli, wait_for

FAST_REAP = {"ARCHHPO_HEARTBEAT_S": "1", "ARCHHPO_GRACE_S": "4", "ARCHHPO_REAP_S": "1"}


def _popen(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "archhpo", *args], cwd=cwd, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def _assert_each_slot_finished_once(trials: list[optuna.trial.FrozenTrial], n_slots: int) -> None:
    final = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
             or (t.state == TrialState.FAIL and "fail_reason" in t.user_attrs)]
    assert sorted(t.user_attrs["plan_slot"] for t in final) == list(range(n_slots))
    assert len({t.number for t in trials}) == len(trials)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


@pytest.mark.postgres
def test_eight_worker_processes_run_a_24_trial_plan_exactly_once(pg_url: str, tmp_path: Path) -> None:
    common = ["--experiment", "x8", "--budget", "200K", "--storage", pg_url]
    res = run_cli("launch", *common, "--trials", "24", "--quick", "--data", "synthetic:steps=400", "--pruner", "none")
    assert res.returncode == 0, res.stderr
    procs = [_popen("worker", *common, "--threads", "1", "--checkpoint-dir", str(tmp_path / "ck"), cwd=tmp_path)
             for _ in range(8)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    trials = _trials(pg_url, "x8_200K")
    assert len(trials) == 24, "exactly the planned trials, none retried or duplicated"
    _assert_each_slot_finished_once(trials, 24)
    assert len({t.user_attrs["pid"] for t in trials}) > 1, "the work was shared"


@pytest.mark.postgres
@pytest.mark.ray
def test_eight_ray_workers_run_a_24_trial_plan_exactly_once(pg_url: str, tmp_path: Path) -> None:
    res = run_cli("run", "--experiment", "r8", "--budget", "200K", "--storage", pg_url, "--trials", "24", "--quick",
                  "--data", "synthetic:steps=400", "--pruner", "none", "--workers", "8", "--out", str(tmp_path / "o"),
                  cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    trials = _trials(pg_url, "r8_200K")
    assert len(trials) == 24
    _assert_each_slot_finished_once(trials, 24)
    with open(tmp_path / "o" / "experiment_results.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 24


def _stress_worker(url: str, name: str, barrier, out) -> None:  # type: ignore[no-untyped-def]
    from archhpo.search import TrialQueue

    q = TrialQueue(url, name)
    barrier.wait()
    done = 0
    while True:  # a worker's loop: claim, else upkeep (which ends the loop once the plan is done)
        c = q.claim({"host": "stress"})
        if c is None:
            if q.maintain(blocking=False).done:
                break
            time.sleep(0.05)
            continue
        q.report(c, 1, 0.5)
        q.finish(c, TrialState.COMPLETE, 1.0 / (1 + c.number), {"duration_s": 0.0})
        done += 1
    out.put(done)


@pytest.mark.postgres
def test_sixteen_workers_with_instant_trials_claim_each_exactly_once(pg_url: str) -> None:
    from archhpo.search import launch, prepare_settings

    s = prepare_settings("stress", "20M", n_trials=60, data=TINY_DATA, quick=True, pruner="none")
    launch(pg_url, s)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(16)
    out = ctx.Queue()
    procs = [ctx.Process(target=_stress_worker, args=(pg_url, s.study_name, barrier, out)) for _ in range(16)]
    for p in procs:
        p.start()
    counts = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    trials = _trials(pg_url, s.study_name)
    assert sum(counts) == len(trials) == len(s.plan), "phase 1 and phase 2 ran once each"
    _assert_each_slot_finished_once(trials, len(s.plan))
    assert any(t.user_attrs["phase"] == 2 for t in trials)


def test_sigkilled_worker_trial_is_retried_once_and_resumes_from_its_checkpoint(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    common = ["--experiment", "kill", "--budget", "200K", "--storage", url]
    res = run_cli("launch", *common, "--trials", "3", "--quick", "--data", "synthetic:steps=4000", "--pruner", "none")
    assert res.returncode == 0, res.stderr
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--threads", "1"]
    victim = _popen("worker", *common, *ck, cwd=tmp_path, env=FAST_REAP)

    def has_checkpoint() -> bool:  # the victim finished at least one epoch of a trial
        return any((tmp_path / "ck").rglob("*.pt"))

    assert wait_for(has_checkpoint, timeout=180)
    running = [t for t in _trials(url, "kill_200K") if t.state == TrialState.RUNNING]
    assert len(running) == 1
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=30)
    killed_at = time.monotonic()
    rescuer = _popen("worker", *common, *ck, cwd=tmp_path, env=FAST_REAP)

    def retried() -> bool:  # reaped (FAIL) and its retry enqueued, while the rescuer is busy training
        return any(t.user_attrs.get("retry_of") == running[0].number for t in _trials(url, "kill_200K"))

    assert wait_for(retried, timeout=120, every=0.1), "the lost trial was reaped and retried"
    reaction_s = time.monotonic() - killed_at
    _, err = rescuer.communicate(timeout=300)
    assert rescuer.returncode == 0, err[-2000:]
    trials = _trials(url, "kill_200K")
    lost = next(t for t in trials if t.number == running[0].number)
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == lost.number)
    assert lost.state == TrialState.FAIL and "fail_reason" not in lost.user_attrs
    assert retry.state == TrialState.COMPLETE and retry.params == lost.params
    assert retry.user_attrs["attempt"] == 2 and retry.user_attrs["resumed_from_epoch"] >= 1
    assert 1 in retry.intermediate_values, "the retry carries the first attempt's validation curve"
    assert len(trials) == 4
    _assert_each_slot_finished_once(trials, 3)
    # The 4 s grace, 1 s reap interval and the rescuer's start (its imports: 27 s once on a 2-core
    # machine loaded by the whole suite and 3 training processes), well below the default 90 s grace.
    assert reaction_s < 4 + 1 + 45 < Environment().grace_s, f"reaped and retried {reaction_s:.1f}s after the kill"
    res = run_cli("export", "--experiment", "kill", "--storage", url, "--out", str(tmp_path / "o"))
    with open(tmp_path / "o" / "experiment_results.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 3, "one CSV row per finished planned trial"
    assert not list((tmp_path / "ck").rglob("*.pt")), "checkpoints are removed once trials finish"
