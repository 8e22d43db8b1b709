"""docs/development.md's recipe "Adding a stopping rule" stays true: its worked example, run as the
page shows it, registers a rule that a study launches with, and the queue stops the trial it names
and only that one."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from archhpo.config import Pruning
from archhpo.schema import PRUNERS
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._rules import RULES, unregister_rule
from tests.conftest import TINY_DATA

PAGE = Path(__file__).resolve().parents[2] / "docs" / "development.md"
RECIPE = "## Adding a stopping rule"
WORKER = {"host": "test", "device": "cpu"}


def recipe_code() -> str:
    section = PAGE.read_text(encoding="utf-8").split(RECIPE, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 1, "the recipe shows one worked example"
    return blocks[0]


@pytest.fixture
def recipe_rule() -> Iterator[Any]:
    module = types.ModuleType("recipe_rule")  # the page's block, run as the module a user would write
    sys.modules[module.__name__] = module
    exec(compile(recipe_code(), str(PAGE), "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    rule = module.BehindTheBest
    try:
        yield rule
    finally:
        unregister_rule(rule.name)
        del sys.modules[module.__name__]
    assert rule.name not in RULES and rule.name not in PRUNERS


def test_the_recipes_rule_is_a_pruner_choice_once_registered(recipe_rule: Any) -> None:
    assert RULES["behind-best"] is recipe_rule and "behind-best" in PRUNERS
    assert Pruning(rule="behind-best").rule == "behind-best"


def test_a_study_launched_with_the_recipes_rule_stops_the_trial_behind_the_best(
        sqlite_url: str, recipe_rule: Any) -> None:
    s = prepare_settings("recipe", "500K", family="patchtst", data=TINY_DATA, quick=True, seed=0, n_trials=8,
                         pruner="behind-best")
    launch(sqlite_url, s)
    q = TrialQueue(sqlite_url, s.study_name)
    assert isinstance(q.rule, recipe_rule) and q.rule.margin == 0.1
    first = q.claim(WORKER)
    assert first is not None and not q.report(first, 1, 1.0), "no finished trial yet: nothing to trail"
    q.finish(first, TrialState.COMPLETE, 1.0, {})
    near, far = q.claim(WORKER), q.claim(WORKER)
    assert near is not None and far is not None
    assert not q.report(near, 1, 1.05), "5% behind the best at epoch 1: within the margin"
    assert q.report(far, 1, 1.2), "20% behind: stopped"
