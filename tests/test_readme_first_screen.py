"""The README's first screen (everything before its Contents) keeps the question, the two commands
and what the demo prints; which machine printed which digits on which day, at which commit, lives
in docs/history.md."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIARY = {
    "a date": re.compile(r"\b20\d\d-\d\d(-\d\d)?\b"),
    "a commit": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "an issue": re.compile(r"\b[Ii]ssues? \d+"),
}


def first_screen(text: str) -> str:
    return text.split("## Contents")[0]


def diary_entries(text: str) -> list[str]:
    return [f"{what}: {m.group(0)}" for what, rx in DIARY.items() for m in rx.finditer(first_screen(text))]


def test_the_readme_opens_with_the_question_the_commands_and_the_demo_output() -> None:
    screen = first_screen((REPO / "README.md").read_text(encoding="utf-8"))
    assert "**What is the best transformer architecture" in screen
    assert "make demo " in screen and "make test " in screen
    assert re.search(r"^demo_75K-L2: .*best val_loss \d\.\d{4}$", screen, re.M)
    assert "\nscaling: " in screen and "\ncompute: " in screen


def test_the_first_screen_keeps_no_diary() -> None:
    assert diary_entries((REPO / "README.md").read_text(encoding="utf-8")) == [], "move dated runs to docs/history.md"


def test_the_diary_check_finds_dates_commits_and_issues() -> None:
    text = "1 min 36 s at cad580a on 2026-11-27 (issue 54's fit)\n## Contents\nlater: 8e17987 on 2026-11-29\n"
    assert diary_entries(text) == ["a date: 2026-11-27", "a commit: cad580a", "an issue: issue 54"]
