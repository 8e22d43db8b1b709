"""The typed study config (archhpo/config.py): its defaults are the command line's, each check
refuses with one sentence, experiment files still work, and a study written before it (a fixture
of the user attributes `launch` stored at 31efe33) still loads and relaunches identically."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from archhpo.cli._main import main
from archhpo.cli._options import OPTIONS, default
from archhpo.config import (
    LADDER,
    Confirm,
    Data,
    Pruning,
    Schedule,
    StudyConfig,
    family_options_class,
    family_options_of,
    field_default,
    field_doc,
    field_help,
    option_fields,
)
from archhpo.environment import Environment
from archhpo.errors import ArchhpoError, ConfigError
from archhpo.models import get_family
from archhpo.schema import LADDER_CONFIRM_SEEDS, LADDER_FINALISTS
from archhpo.search._study import StudySettings, keyword_config, prepare_settings
from tests.conftest import REPO, TINY_DATA

FIXTURE = Path(__file__).parent / "data" / "study_attrs_v1.json"


def _archhpo_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return {m for m in modules if m.startswith("archhpo")}


def test_config_sits_on_the_ground_floor() -> None:
    """archhpo/config.py and the parts it is split into (its sections, the declaration of a setting,
    the stored form, a family's options) import only archhpo.schema, archhpo.errors and each other."""
    parts = {"archhpo._isoflop_config", "archhpo._sections", "archhpo._setting", "archhpo._stored",
             "archhpo._family_options"}
    assert _archhpo_imports(REPO / "archhpo" / "config.py") == {"archhpo.schema", "archhpo.errors", *parts}
    for part in parts:
        found = _archhpo_imports(REPO / "archhpo" / f"{part.removeprefix('archhpo.')}.py")
        assert found <= {"archhpo.schema", "archhpo.errors", *parts}, part


def test_defaults_and_help_are_the_command_lines() -> None:
    by_name = {o.name: o for o in OPTIONS}
    for name in option_fields():
        o = by_name[name]
        assert o.help == field_help(name) != "", name
        if name not in ("experiment", "budget", "tokens_per_param", "samples_per_param", "isoflop", "centre"):  # no default shown
            assert o.default == field_default(name) == default(name), name
    config = StudyConfig("e")
    assert (config.trials, config.family, config.pruning.rule, config.schedule.name) == (
        default("trials"), default("family"), default("pruner"), default("schedule"))


def test_the_models_layers_fallbacks_agree_with_the_config() -> None:
    """budgets/ and models/ keep their own fallback constants; they must equal the config's."""
    from archhpo.budgets import DEFAULT_TOLERANCE
    from archhpo.models.data.timeseries import DEFAULT_HORIZON, DEFAULT_THRESHOLD

    assert (field_default("tolerance"), field_default("horizon"), field_default("threshold")) == (
        DEFAULT_TOLERANCE, DEFAULT_HORIZON, DEFAULT_THRESHOLD)


def test_every_field_has_its_docstring() -> None:
    for cls in (StudyConfig, Data, Pruning, Schedule, Confirm, Environment):
        for f in dataclasses.fields(cls):
            assert field_doc(cls, f.name), f"{cls.__name__}.{f.name} has no docstring"


@pytest.mark.parametrize(("build", "sentence"), [
    (lambda: StudyConfig("bad name"), "Experiment name 'bad name' must start with a letter or digit"),
    (lambda: StudyConfig("e", tolerance=1.5), "Tolerance 1.5 must lie between 0 and 1"),
    (lambda: StudyConfig("e", horizon=0), "--horizon must be at least 1 step, got 0."),
    (lambda: StudyConfig("e", paired_seeds=-1), "--paired-seeds and --confirm must be 0 (off) or positive."),
    (lambda: StudyConfig("e", paired_seeds=2, confirm=Confirm(1)), "A paired study already trains every"),
    (lambda: StudyConfig("e", trials="5"), "trials must be int, got '5'."),
    (lambda: StudyConfig("e", pins={"depth": 3}), "Cannot pin 'depth'; pin one of: d_model"),
    (lambda: StudyConfig("e", fixed_params={"lr": 0.1}), "--lr is not a training parameter"),
    (lambda: StudyConfig("e", fixed_params={"epochs": 2.5}), "--epochs must be int, got 2.5."),
    (lambda: StudyConfig("e", ladder=True, budgets=("2M",)), "--ladder needs at least two --budget values"),
    (lambda: StudyConfig("e", given=frozenset({"seeds"})), "--seeds S counts only with --confirm K"),
    (lambda: StudyConfig("e", given=frozenset({"cooldown"})), "--cooldown counts only with --schedule wsd"),
    (lambda: StudyConfig("e", given=frozenset({"eta"})), "--eta counts only with --pruner halving"),
    (lambda: StudyConfig("e", confirm=Confirm(2, sequential=True), given=frozenset({"confirm", "sequential_confirm"})),
     "--sequential-confirm decides the finalists after the 2 best, so it needs --confirm 3 or more"),
    (lambda: StudyConfig("e", given=frozenset({"min_fraction"})), "--min-fraction counts only with --pruner"),
    (lambda: StudyConfig("e", given=frozenset({"trust_each_budget"})), "--trust-each-budget measures the rungs' "
                                                                      "trust on a ladder's budgets, so it needs --ladder"),
    (lambda: StudyConfig("e", ladder=True, budgets=("2M", "5M"), pruning=Pruning("median"),
                         given=frozenset({"pruner", "trust_each_budget"})), "--trust-each-budget measures"),
    (lambda: Pruning("greedy"), "Unknown pruner 'greedy'; choose one of: median, halving, none."),
    (lambda: Schedule("wsd", 1.0), "Unknown schedule 'wsd' or cooldown 1.0 outside [0, 1)"),
    (lambda: Confirm(-1), "--paired-seeds and --confirm must be 0 (off) or positive."),
    (lambda: Confirm(2, seeds=0), "--seeds must be at least 1 with --confirm, got 0."),
    (lambda: StudyConfig("e", confirm=Confirm(0, baselines=True)), "--baselines compares rule-picked shapes"),
    (lambda: StudyConfig("e", ladder=True, budgets=("2M", "5M"), confirm=Confirm(0, baselines=True),
                         given=frozenset({"confirm"})), "--baselines compares rule-picked shapes"),
    (lambda: Data(tokens_per_param=(20,), samples_per_param=(20,)), "Give --tokens-per-param or --samples-per"),
    (lambda: Data(tokens_per_param=(20, 20.0)), "A data ratio is listed twice (20, 20); give each R once."),
    (lambda: StudyConfig("e", family="lm", family_options=family_options_of("signal", get_family("signal").flags,
                                                                            {})), "options of the signal family"),
    (lambda: family_options_of("lm", get_family("lm").flags, {"encoder": "sum"}), "--encoder is not a flag of the lm"),
    (lambda: family_options_of("lm", get_family("lm").flags, {"seq_len": "16"}), "--seq-len of the lm family must be"),
    (lambda: StudyConfig("e", param_ranges={"epochs": (2, 4)}), "--epochs takes one value, not a range: only "
                                                                 "--learning-rate, --weight-decay take LO:HI."),
    (lambda: StudyConfig("e", param_ranges={"learning_rate": (3e-2, 1e-3)}),
     "--learning-rate 0.03:0.001: a range needs 0 < LO < HI (a log-uniform range), e.g. --learning-rate 1e-3:3e-2."),
    (lambda: StudyConfig("e", param_ranges={"weight_decay": (0.0, 1e-3)}), "--weight-decay 0:0.001: a range needs"),
    (lambda: StudyConfig("e", param_ranges={"learning_rate": (1e-3, 3e-2)}, fixed_params={"learning_rate": 3e-3}),
     "--learning-rate is both fixed and given a range; give one value or LO:HI, not both."),
    (lambda: StudyConfig("e", paired_seeds=3, param_ranges={"learning_rate": (1e-3, 3e-2)}),
     "A paired study (--paired-seeds) trains one set of training parameters, so --learning-rate takes one value"),
])
def test_each_check_raises_its_sentence(build: Any, sentence: str) -> None:
    with pytest.raises(ArchhpoError) as exc:
        build()
    assert sentence in str(exc.value)
    assert str(exc.value).endswith(".")


def test_family_options_are_typed_per_family() -> None:
    fam = get_family("signal")
    cls = family_options_class("signal", tuple(fam.flags))
    assert dataclasses.is_dataclass(cls) and cls.FAMILY == "signal"
    opts = cls(encoder=["sum", "linear"], dropout=0)  # an int is a float; a list is a grid dimension
    assert opts.given() == {"encoder": ["sum", "linear"], "dropout": 0}
    assert opts.values()["channels"] == next(f.default for f in fam.flags if f.name == "channels")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.encoder = "sum"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError):
        cls(channels=True)
    cards = family_options_of("ft_transformer", get_family("ft_transformer").flags, {"cat_cardinalities": (3, 4)})
    assert cards.given() == {"cat_cardinalities": (3, 4)}  # a parsing type: the family checks it


