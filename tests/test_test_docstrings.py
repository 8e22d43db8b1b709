"""Tests are named by behaviour: no test module, class or function docstring says which issue asked
for it, and no test's name carries an issue or part number or says only that something "works" (the
issues live in the tracker and the CHANGELOG, not in the code)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ISSUE = re.compile(r"\b[Ii]ssues? \d+")
# test_issue_42_x, test_part3, test_..._this_issue_touched, test_x_still_works, test_7: no behaviour named
NOT_A_BEHAVIOUR = re.compile(r"issues?_?\d|(^|_)part_?\d|this_issue|(^|_)(still_)?works$|^test_?\d+$")


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


def _test_names(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.name) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name.lower().startswith("test")]


def test_every_test_name_says_a_behaviour_not_an_issue() -> None:
    found = [f"{path.relative_to(TESTS.parent)}:{line}: {name}" for path in sorted(TESTS.rglob("*.py"))
             for line, name in _test_names(path) if NOT_A_BEHAVIOUR.search(name.lower())]
    assert found == [], "name the behaviour the test checks: " + "; ".join(found)


def test_the_name_check_tells_behaviours_from_issue_numbers(tmp_path: Path) -> None:
    sample = tmp_path / "test_x.py"
    names = ["test_issue_42_rungs", "test_part3", "test_scripts_this_issue_touched", "test_x_still_works", "test_7",
             "TestIssue12", "test_a_study_runs_in_parts_across_machines", "test_sigint_exits_130",
             "test_a_refused_launch_never_shows_any_part_of_the_password"]
    sample.write_text("".join(f"def {n}() -> None:\n    pass\n\n\n" for n in names))
    flagged = [name for _, name in _test_names(sample) if NOT_A_BEHAVIOUR.search(name.lower())]
    assert flagged == names[:6]
