"""The family contract is closed: no module outside models/ tells families apart by name.

What code outside models/ needs of a family (its --data help, the task options its data reads, a
sequence head's logits, the unit of its loss) is a field of ``Family`` (models/_family.py), set in
each models/NAME_spec.py.  A comparison with a registered family's name (``family == "lm"``,
``name in ("lm", ...)``), a dict keyed by one, a subscript or a ``match`` case on one would let a
new family silently miss that branch, so this test parses every package module outside models/
and fails on any of them.  The names are the registry's (``family_names()``), not a list here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from archhpo.models import family_names
from tests.conftest import REPO

# The package outside models/: its root and cli (archhpo/), and the layers installed under it.
OUTSIDE_MODELS = (REPO / "archhpo", *(REPO / name for name in ("budgets", "cluster", "report", "search", "workers")))


def _strings(node: ast.AST | None) -> Iterator[ast.Constant]:
    """The string constants of `node`, itself or the items of a tuple, list or set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _strings(item)


def _keyed_strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The strings `node` compares with, tests membership in, keys a dict or a subscript by, or
    matches a case on."""
    if isinstance(node, ast.Compare):
        for side in (node.left, *node.comparators):
            yield from _strings(side)
    elif isinstance(node, ast.Dict):
        for key in node.keys:
            yield from _strings(key)
    elif isinstance(node, ast.Subscript):
        yield from _strings(node.slice)
    elif isinstance(node, ast.MatchValue):
        yield from _strings(node.value)


def family_name_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every place in `source` that compares with or keys on one of `names`."""
    return sorted({(c.lineno, c.value) for node in ast.walk(ast.parse(source))
                   for c in _keyed_strings(node) if c.value in names})


def _package_modules() -> list[Path]:
    return sorted(p for folder in OUTSIDE_MODELS for p in folder.rglob("*.py"))


def test_no_module_outside_models_compares_a_family_name() -> None:
    names = set(family_names())
    found = [f"{path.relative_to(REPO)}:{line}: {name!r}" for path in _package_modules()
             for line, name in family_name_uses(path.read_text(encoding="utf-8"), names)]
    assert found == [], ("code outside models/ tells families apart by name; make the fact a Family "
                         "field (models/_family.py) set in each *_spec.py: " + "; ".join(found))


def test_the_scan_covers_the_package_outside_models() -> None:
    """The folders scanned hold the worker's batch plan, the report's units and the option table
    (the places that named families before), and none of models/."""
    scanned = {p.relative_to(REPO).as_posix() for p in _package_modules()}
    assert {"workers/_batch.py", "report/_units.py", "archhpo/cli/_options.py"} <= scanned
    assert not any(p.startswith("models/") for p in scanned)


def test_the_scan_finds_each_way_of_naming_a_family() -> None:
    """Each form the rule forbids is found, with its line; a name merely passed or printed is not."""
    source = "\n".join([
        'if family == "lm": pass',
        'ok = name in ("patchtst", "other")',
        'TABLE = {"signal": 1}',
        'x = table["char_cls"]',
        'match name:\n    case "ft_transformer": pass',
        'fam = get_family("lm"); print("lm"); default = "patchtst"',
        'if kind == "text": pass',
    ])
    assert family_name_uses(source, set(family_names())) == [
        (1, "lm"), (2, "patchtst"), (3, "signal"), (4, "char_cls"), (6, "ft_transformer")]
