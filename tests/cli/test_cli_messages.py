"""A newcomer's rough edges, each with the exact command a user types: the exit
code, one sentence that says what to do, and nothing written."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import Worker
from tests.cli.test_cli_errors import _assert_clean_failure
from tests.conftest import TINY_DATA, run_cli

LAUNCH = ["launch", "--experiment", "x", "--trials", "4", "--quick"]
REPO = Path(__file__).parent.parent.parent


def _no_price_csv(path: Path) -> Path:
    rows = ["date,f1,f2,close"] + [f"2024-01-{i % 28 + 1:02d},{i * 0.1:.1f},{i % 7},{100 + i % 13 + i * 0.01:.2f}"
                                   for i in range(400)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_price_column_is_a_real_option(tmp_path: Path) -> None:
    data = _no_price_csv(tmp_path / "bad.csv")
    res = run_cli(*LAUNCH, "--budget", "200K", "--data", str(data), cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "no 'price' column", "--price-column NAME")
    url = f"sqlite:///{tmp_path / 'p.db'}"
    res = run_cli(*LAUNCH, "--budget", "200K", "--data", str(data), "--price-column", "close", "--storage", url,
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "created study x_200K" in res.stderr
    q = TrialQueue(url, "x_200K")
    assert q.settings.data["price_column"] == "close"
    assert "--price-column" in run_cli("launch", "--help", cwd=tmp_path).stdout


def test_an_unsupported_storage_scheme_names_the_supported_ones(tmp_path: Path) -> None:
    res = run_cli(*LAUNCH, "--budget", "200K", "--storage", "mysql://u:secret@h/db", cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "unsupported database", "sqlite:///", "postgresql")
    assert "secret" not in res.stderr and "psycopg2-binary" not in res.stderr


def test_a_negative_budget_gets_the_budgets_own_message(tmp_path: Path) -> None:
    res = run_cli(*LAUNCH, "--budget", "-2M", cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "'-2M'", "positive")


def test_another_familys_flag_names_that_family(tmp_path: Path) -> None:
    res = run_cli(*LAUNCH, "--budget", "200K", "--encoder", "sum", cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "--encoder", "signal family", "--family signal")


def test_a_conflicting_relaunch_shows_old_and_new_values(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    assert run_cli(*LAUNCH, "--budget", "200K", "--data", TINY_DATA, "--storage", url, cwd=tmp_path).returncode == 0
    res = run_cli("launch", "--experiment", "x", "--trials", "6", "--quick", "--budget", "200K", "--data", TINY_DATA,
                  "--storage", url, cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "n_trials: stored 4, now 6" in res.stderr


def test_an_unknown_config_key_suggests_the_nearest(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text('experiment = "x"\ntrial = 4\n')  # the name the checker spares
    res = run_cli("launch", "--config", str(tmp_path / "bad.csv"), cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, "'trial'", "did you mean trials?")


def test_export_of_one_budget_keeps_the_other_budgets_rows(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    queues = []
    for budget in ("200K", "400K"):
        s = prepare_settings("ex", budget, n_trials=4, data=TINY_DATA, quick=True, pruner="none")
        launch(url, dataclasses.replace(s, plan=s.plan[:1]))
        queues.append(TrialQueue(url, s.study_name))
    Worker(queues, device="cpu", threads=1).run()
    out = tmp_path / "out"
    assert run_cli("export", "--experiment", "ex", "--storage", url, "--out", str(out), cwd=tmp_path).returncode == 0
    res = run_cli("export", "--experiment", "ex", "--budget", "200K", "--storage", url, "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    with open(out / "experiment_results.csv") as fh:
        budgets = sorted({row["budget"] for row in csv.DictReader(fh)})
    assert budgets == ["200K", "400K"]


def _launched(url: str, experiment: str, train: bool = False) -> str:
    """A one-trial study of `experiment` at 200K (its plan trained to the end when `train`); its name."""
    s = prepare_settings(experiment, "200K", n_trials=4, data=TINY_DATA, quick=True, pruner="none")
    launch(url, dataclasses.replace(s, plan=s.plan[:1]))
    if train:
        Worker([TrialQueue(url, s.study_name)], device="cpu", threads=1).run()
    return s.study_name


def test_a_worker_finds_a_study_by_its_name_alone(sqlite_url: str, tmp_path: Path) -> None:
    name = _launched(sqlite_url, "wk", train=True)
    res = run_cli("worker", "--study", name, "--storage", sqlite_url, "--device", "cpu", "--threads", "1",
                  "--checkpoint-dir", str(tmp_path / "ck"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stderr.strip().splitlines()[-1])
    assert summary["worker"] == "done" and summary["trials"] == [], "the finished plan: nothing left to train"


def test_export_reports_the_experiment_its_study_names(sqlite_url: str, tmp_path: Path) -> None:
    name = _launched(sqlite_url, "rx", train=True)
    out = tmp_path / "out"
    res = run_cli("export", "--study", name, "--report", "--storage", sqlite_url, "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (out / "experiment_results.csv").is_file()
    assert (out / "rx_report.html").is_file(), "the report of the experiment stored in the study"
    assert str(out / "rx_report.html") in res.stdout.splitlines()


@pytest.mark.parametrize("command", ["worker", "export"])
def test_a_worker_or_export_naming_no_study_is_refused(sqlite_url: str, tmp_path: Path, command: str) -> None:
    res = run_cli(command, "--storage", sqlite_url, *(["--out", str(tmp_path / "out")] if command == "export" else []),
                  cwd=tmp_path)
    # Refused before the database is opened: no study.db, no out folder (tmp_path stays empty).
    _assert_clean_failure(res, tmp_path, f"`archhpo {command}` needs the studies", "give --study NAME",
                          "or --experiment NAME")


@pytest.mark.parametrize("names", [["--budget", "200K"], ["--study", "x_200K", "--tokens-per-param", "20"]])
def test_a_budget_or_ratio_without_an_experiment_is_refused(sqlite_url: str, tmp_path: Path,
                                                            names: list[str]) -> None:
    res = run_cli("export", *names, "--storage", sqlite_url, "--out", str(tmp_path / "out"), cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, f"{names[-2]} names a study only together with --experiment",
                          "add --experiment NAME", "--study NAME")


@pytest.mark.parametrize("given", [["--study", "ea_200K"], ["--experiment", "ea"]])
def test_a_report_of_two_experiments_is_refused(sqlite_url: str, tmp_path: Path, given: list[str]) -> None:
    _launched(sqlite_url, "ea")
    other = _launched(sqlite_url, "eb")
    out = tmp_path / "out"
    res = run_cli("export", *given, "--study", other, "--report", "--storage", sqlite_url, "--out", str(out),
                  cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()], "one sentence"
    assert "experiments 'ea' and 'eb'" in res.stderr and "once per experiment" in res.stderr
    assert not out.exists(), "refused before the CSV is written"


def test_quick_says_it_replaces_the_familys_training_defaults(tmp_path: Path) -> None:
    text = " ".join(run_cli("run", "--family", "signal", "--help", cwd=tmp_path).stdout.split())
    assert "replaces the family's own training defaults" in text
    assert "--quick" in (REPO / "README.md").read_text() and "replaces the family's own" in " ".join(
        (REPO / "README.md").read_text().split())


def test_workers_default_to_the_clusters_gpus(tmp_path: Path) -> None:
    text = " ".join(run_cli("run", "--help", cwd=tmp_path).stdout.split())
    assert "one per GPU of the cluster, else 2" in text


def test_the_demo_leaves_no_empty_checkpoint_folders(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    s = prepare_settings("ck", "200K", n_trials=4, data=TINY_DATA, quick=True, pruner="none")
    launch(url, dataclasses.replace(s, plan=s.plan[:1]))
    Worker([TrialQueue(url, s.study_name)], device="cpu", threads=1, checkpoint_dir=tmp_path / "checkpoints").run()
    assert not (tmp_path / "checkpoints").exists()
    ignored = subprocess.run(["git", "check-ignore", "-q", "archhpo.db.lock"], cwd=REPO).returncode
    assert ignored == 0, ".gitignore covers archhpo.db.lock"


@pytest.mark.ray
def test_the_private_ray_prints_no_advice_to_disable_auth(tmp_path: Path) -> None:
    """Also: its workers run at the driver's priority (Ray's default puts them 15 nice levels lower)."""
    script = textwrap.dedent("""
        import os
        import ray
        from ray._raylet import AuthenticationMode, get_authentication_mode
        from archhpo.cluster._run import RunOptions, _start_ray
        os.nice(3)
        _start_ray(RunOptions(workers=1))
        try:
            print("MODE", get_authentication_mode() == AuthenticationMode.TOKEN)
            print("NICE", os.nice(0), ray.get(ray.remote(lambda: os.nice(0)).remote()))
        finally:
            ray.shutdown()
    """)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**env, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "MODE True" in res.stdout, "token authentication stays on"
    nice = next(line.split()[1:] for line in res.stdout.splitlines() if line.startswith("NICE"))
    assert nice[0] == nice[1], "a worker runs at its driver's niceness"
    assert "RAY_AUTH_MODE=disabled" not in res.stdout + res.stderr
