"""Opening Optuna's RDB storage safely: URL defaults, masked passwords, pooled connections
that survive hour-long trials, SQLite pragmas, one session helper, and the plan lock."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import random
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import optuna
import sqlalchemy
from optuna.storages import RDBStorage
from sqlalchemy import orm

from archhpo._urls import mask_url, split_password
from archhpo.environment import Environment
from archhpo.errors import StorageError
from archhpo.search._optuna_private import ALEMBIC_TABLE, TESTED_SCHEMA_VERSIONS, TRIALS_TABLE

T = TypeVar("T")

DEFAULT_STORAGE = "sqlite:///archhpo.db"
# The timing of heartbeats, the grace before a silent trial is reaped and the patience through a
# database outage come from an `Environment` (archhpo/config.py, the one reader of ARCHHPO_*): the
# entry points read it once and pass it down (`timing=`); Environment() holds the defaults.
DEFAULT_TIMING = Environment()
log = logging.getLogger("archhpo.storage")


def resolve_storage_url(url: str | None, env: Environment | None = None) -> str:
    """--storage, else the environment's ARCHHPO_STORAGE (`env`, read by the caller), else an
    SQLite file in the working directory; any password moves to PGPASSWORD."""
    return take_password(with_driver(check_scheme(url or (env or DEFAULT_TIMING).storage or DEFAULT_STORAGE)))


SCHEMES = ("sqlite", "postgresql", "postgres")  # the databases archhpo is tested on (postgres: an alias)
# The driver archhpo ships with (a dependency): a URL naming no driver gets it.  SQLAlchemy 2.1
# gives a bare postgresql:// psycopg 3, which archhpo does not install, and knows no postgres://.
SHIPPED_DRIVER = "postgresql+psycopg2"
# The pip package of each PostgreSQL driver SQLAlchemy knows, for the message when one is missing.
DRIVER_PACKAGES = {"psycopg2": "psycopg2-binary", "psycopg": "psycopg[binary]", "pg8000": "pg8000",
                   "asyncpg": "asyncpg", "psycopg2cffi": "psycopg2cffi"}


def check_scheme(url: str) -> str:
    """The URL itself, or StorageError naming the supported schemes (before any driver is tried)."""
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise StorageError(
            f"--storage {mask_url(url)} uses an unsupported database; archhpo supports sqlite:///FILE and "
            "postgresql://user@host:5432/db."
        )
    return url


def with_driver(url: str) -> str:
    """postgresql://... and postgres://... as the psycopg2 driver archhpo ships with; a URL that
    names its driver (postgresql+psycopg://) and any other URL are left as they are."""
    head, sep, tail = url.partition("://")
    if sep and head.lower() in ("postgresql", "postgres"):
        return f"{SHIPPED_DRIVER}://{tail}"
    if sep and head.lower().startswith("postgres+"):  # the alias with a driver: postgres+pg8000://
        return f"postgresql{head[len('postgres'):]}://{tail}"
    return url


def _missing_driver(url: str, module: str | None) -> StorageError:
    """The sentence for a driver that is not installed (or that SQLAlchemy does not know)."""
    driver = url.partition("://")[0].partition("+")[2] or module or "?"
    package = DRIVER_PACKAGES.get(module or driver)
    what = (f"is not installed; install it (pip install '{package}')" if package
            else "is not one SQLAlchemy knows; check its name")
    return StorageError(
        f"The database driver {driver!r} of {mask_url(url)} {what}, or write the URL as "
        "postgresql://user@host:5432/db to use psycopg2, the driver archhpo ships with."
    )


def take_password(url: str) -> str:
    """Move a password out of the URL into PGPASSWORD (read by libpq) and return the URL without it.

    Every form counts (archhpo/_urls.py: user:pass@ with an unencoded '@' inside, ?password=,
    &password=, percent-encoded).  Everything downstream (Ray task arguments, study attributes,
    logs, process lists) then only ever sees the password-free URL; Ray workers started from this
    process inherit PGPASSWORD.
    """
    if not url.startswith(("postgresql", "mysql")):
        return url
    bare, password = split_password(url)
    if password is not None:
        os.environ["PGPASSWORD"] = password
    return bare


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def sqlite_path(url: str) -> Path | None:
    """The database file of an sqlite:/// URL (None for in-memory databases)."""
    path = url.split(":///", 1)[1] if ":///" in url else ""
    return Path(path).resolve() if path and path != ":memory:" else None


def _engine_kwargs(url: str) -> dict:
    if is_sqlite(url):
        # Writers queue on SQLite's file lock; a generous busy timeout turns "database is locked"
        # into a short wait when several local workers finish trials at the same moment.
        return {"connect_args": {"timeout": 60}}
    return {
        # pre-ping + recycle: a pooled connection idle through an hour-long trial may have been
        # dropped by the server or a firewall; test it before use and replace old ones.
        "pool_pre_ping": True,
        "pool_recycle": 600,
        "pool_size": 2,
        "max_overflow": 4,
        "connect_args": {
            "connect_timeout": 10,
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
            "application_name": "archhpo",
        },
    }


def check_schema(url: str, create: bool = True) -> None:
    """Refuse, before anything is written, a database archhpo cannot safely write to.

    Its Optuna schema version (alembic's `alembic_version` table) must be one archhpo was tested
    with (TESTED_SCHEMA_VERSIONS): the queue writes Optuna's tables directly, so a schema of an
    older or newer Optuna could be corrupted.  A database without Optuna's tables is created at
    the tested version by open_storage when `create`, and refused otherwise (worker, export,
    dashboard: nothing to read, and an SQLite file that does not exist is not created).
    """
    path = sqlite_path(url) if is_sqlite(url) else None
    if is_sqlite(url) and (path is None or not path.exists() or path.stat().st_size == 0):
        if not create:
            raise StorageError(
                f"No study database at {mask_url(url)}; check --storage (or $ARCHHPO_STORAGE), or run "
                "`archhpo launch` first."
            )
        return
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool,
                                      **{k: v for k, v in _engine_kwargs(url).items() if k == "connect_args"})
    try:
        with engine.connect() as conn:
            tables = set(sqlalchemy.inspect(conn).get_table_names())
            versions = (
                [row[0] for row in conn.exec_driver_sql(f"SELECT version_num FROM {ALEMBIC_TABLE}")]
                if ALEMBIC_TABLE in tables else []
            )
            conn.rollback()
    finally:
        engine.dispose()
    if versions or tables & {TRIALS_TABLE, "studies", "version_info"}:
        if len(versions) != 1 or versions[0] not in TESTED_SCHEMA_VERSIONS:
            found = ", ".join(versions) or "none (a pre-alembic Optuna schema)"
            raise StorageError(
                f"The study database {mask_url(url)} has Optuna schema version {found}, but archhpo "
                f"{_archhpo_version()} is tested only with {', '.join(TESTED_SCHEMA_VERSIONS)} (optuna "
                f"{optuna.__version__}), so it refuses to write to it; use an optuna and archhpo that match "
                "the database, or after a backup run `optuna storage upgrade --storage URL`."
            )
    elif not create:
        raise StorageError(
            f"The database {mask_url(url)} holds no Optuna study tables; check --storage (or "
            "$ARCHHPO_STORAGE), or run `archhpo launch` first."
        )


