"""The ARCHHPO_* environment variables: read in one module (archhpo/environment.py's
`Environment`), once per process by the entry points, and passed down to the queue, the storage
and `run`'s options; a library caller that passes nothing gets the defaults."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from archhpo.cli._main import main
from archhpo.environment import Environment
from archhpo.errors import ArchhpoError, ConfigError
from archhpo.search import TrialQueue
from tests.conftest import REPO, TINY_DATA

NAMES = set(Environment.VARIABLES.values())


def _package_files() -> list[Path]:
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    return sorted({p for d in dirs for p in (REPO / d).rglob("*.py")})


def _environ_access(node: ast.AST) -> bool:
    """`os.environ` or `os.getenv` (any use: .get, [...], passing it on)."""
    return (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _readers(path: Path) -> bool:
    """Whether the module reads the environment and names one of the variables as a string."""
    tree = ast.parse(path.read_text())
    reads = any(_environ_access(n) for n in ast.walk(tree))
    names = any(isinstance(n, ast.Constant) and n.value in NAMES for n in ast.walk(tree))
    return reads and names


def test_the_variables_are_read_in_one_module() -> None:
    files = _package_files()
    assert len(files) > 50 and REPO / "search" / "_queue.py" in files
    assert [str(p.relative_to(REPO)) for p in files if _readers(p)] == ["archhpo/environment.py"]


def test_a_library_caller_gets_the_defaults_from_one_place() -> None:
    env = Environment()
    assert (env.heartbeat_s, env.grace_s, env.db_patience_s, env.reap_s, env.stop_wait_s) == (
        15, 90, 600.0, 30.0, 20.0)
    from archhpo.cluster._options import RunOptions

    assert RunOptions().stop_wait_s == 20.0 and RunOptions().timing == Environment()
    read = Environment.read({"ARCHHPO_HEARTBEAT_S": "2", "ARCHHPO_REAP_S": "0.5", "ARCHHPO_STOP_WAIT_S": "45"})
    assert (read.heartbeat_s, read.grace_s, read.reap_s, read.stop_wait_s) == (2, 90, 0.5, 45.0)
    with pytest.raises(ConfigError, match=r"\$ARCHHPO_GRACE_S 'soon' must be a whole number of seconds"):
        Environment.read({"ARCHHPO_GRACE_S": "soon"})
    with pytest.raises(ConfigError, match=r"\$ARCHHPO_REAP_S 'x' must be a number of seconds"):
        Environment.read({"ARCHHPO_REAP_S": "x"})


class _FakeWorker:
    queues: list[Any] = []

    def __init__(self, queues: list[Any], **_: Any) -> None:
        _FakeWorker.queues = queues

    def run(self) -> Any:
        return SimpleNamespace(unhealthy=False, disk_full=None, signal=0)


def test_the_environment_reaches_the_queue_and_the_run_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARCHHPO_STORAGE", url)  # no --storage below: the environment's is used
    assert main(["launch", "--experiment", "env", "--budget", "200K", "--quick", "--data", TINY_DATA]) == 0
    assert TrialQueue(url, "env_200K").reap_s == 30.0  # a library caller: the defaults
    for name, value in [("HEARTBEAT_S", "3"), ("GRACE_S", "12"), ("DB_PATIENCE_S", "7"), ("REAP_S", "2"),
                        ("STOP_WAIT_S", "41")]:
        monkeypatch.setenv(f"ARCHHPO_{name}", value)
    monkeypatch.setattr("archhpo.workers.Worker", _FakeWorker)
    assert main(["worker", "--experiment", "env", "--budget", "200K", "--device", "cpu"]) == 0
    (q,) = _FakeWorker.queues
    assert (q.heartbeat_s, q.reap_s, q.timing.db_patience_s) == (3.0, 2.0, 7.0)
    assert (q.storage.heartbeat_interval, q.storage.grace_period) == (3, 12)

    seen: list[Any] = []

    def refuse(storage_url: str, opts: Any) -> None:
        seen.append(opts)
        raise ArchhpoError("stopped by the test")

    monkeypatch.setattr("archhpo.cluster._run.check_run_options", refuse)
    assert main(["run", "--experiment", "env", "--budget", "200K", "--quick", "--data", TINY_DATA]) == 2
    (opts,) = seen
    assert opts.stop_wait_s == 41.0 and opts.timing.reap_s == 2.0 and opts.timing.grace_s == 12
    assert not (tmp_path / "archhpo.db").exists()
