"""Launching a µP study: a family without a passed coordinate check is refused before anything is
written, and a study without --mup-base-width stores its smallest budget's smallest d_model as
the one base width of every budget (each budget's own smallest would move the base with N)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from archhpo.cli._main import main as cli_main


def _stored_options(db: Path) -> dict[str, dict[str, object]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("select s.study_name, a.value_json from study_user_attributes a join studies s "
                           "using (study_id) where a.key = 'archhpo_options'").fetchall()
    return {name: json.loads(value) for name, value in rows}


def test_a_mup_study_of_a_family_without_a_coordinate_check_is_refused_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.db"
    code = cli_main(["launch", "--experiment", "m", "--family", "patchtst", "--budget", "100K",
                     "--parametrization", "mup", "--storage", f"sqlite:///{db}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "coordinate check" in err and "patchtst" in err
    assert not db.exists()


def test_every_budget_of_a_mup_ladder_stores_the_smallest_budgets_smallest_width(tmp_path: Path) -> None:
    from archhpo.budgets import build_grid
    from archhpo.models import get_family

    db = tmp_path / "m.db"
    assert cli_main(["launch", "--experiment", "m", "--family", "lm", "--budget", "150K", "--budget", "75K",
                     "--ladder", "--quick", "--parametrization", "mup", "--storage", f"sqlite:///{db}"]) == 0
    stored = _stored_options(db)
    fam = get_family("lm")
    options = {"quick": True}
    info = fam.data_info(fam.parse_data("synthetic", options), options)
    rows = build_grid(fam, 75_000, info)
    smallest, shallowest = min(r.d_model for r in rows), min(r.n_layers for r in rows)
    assert {n: (o["parametrization"], o["mup_base_width"], o["mup_base_depth"]) for n, o in stored.items()} == {
        "m_75K": ("mup", smallest, shallowest), "m_150K": ("mup", smallest, shallowest)}


def test_a_stated_base_width_is_stored_as_given_and_sp_stores_neither(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    assert cli_main(["launch", "--experiment", "m", "--family", "lm", "--budget", "75K", "--quick",
                     "--parametrization", "mup", "--mup-base-width", "32", "--storage", f"sqlite:///{db}"]) == 0
    assert cli_main(["launch", "--experiment", "s", "--family", "lm", "--budget", "75K", "--quick",
                     "--storage", f"sqlite:///{db}"]) == 0
    stored = _stored_options(db)
    assert (stored["m_75K"]["parametrization"], stored["m_75K"]["mup_base_width"]) == ("mup", 32)
    assert "parametrization" not in stored["s_75K"] and "mup_base_width" not in stored["s_75K"]
    assert "mup_base_depth" not in stored["s_75K"]
    assert cli_main(["launch", "--experiment", "d", "--family", "lm", "--budget", "75K", "--quick",
                     "--parametrization", "mup", "--mup-base-depth", "3", "--storage", f"sqlite:///{db}"]) == 0
    assert _stored_options(db)["d_75K"]["mup_base_depth"] == 3


def test_the_trials_frame_reads_each_studys_parametrization(tmp_path: Path) -> None:
    from archhpo.report._database import frame_from_storage

    db = tmp_path / "m.db"
    url = f"sqlite:///{db}"
    for experiment, flags in (("m", ["--parametrization", "mup", "--mup-base-width", "32"]), ("s", [])):
        assert cli_main(["launch", "--experiment", experiment, "--family", "lm", "--budget", "75K", "--quick",
                         "--trials", "1", "--epochs", "1", "--storage", url, *flags]) == 0
        assert cli_main(["worker", "--study", f"{experiment}_75K", "--storage", url, "--threads", "1"]) == 0
    mup, sp = frame_from_storage(url, "m", curves=False), frame_from_storage(url, "s", curves=False)
    assert set(zip(mup["parametrization"], mup["mup_base_width"], strict=True)) == {("mup", 32.0)}
    assert set(sp["parametrization"]) == {"sp"} and sp["mup_base_width"].isna().all()
