"""Pinned contracts with Optuna and Ray, and the storage guarantees around them.

- Every private Optuna/Ray part is used in one module each (search/_optuna_private.py,
  cluster/_ray_private.py).
- A database whose Optuna schema version archhpo was not tested with is refused before
  anything is written; a fresh database is created at a tested version.
- Trials written by the queue (complete, pruned, failed, retried, phase 2) read back identically
  through Optuna's API, the `optuna` CLI and optuna-dashboard's HTTP API, on both backends.
- Reads (status, progress, the pruning query, export) never wait for SQLite's write lock.
- A refused command writes nothing: no database file, no lock file, no results folder.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import urllib.request
import wsgiref.simple_server
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from archhpo.errors import StorageError
from archhpo.report import export_studies
from archhpo.schema import OBJECTIVE
from archhpo.search import TrialQueue, launch, open_storage, prepare_settings
from archhpo.search._optuna_private import TESTED_SCHEMA_VERSIONS
from archhpo.search._space import PARAM_NAMES
from tests.conftest import REPO, TINY_DATA, run_cli

WORKER = {"host": "contract", "device": "cpu"}
PINNED = {"search/_optuna_private.py", "cluster/_ray_private.py"}
PACKAGE_DIRS = ("archhpo", "budgets", "cluster", "models", "report", "search", "workers")


# ----------------------------------------------------------------------------- private parts
def _private_uses(path: Path) -> list[str]:
    """Imports of a private optuna/ray module and private attributes known to be Optuna's/Ray's."""
    text = path.read_text()
    found = []
    for node in ast.walk(ast.parse(text)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] in ("optuna", "ray", "optuna_dashboard") and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{path}:{node.lineno}: imports {name}")
    # Private attributes of Optuna objects (studies, trials, pruners, storages) and Ray.
    pattern = re.compile(
        r"\.(_study_id|_trial_id|_n_warmup_steps|_n_startup_trials|_n_min_trials|_interval_steps"
        r"|_version_manager|_system_attrs|_raylet|_private|_rdb|_cached_frozen_trial)\b"
        r"|\b(optuna|ray)(\.\w+)*\._(?!_)\w"
    )
    for i, line in enumerate(text.splitlines(), 1):
        if pattern.search(line) and not line.lstrip().startswith("#"):
            found.append(f"{path}:{i}: {line.strip()}")
    return found


def test_private_optuna_and_ray_parts_live_in_one_module_each() -> None:
    offenders = []
    for folder in PACKAGE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel not in PINNED:
                offenders += _private_uses(path)
    assert not offenders, "private Optuna/Ray parts outside the pinned modules:\n" + "\n".join(offenders)
    # ...and the check itself sees them where they are.
    assert _private_uses(REPO / "search/_optuna_private.py")
    assert _private_uses(REPO / "cluster/_ray_private.py")


def test_dependency_upper_bounds_admit_the_tested_versions() -> None:
    import tomllib

    import optuna_dashboard
    import ray
    from packaging.requirements import Requirement

    deps = {Requirement(d).name: Requirement(d) for d in
            tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    installed = {"optuna": optuna.__version__, "ray": ray.__version__,
                 "optuna-dashboard": optuna_dashboard.__version__, "sqlalchemy": sa.__version__}
    for name, version in installed.items():
        spec = deps[name].specifier
        assert any(s.operator == "<" for s in spec), f"{name} has no upper bound"
        assert spec.contains(version), f"installed {name} {version} is outside {spec}"


# ----------------------------------------------------------------------------- schema versions
def _settings(**kw: Any) -> Any:
    args = {"family": "patchtst", "n_trials": 12, "data": TINY_DATA, "quick": True, "seed": 0}
    return prepare_settings("contract", "500K", **{**args, **kw})


def _snapshot(url: str) -> dict[str, Any]:
    """Every row of every table, and for SQLite the files of its folder: what 'nothing written' means."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            out: dict[str, Any] = {}
            for table in sorted(sa.inspect(conn).get_table_names()):
                rows = conn.execute(sa.text(f'SELECT * FROM "{table}"')).all()
                out[table] = sorted(repr(tuple(r)) for r in rows)
    finally:
        engine.dispose()
    if url.startswith("sqlite"):
        folder = Path(url.split(":///", 1)[1]).parent
        out["files"] = sorted(p.name for p in folder.iterdir() if not p.name.endswith(("-wal", "-shm")))
    return out


