"""search/'s modules import one another without circles, so each has one place in the order.

Every import counts: at module level, inside a function, and under ``if TYPE_CHECKING:`` (a
circle there is one a refactor or an annotation turns real).  The study's record (StudySettings,
search/_settings.py) sits at the bottom, below the launch, the queue, the upkeep and the rules that
all read it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from tests.conftest import REPO

SEARCH = REPO / "search"
PACKAGE = "archhpo.search"


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The search/ modules that `tree` imports anywhere (``from archhpo.search._x import``,
    ``from archhpo.search import _x``, ``import archhpo.search._x``, relative imports)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if base in (PACKAGE, "."):
                found |= {a.name for a in node.names if a.name in modules} or {"__init__"}
            elif base.startswith((PACKAGE + ".", ".")):
                found.add(base.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith(PACKAGE + ".")}
    return found & modules


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Module name -> the other modules of `sources` it imports."""
    names = set(sources)
    return {name: _imported(ast.parse(text), names) - {name} for name, text in sources.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle (a path returning to its start) per strongly connected group of modules."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []

        def visit(node: str, path: list[str] = path) -> list[str] | None:
            if node in path:
                return path[path.index(node):] + [node]
            if node in done:
                return None
            path.append(node)
            for nxt in sorted(graph[node]):
                circle = visit(nxt)
                if circle:
                    return circle
            path.pop()
            done.add(node)
            return None

        circle = visit(start)
        if circle:
            found.append(circle)
            done.update(circle)
    return found


def _search_sources() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(SEARCH.glob("*.py"))}


def test_search_imports_no_circle() -> None:
    circles = cycles(import_graph(_search_sources()))
    assert circles == [], "search/ imports in a circle: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_record_is_at_the_bottom_of_search() -> None:
    """StudySettings' module imports only the definitions its fields are made of, and the modules
    that read the record (launch, upkeep, rules, rankings) take it from there."""
    graph = import_graph(_search_sources())
    assert graph["_settings"] == {"_plan", "_space"}
    assert graph["_plan"] <= {"_space"} and graph["_space"] == set()
    assert all("_settings" in graph[m] for m in ("_study", "_upkeep", "_rules", "_ranking", "__init__"))


def test_a_circle_is_found_whatever_the_form_of_its_imports() -> None:
    """The scan sees function-level, TYPE_CHECKING, package-form and relative imports."""
    sources = {
        "_a": "def f():\n    from archhpo.search._b import x\n",
        "_b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from archhpo.search import _c\n",
        "_c": "from ._a import y\n",
        "_d": "import archhpo.search._a\n",
        "_e": "from archhpo.search._d import z\nfrom archhpo.models import get_family\n",
    }
    graph = import_graph(sources)
    assert graph == {"_a": {"_b"}, "_b": {"_c"}, "_c": {"_a"}, "_d": {"_a"}, "_e": {"_d"}}
    assert cycles(graph) == [["_a", "_b", "_c", "_a"]]
    assert cycles({**graph, "_c": set()}) == []