def _archhpo_version() -> str:
    try:
        from importlib.metadata import version

        return version("archhpo")
    except Exception:
        return "(uninstalled)"


def _check_url(url: str) -> None:
    """A supported scheme, and for SQLite a folder that exists: refused before anything is opened."""
    check_scheme(url)
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is not None and not path.parent.is_dir():
            raise StorageError(
                f"The directory of the SQLite database {path} does not exist; create it or pass another --storage."
            )
    elif not url.startswith(("postgresql", "mysql")):
        raise StorageError(
            f"Unsupported storage URL {mask_url(url)!r}; use sqlite:///FILE.db or "
            "postgresql://user@host:5432/db."
        )


def open_storage(url: str, create: bool = True, timing: Environment | None = None) -> RDBStorage:
    """Open the storage, or raise StorageError with a clear sentence before writing anything.

    create=True (launch, run) creates Optuna's tables in a new or empty database, under the schema
    lock so that any number of first launches at once create them once; create=False (worker,
    export, dashboard) refuses a database that has none.  Either way a database whose Optuna
    schema version archhpo was not tested with is refused (check_schema).  `timing` (an
    Environment, default: the defaults) sets the heartbeat, the grace and the patience.
    """
    url = with_driver(url)
    _check_url(url)
    env = timing or DEFAULT_TIMING
    try:
        # A server that answered and then dropped us (pg_terminate_backend, a restart beginning) is
        # retried; one that refuses or cannot be reached fails at once with the sentence below.
        with contextlib.ExitStack() as stack:
            resilient(lambda: stack.enter_context(schema_lock(url, create)), "locking the study database",
                      env.db_patience_s, transient=_dropped)
            storage = resilient(lambda: _rdb(url, create, env), "opening the study database",
                                env.db_patience_s, transient=_dropped)
            if is_sqlite(url):
                # WAL lets readers (the progress display, the dashboard) read while a worker writes.
                with storage.engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            if create:
                resilient(lambda: ensure_indexes(storage), "creating archhpo's indexes", env.db_patience_s)
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.DatabaseError) as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc) else type(exc).__name__
        raise StorageError(
            f"Cannot open the study database {mask_url(url)} ({mask_url(reason)}); "
            "check that it is running and reachable, or pass another --storage."
        ) from None
    except ImportError as exc:
        raise _missing_driver(url, exc.name) from None
    except sqlalchemy.exc.NoSuchModuleError:
        raise _missing_driver(url, None) from None
    return storage