def _set_schema_version(url: str, version: str) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": version})
    engine.dispose()


def test_a_fresh_database_is_created_at_a_tested_schema_version(storage_url: str) -> None:
    storage = open_storage(storage_url)
    assert storage.get_current_version() in TESTED_SCHEMA_VERSIONS
    assert storage.get_current_version() == storage.get_head_version()


@pytest.mark.parametrize("version", ["v3.0.0.d", "v9.9.9.a"])  # an older and a future Optuna schema
def test_a_database_at_an_untested_schema_version_is_refused_before_writing(
    storage_url: str, version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _settings()
    launch(storage_url, settings)
    _set_schema_version(storage_url, version)
    before = _snapshot(storage_url)
    for attempt in (lambda: open_storage(storage_url), lambda: TrialQueue(storage_url, settings.study_name),
                    lambda: launch(storage_url, settings)):
        with pytest.raises(StorageError, match=f"schema version {re.escape(version)}.*tested only with"):
            attempt()
    common = ["--experiment", "contract", "--budget", "500K", "--storage", storage_url]
    sqlite_dir = Path(storage_url.split(":///", 1)[1]).parent if storage_url.startswith("sqlite") else None
    for command in (["export", "--out", str(sqlite_dir / "results") if sqlite_dir else "/nonexistent/out"],
                    ["worker"], ["launch", "--quick", "--data", TINY_DATA, "--trials", "12"]):
        code, err = _cli([*command, *common], capsys)
        assert code == 2 and f"schema version {version}" in err and err.count("\n") == 1, err
    assert _snapshot(storage_url) == before, "a refused database is left exactly as it was"


# ----------------------------------------------------------------------------- the read-back contract
def _age_heartbeat(url: str, trial_id: int) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE trial_heartbeats SET heartbeat = :t WHERE trial_id = :i"),
                     {"t": "2000-01-01 00:00:00", "i": trial_id})
    engine.dispose()


def _stored_params(claim: Any) -> dict[str, Any]:
    """What a claimed trial stores as Optuna params: the design's (arch_idx and the training
    parameters, which the worker gets) and the architecture's dimensions beside them."""
    assert set(claim.params) == set(PARAM_NAMES)
    return {**claim.params, **{k: claim.arch[k] for k in ("d_model", "n_layers", "n_heads", "d_ff")}}


def _drive_queue(url: str) -> tuple[str, dict[int, dict[str, Any]]]:
    """A study with every kind of trial the queue writes; returns what was written, by number."""
    settings = _settings()
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    wrote: dict[int, dict[str, Any]] = {}

    def run(state: TrialState, curve: list[float], value: float | None, attrs: dict[str, Any]) -> None:
        c = q.claim(WORKER)
        assert c is not None
        pruned = [q.report(c, step, v) for step, v in enumerate(curve, 1)]
        if state == TrialState.PRUNED:
            assert pruned[-1], "the median rule prunes this trial"
        assert q.finish(c, state, value, attrs)
        wrote[c.number] = {"state": state, "params": _stored_params(c), "value": value, "attrs": attrs,
                           "curve": dict(enumerate(curve, 1)), "phase": c.phase, "attempt": c.attempt}

    for i in range(5):  # the median pruner's five startup trials
        curve = [0.9 - 0.01 * i, 0.7 - 0.01 * i, 0.6 - 0.01 * i]
        run(TrialState.COMPLETE, curve, min(curve), {"train_loss": 0.5, "duration_s": 1.5, "best_epoch": 3})
    run(TrialState.PRUNED, [5.0], 5.0, {"duration_s": 0.2, "best_epoch": 1})
    run(TrialState.FAIL, [0.95], None, {"fail_reason": "training loss became non-finite", "duration_s": 0.1})
    lost = q.claim(WORKER)
    q.report(lost, 1, 0.99)
    _age_heartbeat(url, lost.trial_id)  # its worker vanished long ago
    q.maintain()
    wrote[lost.number] = {"state": TrialState.FAIL, "params": _stored_params(lost), "value": None, "attrs": {},
                          "curve": {1: 0.99}, "phase": 1, "attempt": 1}
    while q.status().waiting:  # the rest of phase 1, the retry last
        run(TrialState.COMPLETE, [0.8, 0.55], 0.55, {"train_loss": 0.4, "duration_s": 1.0, "best_epoch": 2})
    retry = max(wrote)
    assert wrote[retry]["attempt"] == 2 and wrote[retry]["params"] == _stored_params(lost)
    q.maintain()  # phase 2
    while q.status().waiting:
        run(TrialState.COMPLETE, [0.7, 0.5, 0.45], 0.45, {"train_loss": 0.3, "duration_s": 2.0, "best_epoch": 3})
    assert q.maintain().done
    assert {w["phase"] for w in wrote.values()} == {1, 2}
    return settings.study_name, wrote


