"""The light command line: --help, grid and params import neither torch, Ray nor Optuna.

Each command runs in a fresh interpreter (a subprocess), so modules imported by other tests do
not hide an import; the check reads ``sys.modules`` after ``archhpo.cli.main`` returns.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "optuna", "sqlalchemy")
_PROBE = f"""
import contextlib, io, json, sys
from archhpo.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as exc:  # --help exits from argparse
        rc = exc.code
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps({{"rc": rc, "heavy": heavy, "out": out.getvalue()}}))
"""

ARCH = ["--d-model", "64", "--n-layers", "2", "--n-heads", "4", "--d-ff", "128"]


def _probe(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["grid", "--help"],
    ["run", "--help"],
    ["run", "--family", "lm", "--help"],  # a family's own help (its --data forms) stays light
    ["train", "--help"],
    ["grid", "--budget", "500K"],
    ["grid", "--family", "signal", "--budget", "300K", "--format", "json"],
    ["params", *ARCH],
    ["params", "--family", "csn_transformer", *ARCH],
], ids=" ".join)
def test_light_commands_import_neither_torch_ray_nor_optuna(argv: list[str]) -> None:
    result = _probe(*argv)
    assert result["rc"] == 0
    assert result["out"]  # it printed the help, the grid or the count
    assert result["heavy"] == []


def test_params_without_torch_equals_the_built_modules_numel() -> None:
    """The count `params` prints without torch is the exact count of the module torch builds."""
    from archhpo.models import family_names, get_family

    for name in family_names():
        result = _probe("params", "--family", name, *ARCH, "--format", "json")
        family = get_family(name)
        config = family.config_cls(**json.loads(result["out"])["config"])
        model = family.build(config)
        assert json.loads(result["out"])["param_count"] == sum(p.numel() for p in model.parameters())