def test_from_options_splits_sections_and_ratios() -> None:
    config = StudyConfig.from_options({"experiment": "e", "budget": ["2M", "20M"], "pruner": "halving", "eta": 4,
                                       "tokens_per_param": [10, 20], "d_model": [64], "epochs": 3, "seeds": None,
                                       "family": "lm"}, given=["eta"])
    assert config.budgets == ("2M", "20M") and config.pruning == Pruning("halving", 4, confirm_at_rung=False,
                                                                                      carry_finalists=False)
    assert config.pins == {"d_model": (64,)} and config.fixed_params == {"epochs": 3}
    assert config.confirm.seeds == 3 and config.given == {"eta"}
    assert [c.data.ratio for c in config.per_ratio()] == [(10.0, None), (20.0, None)]
    with pytest.raises(ArchhpoError, match="one data ratio"):
        _ = config.data.ratio


def test_the_keyword_form_plans_what_the_config_plans() -> None:
    lm_data = "synthetic:tokens=100000"
    kw = dict(family="lm", data=lm_data, quick=True, n_trials=3, pruner="halving", schedule="wsd", seed=2)
    config = StudyConfig("kw", family="lm", data=Data(lm_data), quick=True, trials=3,
                         pruning=Pruning("halving"), schedule=Schedule("wsd"), seed=2)
    assert keyword_config("kw", **kw) == config
    assert prepare_settings("kw", "100K", **kw) == prepare_settings(config, "100K")
    with pytest.raises(TypeError):
        keyword_config("kw", n_trails=3)
    with pytest.raises(TypeError):
        prepare_settings(config, "100K", quick=False)


