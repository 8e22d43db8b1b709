"""docs/development.md's recipe "Adding a model family" stays true: its worked example, written out
file by file as the recipe shows and registered with the recipe's one line, passes every contract of
tests/models/test_family_contract.py, and its spec imports no torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RECIPE = "## Adding a model family"
BLOCK = re.compile(r"^```python\n# (models/[\w/]+\.py)([^\n]*)\n(.*?)^```", re.S | re.M)
REGISTRATION = re.compile(r'^\s*"(\w+)": "(archhpo\.models\.\w+)",\s*$', re.M)


def recipe_blocks(page: str, heading: str) -> dict[str, str]:
    """The recipe's code blocks under `heading`, by the file each names on its first line."""
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    return {path: body for path, _, body in BLOCK.findall(section)}


def test_the_recipe_names_its_files_in_order() -> None:
    blocks = recipe_blocks((REPO / "docs" / "development.md").read_text(encoding="utf-8"), RECIPE)
    assert list(blocks) == ["models/char_mean_spec.py", "models/char_mean.py", "models/__init__.py"]
    assert REGISTRATION.findall(blocks["models/__init__.py"]) == [("char_mean", "archhpo.models.char_mean_spec")]


def test_the_recipes_family_passes_every_family_contract(tmp_path: Path) -> None:
    blocks = recipe_blocks((REPO / "docs" / "development.md").read_text(encoding="utf-8"), RECIPE)
    (name, module), = REGISTRATION.findall(blocks.pop("models/__init__.py"))
    for path, body in blocks.items():
        (tmp_path / Path(path).name).write_text(body)
    # The scratch folder joins archhpo.models' search path, so "archhpo.models.char_mean" (the spec's
    # Lazy) resolves there; the family is registered as step 4 registers it, in _FAMILY_MODULES.
    script = (
        "import importlib, sys\n"
        "import archhpo.models as models\n"
        f"models.__path__.append({str(tmp_path)!r})\n"
        f"models._FAMILY_MODULES[{name!r}] = {module!r}\n"
        f"importlib.import_module({module!r})\n"
        "print('torch imported by the spec:', 'torch' in sys.modules)\n"
        "import pytest\n"
        "class Tally:\n"
        "    selected, passed = 0, 0\n"
        "    def pytest_collection_finish(self, session): Tally.selected = len(session.items)\n"
        "    def pytest_runtest_logreport(self, report): Tally.passed += report.when == 'call' and report.passed\n"
        f"code = pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/models/test_family_contract.py', '-k', {name!r}],"
        " plugins=[Tally()])\n"
        "print(f'contracts: {Tally.passed} of {Tally.selected} passed')\n"
        "sys.exit(code)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "torch imported by the spec: False" in out
    tally = re.search(r"contracts: (\d+) of (\d+) passed", out)
    assert tally and tally.group(1) == tally.group(2) and int(tally.group(2)) > 0, out[-2000:]
