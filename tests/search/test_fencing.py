"""Fenced attempts: a worker paused (SIGSTOP) past the grace period loses its
trial to a retry; when it resumes (SIGCONT) it notices within one heartbeat, stops training,
never writes to the old trial again and never touches the retry's checkpoint; the slot ends with
exactly one finished trial, and every checkpoint is gone once that finish is committed."""

from __future__ import annotations

import dataclasses
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
from archhpo.errors import TrialLost
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers._checkpoints import CheckpointRefused, read_checkpoint
from tests.conftest import wait_for

# The workers beat every second but never reap within the test (a 10-minute grace): on a loaded
# 2-core machine a 4 s grace also reaped the rescuer's retry when its beats were late (CI, stop 49),
# which is the reaper doing its job, not fencing failing.  The test is the one reaper (REAPER: the
# same PlanUpkeep.maintain every worker runs), with the short grace, while the stale worker is paused.
FAST_BEAT = {"ARCHHPO_HEARTBEAT_S": "1", "ARCHHPO_GRACE_S": "600", "ARCHHPO_REAP_S": "1"}
REAPER = Environment(heartbeat_s=1, grace_s=4, reap_s=1.0)


def _popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **FAST_BEAT}
    return subprocess.Popen([sys.executable, "-m", "archhpo", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def _holds_a_lock(url: str) -> bool:
    """Whether some connection to the study's database is inside a transaction or holds the plan
    lock: a process paused there makes everyone wait until it resumes (SQLite's one write lock, a
    PostgreSQL row lock the reaper must take, the plan lock every upkeep takes). That is the
    databases' and the plan lock's limit, not fencing's, so the worker is never paused there."""
    import fcntl
    import sqlite3

    import sqlalchemy as sa

    if url.startswith("sqlite"):
        path = url.split(":///", 1)[1]
        conn = sqlite3.connect(path, timeout=0.5)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.rollback()
        except sqlite3.OperationalError:
            return True
        finally:
            conn.close()
        with open(f"{path}.lock", "a+") as fh:  # the plan lock (search/_storage.py: plan_lock)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
        return False
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            busy = conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")).scalar()
            advisory = conn.execute(sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")).scalar()
        return bool(busy or advisory)
    finally:
        engine.dispose()


def _pause(proc: subprocess.Popen[str], url: str) -> None:
    """SIGSTOP, but never while the worker holds a lock others wait on (_holds_a_lock)."""
    for _ in range(100):
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)  # the signal is delivered
        if not _holds_a_lock(url):
            return
        proc.send_signal(signal.SIGCONT)  # paused holding one: let it finish and try again
        time.sleep(0.3)
    raise AssertionError("could not pause the worker outside its transactions and the plan lock")


def test_a_paused_worker_is_fenced_out_and_never_touches_the_retry(storage_url: str, tmp_path: Path) -> None:
    url = storage_url
    s = prepare_settings("fence", "200K", n_trials=3, data="synthetic:steps=4000", quick=True, pruner="none")
    entry = dataclasses.replace(s.plan[0], params={**(s.plan[0].params or {}), "epochs": 4, "batch_size": 32})
    launch(url, dataclasses.replace(s, plan=[entry]))  # one planned trial: the retry is the only work
    name = s.study_name
    ck = tmp_path / "ck"
    common = ["worker", "--experiment", "fence", "--budget", "200K", "--storage", url, "--threads", "1",
              "--checkpoint-dir", str(ck)]
    stale = _popen(*common, cwd=tmp_path)
    rescuer = None
    try:
        first = ck / name / "slot00000.attempt1.pt"
        assert wait_for(first.exists, timeout=240), "the first attempt checkpointed an epoch"
        _pause(stale, url)  # paused past the grace period: reaped and retried
        (old,) = _trials(url, name)
        rescuer = _popen(*common, cwd=tmp_path)  # waits: nothing is WAITING until the reap

        def retry_exists() -> bool:
            return any(t.user_attrs.get("retry_of") == old.number for t in _trials(url, name))

        reaper = TrialQueue(url, name, timing=REAPER)

        def reaped() -> bool:
            reaper.upkeep.maintain()  # reaps once the paused worker's beat is 4 s old, and retries
            return retry_exists()

        try:
            assert wait_for(reaped, timeout=60, every=0.5), "the paused worker's trial was reaped and retried"
        finally:
            reaper.storage.engine.dispose()

        def retry_running() -> bool:
            return any(t.user_attrs.get("retry_of") == old.number and t.state == TrialState.RUNNING
                       for t in _trials(url, name))

        assert wait_for(retry_running, timeout=120, every=0.2), "reaped and retried while the worker was paused"
        before = next(t for t in _trials(url, name) if t.number == old.number)
        assert before.state == TrialState.FAIL and "fail_reason" not in before.user_attrs
        stale.send_signal(signal.SIGCONT)
        # The retry's checkpoint is only ever written by the rescuer, never by the resumed worker.
        second = ck / name / "slot00000.attempt2.pt"
        writers: set[int] = set()
        end = time.monotonic() + 8
        while time.monotonic() < end and rescuer.poll() is None:
            if second.exists():
                try:
                    writers.add(int(read_checkpoint(second)["pid"]))
                except (OSError, CheckpointRefused, KeyError):
                    pass  # replaced while we read it
            time.sleep(0.2)
        _, rescuer_err = rescuer.communicate(timeout=300)
        _, stale_err = stale.communicate(timeout=60)
    finally:
        for p in (stale, rescuer):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.communicate()
    assert rescuer.returncode == 0, rescuer_err[-2000:]
    assert stale.returncode == 0, stale_err[-2000:]
    assert "was reaped while this worker held it" in stale_err, stale_err[-2000:]
    assert writers <= {rescuer.pid}, f"the retry's checkpoint was written by {writers} (rescuer {rescuer.pid})"
    trials = _trials(url, name)
    after = next(t for t in trials if t.number == old.number)
    assert after.state == TrialState.FAIL
    assert after.intermediate_values == before.intermediate_values, "no report after the fence"
    assert after.user_attrs == before.user_attrs, "no attribute written after the fence"
    assert after.values == before.values
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(trials) == 2 and len(finished) == 1, "exactly one finished trial for the slot"
    retry = finished[0]
    assert retry.user_attrs["retry_of"] == old.number and retry.user_attrs["attempt"] == 2
    assert retry.user_attrs["pid"] == rescuer.pid and retry.user_attrs["resumed_from_epoch"] >= 1
    assert not list(ck.rglob("*.pt")), "both attempts' checkpoints are deleted after the committed finish"


def test_heartbeat_report_finish_and_requeue_are_fenced(storage_url: str) -> None:
    """The queue side: once a trial is reaped (or claimed again by someone else), its old claim
    writes nothing: heartbeat says False, report raises TrialLost, finish, requeue and started say
    False; a new claim forgets the old one's starting point (flops_from) until it says its own."""
    import sqlalchemy as sa

    s = prepare_settings("fq", "200K", n_trials=4, data="synthetic:steps=700", quick=True, pruner="none")
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    c = q.claim({"host": "a"})
    assert q.heartbeat(c) is True and q.started(c, 1234) is True
    q.report(c, 1, 0.5)
    # Someone else's claim of the same trial (requeued by the driver, claimed again): ours is stale.
    assert q.requeue(dataclasses.replace(c, token=None), "run stopped")
    again = q.claim({"host": "b"})
    assert again.trial_id == c.trial_id and again.token != c.token
    assert q.storage.get_trial(c.trial_id).user_attrs["flops_from"] is None, "not the new claim's start"
    assert q.heartbeat(c) is False and q.started(c, 99) is False
    assert q.started(again, 0) is True
    with pytest.raises(TrialLost):
        q.report(c, 2, 0.1)
    assert not q.finish(c, TrialState.COMPLETE, 0.1, {"x": 1})
    assert not q.requeue(c)
    assert q.heartbeat(again) is True and not q.report(again, 2, 0.4)
    # Reaped: nobody's claim may write any more.
    engine = sa.create_engine(storage_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE trials SET state = 'FAIL' WHERE trial_id = :i"), {"i": again.trial_id})
    engine.dispose()
    assert q.heartbeat(again) is False
    with pytest.raises(TrialLost):
        q.report(again, 3, 0.2)
    assert not q.finish(again, TrialState.COMPLETE, 0.1, {}) and not q.started(again, 5)
    t = q.storage.get_trial(again.trial_id)
    assert t.intermediate_values == {1: 0.5, 2: 0.4} and "x" not in t.user_attrs and t.user_attrs["flops_from"] == 0
