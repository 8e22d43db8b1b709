"""The rough edges: the reaper never waits on a stalled worker's row lock, the
dashboard answers only requests addressed to itself (no DNS rebinding), and the command line
masks a password in its own process title before anything heavy is imported."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg2
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from archhpo.search import TrialQueue, launch, open_storage, prepare_settings
from tests.conftest import TINY_DATA, wait_for

WORKER = {"host": "test", "device": "cpu"}


def _queue(url: str) -> TrialQueue:
    settings = prepare_settings("edge", "500K", family="patchtst", n_trials=6, data=TINY_DATA, quick=True, seed=0)
    launch(url, settings)
    return TrialQueue(url, settings.study_name)


def _lost(url: str, trial_id: int) -> None:
    """Its heartbeat long past the grace: as if its worker stopped beating."""
    with open_storage(url).engine.begin() as conn:
        conn.execute(sa.text("UPDATE trial_heartbeats SET heartbeat = :t WHERE trial_id = :i"),
                     {"t": "2000-01-01 00:00:00", "i": trial_id})


def _hold_row_lock(pg_url: str, trial_id: int) -> psycopg2.extensions.connection:
    """A second connection in an open transaction holding the trial's row, as a worker stalled
    inside its fence's `SELECT ... FOR UPDATE` would."""
    dsn = sa.engine.make_url(pg_url)
    conn = psycopg2.connect(host=dsn.host, port=dsn.port, user=dsn.username, dbname=dsn.database)
    with conn.cursor() as cur:
        cur.execute("SELECT trial_id FROM trials WHERE trial_id = %s FOR UPDATE", (trial_id,))
    return conn


@pytest.mark.postgres
def test_the_reaper_skips_a_row_a_stalled_transaction_holds_and_reaps_it_after(pg_url: str) -> None:
    q = _queue(pg_url)
    c = q.claim(WORKER)
    assert c is not None
    _lost(pg_url, c.trial_id)
    holder = _hold_row_lock(pg_url, c.trial_id)
    try:
        upkeep = threading.Thread(target=q.maintain, daemon=True)
        started = time.monotonic()
        upkeep.start()
        upkeep.join(30)
        assert not upkeep.is_alive(), "the upkeep waited on the row lock"
        assert time.monotonic() - started < 30
        assert q.storage.get_trial(c.trial_id).state == TrialState.RUNNING, "skipped this round"
    finally:
        holder.rollback()
        holder.close()
    q.maintain()  # the next upkeep
    assert q.storage.get_trial(c.trial_id).state == TrialState.FAIL
    retries = [t for t in q.storage.get_all_trials(q.study_id) if t.user_attrs.get("retry_of") == c.number]
    assert len(retries) == 1 and retries[0].state == TrialState.WAITING


# ------------------------------------------------------------------------------- dashboard
def _get(port: int, host_header: str, path: str = "/api/studies") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host_header)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def _post(port: int, host_header: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/api/studies", body=b'{"study_name": "planted", "directions": ["minimize"]}',
                     headers={"Host": host_header, "Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_dashboard_refuses_a_host_header_that_is_not_its_own(sqlite_url: str, tmp_path: Path) -> None:
    import socket

    _queue(sqlite_url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "archhpo", "dashboard", "--storage", sqlite_url,
                             "--port", str(port)], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: _answers(port), timeout=60), "the dashboard answered"
        for own in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
            assert _get(port, own) == 200, own
        assert _get(port, f"localhost:{port + 1}") == 200, "a forwarded port (compose, ssh -L) is its own"
        for foreign in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", ""):
            assert _get(port, foreign) == 403, foreign
            assert _get(port, foreign, "/dashboard/") == 403, foreign
        assert _post(port, f"evil.example:{port}") == 403, "a rebound page cannot write"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    studies = open_storage(sqlite_url, create=False).get_all_studies()
    assert [s.study_name for s in studies] == ["edge_500K"], "nothing was planted"


def _answers(port: int) -> bool:
    try:
        return _get(port, f"127.0.0.1:{port}") == 200
    except OSError:
        return False


# ------------------------------------------------------------------------- process title
def test_the_command_line_masks_its_password_before_importing_the_storage_layer() -> None:
    """The window in which `ps` shows a password typed into --storage ends before Optuna,
    SQLAlchemy or torch load (they took seconds under load): only the interpreter's start and
    the command line's own modules come before it."""
    code = ("import sys\nfrom archhpo.cli._main import _hide_passwords_from_ps\n_hide_passwords_from_ps()\n"
            "heavy = [m for m in ('optuna', 'sqlalchemy', 'torch', 'ray') if m in sys.modules]\n"
            "print(heavy, sys.argv[1:])\nprint(open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode())")
    secret = "postgresql://u:Canary-p@ss@db.example/hpo?sslmode=require&password=Canary-2"
    out = subprocess.run([sys.executable, "-c", code, "worker", "--storage", secret], capture_output=True,
                         text=True, check=True, timeout=120, env={**os.environ, "PGPASSWORD": ""}).stdout
    assert "Canary" not in out
    assert out.splitlines()[0] == ("[] ['worker', '--storage', "
                                   "'postgresql://u:***@db.example/hpo?sslmode=require&password=***']")


def test_the_dashboard_answers_to_loopback_its_host_and_for_a_wildcard_this_machines_names() -> None:
    import socket

    from archhpo.cli._dashboard import allowed_hosts

    assert allowed_hosts("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("10.1.2.3") == {"127.0.0.1", "localhost", "::1", "10.1.2.3"}
    assert allowed_hosts("[fd00::5]") == {"127.0.0.1", "localhost", "::1", "fd00::5"}
    wild = allowed_hosts("0.0.0.0")
    assert {"127.0.0.1", "localhost", "::1", socket.gethostname().lower()} <= wild
    assert not wild & {"0.0.0.0", "::", ""}, "a wildcard is no name a request can be addressed by"
