"""Shared fixtures: storage backends (SQLite temp file and real PostgreSQL), tiny study settings.

PostgreSQL: the server on 127.0.0.1:5432 (user postgres, trust auth) when one answers, else a
throwaway cluster started with initdb/pg_ctl when they are installed; each test gets a fresh
database that is dropped afterwards.  Without either, PostgreSQL tests are skipped with a
message saying what is missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# `make test` runs two xdist workers on a 2-core machine: a test's `archhpo worker` (or torch in the
# test process) left at torch's default of one thread per core would oversubscribe the cores with
# the other worker's test.  Tests that mean a thread count pass --threads or set it themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
TINY_DATA = "synthetic:steps=700"  # ~500 training windows: a quick trial takes about a second


def load_script(path: Path, name: str) -> ModuleType:
    """A bench script (not a package module) imported under `name`, registered so dataclasses resolve."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs `pytest -n 2 --dist loadgroup`: every test that starts a Ray instance goes to
    one xdist worker, one after another, so two Ray clusters (each with its raylet, GCS and
    workers) never compete for a 2-core CI machine; the rest spreads over both workers."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))


def _pg_answers(host: str, port: int, user: str = "postgres", dbname: str = "postgres") -> bool:
    try:
        import psycopg2

        psycopg2.connect(host=host, port=port, user=user, dbname=dbname, connect_timeout=3).close()
        return True
    except Exception:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Base URL of a PostgreSQL server we may create databases on."""
    host, port = "127.0.0.1", int(os.environ.get("ARCHHPO_TEST_PG_PORT", "5432"))
    if _pg_answers(host, port):
        yield f"postgresql+psycopg2://postgres@{host}:{port}"
        return
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL tests skipped: nothing answers on 127.0.0.1:5432 and initdb/pg_ctl are not "
                    "installed (apt-get install postgresql, or start a server there)")
    tmp = Path(tempfile.mkdtemp(prefix="archhpo-pg-"))
    pg = ThrowawayPostgres(tmp, initdb, pg_ctl)
    pg.start()
    try:
        yield f"postgresql+psycopg2://postgres@{pg.host}:{pg.port}"
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _admin(base: str, sql: str) -> None:
    import psycopg2

    rest = base.split("@", 1)[1]
    host, port = rest.split(":")
    conn = psycopg2.connect(host=host, port=int(port), user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.close()


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    name = f"archhpo_t_{uuid.uuid4().hex[:12]}"
    _admin(pg_server, f"CREATE DATABASE {name}")
    try:
        yield f"{pg_server}/{name}"
    finally:
        _admin(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite study database in the test's folder, for tests whose subject is not the storage
    (training, the command line, the report); storage behaviour is tested with `storage_url`."""
    return f"sqlite:///{tmp_path / 'study.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every storage test runs on both backends."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `archhpo ...` in a subprocess, as a user would."""
    full_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    return subprocess.run([sys.executable, "-m", "archhpo", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def wait_for(predicate, timeout: float = 30, every: float = 0.2) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every)
    return False


class ThrowawayPostgres:
    """A private PostgreSQL cluster on a free port that a test may stop and start at will."""

    def __init__(self, root: Path, initdb: str, pg_ctl: str) -> None:
        self.root, self.pg_ctl = root, pg_ctl
        self.data, self.log = root / "data", root / "log"
        self.host, self.port = "127.0.0.1", _free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            shutil.chown(root, "postgres")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*self.prefix, initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust"],
                       check=True, capture_output=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@{self.host}:{self.port}/postgres"

    def answers(self) -> bool:
        return _pg_answers(self.host, self.port)

    def start(self) -> None:
        subprocess.run([*self.prefix, self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                        "-o", f"-p {self.port} -k {self.root} -c listen_addresses={self.host}", "start"],
                       check=True, capture_output=True, timeout=90)

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"],
                       capture_output=True, timeout=90)


@pytest.fixture
def throwaway_pg() -> Iterator[ThrowawayPostgres]:
    """A started private PostgreSQL cluster (see ThrowawayPostgres), always stopped and removed."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("needs initdb and pg_ctl to start a private PostgreSQL cluster it can restart "
                    "(apt-get install postgresql)")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.skip("running as root, and runuser is missing to start PostgreSQL as the postgres user")
    root = Path(tempfile.mkdtemp(prefix="archhpo-pg-outage-"))
    pg: ThrowawayPostgres | None = None
    try:
        pg = ThrowawayPostgres(root, initdb, pg_ctl)
        pg.start()
        yield pg
    finally:
        if pg is not None:
            pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def _maintain_at_once(url: str, name: str, barrier) -> None:  # type: ignore[no-untyped-def]
    from archhpo.search import TrialQueue

    q = TrialQueue(url, name)
    barrier.wait()
    q.maintain()


def race_upkeeps(url: str, name: str, n: int = 6) -> None:
    """n processes (spawned: no shared state) open the study's queue and run its upkeep at once."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_maintain_at_once, args=(url, name, barrier)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