def test_environment_is_read_once_into_one_object() -> None:
    env = Environment.read({"ARCHHPO_CHECKPOINT_DIR": "/ck", "ARCHHPO_STORAGE": ""})
    assert env.checkpoint_dir == "/ck" and env.storage is None
    assert env.value("ARCHHPO_CHECKPOINT_DIR") == "/ck"
    checkpoint = next(o for o in OPTIONS if o.name == "checkpoint_dir")
    assert checkpoint.default_for("worker", env) == "/ck"
    assert checkpoint.default_for("worker", Environment()) == "checkpoints"


def test_an_experiment_file_still_builds_the_study(tmp_path: Path, sqlite_url: str) -> None:
    cfg = tmp_path / "study.toml"
    cfg.write_text(f'experiment = "toml"\nbudget = ["200K"]\nfamily = "patchtst"\ntrials = 4\nquick = true\n'
                   f'data = "{TINY_DATA}"\npruner = "halving"\neta = 2\nmin-fraction = "1/2"\nstorage = "{sqlite_url}"\n')
    assert main(["launch", "--config", str(cfg)]) == 0
    attrs = optuna.load_study(study_name="toml_200K", storage=sqlite_url).user_attrs
    assert attrs["archhpo_options"]["halving"] == {"eta": 2, "min_fraction": "1/2"}
    assert attrs["archhpo_n_trials"] == 4 and attrs["archhpo_pruner"] == "halving"
    cfg.write_text(cfg.read_text().replace('pruner = "halving"', 'pruner = "median"'))
    assert main(["launch", "--config", str(cfg)]) == 2  # --eta without halving: refused, one sentence


def test_a_study_written_before_the_config_loads_and_relaunches_identically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixture = json.loads(FIXTURE.read_text())
    attrs, name = fixture["user_attrs"], fixture["study_name"]
    stored = StudySettings.from_attrs(attrs, name)
    assert stored.study_name == name and stored.to_attrs() == attrs
    assert [e.as_dict() for e in stored.plan] == attrs["archhpo_plan"]
    url = f"sqlite:///{tmp_path / 'old.db'}"
    study = optuna.create_study(study_name=name, storage=url)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    assert main([*fixture["launch"], "--storage", url]) == 0
    err = capsys.readouterr().err
    assert f"reloaded study {name}" in err and "differen" not in err
    assert optuna.load_study(study_name=name, storage=url).user_attrs == attrs  # nothing rewritten


def test_a_ladder_takes_baselines_without_confirm_as_it_confirms_by_default() -> None:
    ladder = StudyConfig.from_options({"experiment": "e", "budget": ["200K", "500K"], "ladder": True, "baselines": True},
                                      given=["ladder", "budget", "baselines"])
    assert (ladder.confirm.top, ladder.confirm.seeds, ladder.confirm.baselines) == (LADDER_FINALISTS,
                                                                                     LADDER_CONFIRM_SEEDS, True)


