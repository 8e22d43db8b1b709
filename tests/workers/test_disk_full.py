"""A full disk is a pause, not a verdict.

A checkpoint that cannot be written for lack of space stops the worker with one sentence naming
the path and the cause; the trial goes back WAITING without spending an attempt, nothing FAILs,
and the same command finishes it once space returns, with the value an uninterrupted run gets.
A results write that fails for lack of space is refused the same way (`export` exits 2, nothing
half-written). The full disk is a real one: a small tmpfs (root and mount needed, else skipped).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from optuna.trial import TrialState

from archhpo.cli import main as cli_main
from archhpo.errors import DiskFull
from archhpo.schema import Attr
from archhpo.search import TrialQueue
from archhpo.workers import Worker
from archhpo.workers import _loop as loop
from tests.conftest import run_cli
from tests.workers.test_build import _tiny_study

DATA = "synthetic:tokens=4000"  # an lm validates, and checkpoints, every epoch
EPOCHS = 3


@contextlib.contextmanager
def _full_tmpfs(folder: Path, size: str, leave: int) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder`, filled by `folder/filler` up to `leave` free bytes."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"a {size} tmpfs cannot be mounted here ({mounted.stderr.strip() or mounted.returncode}); "
                    "this test needs root and mount")
    try:
        st = os.statvfs(folder)
        (folder / "filler").write_bytes(bytes(st.f_bavail * st.f_frsize - leave))
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _study(url: str) -> TrialQueue:
    s = _tiny_study(url, "full", "lm", "100K", DATA, {"seq_len": 16}, EPOCHS)
    return TrialQueue(url, s.study_name)


def _worker(q: TrialQueue, url: str, ck: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """`archhpo worker --study S --checkpoint-dir CK` in this process: its exit code and summary."""
    capsys.readouterr()
    code = cli_main(["worker", "--study", q.name, "--storage", url, "--device", "cpu", "--threads", "1",
                     "--checkpoint-dir", str(ck)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith('{"worker"')]
    return code, json.loads(lines[-1])


def _reference(tmp_path: Path, sizes: list[int], monkeypatch: pytest.MonkeyPatch) -> float:
    """The trial trained uninterrupted on a roomy disk; `sizes` gets each checkpoint's bytes."""
    real = loop._atomic_save

    def measured(obj: dict[str, Any], path: Path) -> None:
        real(obj, path)
        sizes.append(path.stat().st_size)

    monkeypatch.setattr(loop, "_atomic_save", measured)
    q = _study(f"sqlite:///{tmp_path / 'reference.db'}")
    torch.set_num_threads(1)
    assert Worker([q], device="cpu", threads=1, checkpoint_dir=tmp_path / "roomy").run().complete == 1
    monkeypatch.setattr(loop, "_atomic_save", real)
    (trial,) = q.storage.get_all_trials(q.study_id)
    return float(trial.value)


# How full the disk is -> the free bytes it leaves, given the largest checkpoint's size: none fits,
# or the first fits and the next does not (a replace needs the old file and the new one at once).
FULLNESS = {
    "no checkpoint fits": lambda size: 10_000,
    "the first checkpoint fits, the next does not": lambda size: size * 3 // 2,
}


