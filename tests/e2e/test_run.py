"""End to end as a user runs it: launch + worker + export, and `run` on a real local Ray, on
SQLite and PostgreSQL; the outputs match docs/design.md §8; Optuna's own CLI reads the study."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from archhpo.report import CSV_COLUMNS
from tests.conftest import TINY_DATA, run_cli, wait_for

BEST_KEYS = {"experiment", "budget", "best_params", "best_value", "n_trials_completed", "n_trials_pruned",
             "timestamp", "study_name", "optuna_version", "architecture"}


def _check_outputs(out: Path, experiment: str, budget: str, n_planned: int) -> list[dict[str, str]]:
    with open(out / "experiment_results.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        header = tuple(reader.fieldnames or ())
        assert header[: len(CSV_COLUMNS)] == CSV_COLUMNS  # then the family's own metrics, by name
        assert list(header[len(CSV_COLUMNS):]) == sorted(header[len(CSV_COLUMNS):])
        assert all(c.startswith("val_") for c in header[len(CSV_COLUMNS):])
        rows = list(reader)
    assert 0 < len(rows) <= n_planned
    assert len({r["trial"] for r in rows}) == len(rows)
    best = json.loads((out / f"{experiment}_{budget}_best.json").read_text())
    assert BEST_KEYS <= set(best)
    assert set(best["best_params"]) == {"arch_idx", "learning_rate", "epochs", "batch_size", "weight_decay",
                                        "warmup_steps"}
    assert set(best["architecture"]) == {"d_model", "n_layers", "n_heads", "d_ff", "param_count"}
    assert best["best_value"] == pytest.approx(min(float(r["val_loss"]) for r in rows if r["val_loss"]))
    winner = next(r for r in rows if float(r["val_loss"]) == pytest.approx(best["best_value"]))
    assert int(winner["param_count"]) == best["architecture"]["param_count"]
    assert best["study_name"] == f"{experiment}_{budget}"
    return rows


def test_launch_worker_export_end_to_end(storage_url: str, tmp_path: Path) -> None:
    common = ["--experiment", "e2e", "--budget", "200K", "--storage", storage_url]
    res = run_cli("launch", *common, "--trials", "5", "--quick", "--data", TINY_DATA, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run_cli("worker", *common, "--device", "cpu", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    study = optuna.load_study(study_name="e2e_200K", storage=storage_url)
    trials = study.get_trials()
    assert len(trials) == 5 and all(t.state.is_finished() for t in trials)
    for t in trials:  # the worker reported every epoch and recorded where it ran
        assert t.intermediate_values and t.user_attrs["host"] and t.user_attrs["device"] == "cpu"
        assert t.user_attrs["param_count"] > 0
    res = run_cli("export", "--experiment", "e2e", "--storage", storage_url, "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    rows = _check_outputs(tmp_path / "out", "e2e", "200K", 5)
    assert {int(r["epochs"]) for r in rows} <= {2, 3, 4}, "quick studies record the epochs really trained"


def test_optuna_cli_reads_an_archhpo_study_on_postgres(pg_url: str, tmp_path: Path) -> None:
    res = run_cli("launch", "--experiment", "cli", "--budget", "200K", "--storage", pg_url, "--trials", "4",
                  "--quick", "--data", TINY_DATA)
    assert res.returncode == 0, res.stderr
    run_cli("worker", "--experiment", "cli", "--budget", "200K", "--storage", pg_url)
    optuna_bin = str(Path(sys.executable).parent / "optuna")
    studies = subprocess.run([optuna_bin, "studies", "--storage", pg_url, "-f", "json"],
                             capture_output=True, text=True, timeout=120)
    assert studies.returncode == 0, studies.stderr
    assert any(s["name"] == "cli_200K" for s in json.loads(studies.stdout))
    trials = subprocess.run([optuna_bin, "trials", "--study-name", "cli_200K", "--storage", pg_url, "-f", "json"],
                            capture_output=True, text=True, timeout=120)
    assert trials.returncode == 0, trials.stderr
    rows = json.loads(trials.stdout)
    assert len(rows) == 4 and all("arch_idx" in r["params"] and "param_count" in r["user_attrs"] for r in rows)


@pytest.mark.ray
def test_run_with_local_ray_writes_results(storage_url: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    res = run_cli("run", "--experiment", "ray", "--budget", "200K", "--trials", "5", "--quick",
                  "--data", TINY_DATA, "--workers", "2", "--storage", storage_url, "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "trials 5/5 done" in res.stderr
    rows = _check_outputs(out, "ray", "200K", 5)
    study = optuna.load_study(study_name="ray_200K", storage=storage_url)
    assert len(study.trials) == 5
    assert all(t.user_attrs.get("ray_node_id") for t in study.trials if t.state == TrialState.COMPLETE)
    assert len(rows) == sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    assert not list(out.glob("*.tmp")), "no temporary files left behind"


@pytest.mark.ray
def test_a_study_runs_in_parts_across_machines(tmp_path: Path) -> None:
    """README "A study longer than one machine's lease": SIGTERM stops `run` as Ctrl-C does (exit
    130, no trial left RUNNING); a `.backup` copy of the database and the checkpoint folder, moved
    elsewhere, resume with the same command: every slot finishes once and the interrupted trial
    resumes from the step where the cancel stopped it, its compute counted once."""
    def args(home: Path) -> list[str]:
        return ["run", "--experiment", "stop", "--budget", "200K", "--trials", "4", "--quick",
                "--data", "synthetic:steps=3000", "--workers", "2", "--storage", f"sqlite:///{home / 'study.db'}",
                "--checkpoint-dir", str(home / "checkpoints"), "--out", str(tmp_path / "o")]

    first, second = tmp_path / "lease1", tmp_path / "lease2"
    first.mkdir()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "archhpo", *args(first)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: any((first / "checkpoints").rglob("*.pt")), timeout=180), "an epoch was checkpointed"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    study = optuna.load_study(study_name="stop_200K", storage=f"sqlite:///{first / 'study.db'}")
    assert not [t for t in study.trials if t.state == TrialState.RUNNING], err
    assert any((first / "checkpoints").rglob("*.pt")), "the given-back trial keeps its checkpoint"

    second.mkdir()
    with closing(sqlite3.connect(first / "study.db")) as src, closing(sqlite3.connect(second / "study.db")) as dst:
        src.backup(dst)  # what `sqlite3 study.db ".backup copy.db"` does
    shutil.move(first / "checkpoints", second / "checkpoints")
    shutil.rmtree(first)
    res = run_cli(*args(second), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    study = optuna.load_study(study_name="stop_200K", storage=f"sqlite:///{second / 'study.db'}")
    slots = [t.user_attrs["plan_slot"] for t in study.trials]
    assert sorted(slots) == list(range(4)) and all(t.state.is_finished() for t in study.trials)
    resumed = [t for t in study.trials if "resumed_from_step" in t.user_attrs]
    # The trial whose epoch was checkpointed resumes after it; the other worker's may have been given
    # back inside its first epoch (resumed_from_epoch 0, resumed_from_step the steps it had taken).
    assert any(t.user_attrs["resumed_from_epoch"] >= 1 for t in resumed), res.stderr
    # Saved where the cancel stopped it (through Ray too): nothing was trained twice, all was counted.
    assert all(t.user_attrs["flops_spent"] == t.user_attrs["train_flops"] for t in resumed)
