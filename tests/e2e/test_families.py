"""Every family is searchable end to end (launch, worker and export on its synthetic data; `run`
through Ray for lm) and `archhpo train` reproduces a study's winner from its best JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import TINY_DATA, run_cli

# Small budgets and data so that a whole study takes seconds per trial on one core.
# family: (budget, its flags)
FAMILY_RUNS = {
    "ft_transformer": ("150K", ["--variant", "tabular", "--data", "synthetic:symbols=20,steps=120"]),
    "csn_transformer": ("400K", ["--data", "synthetic:symbols=20,steps=120"]),
    "char_cls": ("150K", ["--data", "synthetic:n=300"]),
    "signal": ("150K", ["--data", "multisignal:series=48"]),
    "lm": ("100K", ["--data", "synthetic:tokens=8000", "--seq-len", "16"]),
}


def _check_and_replay(family: str, url: str, out: Path, threads: int | None = None) -> None:
    """The study's outputs in `out` hold its trials, and its best JSON alone reproduces the winning
    trial exactly (same data, parameters, seeds and, on a CPU, the thread count it trained with)."""
    path = next(out.glob("fam_*_best.json"))
    best = json.loads(path.read_text())
    assert best["family"] == family and best["n_trials_completed"] >= 1
    assert best["architecture"]["param_count"] > 0
    rows = (out / "experiment_results.csv").read_text().strip().splitlines()
    assert len(rows) - 1 == best["n_trials_completed"] + best["n_trials_pruned"]
    import optuna

    winner = optuna.load_study(study_name=best["study_name"], storage=url).trials[best["best_trial"]]
    assert threads is None or winner.user_attrs["threads"] == threads
    res = run_cli("train", "--from", str(path), "--device", "cpu", "--threads", str(winner.user_attrs["threads"]),
                  timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    again = json.loads(res.stdout.strip().splitlines()[-1])
    assert again["param_count"] == best["architecture"]["param_count"]
    assert again["val_loss"] == best["best_value"]


# Every family through the plain-process path (launch, worker, export), which is what a family
# changes; `run`'s private Ray is the same loop in a Ray task, started once below for lm (the
# family of `make demo`): each Ray start costs CI about 10 s before any trial trains.
@pytest.mark.parametrize("family", list(FAMILY_RUNS))
def test_tiny_study_per_family(sqlite_url: str, family: str, tmp_path: Path) -> None:
    url = sqlite_url
    budget, flags = FAMILY_RUNS[family]
    common = ["--experiment", "fam", "--budget", budget, "--storage", url]
    res = run_cli("launch", "--family", family, *common, "--trials", "4", "--quick", "--pruner", "none", *flags,
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("worker", *common, "--threads", "1", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("export", "--experiment", "fam", "--storage", url, "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    _check_and_replay(family, url, tmp_path / "out", threads=1)


@pytest.mark.ray
def test_a_tiny_run_through_ray_replays_with_the_ray_workers_threads(sqlite_url: str, tmp_path: Path) -> None:
    budget, flags = FAMILY_RUNS["lm"]
    res = run_cli("run", "--family", "lm", "--experiment", "fam", "--budget", budget, "--trials", "4", "--quick",
                  "--workers", "2", "--storage", sqlite_url, "--out", str(tmp_path / "out"), "--pruner", "none",
                  *flags, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_and_replay("lm", sqlite_url, tmp_path / "out")


def test_train_from_best_json_reproduces_the_trial(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    common = ["--experiment", "rep", "--budget", "200K", "--storage", url]
    assert run_cli("launch", *common, "--trials", "4", "--quick", "--data", TINY_DATA,
                   "--pruner", "none").returncode == 0
    assert run_cli("worker", *common, "--threads", "1").returncode == 0
    assert run_cli("export", "--experiment", "rep", "--storage", url, "--out", str(tmp_path)).returncode == 0
    best = json.loads((tmp_path / "rep_200K_best.json").read_text())
    res = run_cli("train", "--from", str(tmp_path / "rep_200K_best.json"), "--device", "cpu", "--threads", "1",
                  "--save", str(tmp_path / "w.pt"))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["param_count"] == best["architecture"]["param_count"]
    assert out["val_loss"] == best["best_value"], "exactly the trial's value (see tests/workers/test_build.py)"
    assert (tmp_path / "w.pt").exists()


@pytest.mark.parametrize(("family", "flags"), [
    ("patchtst", ["--data", TINY_DATA]),
    ("ft_transformer", ["--variant", "sequence", "--data", "synthetic:symbols=10,steps=80", "--seq-len", "5"]),
    ("csn_transformer", ["--data", "synthetic:symbols=10,steps=120"]),
    ("char_cls", ["--data", "synthetic:n=200"]),
    ("signal", ["--encoder", "cat", "--data", "multisignal:series=16", "--channels", "4"]),
    ("lm", ["--data", "synthetic:tokens=4000", "--seq-len", "16"]),
])
def test_train_prints_one_json_line_of_metrics(family: str, flags: list[str]) -> None:
    res = run_cli("train", "--family", family, "--d-model", "32", "--n-layers", "1", "--n-heads", "4",
                  "--d-ff", "64", "--epochs", "1", "--quick", *flags)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    for key in ("val_loss", "train_loss", "param_count", "duration_s", "baseline_val_loss"):
        assert key in out
    if family == "char_cls":
        assert {"accuracy", "precision", "recall", "f1"} <= set(out)
    if family == "lm":
        # nats per token; the unigram baseline lies below the uniform ln(32)
        assert out["val_loss"] > 0 and 0 < out["baseline_val_loss"] < math.log(32) and "accuracy" in out


def test_train_needs_an_architecture_or_a_best_json(tmp_path: Path) -> None:
    res = run_cli("train", "--family", "patchtst", "--d-model", "64", cwd=tmp_path)
    assert res.returncode == 2 and "--n-layers" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("train", "--from", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert res.returncode == 2 and "does not exist" in res.stderr
