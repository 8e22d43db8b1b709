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

# Data flows one way, from the command line down to the models: a layer imports only layers below it.
# cli (archhpo/cli) -> cluster -> report -> search -> budgets -> workers -> models
LAYERS = {"cli": 0, "cluster": 1, "report": 2, "search": 3, "budgets": 4, "workers": 5, "models": 6}
FOLDERS = {"cli": REPO / "archhpo" / "cli", **{name: REPO / name for name in LAYERS if name != "cli"}}
ROOT_MODULES = ("errors", "schema", "config", "environment", "_io", "_urls")  # shared definitions every layer may import
# ... and which of them may import a layer: only the entry point (the command line's option table
# lives in archhpo/cli/_options.py; archhpo/config.py, the typed study config, imports no layer).
ROOT_IMPORTS = {"__main__.py": {"cli"}}


def _sources() -> list[Path]:
    return sorted({*(REPO / "archhpo").rglob("*.py"), *(p for d in FOLDERS.values() for p in d.rglob("*.py"))})


def _layer_of(path: Path) -> str | None:
    return next((name for name, folder in FOLDERS.items() if folder in path.parents), None)


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
    for sub in ("budgets", "cli", "cluster", "models", "models/data", "report", "search", "workers"):
        assert f"archhpo/{sub}/__init__.py" in names


def test_code_imports_only_through_the_archhpo_namespace() -> None:
    bare = [(p.relative_to(REPO), n) for p in _sources() for n in _imports(p)
            if n.split(".")[0] in LAYERS and n.split(".")[0] != "cli"]
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
    # A trial's stop (TrialStopped and its kin: TrialLost, GroupBroken) is control flow, not an error.
    user_facing = [n for n in errors.__all__ if not issubclass(getattr(errors, n), errors.TrialStopped)]
    for name in user_facing:
        assert issubclass(getattr(errors, name), errors.ArchhpoError), name


def test_imports_flow_one_way() -> None:
    wrong = []
    for p in _sources():
        layer = _layer_of(p)
        for name in _imports(p):
            parts = name.split(".")
            if parts[0] != "archhpo" or len(parts) < 2:
                continue
            if layer is None:  # the root package (errors, the lazy public API) imports no layer eagerly
                if parts[1] in LAYERS and parts[1] not in ROOT_IMPORTS.get(p.name, ()):
                    wrong.append((str(p.relative_to(REPO)), name))
                continue
            if parts[1] in LAYERS and parts[1] != layer and LAYERS[parts[1]] < LAYERS[layer]:
                wrong.append((str(p.relative_to(REPO)), name))
            elif parts[1] not in LAYERS and parts[1] not in ROOT_MODULES:
                wrong.append((str(p.relative_to(REPO)), name))
    assert wrong == []


def test_the_cluster_writes_no_results_and_search_reads_no_command_line() -> None:
    """Results are written by the command line (the cluster calls back; it imports no report), and
    the search layer takes nothing from the command line: the two arrows the layering once broke."""
    wrong = [(str(p.relative_to(REPO)), n) for p in _sources() for n in _imports(p)
             if (_layer_of(p) == "cluster" and n.startswith("archhpo.report"))
             or (_layer_of(p) == "search" and n.startswith("archhpo.cli"))]
    assert wrong == []


def test_only_the_command_line_reads_its_option_table() -> None:
    """search/ (and every layer below the command line) takes its defaults from archhpo.config."""
    wrong = [(str(p.relative_to(REPO)), n) for p in _sources() for n in _imports(p)
             if n.startswith("archhpo.cli") and _layer_of(p) not in ("cli", None)]
    assert wrong == []
    assert not (REPO / "archhpo" / "_options.py").exists()


def test_every_source_folder_is_a_layer_of_the_import_test() -> None:
    folders = {p.parent for p in REPO.glob("*/__init__.py")} | {p.parent for p in (REPO / "archhpo").glob("*/__init__.py")}
    layered = {REPO / "archhpo", *FOLDERS.values()}
    assert {f for f in folders if f.name not in ("tests", "bench")} - layered == set()


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


def test_a_run_refused_on_its_options_imports_neither_torch_nor_ray() -> None:
    """`archhpo run --threads 0` is refused by cluster/_options.py before run_workers' torch (and Ray)
    are imported (the package `archhpo.cluster` loads them on first use)."""
    code = ("import sys\nfrom archhpo.cli import main\ntry:\n    rc = main(['run', '--threads', '0'])\n"
            "except SystemExit as exc:\n    rc = exc.code\nprint(rc, 'torch' in sys.modules, 'ray' in sys.modules)\n"
            "import archhpo.cluster as c\nc.run_workers\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["2", "False", "False", "True"]
    assert "--threads must be at least 1, got 0." in out.stderr
