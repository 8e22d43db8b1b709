"""Safe defaults: the database password goes nowhere but PGPASSWORD, and a local Ray binds loopback.

The canary test gives `archhpo run` a PostgreSQL URL with a random password and then searches
every place a secret tends to leak: the command's output, the result files, every study and trial
attribute (in fact every row of the database), the process list while it runs (Ray task and
worker command lines) and all files of this run's Ray session (logs included).  The server's
trust authentication never checks the password, which does not matter: what is tested is where
the string travels.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import archhpo.cluster._run
from archhpo.search._storage import mask_url, take_password
from tests.conftest import TINY_DATA, wait_for


# ----------------------------------------------------------------------------- helpers
def _pg_admin(base: str, *sql: str) -> None:
    import psycopg2

    host, port = base.split("@", 1)[1].split(":")
    conn = psycopg2.connect(host=host, port=int(port), user="postgres", dbname="postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for stmt in sql:
                cur.execute(stmt)
    finally:
        conn.close()


def _descendants(root: int) -> set[int]:
    """root and every process below it (Ray's gcs_server, raylet, agents, workers)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        pid, ppid = (int(x) for x in line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            if kid not in found:
                found.add(kid)
                todo.append(kid)
    return found


def _files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                hits.append(str(path))
        except OSError:
            pass
    return hits


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **extra}
    env.pop("PGPASSWORD", None)
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture
def ray_tmpdir() -> Iterator[Path]:
    """A private Ray temp dir: this run's session files are all under it (a short path: Ray's
    unix socket names must stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ahs"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- unit: take_password
def test_password_in_url_moves_to_pgpassword(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    url = "postgresql+psycopg2://alice:p%40ss%3Aw%2Frd@db.example:5432/hpo"
    assert take_password(url) == "postgresql+psycopg2://alice@db.example:5432/hpo"
    assert os.environ["PGPASSWORD"] == "p@ss:w/rd", "percent-encoding is undone for libpq"
    assert take_password("postgresql://bob:plain@127.0.0.1/db") == "postgresql://bob@127.0.0.1/db"
    assert os.environ["PGPASSWORD"] == "plain"

    monkeypatch.delenv("PGPASSWORD")
    for untouched in ("postgresql+psycopg2://alice@db.example:5432/hpo",  # no password: .pgpass / env
                      "postgresql://db.example:5432/hpo",                  # not even a user
                      "sqlite:///archhpo.db", "sqlite:////abs/path/x:y@z.db", "sqlite://"):
        assert take_password(untouched) == untouched
        assert "PGPASSWORD" not in os.environ, untouched

    assert mask_url("postgresql+psycopg2://alice:s3cret@h:5432/db") == "postgresql+psycopg2://alice:***@h:5432/db"
    assert mask_url("postgresql://alice:p%40ss@h/db") == "postgresql://alice:***@h/db"
    assert mask_url("postgresql://alice@h/db") == "postgresql://alice@h/db"
    assert mask_url("sqlite:///x.db") == "sqlite:///x.db"
    msg = "could not connect to postgresql://u:hunter2@h/db: timeout"
    assert "hunter2" not in mask_url(msg) and "postgresql://u:***@h/db" in mask_url(msg)


@pytest.mark.postgres
def test_ray_tasks_get_a_password_free_url(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `archhpo run` hands to run_workers (and so to every Ray task's arguments) has no password;
    the password reaches the workers through PGPASSWORD, inherited by the Ray processes."""
    from archhpo.cli import _main as cli

    monkeypatch.delenv("PGPASSWORD", raising=False)
    canary = f"Canary-{uuid.uuid4().hex}"
    secret = pg_url.replace("://postgres@", f"://postgres:{canary}@", 1)
    assert canary in secret
    seen: list[str] = []

    def fake_run_workers(url, names, opts, out=sys.stderr):  # type: ignore[no-untyped-def]
        seen.append(url)
        return {}

    monkeypatch.setattr(archhpo.cluster._run, "run_workers", fake_run_workers)
    rc = cli.main(["run", "--storage", secret, "--experiment", "argv", "--budget", "200K", "--trials", "3",
                   "--quick", "--data", TINY_DATA, "--out", str(tmp_path / "o")])
    assert rc == 0
    assert seen == [pg_url], "the task arguments carry the URL without its password"
    assert os.environ["PGPASSWORD"] == canary
    attrs = optuna.load_study(study_name="argv_200K", storage=pg_url).user_attrs
    assert canary not in repr(attrs)


