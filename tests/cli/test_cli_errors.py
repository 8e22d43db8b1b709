"""docs/design.md §2 errors: one clear sentence, a non-zero exit, no traceback, nothing half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_DATA, run_cli


def _assert_clean_failure(res, tmp_path: Path, *phrases: str) -> None:  # type: ignore[no-untyped-def]
    assert res.returncode != 0
    err = res.stderr.strip()
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("archhpo: error: "), err
    for phrase in phrases:
        assert phrase in err
    assert not [p for p in tmp_path.iterdir() if p.name != "bad.csv"], "nothing written on failure"


LAUNCH = ["launch", "--experiment", "x", "--trials", "4", "--quick"]


@pytest.mark.parametrize("command", ["grid", "launch", "run"])
def test_bad_budget(tmp_path: Path, command: str) -> None:
    args = ["grid", "--budget", "2Q"] if command == "grid" else [command, "--experiment", "x", "--budget", "2Q"]
    _assert_clean_failure(run_cli(*args, cwd=tmp_path), tmp_path, "2Q", "2M")


def test_no_architecture_fits(tmp_path: Path) -> None:
    res = run_cli(*LAUNCH, "--budget", "1K", "--data", TINY_DATA, cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "No patchtst architecture", "--tolerance")


def test_unknown_family(tmp_path: Path) -> None:
    res = run_cli(*LAUNCH, "--budget", "2M", "--family", "resnet", cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "resnet", "patchtst")


def test_unreachable_database_does_not_leak_the_password(tmp_path: Path) -> None:
    url = "postgresql+psycopg2://archhpo:canary-Pa55@127.0.0.1:1/nothing"
    res = run_cli(*LAUNCH, "--budget", "200K", "--data", TINY_DATA, "--storage", url, cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "Cannot open the study database", "--storage")
    assert "canary-Pa55" not in res.stderr + res.stdout


def test_malformed_data_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    rows = ["date,f1,price"] + [f"2024-01-{i % 28 + 1:02d},{i * 0.1},{100 + i}" for i in range(300)]
    rows[50] = "2024-02-01,oops,150"
    bad.write_text("\n".join(rows) + "\n")
    res = run_cli(*LAUNCH, "--budget", "200K", "--data", str(bad), cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "f1", "oops")


def test_missing_data_file(tmp_path: Path) -> None:
    res = run_cli(*LAUNCH, "--budget", "200K", "--data", str(tmp_path / "none.csv"), cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "none.csv")


def test_worker_for_a_study_that_does_not_exist(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    res = run_cli("worker", "--experiment", "ghost", "--budget", "2M", "--storage", url, cwd=tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    # No database at all: said so, and not created (issue 7 part 4: refused means nothing written).
    assert "No study database at" in res.stderr and "archhpo launch" in res.stderr
    assert not (tmp_path / "empty.db").exists()


def test_sqlite_cannot_serve_a_remote_ray_cluster(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    res = run_cli("run", "--experiment", "x", "--budget", "200K", "--trials", "4", "--quick", "--data", TINY_DATA,
                  "--storage", url, "--ray-address", "127.0.0.1:6380", cwd=tmp_path)
    assert res.returncode != 0 and "PostgreSQL" in res.stderr and "Traceback" not in res.stderr
