"""A study setting is declared once (archhpo/config.py): a toy setting added through its declaration
alone is a flag of `launch --help`, a key of an experiment file, a key of the stored study, and a
relaunch with another value is refused by the identity check; and every option's help is one line.
This is the worked example of docs/development.md, "Adding a study setting"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from archhpo.cli._main import main
from archhpo.cli._options import all_options, family_options
from archhpo.config import Setting, StoredOptions, declared, register_setting, unregister_setting
from archhpo.models import family_names, get_family
from tests.conftest import TINY_DATA

TOY = "toy_width"
TOY_HELP = "a toy setting: a width every trial would read"
MAX_HELP = 100  # columns of one --help line's text


@pytest.fixture
def toy() -> Iterator[None]:
    """The toy setting declared for one test (an int, default 0, stored under its name)."""
    register_setting(TOY, 0, int, Setting(TOY_HELP, parse=int, stored=TOY, metavar="W",
                                          check=lambda v: None if v >= 0 else f"--toy-width must be 0 or more, got {v}."))
    try:
        yield
    finally:
        unregister_setting(TOY)


def _toml(path: Path, storage: str, **extra: object) -> Path:
    lines = ['experiment = "toy"', 'budget = ["200K"]', "trials = 3", "quick = true", f'data = "{TINY_DATA}"',
             f'storage = "{storage}"', *(f"{k} = {v}" for k, v in extra.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_toy_setting_is_in_help_file_stored_study_and_identity(
        toy: None, tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    assert f"--toy-width W {TOY_HELP} (default 0)" in " ".join(capsys.readouterr().out.split())
    cfg = _toml(tmp_path / "study.toml", sqlite_url, toy_width=3)
    assert main(["launch", "--config", str(cfg)]) == 0
    stored = optuna.load_study(study_name="toy_200K", storage=sqlite_url).user_attrs["archhpo_options"]
    assert stored[TOY] == 3 and list(stored)[-1] == TOY, "stored, after every key older studies hold"
    assert StoredOptions.from_dict(stored).as_dict() == stored
    capsys.readouterr()
    assert main(["launch", "--config", str(cfg)]) == 0, "the same file relaunches the study"
    assert "reloaded study toy_200K" in capsys.readouterr().err
    assert main(["launch", "--config", str(cfg), "--toy-width", "4"]) == 2
    assert f"options.{TOY}: stored 3, now 4" in capsys.readouterr().err
    assert main(["launch", "--config", str(cfg), "--toy-width", "-1"]) == 2
    assert "--toy-width must be 0 or more, got -1." in capsys.readouterr().err


def test_a_setting_at_its_default_is_not_stored(toy: None, tmp_path: Path, sqlite_url: str) -> None:
    """A new setting left at its default leaves a study's stored options, and so its identity, as
    they were before it existed."""
    assert main(["launch", "--config", str(_toml(tmp_path / "plain.toml", sqlite_url))]) == 0
    stored = optuna.load_study(study_name="toy_200K", storage=sqlite_url).user_attrs["archhpo_options"]
    assert TOY not in stored
    assert not {"parametrization", "mup_base_width", "ranks_per_trial", "shard"} & set(stored)


def test_a_registered_setting_is_gone_once_removed(toy: None) -> None:
    assert TOY in {d.option for d in declared()}
    unregister_setting(TOY)
    try:
        assert TOY not in {d.option for d in declared()} and TOY not in {o.name for o in all_options()}
    finally:
        register_setting(TOY, 0, int, Setting(TOY_HELP, parse=int, stored=TOY))


def test_every_option_help_is_one_line() -> None:
    """Every --help text is one line of at most MAX_HELP columns; the detail is in docs/guide.md."""
    long = [f"--{o.name}: {len(o.help)}" for o in all_options() if "\n" in o.help or len(o.help) > MAX_HELP]
    long += [f"{name} --{o.name}: {len(o.help)}" for name in family_names()
             for o in family_options(get_family(name)) if "\n" in o.help or len(o.help) > MAX_HELP]
    assert long == []


@pytest.mark.parametrize(("values", "sentence"), [
    ({"parametrization": "mup", "mup_base_width": 0}, "--mup-base-width must be at least 1, got 0."),
    ({"parametrization": "mup", "mup_base_depth": 0}, "--mup-base-depth must be at least 1, got 0."),
    ({"ranks_per_trial": 0}, "--ranks-per-trial must be at least 1, got 0."),
])
def test_the_new_settings_refuse_what_cannot_be_used(values: dict[str, object], sentence: str) -> None:
    from archhpo.config import StudyConfig
    from archhpo.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        StudyConfig.from_options({"experiment": "e", **values})
    assert str(info.value) == sentence


def test_mup_base_width_needs_mup_and_the_new_settings_are_stored_when_set() -> None:
    from archhpo.config import StudyConfig
    from archhpo.errors import StudyError
    from archhpo.search._study import prepare_settings

    with pytest.raises(StudyError, match="needs --parametrization mup"):
        StudyConfig.from_options({"experiment": "e", "mup_base_width": 64}, given=["mup_base_width"])
    with pytest.raises(StudyError, match="--mup-base-depth sets CompleteP's base depth under µP, so it needs"):
        StudyConfig.from_options({"experiment": "e", "mup_base_depth": 2}, given=["mup_base_depth"])
    stated: dict[str, Any] = {"parametrization": "mup", "mup_base_width": 64, "ranks_per_trial": 2, "shard": "fsdp"}
    settings = prepare_settings("e", "200K", n_trials=3, quick=True, family="lm", **stated)  # µP: lm only
    options = settings.options
    assert {k: v for k, v in options.as_dict().items() if k in stated} == stated
    assert (options.parametrization, options.mup_base_width, options.ranks_per_trial, options.shard) == (
        "mup", 64, 2, "fsdp")
    plain = StoredOptions.from_dict({"horizon": 1, "threshold": 0.01, "quick": False, "seed": 0})
    assert (plain.parametrization, plain.mup_base_width, plain.ranks_per_trial, plain.shard) == ("sp", None, 1, "auto")
