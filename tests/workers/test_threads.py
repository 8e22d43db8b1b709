"""Cores split sensibly: `run --workers N` without `--threads` gives each local
worker cores / N torch threads, `--threads` wins, and a bad `--threads` is refused before anything
is written."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from archhpo.cluster._run import usable_cores, worker_threads
from tests.conftest import TINY_DATA, run_cli


@pytest.mark.parametrize(
    ("workers", "threads", "cores", "cluster", "want"),
    [
        (1, None, 2, False, 2),  # one worker takes every core
        (2, None, 2, False, 1),
        (4, None, 2, False, 1),  # more workers than cores: never below one thread
        (3, None, 16, False, 5),  # uneven: floor, so the workers never oversubscribe
        (2, 3, 16, False, 3),  # --threads wins
        (2, None, 16, True, 1),  # a cluster task holds one Ray CPU
        (2, 4, 16, True, 4),
    ],
)
def test_worker_threads_split_the_cores(workers: int, threads: int | None, cores: int, cluster: bool,
                                        want: int) -> None:
    assert worker_threads(workers, threads, cores, cluster) == want


def _run(tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    db = tmp_path / "t.db"
    res = run_cli("run", "--experiment", "t", "--budget", "200K", "--trials", "3", "--quick", "--data", TINY_DATA,
                  "--storage", f"sqlite:///{db}", "--device", "cpu", "--out", str(tmp_path / "o"), *extra,
                  cwd=tmp_path, timeout=600)
    return res.returncode, res.stderr, db


@pytest.mark.ray  # `run` starts a private Ray: kept on the Ray tests' xdist worker (tests/conftest.py)
def test_run_without_threads_gives_each_worker_cores_over_workers(tmp_path: Path) -> None:
    rc, err, db = _run(tmp_path, "--workers", "2")
    assert rc == 0, err
    trials = [t for s in optuna.get_all_study_summaries(f"sqlite:///{db}")
              for t in optuna.load_study(study_name=s.study_name, storage=f"sqlite:///{db}").trials]
    recorded = {t.user_attrs.get("threads") for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert recorded == {max(1, usable_cores() // 2)}, recorded


def test_run_refuses_threads_below_one(tmp_path: Path) -> None:
    rc, err, db = _run(tmp_path, "--threads", "0")
    assert rc != 0 and "--threads must be at least 1" in err and "Traceback" not in err
    assert not db.exists(), "a refused command writes no study"
