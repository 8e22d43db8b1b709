"""Tests are named by behaviour: no test module, class or function docstring says which issue asked
for it (the issues live in the tracker and the CHANGELOG, not in the code)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ISSUE = re.compile(r"\b[Ii]ssues? \d+")


def _docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))]
    out = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            out.append((getattr(node, "lineno", 1), doc))
    return out


def test_no_test_docstring_names_an_issue() -> None:
    found = [f"{path.relative_to(TESTS.parent)}:{line}: {ISSUE.search(doc).group(0)}"  # type: ignore[union-attr]
             for path in sorted(TESTS.rglob("*.py")) for line, doc in _docstrings(path) if ISSUE.search(doc)]
    assert found == [], "say what the test checks, not which issue asked for it"


def test_the_check_finds_an_issue_number(tmp_path: Path) -> None:
    sample = tmp_path / "test_x.py"
    sample.write_text('"""Issue 12 part 3: a thing."""\n\n\ndef test_y() -> None:\n    """Fine."""\n')
    assert [ISSUE.search(d) is not None for _, d in _docstrings(sample)] == [True, False]
