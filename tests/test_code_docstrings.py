"""The rule in the code, the evidence in the docs: every docstring of the package says what and why
in at most MAX_LINES lines, and names no date, no issue and no ground truth (T1, T2, ...).  The dated
runs, their figures and the truths they were measured on live in docs/searching.md, docs/design.md
and docs/history.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = ("archhpo", "budgets", "cluster", "models", "report", "search", "workers")
MAX_LINES = 15
FORBIDDEN = {
    "a date": re.compile(r"\b20\d\d-\d\d(-\d\d)?\b"),
    "an issue": re.compile(r"\b[Ii]ssues? \d+"),
    "a ground truth": re.compile(r"(?<!Tesla )\bT[1-9]\b"),  # T1's 400K, not an NVIDIA Tesla T4
}


def _docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, docstring) of the module and of every class and function in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))]
    found = [(getattr(node, "lineno", 1), ast.get_docstring(node)) for node in nodes]
    return [(line, doc) for line, doc in found if doc]


def problems(path: Path) -> list[str]:
    """What is wrong with each docstring of `path`: too long, or naming a date, issue or truth."""
    out = []
    for line, doc in _docstrings(path):
        n = len(doc.splitlines())
        if n > MAX_LINES:
            out.append(f"{line}: {n} lines (at most {MAX_LINES})")
        out += [f"{line}: names {what} ({m.group(0)!r})" for what, rx in FORBIDDEN.items() if (m := rx.search(doc))]
    return out


def test_no_package_docstring_is_long_or_names_a_date_an_issue_or_a_truth() -> None:
    found = [f"{path.relative_to(REPO)}:{p}" for folder in PACKAGE
             for path in sorted((REPO / folder).rglob("*.py")) for p in problems(path)]
    assert found == [], "say what and why in the code; move dates, issues and run figures to docs/: " + "; ".join(found)


@pytest.mark.parametrize(("doc", "expected"), [
    ('"""Fine: what and why."""', []),
    ('"""Decided on 2026-11-28."""', ["1: names a date ('2026-11-28')"]),
    ('"""Asked for in issue 31."""', ["1: names an issue ('issue 31')"]),
    ('"""T1\'s 200K chose it."""', ["1: names a ground truth ('T1')"]),
    ('"""No bf16 tensor cores: V100, Tesla T4."""', []),
    ('"""' + "\n".join(f"line {i}" for i in range(MAX_LINES)) + '"""', []),
    ('"""' + "\n".join(f"line {i}" for i in range(MAX_LINES + 1)) + '"""', [f"1: {MAX_LINES + 1} lines (at most 15)"]),
])
def test_the_check_reads_module_docstrings(tmp_path: Path, doc: str, expected: list[str]) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(doc + "\n")
    assert problems(sample) == expected


def test_the_check_reads_functions_and_classes(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('class A:\n    """Issue 4."""\n\n    def f(self) -> None:\n        """On 2026-12-01."""\n')
    assert problems(sample) == ["1: names an issue ('Issue 4')", "4: names a date ('2026-12-01')"]
