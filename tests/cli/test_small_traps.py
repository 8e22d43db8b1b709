"""Small traps a new user met: a name with a trailing newline, a budget given twice, a default
learning-rate range beside the family's own rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from archhpo.config import check_experiment
from archhpo.errors import StudyError
from archhpo.models import family_names, get_family
from archhpo.search import launch, prepare_settings
from archhpo.search._space import FULL_SPACE, QUICK_SPACE
from tests.cli.test_cli_errors import _assert_clean_failure
from tests.conftest import run_cli


@pytest.mark.parametrize("name", ["demo\n", "demo\r\n", "\ndemo", "de\nmo"])
def test_an_experiment_name_with_a_newline_is_refused(name: str) -> None:
    with pytest.raises(StudyError, match="must start with a letter or digit"):
        check_experiment(name)


def test_an_experiment_name_without_a_newline_is_accepted() -> None:
    assert check_experiment("demo_2.b-1") == "demo_2.b-1"


@pytest.mark.parametrize("second", ["75K", "75000", "75k"])
def test_a_budget_given_twice_is_refused_before_anything_is_written(tmp_path: Path, second: str) -> None:
    res = run_cli("launch", "--experiment", "x", "--quick", "--family", "lm", "--budget", "75K", "--budget", second,
                  "--budget", "100K", cwd=tmp_path)
    _assert_clean_failure(res, tmp_path, f"--budget {second} is given twice", "give each budget once")


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("family", family_names())
def test_the_default_learning_rate_range_brackets_the_familys_own_rate(family: str, quick: bool) -> None:
    rate = get_family(family).train_defaults.get("learning_rate")
    base = QUICK_SPACE if quick else FULL_SPACE
    lo, hi = base.bracketing(rate).learning_rate
    if rate is not None:
        assert lo <= rate <= hi
        assert hi / lo == pytest.approx(base.learning_rate[1] / base.learning_rate[0])  # the width is kept
    if rate is None or base.learning_rate[0] <= rate <= base.learning_rate[1]:
        assert (lo, hi) == base.learning_rate  # a rate already inside leaves the range as it was


def test_an_lm_study_searches_around_its_own_rate(tmp_path: Path) -> None:
    settings = prepare_settings("lr", "100K", family="lm", data="synthetic:tokens=20000", quick=True, n_trials=4)
    lo, hi = settings.space["learning_rate"]
    assert lo < 3e-3 < hi
    assert all(lo <= e.params["learning_rate"] <= hi for e in settings.plan if e.params)


def test_a_study_planned_on_the_old_lm_range_relaunches_with_the_same_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    new = prepare_settings("old", "100K", family="lm", data="synthetic:tokens=20000", quick=True, n_trials=4)
    before = list(QUICK_SPACE.learning_rate)  # what the study stored when it was launched
    old = type(new)(**{**new.__dict__, "space": {**new.space, "learning_rate": before}})
    launch(url, old)
    again = launch(url, new)  # refused before the range moved: "space.learning_rate: stored ..., now ..."
    assert again is not None
    from archhpo.search._storage import open_storage
    from archhpo.search._study import StudySettings, load_study

    study = load_study(open_storage(url), new.study_name)
    assert StudySettings.from_attrs(study.user_attrs, new.study_name).space["learning_rate"] == before


def test_the_readme_says_how_to_reach_archhpo_after_make_demo() -> None:
    root = Path(__file__).resolve().parents[2]
    venv = next(line.split("?=")[1].strip() for line in (root / "Makefile").read_text().splitlines()
                if line.startswith("VENV ?="))
    first_screen = (root / "README.md").read_text().split("## Contents")[0]
    assert f"source {venv}/bin/activate" in first_screen and f"{venv}/bin/archhpo" in first_screen