def test_a_ladder_confirms_its_finalists_unless_confirm_or_seeds_is_stated() -> None:
    budgets = {"experiment": "e", "budget": ["200K", "500K"], "ladder": True, "seeds": 3}  # --seeds' default
    ladder = StudyConfig.from_options(budgets, given=["ladder", "budget"])
    assert (ladder.confirm.top, ladder.confirm.seeds) == (LADDER_FINALISTS, LADDER_CONFIRM_SEEDS) == (3, 1)
    off = StudyConfig.from_options({**budgets, "confirm": 0}, given=["ladder", "budget", "confirm"])
    assert off.confirm == Confirm(), "--confirm 0 stated: no confirmation"
    seeds = StudyConfig.from_options({**budgets, "seeds": 5}, given=["ladder", "budget", "seeds"])
    assert (seeds.confirm.top, seeds.confirm.seeds) == (LADDER_FINALISTS, 5), "--seeds stated wins"
    three = StudyConfig.from_options({**budgets, "confirm": 3}, given=["ladder", "budget", "confirm"])
    assert (three.confirm.top, three.confirm.seeds) == (3, 3), "--confirm stated: --seeds keeps its default"
    assert ladder.confirm.sequential and seeds.confirm.sequential, "the default confirmation goes in two waves"
    assert not three.confirm.sequential, "--confirm stated: every finalist at once unless --sequential-confirm"
    both = StudyConfig.from_options({**budgets, "confirm": 4, "sequential_confirm": True},
                                    given=["ladder", "budget", "confirm", "sequential_confirm"])
    assert (both.confirm.top, both.confirm.sequential) == (4, True)
    assert StudyConfig.from_options({**budgets, "ladder": False}).confirm == Confirm(), "off the ladder: none"
    assert dataclasses.replace(off, seed=1).confirm == Confirm(), "a stated --confirm 0 survives a copy"
    paired = StudyConfig.from_options({**budgets, "paired_seeds": 2}, given=["ladder", "budget", "paired_seeds"])
    assert paired.confirm == Confirm(), "a paired ladder is refused by the plan with its own sentence"
    with pytest.raises(ArchhpoError, match="--seeds S counts only with --confirm K"):
        StudyConfig.from_options({**budgets, "confirm": 0}, given=["ladder", "budget", "confirm", "seeds"])
    assert (LADDER.values()["confirm"], LADDER.values()["seeds"]) == (LADDER_FINALISTS, LADDER_CONFIRM_SEEDS), \
        "the preset is the constants"


def test_a_ladder_confirms_at_full_length_unless_confirm_at_rung_is_stated() -> None:
    """--confirm-at-rung is off by default (docs/searching.md, "Choosing the defaults"); stated with
    --ladder's halving and confirmation it is on; --no-confirm-at-rung keeps it off."""
    from archhpo.cli._main import _complete, build_parser
    from archhpo.cli._study_cmds import _study_config

    budgets = {"experiment": "e", "budget": ["200K", "500K"], "ladder": True}
    given = ["ladder", "budget"]
    assert StudyConfig.from_options(budgets, given=given).pruning.confirm_at_rung is False
    on = StudyConfig.from_options({**budgets, "confirm_at_rung": True}, given=[*given, "confirm_at_rung"])
    assert on.pruning.confirm_at_rung is True
    assert dataclasses.replace(on, seed=1).pruning.confirm_at_rung is True, "a stated choice survives a copy"
    assert StudyConfig("e").pruning.confirm_at_rung is False, "off the ladder: off"
    with pytest.raises(ArchhpoError, match="--confirm-at-rung and --no-confirm-at-rung choose where a ladder "
                                           "budget confirms its finalists, so they need --ladder"):
        StudyConfig.from_options({"experiment": "e", "confirm_at_rung": False}, given=["confirm_at_rung"])
    fam = get_family("patchtst")
    line = ["run", "--experiment", "e", "--budget", "200K", "--budget", "500K", "--ladder"]
    for extra, expected in (([], False), (["--no-confirm-at-rung"], False), (["--confirm-at-rung"], True)):
        args = build_parser(fam).parse_args([*line, *extra])
        _complete(args, fam, {}, None)
        assert _study_config(args).pruning.confirm_at_rung is expected, extra