# ----------------------------------------------------------------------------- canary
@pytest.mark.ray
@pytest.mark.postgres
def test_canary_password_never_leaks(pg_server: str, tmp_path: Path, ray_tmpdir: Path) -> None:
    tag = uuid.uuid4().hex[:10]
    canary = f"Canary-{uuid.uuid4().hex}"
    role = db = f"archhpo_canary_{tag}"
    host_port = pg_server.split("@", 1)[1]
    _pg_admin(pg_server, f"CREATE ROLE {role} LOGIN PASSWORD '{canary}'", f"CREATE DATABASE {db} OWNER {role}")
    try:
        secret_url = f"postgresql+psycopg2://{role}:{canary}@{host_port}/{db}"
        clean_url = f"postgresql+psycopg2://{role}@{host_port}/{db}"
        out = tmp_path / "results"
        proc = subprocess.Popen(
            [sys.executable, "-m", "archhpo", "run", "--storage", secret_url, "--experiment", "canary",
             "--budget", "200K", "--workers", "2", "--trials", "4", "--quick", "--data", TINY_DATA,
             "--out", str(out), "--checkpoint-dir", str(tmp_path / "ckpt")],
            cwd=tmp_path, env=_env(RAY_TMPDIR=str(ray_tmpdir)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        samples: list[str] = []
        ray_seen = False
        try:
            deadline = time.monotonic() + 240
            while proc.poll() is None and time.monotonic() < deadline:
                ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
                # Sampled once Ray runs under the driver.  Before that, while Python imports, the
                # driver's own command line still shows what the user typed: a password on the
                # command line is visible for those first seconds, PGPASSWORD or ~/.pgpass never.
                if any(pid != proc.pid for pid in _descendants(proc.pid)):
                    samples.append(ps)
                    ray_seen = ray_seen or "raylet" in ps
                time.sleep(0.5)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, stderr
        assert len(samples) >= 3 and ray_seen, "the process list was sampled while Ray ran"
        assert all(f"://{role}:***@" in s for s in samples), "the driver's command line shows a masked URL"

        assert canary not in stdout + stderr
        assert canary not in "".join(samples), [
            line for s in samples for line in s.splitlines() if canary in line][:3]
        assert (out / "experiment_results.csv").is_file() and (out / "canary_200K_best.json").is_file()
        assert not _files_containing(tmp_path, canary.encode()), "results, checkpoints and the working dir"
        sessions = list((ray_tmpdir / "ray").glob("session_2*"))
        assert len(sessions) == 1 and list(sessions[0].glob("logs/*")), "this run's Ray session and its logs"
        assert not _files_containing(ray_tmpdir, canary.encode()), "Ray session files (logs included)"

        # Every attribute Optuna stores, read back with a password-free URL (trust auth here; a
        # real server would take the password from PGPASSWORD or ~/.pgpass)...
        study = optuna.load_study(study_name="canary_200K", storage=clean_url)
        trials = study.get_trials(deepcopy=False)
        assert len(trials) == 4 and all(t.state.is_finished() for t in trials)
        assert any(t.state == TrialState.COMPLETE for t in trials)
        storage = study._storage
        stored = [study.user_attrs, storage.get_study_system_attrs(study._study_id)] + [
            (t.user_attrs, t.system_attrs, t.params) for t in trials]
        assert canary not in repr(stored)
        assert all(t.user_attrs.get("ray_node_id") for t in trials if t.state == TrialState.COMPLETE)
        # ...and, beyond Optuna's view, every row of every table of the database.
        import psycopg2

        host, port = host_port.split(":")
        conn = psycopg2.connect(host=host, port=int(port), user="postgres", dbname=db)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                tables = [r[0] for r in cur.fetchall()]
                assert "trial_user_attributes" in tables
                for table in tables:
                    cur.execute(f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', (f"%{canary}%",))
                    assert cur.fetchone()[0] == 0, table
        finally:
            conn.close()
    finally:
        _pg_admin(pg_server, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", f"DROP ROLE IF EXISTS {role}")


# ----------------------------------------------------------------------------- loopback
_LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|\[::1\]|\[::ffff:127\.\d+\.\d+\.\d+\]):\d+$")


def _listeners(pids: set[int]) -> list[tuple[str, str, int]]:
    """(local address, process name, pid) of every TCP listening socket owned by pids."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        for name, pid in re.findall(r'\("([^"]*)",pid=(\d+)', line):
            if int(pid) in pids:
                found.append((fields[3], name, int(pid)))
    return found


@pytest.mark.ray
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to list listening sockets")
def test_local_ray_and_dashboard_bind_loopback(sqlite_url: str, tmp_path: Path, ray_tmpdir: Path) -> None:
    url = sqlite_url
    proc = subprocess.Popen(
        [sys.executable, "-m", "archhpo", "run", "--experiment", "lo", "--budget", "200K", "--trials", "6",
         "--quick", "--data", "synthetic:steps=3000", "--workers", "2", "--storage", url,
         "--out", str(tmp_path / "o")],
        cwd=tmp_path, env=_env(RAY_TMPDIR=str(ray_tmpdir)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )

    def running() -> bool:
        try:
            study = optuna.load_study(study_name="lo_200K", storage=url)
            return any(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False))
        except Exception:
            return False

    try:
        assert wait_for(running, timeout=180), "a trial started"
        listeners = _listeners(_descendants(proc.pid))
        names = {name for _, name, _ in listeners}
        assert {"gcs_server", "raylet"} <= names, f"Ray's own servers were found: {listeners}"
        exposed = [entry for entry in listeners if not _LOOPBACK.match(entry[0])]
        assert not exposed, f"Ray processes of this run listen beyond loopback: {exposed}"
        assert not [e for e in listeners if e[0].endswith(":8265")], "no Ray dashboard on its default port"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 130, err
