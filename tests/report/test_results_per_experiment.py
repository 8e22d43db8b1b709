"""Two experiments exported into one folder: the trials CSV keeps both experiments' rows, and each
report links it and names its own rows."""

from __future__ import annotations

import csv
import threading
from pathlib import Path

from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.report._export import RESULTS_CSV
from archhpo.search import TrialQueue, launch, prepare_settings
from tests.conftest import TINY_DATA


def _study(url: str, experiment: str, offset: float) -> None:
    """Three complete trials whose values are 2.2, 2.3 and 2.4, plus offset."""
    settings = prepare_settings(experiment, "200K", family="patchtst", data=TINY_DATA, quick=True, n_trials=3)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    for i in range(3):
        claim = q.claim({"host": "test", "device": "cpu"})
        assert claim is not None
        q.report(claim, 1, 2.5 + offset)
        q.finish(claim, TrialState.COMPLETE, 2.2 + i / 10 + offset, {"duration_s": 0.1, "best_epoch": 1})


def _values(out: Path) -> dict[str, list[float]]:
    with open(out / RESULTS_CSV) as fh:
        rows = list(csv.DictReader(fh))
    got: dict[str, list[float]] = {}
    for r in rows:
        got.setdefault(r["experiment"], []).append(round(float(r["val_loss"]), 6))
    return {k: sorted(v) for k, v in got.items()}


def test_a_second_experiment_into_the_same_folder_keeps_the_first_ones_rows(tmp_path: Path) -> None:
    first, second = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"  # two databases
    _study(first, "alpha", 0.0)
    _study(second, "beta", 1.0)
    out = tmp_path / "results"
    assert main(["export", "--experiment", "alpha", "--storage", first, "--out", str(out), "--report"]) == 0
    assert main(["export", "--experiment", "beta", "--storage", second, "--out", str(out), "--report"]) == 0
    assert _values(out) == {"alpha": [2.2, 2.3, 2.4], "beta": [3.2, 3.3, 3.4]}
    # exporting the first again rewrites its own rows from its database and keeps the second's
    assert main(["export", "--experiment", "alpha", "--storage", first, "--out", str(out)]) == 0
    assert _values(out) == {"alpha": [2.2, 2.3, 2.4], "beta": [3.2, 3.3, 3.4]}
    for name in ("alpha", "beta"):
        page = (out / f"{name}_report.html").read_text()
        assert (f"<a href='{RESULTS_CSV}'>{RESULTS_CSV}</a> (this experiment's rows: experiment = {name})"
                in page)
    # each experiment's report from the shared CSV holds its own rows only
    assert main(["report", "--csv", str(out / RESULTS_CSV), "--experiment", "beta", "--out", str(tmp_path / "r")]) == 0
    assert "beta_200K" in (tmp_path / "r" / "beta_report.html").read_text()


def test_two_experiments_exporting_at_once_lose_no_rows(tmp_path: Path) -> None:
    urls = {name: f"sqlite:///{tmp_path / f'{name}.db'}" for name in ("gamma", "delta")}
    for k, (name, url) in enumerate(urls.items()):
        _study(url, name, float(k))
    out = tmp_path / "results"
    codes: list[int] = []

    def export(name: str) -> None:
        for _ in range(5):
            codes.append(main(["export", "--experiment", name, "--storage", urls[name], "--out", str(out)]))

    threads = [threading.Thread(target=export, args=(name,)) for name in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [0] * 10
    assert _values(out) == {"gamma": [2.2, 2.3, 2.4], "delta": [3.2, 3.3, 3.4]}
