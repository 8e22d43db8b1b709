"""A readable core: no function in the package is longer than 50 lines, no class longer than 300 and no module longer than 500.

The limits count every line from ``def``/``class`` (or its first decorator) to the last line,
docstrings and comments included, and every line of a module: split a longer function into named
steps, a longer class or module into parts.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = ("archhpo", "budgets", "cluster", "models", "report", "search", "workers")
MAX_LINES = 50
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 500
# The modules and classes over the limits today, each with its current length as a ceiling that may
# not grow: they are being split (issue 30), and each leaves its list when it is.  search/_queue.py
# and its TrialQueue were split (search/_upkeep.py, _rungs.py, _ranking.py, _tables.py).
MODULE_CEILINGS = {
}
CLASS_CEILINGS: dict[str, int] = {}


def _modules() -> list[Path]:
    return [path for folder in PACKAGE for path in sorted((REPO / folder).rglob("*.py"))]


def _lengths(kinds: tuple[type, ...]) -> list[tuple[Path, ast.AST, int]]:
    """(module, node, lines from its first decorator to its end) of every node of `kinds`."""
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, kinds):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                found.append((path, node, (node.end_lineno or node.lineno) - start + 1))
    return found


def _long_functions(limit: int) -> list[str]:
    return [f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)"
            for path, node, length in _lengths((ast.FunctionDef, ast.AsyncFunctionDef)) if length > limit]


def _long_classes(limit: int) -> dict[str, int]:
    return {f"{path.relative_to(REPO)}:{node.name}": length
            for path, node, length in _lengths((ast.ClassDef,)) if length > limit}


def _long_modules(limit: int) -> dict[str, int]:
    lengths = {str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in _modules()}
    return {name: n for name, n in lengths.items() if n > limit}


def test_no_function_is_longer_than_50_lines() -> None:
    assert _long_functions(MAX_LINES) == []


def test_the_scan_measures_functions() -> None:
    """The scan sees functions at all: with a limit of 1 line every function is reported."""
    assert len(_long_functions(1)) > 100


def test_no_class_is_longer_than_300_lines_but_those_being_split() -> None:
    long = _long_classes(MAX_CLASS_LINES)
    assert set(long) <= set(CLASS_CEILINGS), "a class crossed the limit"
    assert {k: n for k, n in long.items() if n > CLASS_CEILINGS[k]} == {}, "a class on the list grew"


def test_no_module_is_longer_than_500_lines_but_those_being_split() -> None:
    long = _long_modules(MAX_MODULE_LINES)
    assert not {"search/_queue.py", "search/_upkeep.py"} & set(MODULE_CEILINGS)
    assert set(long) <= set(MODULE_CEILINGS), "a module crossed the limit"
    assert {k: n for k, n in long.items() if n > MODULE_CEILINGS[k]} == {}, "a module on the list grew"


def test_the_scans_measure_classes_and_modules() -> None:
    """The scans see classes and modules at all: with a limit of 1 line each is reported."""
    assert len(_long_classes(1)) > 20 and len(_long_modules(1)) > 50
