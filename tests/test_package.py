"""The install is one `archhpo` namespace: no generic top-level modules in site-packages, one public
API with __all__, one errors module every layer uses, and imports that flow one way."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import archhpo
from tests.conftest import REPO

LAYERS = {"budgets": 0, "search": 1, "workers": 2, "models": 3}  # data flows budgets -> search -> workers -> models
ALLOWED = {  # (importer, imported) pairs that skip a layer downwards but never go back up
    ("budgets", "models"),
    ("search", "models"),
    ("search", "budgets"),
}


def _sources() -> list[Path]:
    return [p for d in ("archhpo", *LAYERS) for p in (REPO / d).rglob("*.py")]


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_wheel_installs_only_the_archhpo_package(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("archhpo-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"archhpo"}
    names = zipfile.ZipFile(wheel).namelist()
    for sub in ("budgets", "models", "models/data", "search", "workers"):
        assert f"archhpo/{sub}/__init__.py" in names


def test_code_imports_only_through_the_archhpo_namespace() -> None:
    bare = [(p.relative_to(REPO), n) for p in _sources() for n in _imports(p) if n.split(".")[0] in LAYERS]
    assert bare == []


def test_every_project_exception_lives_in_archhpo_errors() -> None:
    defined = []
    for p in _sources():
        if p == REPO / "archhpo" / "errors.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id.endswith("Error") for b in node.bases
            ):
                defined.append((p.relative_to(REPO), node.name))
    assert defined == []
    errors = importlib.import_module("archhpo.errors")
    user_facing = [n for n in errors.__all__ if not n.startswith("Trial")]  # Trial*: control flow
    for name in user_facing:
        assert issubclass(getattr(errors, name), errors.ArchhpoError), name


def test_imports_flow_one_way() -> None:
    wrong = []
    for p in _sources():
        layer = p.relative_to(REPO).parts[0]
        if layer not in LAYERS:
            continue
        for name in _imports(p):
            parts = name.split(".")
            if parts[0] != "archhpo" or len(parts) < 2 or parts[1] not in LAYERS or parts[1] == layer:
                continue
            target = parts[1]
            if LAYERS[target] < LAYERS[layer] and (layer, target) not in ALLOWED:
                wrong.append((str(p.relative_to(REPO)), name))
    assert wrong == []


def test_public_api_names_resolve() -> None:
    assert len(archhpo.__all__) == len(set(archhpo.__all__))
    for name in archhpo.__all__:
        assert getattr(archhpo, name) is not None, name
    with pytest.raises(AttributeError):
        archhpo.no_such_name  # noqa: B018


def test_import_archhpo_is_cheap_and_imports_no_ray() -> None:
    code = ("import sys, archhpo; print('ray' in sys.modules, 'torch' in sys.modules); "
            "archhpo.get_family, archhpo.Worker, archhpo.train; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False", "False"]