# The errors of two processes creating Optuna's tables at once (a creator that is not archhpo, or
# an older archhpo, takes no schema lock): the table is there by now, so opening again succeeds.
SCHEMA_RACE = ("already exists", "pg_type_typname_nsp_index", "pg_class_relname_nsp_index",
               "unique constraint failed: alembic_version", "alembic_version_pkc", "duplicate key value")


def _rdb(url: str, create: bool, env: Environment) -> RDBStorage:
    """Check the schema and construct Optuna's storage (which creates the tables when missing);
    one more try when that lost a race with a creator outside the schema lock."""
    for attempt in (1, 2):
        check_schema(url, create)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=env.heartbeat_s,
                                  grace_period=env.grace_s)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                sqlalchemy.exc.OperationalError) as exc:
            if attempt == 2 or not any(k in str(exc).lower() for k in SCHEMA_RACE):
                raise
            log.info("another process created the study tables at the same time; opening again")
            time.sleep(0.5)
    raise AssertionError("unreachable")


# The key of the schema lock (PostgreSQL advisory locks are per database, so one constant serves).
SCHEMA_LOCK_KEY = int.from_bytes(hashlib.sha256(b"archhpo:schema").digest()[:8], "big", signed=True)


@contextlib.contextmanager
def schema_lock(url: str, create: bool) -> Iterator[None]:
    """Serialise the creation of Optuna's tables across processes (first launches at once).

    PostgreSQL: creators take the advisory lock exclusively, readers (create=False) shared, so a
    reader never sees a half-made schema (the tables before their version row).  SQLite: creators
    take an flock on the plan lock's file beside the database; readers take none (the dashboard
    may read a folder it cannot write).  Entered only once the URL was checked.
    """
    if is_sqlite(url):
        path = sqlite_path(url)
        if not create or path is None:
            yield
            return
        with open(f"{path}.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool,
                                      connect_args=_engine_kwargs(url)["connect_args"])
    kind = "" if create else "_shared"
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f"SELECT pg_advisory_lock{kind}(:k)"), {"k": SCHEMA_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                with contextlib.suppress(sqlalchemy.exc.DBAPIError):  # a lost session released it
                    conn.execute(sqlalchemy.text(f"SELECT pg_advisory_unlock{kind}(:k)"), {"k": SCHEMA_LOCK_KEY})
                    conn.commit()
    finally:
        engine.dispose()


# Indexes archhpo adds to Optuna's tables (named archhpo_*; created by launch/run, idempotent), so
# that the queue's per-trial queries stay bounded as a study grows to 100,000 trials:
# - claiming picks a study's oldest WAITING trial, and the upkeep reads its live (WAITING/RUNNING)
#   trials: Optuna indexes trials.study_id alone, which makes both scan the whole study;
# - the median rule reads the completed trials' values at one step.
ARCHHPO_INDEXES = {
    "archhpo_trials_study_state": "trials (study_id, state, trial_id)",
    "archhpo_intermediate_step": "trial_intermediate_values (step, trial_id, intermediate_value)",
}


def ensure_indexes(storage: RDBStorage) -> None:
    # Look first: CREATE INDEX takes a table lock (briefly blocking writers) even when the index exists.
    with storage.engine.connect() as conn:
        inspector = sqlalchemy.inspect(conn)
        have = {ix["name"] for table in ("trials", "trial_intermediate_values") for ix in inspector.get_indexes(table)}
    missing = {name: target for name, target in ARCHHPO_INDEXES.items() if name not in have}
    if missing:
        with storage.engine.begin() as conn:
            for name, target in missing.items():
                conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {name} ON {target}")


@contextlib.contextmanager
def session_scope(storage: RDBStorage, write: bool = True) -> Iterator[orm.Session]:
    """The one place archhpo touches the database directly: commit on success, roll back on error.

    write=False (read_scope) is for reads: one consistent snapshot that never takes SQLite's write
    lock (in WAL mode it never waits for a writer) and is read-only on PostgreSQL.
    """
    session = orm.Session(bind=storage.engine)
    try:
        dialect = storage.engine.dialect.name
        if dialect == "sqlite":
            # A writer takes SQLite's write lock up front: a deferred transaction that reads and
            # then writes can deadlock with another writer and fail instead of waiting.  A reader
            # starts a deferred transaction: a snapshot, no lock that writers or readers wait on.
            session.connection().exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")
        elif not write and dialect == "postgresql":
            session.connection().exec_driver_sql("SET TRANSACTION READ ONLY")
        yield session
        if write:
            session.commit()
        else:
            session.rollback()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def plan_slots_of(storage: RDBStorage, study_id: int) -> set[int]:
    """The plan slots that have a trial (any state): one light query on the trials' plan_slot
    attribute instead of loading every trial of the study."""
    from archhpo.search._optuna_private import models as m

    with read_scope(storage) as s:
        texts = s.execute(
            sqlalchemy.select(m.TrialUserAttributeModel.value_json)
            .join(m.TrialModel, m.TrialModel.trial_id == m.TrialUserAttributeModel.trial_id)
            .where(m.TrialModel.study_id == study_id, m.TrialUserAttributeModel.key == "plan_slot")
        ).scalars().all()
    return {int(json.loads(t)) for t in texts}


def read_scope(storage: RDBStorage) -> contextlib.AbstractContextManager[orm.Session]:
    """A read-only session (see session_scope): status, progress, the pruning query, export."""
    return session_scope(storage, write=False)


def _transient(exc: BaseException) -> bool:
    """Errors worth retrying: SQLite's lock contention and any lost or refused connection."""
    if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ is not None:
        return _transient(exc.__cause__)  # Optuna's storage wraps every SQLAlchemy error in this
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError)


