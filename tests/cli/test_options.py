"""One source for options: the parser and experiment files (--config) take their defaults from
archhpo/cli/_options.py, whose study options take theirs from archhpo/config.py's StudyConfig; --help shows the named family's flags; flags on the line
win over the file; unknown keys are refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from archhpo.cli._main import COMMANDS, build_parser, main, register_command
from archhpo.cli._options import OPTIONS, default, options_for
from archhpo.models import family_names, get_family
from tests.conftest import TINY_DATA


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("family", family_names())
@pytest.mark.parametrize("command", ["grid", "params", "launch", "run", "train"])
def test_help_shows_the_flags_of_the_family_on_the_line(
    capsys: pytest.CaptureFixture[str], command: str, family: str
) -> None:
    text = _help(capsys, command, "--family", family)
    for flag in get_family(family).flags:
        assert "--" + flag.name.replace("_", "-") in text, (command, family, flag.name)
    others = {f.name for name in family_names() if name != family for f in get_family(name).flags}
    own = {f.name for f in get_family(family).flags}
    for name in others - own:
        assert "--" + name.replace("_", "-") + " " not in text, f"{command} --family {family} shows --{name}"
    assert f"{family} options" in text


def test_help_without_family_shows_the_default_family(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "launch")
    assert "patchtst options" in text and "--num-features" in text and "--encoder" not in text
    assert _help(capsys, "launch", "--family=signal").count("--encoder") >= 1


def test_help_follows_the_family_of_the_experiment_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "study.toml"
    cfg.write_text('family = "signal"\n')
    text = _help(capsys, "run", "--config", str(cfg))
    assert "signal options" in text and "--encoder" in text


def test_every_default_is_defined_once() -> None:
    """The study options' defaults are the StudyConfig's, and the parser fills them."""
    from archhpo.config import StudyConfig, field_default, option_fields

    config = StudyConfig("e")
    for name, path in option_fields().items():
        if name == "experiment":
            continue  # required: no default
        value: object = config
        for part in path.split("."):
            value = getattr(value, part)
        if name in ("confirm_at_rung", "carry_finalists"):  # None: decided by the study's other options
            assert field_default(name) is None and value is False, name
            continue
        assert value == field_default(name), name
        if name not in ("experiment", "budget", "tokens_per_param", "samples_per_param", "isoflop", "centre"):
            assert default(name) == value, name
    import argparse

    from archhpo.cli._main import _complete

    args = build_parser(get_family("patchtst")).parse_args(["launch", "--experiment", "e", "--budget", "2M"])
    _complete(args, get_family("patchtst"), {}, None)
    for o in options_for("launch"):
        if o.name not in ("experiment", "budget"):
            assert getattr(args, o.key) == o.default_for("launch"), o.name
    assert args.given == {"experiment", "budget"}
    assert isinstance(args, argparse.Namespace)
    stored = {o.name for o in OPTIONS if o.stored}
    assert {"family", "trials", "data", "seed", "quick", "paired_seeds", "confirm", "seeds"} <= stored


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def test_experiment_file_with_flags_on_the_line_winning(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    cfg = _toml(tmp_path, f"""
experiment = "fromfile"
budget = ["200K"]
trials = 4
seed = 3
quick = true
data = "{TINY_DATA}"
pruner = "none"
storage = "{url}"
workers = 3          # a run-only key: launch ignores it
""")
    assert main(["launch", "--config", str(cfg), "--trials", "6"]) == 0
    attrs = optuna.load_study(study_name="fromfile_200K", storage=url).user_attrs
    assert attrs["archhpo_n_trials"] == 6, "the line wins"
    assert attrs["archhpo_options"]["seed"] == 3 and attrs["archhpo_options"]["quick"] is True
    assert attrs["archhpo_pruner"] == "none" and attrs["archhpo_options"]["horizon"] == default("horizon")
    # The same file again, now without the override, is another study's settings: refused.
    assert main(["launch", "--config", str(cfg)]) == 2


def test_experiment_file_holds_family_choices_pins_and_yaml(tmp_path: Path) -> None:
    from archhpo.cli._main import _complete

    fam = get_family("signal")
    cfg = _toml(tmp_path, 'family = "signal"\nencoder = ["sum", "linear"]\nd-model = 64\nn_layers = [2, 3]\n'
                          'paired_seeds = 2\nepochs = 300\n')
    from archhpo.cli._options import load_config

    args = build_parser(fam).parse_args(["launch", "--experiment", "e", "--n-layers", "4"])
    _complete(args, fam, load_config(str(cfg)), str(cfg))
    assert args.fam_encoder == ["sum", "linear"] and args.d_model == [64] and args.n_layers == [4]
    assert args.paired_seeds == 2 and args.epochs == 300 and args.family == "signal"
    yaml = pytest.importorskip("yaml")
    ycfg = tmp_path / "study.yaml"
    ycfg.write_text(yaml.safe_dump({"family": "signal", "encoder": "sum,cat", "trials": 5}))
    args = build_parser(fam).parse_args(["run", "--experiment", "e"])
    _complete(args, fam, load_config(str(ycfg)), str(ycfg))
    assert args.fam_encoder == ["sum", "cat"] and args.trials == 5


@pytest.mark.parametrize(("text", "needle"), [
    ('experiment = "x"\nbudget = "200K"\ntrails = 5\n', "Unknown key 'trails'"),
    ('experiment = "x"\nbudget = "200K"\ntrials = "many"\n', "Key 'trials'"),
    ('experiment = "x"\nbudget = "200K"\nquick = "yes"\n', "true or false"),
    ('experiment = "x"\nbudget = "200K"\nencoder = "sum"\n', "Unknown key 'encoder'"),  # not patchtst's
    ('experiment = "x"\nbudget = "200K"\nseeds = 4\n', "--seeds S counts only with --confirm"),
    ('experiment = "x"\nbudget = "200K"\n[trials]\nn = 3\n', "not a table"),
    ('experiment = "x"\nbudget = \n', "not valid TOML"),
])
def test_bad_experiment_files_are_refused_with_one_sentence_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    db = tmp_path / "s.db"
    cfg = _toml(tmp_path, text)
    for command in ("launch", "run"):
        assert main([command, "--config", str(cfg), "--storage", f"sqlite:///{db}"]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert not db.exists() and list(tmp_path.iterdir()) == [cfg], "nothing written"


@pytest.mark.parametrize("argv", [
    ["--family", "signal", "--channels", "4,8"],  # a data-shaping flag cannot be a grid dimension
    ["--family", "signal", "--encoder", "sum,bogus"],
    ["--d-model", "64"],  # pinned width with every depth: fine, but no experiment
])
def test_refused_launches_write_nothing(tmp_path: Path, argv: list[str]) -> None:
    db = tmp_path / "s.db"
    experiment = [] if argv == ["--d-model", "64"] else ["--experiment", "x", "--budget", "150K"]
    assert main(["launch", *experiment, *argv, "--storage", f"sqlite:///{db}"]) == 2
    assert not db.exists() and not list(tmp_path.iterdir())


def test_missing_experiment_file_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--config", str(tmp_path / "none.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_command_can_be_registered(capsys: pytest.CaptureFixture[str]) -> None:
    seen = {}

    def cmd_hello(args) -> int:  # type: ignore[no-untyped-def]
        seen.update(vars(args))
        return 0

    def configure(p) -> None:  # type: ignore[no-untyped-def]
        p.add_argument("--loud", action="store_true")

    register_command("hello", cmd_hello, "say hello", configure)
    try:
        assert main(["hello", "--loud"]) == 0
        assert seen["loud"] is True and seen["given"] == set()
    finally:
        del COMMANDS["hello"]


def test_lm_help_lists_only_what_lm_reads() -> None:
    """`archhpo run --family lm --help`, as a user runs it: lm's --data forms (a text file, not a
    CSV/Parquet path) and neither --horizon nor --threshold, which lm's data never reads."""
    from tests.conftest import run_cli

    done = run_cli("run", "--family", "lm", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps the help
    assert "--horizon" not in text and "--threshold" not in text
    assert "CSV/Parquet" not in text and "UTF-8 text file" in text and "--data DATA synthetic[:vocab=" in text


@pytest.mark.parametrize("family", family_names())
@pytest.mark.parametrize("command", ["launch", "run", "train"])
def test_each_family_help_shows_its_own_data_forms_and_task_options(
    capsys: pytest.CaptureFixture[str], command: str, family: str
) -> None:
    from archhpo.cli._options import FAMILY_DATA, TASK_OPTIONS

    assert family in FAMILY_DATA, f"a built-in family needs its --data forms in FAMILY_DATA: {family}"
    text = _help(capsys, command, "--family", family)
    assert "".join(FAMILY_DATA[family].forms.split()) in "".join(text.split()), "argparse breaks long words"
    for name in TASK_OPTIONS:
        assert (f"--{name}" in text) == (name in FAMILY_DATA[family].task_options), (command, family, name)


def test_a_task_option_left_out_of_the_help_is_still_accepted(sqlite_url: str) -> None:
    """One experiment file may serve several families: lm takes --horizon (it reads nothing of it)."""
    args = build_parser(get_family("lm")).parse_args(["run", "--family", "lm", "--horizon", "3"])
    assert args.horizon == 3


def test_the_reference_says_which_families_read_a_task_option() -> None:
    from archhpo.cli._options import option

    text = option("horizon").help_for("run")
    assert "patchtst" in text and "lm" not in text.split("only")[-1]