def test_a_ladder_carries_its_finalists_to_the_largest_budget_unless_stated_otherwise() -> None:
    """--carry-finalists is on by default with --ladder (docs/searching.md, "Choosing the defaults"),
    off without it; --no-carry-finalists turns it off."""
    from archhpo.cli._main import _complete, build_parser
    from archhpo.cli._study_cmds import _study_config

    budgets = {"experiment": "e", "budget": ["200K", "500K"], "ladder": True}
    given = ["ladder", "budget"]
    assert StudyConfig.from_options(budgets, given=given).pruning.carry_finalists is True
    off = StudyConfig.from_options({**budgets, "carry_finalists": False}, given=[*given, "carry_finalists"])
    assert off.pruning.carry_finalists is False
    assert dataclasses.replace(off, seed=1).pruning.carry_finalists is False, "a stated opt-out survives a copy"
    assert StudyConfig("e").pruning.carry_finalists is False, "off the ladder: off"
    fam = get_family("patchtst")
    line = ["run", "--experiment", "e", "--budget", "200K", "--budget", "500K", "--ladder"]
    for extra, expected in (([], True), (["--no-carry-finalists"], False), (["--carry-finalists"], True)):
        args = build_parser(fam).parse_args([*line, *extra])
        _complete(args, fam, {}, None)
        assert _study_config(args).pruning.carry_finalists is expected, extra


def test_a_learning_rate_range_replaces_the_default_one_on_the_line_and_in_a_file(tmp_path: Path,
                                                                                  sqlite_url: str) -> None:
    """--learning-rate LO:HI: the plan samples it log-uniformly within [LO, HI] (the default
    1e-4:1e-3 lies below the lm family's own 3e-3); one value still fixes it."""
    config = StudyConfig.from_options({"experiment": "r", "learning_rate": (1e-3, 3e-2), "weight_decay": 1e-4})
    assert config.param_ranges == {"learning_rate": (1e-3, 3e-2)} and config.fixed_params == {"weight_decay": 1e-4}
    line = ["launch", "--experiment", "rl", "--family", "patchtst", "--budget", "200K", "--trials", "6", "--quick",
            "--data", TINY_DATA, "--storage", sqlite_url, "--learning-rate", "1e-3:3e-2"]
    assert main(line) == 0
    study = optuna.load_study(study_name="rl_200K", storage=sqlite_url)
    assert study.user_attrs["archhpo_space"]["learning_rate"] == [1e-3, 3e-2]
    rates = [float(t.system_attrs["fixed_params"]["learning_rate"]) for t in study.trials]
    assert len(rates) == 6 and all(1e-3 <= r <= 3e-2 for r in rates) and max(rates) > 1e-3 * 3
    cfg = tmp_path / "range.toml"
    cfg.write_text(f'experiment = "rf"\nbudget = ["200K"]\nfamily = "patchtst"\ntrials = 6\nquick = true\n'
                   f'data = "{TINY_DATA}"\nstorage = "{sqlite_url}"\nlearning-rate = "1e-3:3e-2"\n')
    assert main(["launch", "--config", str(cfg)]) == 0
    again = optuna.load_study(study_name="rf_200K", storage=sqlite_url)
    assert [t.system_attrs["fixed_params"]["learning_rate"] for t in again.trials] == pytest.approx(rates), \
        "the same plan seed and range draw the same rates"
    cfg.write_text(cfg.read_text().replace('"rf"', '"rg"').replace('"1e-3:3e-2"', "[1e-3, 3e-2]"))
    assert main(["launch", "--config", str(cfg)]) == 0, "a TOML list of two is the range too"
    listed = optuna.load_study(study_name="rg_200K", storage=sqlite_url)
    assert [t.system_attrs["fixed_params"]["learning_rate"] for t in listed.trials] == pytest.approx(rates)
    cfg.write_text(cfg.read_text().replace('"rg"', '"rh"').replace("[1e-3, 3e-2]", "[1e-3, 3e-3, 3e-2]"))
    assert main(["launch", "--config", str(cfg)]) == 2, "three: neither a value nor a range"


def test_a_range_refused_on_the_line_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "none.db"
    line = ["launch", "--experiment", "bad", "--family", "patchtst", "--budget", "200K", "--quick", "--data",
            TINY_DATA, "--storage", f"sqlite:///{db}"]
    assert main([*line, "--learning-rate", "3e-2:1e-3"]) == 2  # the config's check: one sentence
    assert "a range needs 0 < LO < HI" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse's own: the flag's type
        main([*line, "--epochs", "2:4"])
    assert exc.value.code == 2 and "argument --epochs: invalid int value: '2:4'" in capsys.readouterr().err
    assert not db.exists()
    with pytest.raises(SystemExit):  # `train` runs one configuration: no range there
        main(["train", "--family", "patchtst", "--learning-rate", "1e-3:3e-2"])
    assert "invalid float value: '1e-3:3e-2'" in capsys.readouterr().err