@pytest.mark.parametrize("fullness", list(FULLNESS))
def test_a_full_checkpoint_disk_gives_the_trial_back_and_the_same_command_resumes_it(
        fullness: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    uninterrupted = _reference(tmp_path, sizes, monkeypatch)
    assert len(sizes) >= 2, "the trial writes more than one checkpoint"
    url = f"sqlite:///{tmp_path / 'full.db'}"
    q = _study(url)
    with _full_tmpfs(tmp_path / "small", "8m", FULLNESS[fullness](max(sizes))) as disk:
        ck = disk / "ck"
        code, summary = _worker(q, url, ck, capsys)
        assert code == 2 and summary["worker"] == "disk full", "stopped, not done"
        assert (summary["requeued"], summary["failed"], summary["complete"]) == (1, 0, 0)
        sentence = summary["disk_full"]
        assert sentence.startswith(f"No space left on the device holding {ck / q.name}/slot00001.attempt1.pt (")
        assert sentence.endswith("free some space and run the same command to resume.")
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [sentence], "said once"
        (trial,) = q.storage.get_all_trials(q.study_id)
        assert trial.state == TrialState.WAITING and trial.user_attrs[Attr.ATTEMPT] == 1, "no attempt spent"
        assert Attr.FAIL_REASON not in trial.user_attrs
        left = sorted(p.name for p in ck.rglob("*"))
        assert not [n for n in left if n.endswith(".tmp")], "no half-written checkpoint left behind"
        assert left == ([q.name] if fullness == "no checkpoint fits" else [q.name, "slot00001.attempt1.pt"])

        (disk / "filler").unlink()  # space returns: the same command finishes the trial
        code, summary = _worker(q, url, ck, capsys)
    assert code == 0 and summary["worker"] == "done" and summary["complete"] == 1
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert trial.state == TrialState.COMPLETE and trial.user_attrs[Attr.ATTEMPT] == 1
    assert ("resumed_from_epoch" in trial.user_attrs) == (fullness != "no checkpoint fits")
    assert trial.value == uninterrupted, "exactly an uninterrupted run's value"


def test_results_on_a_full_disk_are_refused_in_one_sentence_and_nothing_is_half_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'done.db'}"
    q = _study(url)
    torch.set_num_threads(1)
    assert Worker([q], device="cpu", threads=1).run().complete == 1
    with _full_tmpfs(tmp_path / "small", "2m", 0) as disk:
        out = disk / "results"
        capsys.readouterr()
        assert cli_main(["export", "--study", q.name, "--storage", url, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"archhpo: error: No space left on the device holding {out} (")
        assert err.endswith("free some space and run the same command to resume.") and "\n" not in err
        assert sorted(p.name for p in disk.rglob("*")) == ["filler", "results"], "nothing written, not even a part"
        (disk / "filler").unlink()
        assert cli_main(["export", "--study", q.name, "--storage", url, "--out", str(out)]) == 0
    assert capsys.readouterr().out.count(str(out)) == 2, "the CSV and the best JSON, once space returned"


def test_only_a_lack_of_space_is_a_full_disk(tmp_path: Path) -> None:
    """ENOSPC or EDQUOT anywhere in the chain is; torch's opaque zip error is only where the device
    is short of what was being written; an I/O error is not (the trial fails as before)."""
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert str(DiskFull.of(enospc, tmp_path)) == (f"No space left on the device holding {tmp_path} (No space left "
                                                   "on device); free some space and run the same command to resume.")
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    torch_error.__context__ = enospc
    assert DiskFull.of(torch_error, tmp_path) is not None
    bare = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert DiskFull.of(bare, tmp_path, needed=10) is None, "plenty of room: some other fault"
    full = DiskFull.of(bare, tmp_path / "ck" / "x.pt", needed=free)
    assert full is not None and full.path == tmp_path / "ck" / "x.pt"
    assert DiskFull.of(OSError(errno.EIO, "Input/output error"), tmp_path) is None
    assert DiskFull.of(RuntimeError("CUDA error: an illegal memory access"), tmp_path, needed=free) is None
    import pickle

    assert str(pickle.loads(pickle.dumps(full))) == str(full), "crosses a process boundary whole"


@pytest.mark.ray
def test_run_on_a_full_checkpoint_disk_stops_as_on_ctrl_c_and_the_same_command_finishes(tmp_path: Path) -> None:
    """`archhpo run` (a real local Ray): its worker stops for want of space and gives its trial
    back, so the run stops as Ctrl-C stops it, exit 2, the sentence last; with space, it finishes."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    with _full_tmpfs(tmp_path / "small", "8m", 10_000) as disk:
        command = ("run", "--experiment", "full", "--family", "lm", "--budget", "100K", "--trials", "2", "--quick",
                   "--data", DATA, "--seq-len", "16", "--workers", "1", "--storage", url,
                   "--checkpoint-dir", str(disk / "ck"), "--out", str(tmp_path / "results"))
        stopped = run_cli(*command, cwd=tmp_path)
        assert stopped.returncode == 2, stopped.stderr
        last = stopped.stderr.strip().splitlines()[-1]
        assert last.startswith(f"archhpo: error: No space left on the device holding {disk / 'ck'}/full_100K/slot0")
        assert last.endswith("free some space and run the same command to resume.")
        assert "Stopped: the workers saved and gave back 1 trial(s)" in stopped.stderr
        q = TrialQueue(url, "full_100K")
        trials = q.storage.get_all_trials(q.study_id)
        assert {t.state for t in trials} == {TrialState.WAITING}, "given back, nothing FAILed"
        assert all(t.user_attrs.get(Attr.ATTEMPT, 1) == 1 for t in trials), "no attempt spent"
        (disk / "filler").unlink()
        finished = run_cli(*command, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert "full_100K: 2 complete, 0 pruned, 0 failed" in finished.stderr
