"""The CSV carries how fast each trial trained: step_mfu, trial_mfu, micro_batch, accumulation_steps."""

from __future__ import annotations

import csv
from pathlib import Path

from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.report import CSV_COLUMNS, SPEC_COLUMNS
from archhpo.schema import Attr
from archhpo.search import TrialQueue
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}
SPEED = {Attr.STEP_MFU: 0.41, Attr.TRIAL_MFU: 0.33, Attr.MICRO_BATCH: 8, Attr.ACCUMULATION_STEPS: 4}


def test_the_csv_ends_with_the_speed_of_each_trial(sqlite_url: str, tmp_path: Path) -> None:
    assert main(["launch", "--experiment", "sp", "--budget", "200K", "--trials", "3", "--quick", "--data",
                 TINY_DATA, "--pruner", "none", "--storage", sqlite_url]) == 0
    q = TrialQueue(sqlite_url, "sp_200K")
    first = q.claim(WORKER)
    assert first is not None
    q.finish(first, TrialState.COMPLETE, 1.5, {"duration_s": 1.0, **SPEED})
    second = q.claim(WORKER)  # trained at its whole batch on a CPU: no MFU, no accumulation
    assert second is not None
    q.finish(second, TrialState.COMPLETE, 1.6, {"duration_s": 1.0})
    out = tmp_path / "res"
    assert main(["export", "--experiment", "sp", "--storage", sqlite_url, "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "experiment_results.csv").open()))
    header = tuple(rows[0])
    assert header[: len(SPEC_COLUMNS)] == SPEC_COLUMNS  # the design's columns stay first
    assert header[len(CSV_COLUMNS) - len(SPEED): len(CSV_COLUMNS)] == tuple(SPEED)
    by_trial = {int(r["trial"]): r for r in rows}
    assert {k: by_trial[first.number][k] for k in SPEED} == {k: str(v) for k, v in SPEED.items()}
    assert {k: by_trial[second.number][k] for k in SPEED} == dict.fromkeys(SPEED, "")


def test_a_frame_read_from_the_csv_knows_the_datas_truth_as_one_read_from_the_database(
        sqlite_url: str, tmp_path: Path) -> None:
    """The synthetic language's entropy rate and loss floor travel in the CSV, so a report read
    from it checks E against the same floor; a CSV without them (an older one) knows none."""
    from archhpo.report._frame import trials_frame

    assert main(["launch", "--experiment", "tr", "--family", "lm", "--budget", "200K", "--trials", "3", "--quick",
                 "--data", "synthetic:tokens=100000", "--pruner", "none", "--storage", sqlite_url]) == 0
    q = TrialQueue(sqlite_url, "tr_200K")
    for value in (1.5, 1.6):
        claim = q.claim(WORKER)
        assert claim is not None
        q.finish(claim, TrialState.COMPLETE, value, {"duration_s": 1.0})
    out = tmp_path / "res"
    assert main(["export", "--experiment", "tr", "--storage", sqlite_url, "--out", str(out)]) == 0
    path = out / "experiment_results.csv"
    stored = trials_frame("tr", storage=sqlite_url, curves=False)
    read = trials_frame("tr", csv=path)
    truth = stored.attrs["truth"]
    assert set(truth) == {"entropy_rate", "loss_floor"} and truth["loss_floor"] > truth["entropy_rate"] > 0
    assert read.attrs["truth"] == truth and "loss_floor" not in read.columns
    rows = list(csv.DictReader(path.open()))
    older = tmp_path / "older.csv"
    with older.open("w", newline="") as fh:
        keep = [k for k in rows[0] if k not in truth]
        writer = csv.DictWriter(fh, fieldnames=keep, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    assert trials_frame("tr", csv=older).attrs["truth"] == {}
