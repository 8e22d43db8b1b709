"""The folders a command writes are checked before anything starts (one sentence,
exit 2, nothing written); a write that fails mid-run stops the run cleanly, naming the path; a
reader that goes away (`archhpo grid | head`) ends the command quietly."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from archhpo._io import unwritable
from tests.cli.test_cli_errors import _assert_clean_failure
from tests.conftest import TINY_DATA, run_cli

RUN = ["run", "--experiment", "x", "--budget", "200K", "--trials", "4", "--quick", "--data", TINY_DATA]


def _blocker(tmp_path: Path) -> Path:
    """A file where a folder should be: nothing can be written below it, as root too."""
    (tmp_path / "bad.csv").write_text("")  # the name _assert_clean_failure allows
    return tmp_path / "bad.csv"


@pytest.mark.parametrize(("flags", "phrase"), [
    (["--out", "{b}/results"], "--out {b}/results cannot be written"),
    (["--checkpoint-dir", "{b}/ckpt"], "--checkpoint-dir {b}/ckpt cannot be written"),
    (["--storage", "sqlite:///{b}/study.db"], None),  # the SQLite folder: open_storage's own sentence
])
def test_run_refuses_an_unwritable_output_before_the_study(tmp_path: Path, flags: list[str],
                                                          phrase: str | None) -> None:
    b = _blocker(tmp_path)
    res = run_cli(*RUN, *[f.format(b=b) for f in flags], cwd=tmp_path)
    assert res.returncode == 2
    _assert_clean_failure(res, tmp_path, *([phrase.format(b=b), "a folder you can write to"] if phrase else []))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder without write permission")
@pytest.mark.parametrize("command", ["run", "launch"])
def test_a_read_only_folder_is_refused(tmp_path: Path, command: str) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        args = [*RUN, "--out", str(ro / "results")] if command == "run" else \
            ["launch", *RUN[1:], "--storage", f"sqlite:///{ro / 'study.db'}"]
        res = run_cli(*args, cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert "cannot be written" in res.stderr and "Permission denied" in res.stderr
        assert not list(ro.iterdir()) and not (tmp_path / "archhpo.db").exists()
    finally:
        ro.chmod(0o755)


def test_the_sqlite_folder_is_checked_by_launch(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    res = run_cli("launch", *RUN[1:], "--storage", f"sqlite:///{ro / 'study.db'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr  # writable: created
    (ro / "study.db").chmod(0o444)
    if os.geteuid() != 0:
        res = run_cli("launch", *RUN[1:], "--storage", f"sqlite:///{ro / 'study.db'}", cwd=tmp_path)
        assert res.returncode == 2 and "is read-only" in res.stderr


def test_unwritable_says_why_and_writes_nothing(tmp_path: Path) -> None:
    b = _blocker(tmp_path)
    assert unwritable(tmp_path / "new" / "deeper") is None
    assert unwritable(b / "x") == f"{b} is a file, not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]  # nothing made by asking


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_grid_into_a_closed_pipe_exits_quietly(fmt: str) -> None:
    """`archhpo grid ... | head`: the reader is gone before the output is written."""
    proc = subprocess.Popen([sys.executable, "-m", "archhpo", "grid", "--budget", "2M", "--budget", "20M",
                             "--format", fmt], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `head` does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141  # 128 + SIGPIPE, as a shell reports for `yes | head`
    assert err == ""


def test_grid_piped_to_head(tmp_path: Path) -> None:
    res = subprocess.run(f"'{sys.executable}' -m archhpo grid --budget 2M --budget 20M --budget 200M | head -n 1",
                         shell=True, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.stdout.startswith("budget") and len(res.stdout.splitlines()) == 1
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr


@pytest.mark.ray
def test_a_results_write_that_fails_mid_run_stops_the_run_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The disk fills up while `run` writes its results: the workers give their trials back,
    nothing stays RUNNING, and the run ends with one sentence naming the file (exit 2)."""
    from archhpo.cli import main
    from archhpo.report import _export

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    out = tmp_path / "results"
    calls = []

    def disk_full(storage, names, out_dir):  # type: ignore[no-untyped-def]
        calls.append(out_dir)
        if len(calls) > 1:  # the first export (at the start) goes through; the next finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out_dir / "experiment_results.csv"))

    monkeypatch.setattr(_export, "export_studies", disk_full)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    code = main([*RUN, "--budget", "500K", "--storage", url, "--out", str(out), "--workers", "1",
                 "--threads", "1", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("archhpo: error: Cannot write the results to ")
    assert f"{out / 'experiment_results.csv'} (No space left on device)" in last and "--out" in last
    assert "Traceback" not in err
    trials = optuna.load_study(study_name="x_500K", storage=url).get_trials(deepcopy=False)
    assert trials and not [t for t in trials if t.state == TrialState.RUNNING]
    assert [t for t in trials if t.state == TrialState.WAITING], "the plan is left to resume"
