"""Database outages: a PostgreSQL restart mid-study or connections killed with
pg_terminate_backend cost a retry, never a trial: nothing live is reaped, nothing is run twice,
and the worker finishes the plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from archhpo.search._storage import resilient
from tests.conftest import TINY_DATA, ThrowawayPostgres, run_cli, wait_for

pytestmark = pytest.mark.postgres

OUTAGE_S = 30.0
# Small enough that the whole file stays within a few minutes on two shared CPU cores; long enough
# (three epochs of several seconds each) that the database goes down in the middle of a trial.
OUTAGE_DATA = "synthetic:steps=1500"


def _connect(url: str) -> Any:
    import psycopg2

    rest = url.split("@", 1)[1]
    hostport, dbname = rest.split("/", 1)
    host, port = hostport.split(":")
    return psycopg2.connect(host=host, port=int(port), user="postgres", dbname=dbname, connect_timeout=5)


def _query(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = _connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _start_worker(url: str, experiment: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    for knob in ("ARCHHPO_HEARTBEAT_S", "ARCHHPO_GRACE_S", "ARCHHPO_DB_PATIENCE_S", "ARCHHPO_REAP_S"):
        env.pop(knob, None)  # the defaults are what is promised: a 90 s grace outlasts a 30 s restart
    # stderr to a file, not a pipe: nobody reads while it runs, and retry warnings must never block it.
    with open(cwd / "worker.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "archhpo", "worker", "--experiment", experiment, "--budget", "200K",
             "--device", "cpu", "--storage", url],
            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
        )


def _log(cwd: Path) -> str:
    return (cwd / "worker.log").read_text()


def _finish(worker: subprocess.Popen[str], cwd: Path, timeout: float) -> tuple[int, str]:
    try:
        worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        pytest.fail(f"the worker did not finish within {timeout:.0f} s; its stderr:\n{_log(cwd)[-4000:]}")
    return worker.returncode, _log(cwd)


def _summary(stderr: str) -> dict[str, Any]:
    lines = [ln for ln in stderr.splitlines() if ln.startswith('{"worker"')]
    return json.loads(lines[-1]) if lines else {}


def _assert_plan_finished_once(url: str, study_name: str) -> list[optuna.trial.FrozenTrial]:
    """Every planned slot has exactly one trial and it is COMPLETE: no FAIL, no retry, no duplicate."""
    study = optuna.load_study(study_name=study_name, storage=url)
    plan = study.user_attrs["archhpo_plan"]
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    assert not [t for t in trials if t.state == TrialState.FAIL], (
        f"a trial failed: {[(t.number, t.user_attrs.get('fail_reason')) for t in trials if t.state == TrialState.FAIL]}"
    )
    assert len(trials) == len(plan), f"{len(trials)} trials for a {len(plan)}-trial plan: {dict(states)}"
    slots = Counter(int(t.user_attrs["plan_slot"]) for t in trials)
    assert set(slots) == {int(e["slot"]) for e in plan} and set(slots.values()) == {1}, slots
    assert all(t.state == TrialState.COMPLETE for t in trials), dict(states)
    assert not [t.number for t in trials if "retry_of" in t.user_attrs], "a trial was retried"
    return trials


def test_postgres_restart_mid_study_loses_no_trial(throwaway_pg: ThrowawayPostgres, tmp_path: Path) -> None:
    url = throwaway_pg.url
    res = run_cli("launch", "--experiment", "outage", "--budget", "200K", "--trials", "4", "--quick",
                  "--data", OUTAGE_DATA, "--pruner", "none", "--storage", url, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    worker = _start_worker(url, "outage", tmp_path)
    try:
        running_sql = (
            "SELECT t.trial_id FROM trials t WHERE t.state = 'RUNNING' AND EXISTS "
            "(SELECT 1 FROM trial_intermediate_values v WHERE v.trial_id = t.trial_id) ORDER BY t.trial_id"
        )
        hit: list[int] = []

        def mid_trial() -> bool:
            hit[:] = [r[0] for r in _query(url, running_sql)]
            return bool(hit) or worker.poll() is not None

        assert wait_for(mid_trial, timeout=120, every=0.2), "no trial reported an epoch within 120 s"
        assert worker.poll() is None and hit, f"the worker ended before the outage:\n{_log(tmp_path)}"
        epochs_before = _query(url, f"SELECT count(*) FROM trial_intermediate_values WHERE trial_id = {hit[0]}")[0][0]

        down = time.monotonic()
        throwaway_pg.stop("fast")
        assert not throwaway_pg.answers(), "PostgreSQL still answers after pg_ctl stop"
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
        assert worker.poll() is None, f"the worker gave up during the outage:\n{_log(tmp_path)}"
        throwaway_pg.start()
        outage = time.monotonic() - down
        rc, err = _finish(worker, tmp_path, timeout=240)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    after = time.monotonic() - down - outage
    assert rc == 0, err[-4000:]
    assert "retrying" in err, f"the worker never noticed the outage (test did not exercise it):\n{err[-4000:]}"
    trials = _assert_plan_finished_once(url, "outage_200K")
    victim = next(t for t in trials if t._trial_id == hit[0])
    assert len(victim.intermediate_values) > epochs_before, "the interrupted trial reported no epoch after the outage"
    durations = {t.number: t.user_attrs.get("duration_s") for t in trials}
    print(f"outage {outage:.1f} s (server down, then restarted); worker finished {after:.1f} s later; "
          f"trial {victim.number} spanned it ({victim.user_attrs.get('duration_s')} s, others {durations}); "
          f"retry warnings: {err.count('retrying')}; summary {_summary(err)}")


def test_terminated_connections_cost_no_result(pg_url: str, tmp_path: Path) -> None:
    res = run_cli("launch", "--experiment", "killconn", "--budget", "200K", "--trials", "5", "--quick",
                  "--data", TINY_DATA, "--pruner", "none", "--storage", pg_url, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    killer = _connect(pg_url)
    killer.autocommit = True
    worker = _start_worker(pg_url, "killconn", tmp_path)
    killed = rounds = 0
    try:
        deadline = time.monotonic() + 240
        while worker.poll() is None and time.monotonic() < deadline:
            with killer.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                killed += cur.fetchone()[0]
            rounds += 1
            time.sleep(0.5)
        rc, err = _finish(worker, tmp_path, timeout=max(1.0, deadline - time.monotonic()))
    finally:
        killer.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert rc == 0, err[-4000:]
    assert killed > 0, "no worker connection was ever terminated: the test exercised nothing"
    _assert_plan_finished_once(pg_url, "killconn_200K")
    print(f"terminated {killed} connections in {rounds} rounds; retry warnings: {err.count('retrying')}; "
          f"summary {_summary(err)}")


class _Flaky:
    def __init__(self, errors: list[BaseException], value: object = "ok") -> None:
        self.errors, self.value, self.calls = list(errors), value, 0

    def __call__(self) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.value


def _lost_connection() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))


def test_resilient_retries_transient_errors_and_gives_up_on_others(caplog: pytest.LogCaptureFixture) -> None:
    fn = _Flaky([_lost_connection(), _lost_connection()], value=42)
    assert resilient(fn, "test call", patience_s=30) == 42
    assert fn.calls == 3

    # Optuna's own storage calls wrap a lost connection in StorageInternalError: still transient.
    wrapped = optuna.exceptions.StorageInternalError("commit failed")
    wrapped.__cause__ = _lost_connection()
    fn = _Flaky([wrapped], value="again")
    with caplog.at_level("WARNING", logger="archhpo.storage"):
        assert resilient(fn, "optuna call", patience_s=30) == "again"
    assert fn.calls == 2
    assert "server closed the connection" in caplog.text, "the retry warning hides the lost connection"

    fn = _Flaky([ValueError("a bug, not an outage")])
    with pytest.raises(ValueError):
        resilient(fn, "test call", patience_s=30)
    assert fn.calls == 1

    fn = _Flaky([optuna.exceptions.StorageInternalError("bad data, no lost connection")])
    with pytest.raises(optuna.exceptions.StorageInternalError):
        resilient(fn, "test call", patience_s=30)
    assert fn.calls == 1

    fn = _Flaky([_lost_connection()])
    with pytest.raises(sqlalchemy.exc.OperationalError):
        resilient(fn, "test call", patience_s=0)
    assert fn.calls == 1
