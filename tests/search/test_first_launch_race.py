"""Concurrent first launches on a fresh database create Optuna's schema once and all succeed.

Four `launch`es started at once on a database that holds nothing yet used to race on Optuna's
table creation (check_schema saw another's half-made schema and said "schema version none",
create_all hit "relation studies already exists" or a duplicate pg_type row).  open_storage now
creates the schema under a lock (search/_storage.py `schema_lock`).  The processes are spawned
and imported first, then released together by a barrier, 10 rounds of 4 on fresh databases of
each backend; one round on PostgreSQL runs the real command line as 4 subprocesses.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import TINY_DATA, _admin

ROUNDS = 10
AT_ONCE = 4
EXPERIMENT = "race"


def _launch_args(url: str) -> list[str]:
    return ["launch", "--experiment", EXPERIMENT, "--budget", "200K", "--quick", "--trials", "6",
            "--data", TINY_DATA, "--storage", url]


def _launch_rounds(urls: list[str], barrier, results) -> None:  # type: ignore[no-untyped-def]
    """One of AT_ONCE processes: for each fresh database, wait for the others, then launch."""
    import archhpo.search._study  # noqa: F401 - imported before the barrier: the launches start together
    from archhpo.cli import main

    for url in urls:
        barrier.wait()
        try:
            rc = main(_launch_args(url))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent as a failure
            rc = f"{type(exc).__name__}: {exc}"
        results.put((url, rc))


def _slots(url: str) -> tuple[int, Counter[int]]:
    """The studies in the database and how often each plan slot has a trial."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            studies = conn.exec_driver_sql("SELECT count(*) FROM studies").scalar_one()
            rows = conn.exec_driver_sql(
                "SELECT value_json FROM trial_user_attributes WHERE key = 'plan_slot'").scalars().all()
    finally:
        engine.dispose()
    return int(studies), Counter(int(json.loads(r)) for r in rows)


def _planned_once(url: str) -> None:
    studies, slots = _slots(url)
    assert studies == 1
    assert slots and set(slots.values()) == {1}, f"every planned slot has one trial: {slots}"
    assert sorted(slots) == list(range(len(slots))), "the slots of phase 1, each once"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fresh_urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """ROUNDS fresh databases of one backend (PostgreSQL: created here, dropped after)."""
    if request.param == "sqlite":
        yield [f"sqlite:///{tmp_path / f'r{i}.db'}" for i in range(ROUNDS)]
        return
    server = request.getfixturevalue("pg_server")
    names = [f"archhpo_race_{uuid.uuid4().hex[:10]}" for _ in range(ROUNDS)]
    for name in names:
        _admin(server, f"CREATE DATABASE {name}")
    try:
        yield [f"{server}/{name}" for name in names]
    finally:
        for name in names:
            _admin(server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_four_launches_at_once_on_a_fresh_database_all_succeed_ten_times(fresh_urls: list[str]) -> None:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(AT_ONCE), ctx.Queue()
    procs = [ctx.Process(target=_launch_rounds, args=(fresh_urls, barrier, results)) for _ in range(AT_ONCE)]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in range(ROUNDS * AT_ONCE)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    failed = [(url, rc) for url, rc in got if rc != 0]
    assert failed == [], f"{len(failed)} of {len(got)} launches failed"
    for url in fresh_urls:
        _planned_once(url)


@pytest.mark.postgres
def test_four_launch_commands_at_once_on_a_fresh_database_all_exit_zero(pg_url: str, tmp_path: Path) -> None:
    """The real command line, once (on PostgreSQL, where the issue saw it): 4 `archhpo launch`
    processes started together."""
    procs = [subprocess.Popen([sys.executable, "-m", "archhpo", *_launch_args(pg_url)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(AT_ONCE)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * AT_ONCE, [err for _, err in outs if err]
    assert sum("created study race_200K" in err for _, err in outs) == 1, "one of them created it"
    _planned_once(pg_url)


@pytest.mark.postgres
def test_a_reader_waits_for_the_schema_a_launch_is_creating(pg_url: str) -> None:
    """A worker or export opening the database while a first launch creates the tables waits for
    them (a shared advisory lock) instead of refusing a half-made schema."""
    import threading

    from archhpo.environment import Environment
    from archhpo.search._storage import _rdb, open_storage, schema_lock

    opened: list[object] = []
    reader = threading.Thread(target=lambda: opened.append(open_storage(pg_url, create=False)), daemon=True)
    with schema_lock(pg_url, create=True):
        reader.start()
        reader.join(2)
        assert reader.is_alive() and not opened, "the reader waits while the schema is made"
        _rdb(pg_url, True, Environment()).engine.dispose()
    reader.join(60)
    assert len(opened) == 1, "then it opens the finished schema"
