"""A refused line costs no heavy import: `archhpo train --from` a bad file and `launch --budget 2Q`
are refused before Optuna, SciPy, SQLAlchemy, Ray, Matplotlib, pandas or torch is imported, and
`train --help` imports none of Optuna, SciPy or Ray.

Each line runs in a fresh interpreter, so what other tests imported hides nothing; the probe reads
``sys.modules`` after ``archhpo.cli.main`` returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("optuna", "scipy", "sqlalchemy", "ray", "matplotlib", "pandas", "torch")
_PROBE = f"""
import contextlib, io, json, sys
from archhpo.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as exc:  # --help exits from argparse
        rc = exc.code
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print(json.dumps({{"rc": rc, "heavy": heavy, "err": err.getvalue()}}))
"""


def _probe(*argv: str, cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True,
                          cwd=cwd, timeout=300)
    return json.loads(done.stdout.splitlines()[-1])


def _bad_best(tmp_path: Path) -> Path:
    """A best JSON with a key archhpo never writes: refused by cli/_train_file.py's check."""
    path = tmp_path / "bad_best.json"
    path.write_text(json.dumps({"family": "lm", "architecture": {"d_model": 64}, "best_params": {"epochs": 1},
                                "not_a_key": 1}))
    return path


def test_train_from_a_bad_file_is_refused_before_any_heavy_import(tmp_path: Path) -> None:
    result = _probe("train", "--from", str(_bad_best(tmp_path)), cwd=tmp_path)
    assert result["rc"] == 2
    assert "unknown key not_a_key" in result["err"]
    assert result["heavy"] == []


def test_train_from_a_missing_file_is_refused_before_any_heavy_import(tmp_path: Path) -> None:
    result = _probe("train", "--from", str(tmp_path / "none_best.json"), cwd=tmp_path)
    assert result["rc"] == 2
    assert "does not exist" in result["err"]
    assert result["heavy"] == []


@pytest.mark.parametrize("command", ["launch", "run"])
def test_a_bad_budget_is_refused_before_any_heavy_import(tmp_path: Path, command: str) -> None:
    result = _probe(command, "--experiment", "x", "--budget", "2Q", cwd=tmp_path)
    assert result["rc"] == 2
    assert "Cannot read budget '2Q'" in result["err"]
    assert result["heavy"] == []
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_launch_without_an_experiment_is_refused_before_any_heavy_import(tmp_path: Path) -> None:
    result = _probe("launch", "--budget", "2M", cwd=tmp_path)
    assert result["rc"] == 2
    assert "--experiment is required" in result["err"]
    assert result["heavy"] == []


def test_a_worker_naming_no_study_is_refused_before_any_heavy_import(tmp_path: Path) -> None:
    result = _probe("worker", "--budget", "2M", cwd=tmp_path)
    assert result["rc"] == 2
    assert "only together with --experiment" in result["err"]
    assert result["heavy"] == []


def test_train_help_imports_neither_optuna_scipy_nor_ray(tmp_path: Path) -> None:
    result = _probe("train", "--help", cwd=tmp_path)
    assert result["rc"] == 0
    assert not {"optuna", "scipy", "ray"} & set(result["heavy"])


def test_the_search_package_imports_a_module_without_the_others() -> None:
    """`archhpo.search._queue` (the worker's queue) loads without SciPy, pandas or Matplotlib:
    the package's names come on first use and the learning-rate fit imports SciPy when it fits."""
    code = ("import sys, archhpo.search._queue as q, archhpo.search as s\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'pandas', 'matplotlib', 'ray'}))\n"
            "print(s.TrialQueue is q.TrialQueue, s._lrfit.fit_lr_exponent is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split("\n")[:2] == ["[]", "True True"]