def _dropped(exc: BaseException) -> bool:
    """A connection the server accepted and then closed (not one it refused)."""
    if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ is not None:
        return _dropped(exc.__cause__)
    return isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated


def resilient(fn: Callable[[], T], what: str = "database call", patience_s: float | None = None,
              transient: Callable[[BaseException], bool] | None = None) -> T:
    """Run fn, retrying transient database errors with backoff for up to patience_s seconds
    (default: Environment's 600 s; a caller holding an Environment passes its `db_patience`).

    A PostgreSQL restart or a connection killed by pg_terminate_backend costs a retry, not a
    trial; SQLite's 'database is locked' becomes a short wait.  Every retried call is
    idempotent or re-checks the trial's state inside its transaction.
    """
    patience = DEFAULT_TIMING.db_patience_s if patience_s is None else patience_s
    deadline = time.monotonic() + patience
    delay = 0.05
    while True:
        try:
            return fn()
        except Exception as exc:
            if not (transient or _transient)(exc) or time.monotonic() + delay > deadline:
                raise
            if "locked" not in str(exc):
                # Show the lost connection, not Optuna's "invalid data in the commit" wrapper text.
                cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) else None
                reason = str(cause or exc).strip().splitlines()[0] if str(cause or exc).strip() else type(exc).__name__
                log.warning("%s failed (%s); retrying in %.1f s", what, mask_url(reason), delay)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 5.0)


@contextlib.contextmanager
def plan_lock(storage: RDBStorage, study_name: str, blocking: bool = True) -> Iterator[bool]:
    """Serialise plan changes (writing phase 1, creating phase 2, retries) across all workers.

    PostgreSQL: a session-level advisory lock, released by the server if the holder dies.
    SQLite: an flock on a file beside the database (SQLite studies are single-machine).
    Yields whether the lock is held: with blocking=False a busy lock yields False at once
    (the periodic upkeep skips a round rather than queueing behind another worker's).
    """
    key = int.from_bytes(hashlib.sha256(f"archhpo:{study_name}".encode()).digest()[:8], "big", signed=True)
    url = str(storage.engine.url)
    if storage.engine.dialect.name == "postgresql":
        with storage.engine.connect() as conn:
            if blocking:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            elif not conn.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                conn.commit()
                yield False
                return
            conn.commit()
            try:
                yield True
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
    elif is_sqlite(url) and sqlite_path(url) is not None:
        lock_path = Path(f"{sqlite_path(url)}.lock")
        with open(lock_path, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    else:
        yield True