def _free_port_server(app: Any) -> Iterator[str]:
    class Quiet(wsgiref.simple_server.WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = wsgiref.simple_server.make_server("127.0.0.1", 0, app, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _optuna_cli(*args: str) -> Any:
    exe = shutil.which("optuna", path=str(Path(sys.executable).parent)) or shutil.which("optuna")
    assert exe, "the optuna command is installed with optuna"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    res = subprocess.run([exe, *args, "-f", "json"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_queue_trials_read_back_identically_through_optuna_cli_and_dashboard(storage_url: str) -> None:
    name, wrote = _drive_queue(storage_url)

    # 1. Optuna's public API, from a storage of its own.
    study = optuna.load_study(study_name=name, storage=storage_url)
    trials = {t.number: t for t in study.trials}
    assert set(trials) == set(wrote)
    for number, w in wrote.items():
        t = trials[number]
        assert t.state == w["state"], number
        assert t.params == w["params"], number
        assert t.value == w["value"], number
        assert t.intermediate_values == w["curve"], number
        assert {k: t.user_attrs[k] for k in w["attrs"]} == w["attrs"], number
        assert t.user_attrs["phase"] == w["phase"] and t.user_attrs["attempt"] == w["attempt"]
        assert t.datetime_start is not None and t.datetime_complete is not None, number
    retried = [t for t in trials.values() if "retry_of" in t.user_attrs]
    assert len(retried) == 1 and trials[retried[0].user_attrs["retry_of"]].state == TrialState.FAIL
    assert "fail_reason" not in trials[retried[0].user_attrs["retry_of"]].user_attrs
    best = min((n for n, w in wrote.items() if w["state"] == TrialState.COMPLETE),
               key=lambda n: (wrote[n]["value"], n))
    assert study.best_trial.number == best and study.best_value == wrote[best]["value"]

    # 2. The optuna command line.
    # The study names its objective (launch sets Optuna's metric names), so the CLI keys values by it.
    assert study.metric_names == [OBJECTIVE]
    cli = {d["number"]: d for d in _optuna_cli("trials", "--study-name", name, "--storage", storage_url)}
    assert set(cli) == set(trials)
    for number, t in trials.items():
        d = cli[number]
        value = {OBJECTIVE: t.value}
        assert (d["state"], d["params"], d["value"], d["user_attrs"]) == (
            t.state.name, t.params, value, t.user_attrs), number
    best_cli = _optuna_cli("best-trial", "--study-name", name, "--storage", storage_url)
    assert (best_cli["number"], best_cli["value"]) == (best, {OBJECTIVE: wrote[best]["value"]})

    # 3. optuna-dashboard's HTTP API (the app `archhpo dashboard` serves), its own storage too.
    from optuna_dashboard import wsgi

    for base in _free_port_server(wsgi(storage_url)):
        summaries = _get(f"{base}/api/studies")["study_summaries"]
        summary = next(s for s in summaries if s["study_name"] == name)
        detail = _get(f"{base}/api/studies/{summary['study_id']}")
        importances = _get(f"{base}/api/studies/{summary['study_id']}/param_importances")
    # the dashboard's plots name the architecture's dimensions, beside the index of the grid row
    dims = {"arch_idx", "d_model", "n_layers", "n_heads", "d_ff"}
    assert dims <= {p["name"] for p in detail["intersection_search_space"]}
    assert dims <= {p["name"] for p in detail["union_search_space"]}
    assert dims <= {p["name"] for p in importances["param_importances"][0]}
    dash = {d["number"]: d for d in detail["trials"]}
    assert set(dash) == set(trials)
    for number, t in trials.items():
        d = dash[number]
        assert d["state"] == t.state.name.capitalize(), number
        assert {p["name"]: p["param_external_value"] for p in d["params"]} == {
            k: str(v) for k, v in t.params.items()}, number
        assert (d["values"][0] if d.get("values") else None) == t.value, number
        assert {iv["step"]: iv["value"] for iv in d["intermediate_values"]} == t.intermediate_values, number
        shown = {a["key"]: a["value"] for a in d["user_attrs"]}
        assert shown == {k: v if isinstance(v, str) else (str(v) if isinstance(v, int | float) else json.dumps(v))
                         for k, v in t.user_attrs.items()}, number
    assert [b["number"] for b in detail["best_trials"]] == [best]


# ----------------------------------------------------------------------------- reads and the write lock
def _stops(q: TrialQueue, step: int, best: float) -> bool:
    """The question the queue asks its stopping rule when a trial reports `best` at `step`."""
    return q.rule.stops(step, best, lambda: q._completed_values(step))


def test_reads_never_wait_for_the_sqlite_write_lock(tmp_path: Path) -> None:
    """While another connection holds SQLite's write lock, status, the driver's progress upkeep,
    the pruning query and export finish; a write (a claim) waits until the lock is released."""
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    settings = _settings()
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    for i in range(6):
        c = q.claim(WORKER)
        q.report(c, 1, 0.5 + 0.1 * i)
        q.finish(c, TrialState.COMPLETE, 0.5 + 0.1 * i, {"duration_s": 1.0})
    running = q.claim(WORKER)

    holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # a writer in the middle of its transaction
    holder.execute("UPDATE studies SET study_name = study_name")
    results: dict[str, Any] = {}

    def reads() -> None:
        results["status"] = q.status()
        results["progress"] = q.maintain(blocking=False)
        results["prune"] = _stops(q, 1, 10.0)
        results["export"] = export_studies(q.storage, [settings.study_name], tmp_path / "results")

    def write() -> None:
        results["claim"] = q.claim(WORKER)

    try:
        reader = threading.Thread(target=reads, daemon=True)
        reader.start()
        reader.join(45)  # far below the 60 s busy timeout a blocked read would wait
        assert not reader.is_alive(), "a read waited for the write lock"
        assert results["status"].complete == 6 and results["status"].running == 1
        assert results["progress"].complete == 6 and results["prune"] is True
        assert (tmp_path / "results").is_dir() and results["export"]
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(1.0)
        assert writer.is_alive(), "a claim waits for the write lock (the lock in this test is real)"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    writer.join(60)
    assert results["claim"] is not None and results["claim"].number != running.number


def test_read_scope_never_writes(storage_url: str) -> None:
    from archhpo.search._storage import read_scope

    storage = open_storage(storage_url)
    try:
        with read_scope(storage) as s:  # PostgreSQL refuses; SQLite's deferred transaction is rolled back
            s.execute(sa.text("INSERT INTO studies (study_name) VALUES ('x')"))
    except sa.exc.DBAPIError:
        assert storage.engine.dialect.name == "postgresql"
    with read_scope(storage) as s:
        assert s.execute(sa.text("SELECT count(*) FROM studies")).scalar() == 0


# ----------------------------------------------------------------------------- refused: nothing written
REFUSED = [
    ("run", "--workers", "0"),
    ("run", "--workers", "-1"),
    ("run", "--ray-address", "127.0.0.1:6379"),
    ("run", "--gpus-per-trial", "lots"),
    ("run", "--budget", "1K"),  # nothing fits
    ("worker",),
    ("export",),
]


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`archhpo ...` in this process (what a subprocess would run, without re-importing torch)."""
    from archhpo.cli import main

    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", REFUSED, ids=[" ".join(c) for c in REFUSED])
def test_refused_commands_write_nothing(
    command: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each refused command leaves its folder empty: no database, no .lock, no results."""
    name, *extra = command
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARCHHPO_STORAGE", raising=False)
    for storage in ([f"--storage=sqlite:///{tmp_path / 'study.db'}"], []):  # given, and the default archhpo.db
        args = [name, "--experiment", "refused", *storage]
        if "--budget" not in extra:
            args += ["--budget", "500K"]
        if name == "run":
            args += ["--quick", "--data", TINY_DATA]
        code, err = _cli(args + extra, capsys)
        assert code == 2, err
        assert err.startswith("archhpo: error: ") and err.count("\n") == 1, err
        assert sorted(p.name for p in tmp_path.iterdir()) == [], err


def test_a_refused_run_writes_nothing_as_a_process(tmp_path: Path) -> None:
    res = run_cli("run", "--experiment", "refused", "--budget", "500K", "--quick", "--workers", "0",
                  cwd=tmp_path, env={"ARCHHPO_STORAGE": f"sqlite:///{tmp_path / 'study.db'}"})
    assert res.returncode == 2 and "--workers must be at least 1" in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["worker", "export"])
def test_reading_commands_do_not_create_tables_in_an_empty_database(
    name: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = _cli([name, "--experiment", "refused", "--budget", "500K", "--storage", pg_url], capsys)
    assert code == 2 and "holds no Optuna study tables" in err, err
    assert _snapshot(pg_url) == {} and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- bounded upkeep
def test_a_long_lived_queue_reports_the_same_status_as_a_fresh_one(storage_url: str) -> None:
    """The upkeep reads finished trials once and keeps what settled slots contribute; its status
    must equal one computed from scratch at every step (complete, pruned, failed, lost, retried,
    phase 2)."""
    import dataclasses

    settings = _settings()
    launch(storage_url, settings)
    long_lived = TrialQueue(storage_url, settings.study_name)
    work = TrialQueue(storage_url, settings.study_name)

    def same() -> None:
        fresh = TrialQueue(storage_url, settings.study_name)
        assert dataclasses.asdict(long_lived.status()) == dataclasses.asdict(fresh.status())
        assert dataclasses.asdict(long_lived.maintain(blocking=False)) == dataclasses.asdict(fresh.status())
        fresh.storage.engine.dispose()

    same()
    for i, state in enumerate([TrialState.COMPLETE] * 5 + [TrialState.PRUNED, TrialState.FAIL]):
        c = work.claim(WORKER)
        same()
        work.finish(c, state, None if state == TrialState.FAIL else 0.5 + 0.01 * i,
                    {"duration_s": 1.0 + i, **({"fail_reason": "nan"} if state == TrialState.FAIL else {})})
        same()
    lost = work.claim(WORKER)
    _age_heartbeat(storage_url, lost.trial_id)
    work.maintain()  # reaped, retried
    same()
    while (c := work.claim(WORKER)) is not None:
        work.finish(c, TrialState.COMPLETE, 0.4, {"duration_s": 2.0})
    same()
    work.maintain()  # phase 2
    same()
    while (c := work.claim(WORKER)) is not None:
        work.finish(c, TrialState.COMPLETE, 0.3, {"duration_s": 3.0})
    same()
    assert long_lived.maintain().done and long_lived.status().best_value == 0.3


def test_launch_creates_the_indexes_that_keep_claims_bounded(storage_url: str) -> None:
    from archhpo.search._storage import ARCHHPO_INDEXES

    launch(storage_url, _settings())
    engine = sa.create_engine(storage_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            names = {ix["name"] for table in ("trials", "trial_intermediate_values")
                     for ix in insp.get_indexes(table)}
    finally:
        engine.dispose()
    assert set(ARCHHPO_INDEXES) <= names
    launch(storage_url, _settings())  # again: idempotent


def test_the_median_rule_sees_trials_completed_by_other_workers_since_its_last_report(storage_url: str) -> None:
    """The median rule keeps the completed values between reports; trials completed by another
    worker afterwards must count at this worker's next report, exactly as a fresh query would."""
    settings = _settings()  # quick: warm-up 1 epoch, 5 startup trials
    launch(storage_url, settings)
    a, b = TrialQueue(storage_url, settings.study_name), TrialQueue(storage_url, settings.study_name)
    mine = a.claim(WORKER)
    assert not a.report(mine, 1, 0.9), "nothing completed yet"
    for i in range(5):
        c = b.claim(WORKER)
        b.report(c, 1, 0.5 + 0.1 * i)  # 0.5 .. 0.9: median 0.7
        b.finish(c, TrialState.COMPLETE, 0.5 + 0.1 * i, {})
    assert a.report(mine, 2, 0.75) is False, "no completed trial has epoch 2"
    assert _stops(a, 1, 0.75) and not _stops(a, 1, 0.65)
    c = b.claim(WORKER)
    b.report(c, 1, 0.1)
    b.finish(c, TrialState.COMPLETE, 0.1, {})  # median now (0.6 + 0.7) / 2 = 0.65
    assert _stops(a, 1, 0.66) and not _stops(a, 1, 0.64)
    fresh = TrialQueue(storage_url, settings.study_name)
    assert fresh._completed_values(1) == a._completed_values(1) == [0.1, 0.5, 0.6, 0.7, 0.8, 0.9]
