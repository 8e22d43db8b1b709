"""The documentation a newcomer navigates: links resolve, the CLI reference is current, the README
stays short, and the code cites the design document of the repository (docs/design.md), not a
specification that lives elsewhere."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
PACKAGE_FOLDERS = ("archhpo", "budgets", "cluster", "models", "report", "search", "workers")
README_MAX_LINES = 300


def _links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


def _generator():  # noqa: ANN202 - the script's module
    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "scripts" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cli_reference", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^(https?:|mailto:|#)", target):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to missing files: {broken}"


def test_the_docs_have_pages() -> None:
    for name in ("index.md", "guide.md", "cli.md", "cluster.md", "gpu.md", "reports.md", "reproducibility.md",
                 "audits.md", "benchmarks.md", "design.md", "history.md"):
        assert (REPO / "docs" / name).is_file(), f"docs/{name} is missing"


def test_the_cli_reference_is_generated_from_the_option_table() -> None:
    expected = _generator().reference()
    current = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert current == expected, (
        "docs/cli.md is stale (the option table changed): regenerate it with "
        "`python scripts/cli_reference.py > docs/cli.md`"
    )


def test_the_readme_fits_a_few_screens() -> None:
    n = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move reference to docs/"


def test_code_cites_the_design_document_not_an_outside_spec() -> None:
    cited = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "SPEC §" in line:
                    cited.append(f"{path.relative_to(REPO)}:{n}")
    assert not cited, f"cite docs/design.md §N instead of SPEC §N: {cited}"
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    for n in range(1, 12):
        assert re.search(rf"^## {n}\. ", design, re.M), f"docs/design.md has no section §{n}"
