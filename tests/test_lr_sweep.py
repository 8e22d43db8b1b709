"""bench/truths/lr_sweep.py, T1's learning-rate sweep: the best rate of a sweep (a parabola's vertex
in log rate, a bound at an end of the sweep) and the top architectures it sweeps, read from the
committed truth database (its 200K budget is finished) and refused while a budget is still open."""

from __future__ import annotations

import math
import shutil
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    return load_script(ROOT / "bench" / "truths" / "lr_sweep.py", "lr_sweep")


sweep = _load()


def test_the_best_rate_is_the_vertex_of_the_parabola_around_the_lowest_loss() -> None:
    points = [(r, (math.log(r) - math.log(2e-3)) ** 2) for r in sweep.RATES]
    rate, how = sweep.best_rate(points)
    assert how == "parabola vertex"
    assert rate == pytest.approx(2e-3, rel=1e-9)


def test_a_minimum_at_the_end_of_the_sweep_is_a_bound() -> None:
    points = [(r, -math.log(r)) for r in sweep.RATES]  # still falling at the largest rate
    assert sweep.best_rate(points) == (sweep.RATES[-1], "bound")


def test_the_top_architectures_are_ranked_by_mean_over_seeds(tmp_path: Path) -> None:
    db = tmp_path / "t1.db"
    shutil.copy(ROOT / "bench" / "truths" / "studies" / "t1.db", db)
    url = f"sqlite:///{db}"
    top = sweep.top_architectures(url, "t1_200K-h2+4+8-t10")
    with sqlite3.connect(db) as con:  # the same ranking, straight from the stored values
        rows = con.execute(
            "select t.trial_id, v.value from trials t join studies s using (study_id) join trial_values v "
            "using (trial_id) where s.study_name = 't1_200K-h2+4+8-t10' and t.state = 'COMPLETE'").fetchall()
        arch: dict[tuple[int, ...], list[float]] = {}
        for trial_id, value in rows:
            attrs = dict(con.execute("select key, value_json from trial_user_attributes where trial_id = ?",
                                     (trial_id,)).fetchall())
            arch.setdefault(tuple(int(attrs[k]) for k in sweep.ARCH), []).append(value)
    expected = sorted(arch, key=lambda a: (sum(arch[a]) / len(arch[a]), a))[:3]
    assert len(rows) == 18 and top == expected


def test_a_budget_still_training_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "t1.db"
    shutil.copy(ROOT / "bench" / "truths" / "studies" / "t1.db", db)
    with sqlite3.connect(db) as con:  # one trial of the finished 200K budget reopened
        con.execute("update trials set state = 'WAITING' where trial_id = (select min(trial_id) from trials "
                    "join studies using (study_id) where study_name = 't1_200K-h2+4+8-t10')")
    with pytest.raises(SystemExit, match="open trials; finish the truth's budget first"):
        sweep.top_architectures(f"sqlite:///{db}", "t1_200K-h2+4+8-t10")


TABLE = ROOT / "bench" / "truths" / "t1_lr.csv"


def _table_rows() -> list[dict[str, str]]:
    import csv

    with open(TABLE, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["budget"] == "400K"]


def test_judge_moves_the_carried_rate_to_each_architectures_width_and_grades_it_against_the_vertex() -> None:
    rows = _table_rows()
    bests = {}
    for rank in ("1", "2", "3"):
        group = [r for r in rows if r["rank"] == rank]
        bests[rank] = sweep.best_rate([(float(r["learning_rate"]), float(r["loss"])) for r in group])[0]
    at_128 = sweep.judge_rows(rows, "400K", 3e-3, 128)
    assert [v["factor"] for v in at_128] == [max(3e-3 / bests[k], bests[k] / 3e-3) for k in ("1", "2", "3")]
    assert all(v["within"] for v in at_128) and all(v["carried"] == 3e-3 for v in at_128)
    at_64 = sweep.judge_rows(rows, "400K", 3e-3, 64)  # muP: 3e-3 at d_model 64 is 1.5e-3 at 128
    assert [v["carried"] for v in at_64] == [1.5e-3] * 3
    assert at_64[0]["factor"] == bests["1"] / 1.5e-3 and not at_64[0]["within"], "x1.59 for the vertex 2.38e-3"
    one_rate = sweep.judge_rows(rows, "400K", 1.2e-2, None)  # a record stored before the width rule
    assert [v["carried"] for v in one_rate] == [1.2e-2] * 3 and not any(v["within"] for v in one_rate)


def test_judge_says_nothing_of_a_rate_beyond_a_bound_of_the_sweep() -> None:
    rows = [{"budget": "800K", "rank": "1", "d_model": "128", "n_layers": "2", "n_heads": "2", "d_ff": "512",
             "learning_rate": str(r), "loss": str(-math.log(r))} for r in sweep.RATES]  # still falling at 1.2e-2
    beyond, inside = sweep.judge_rows(rows, "800K", 2e-2, 128), sweep.judge_rows(rows, "800K", 1e-2, 128)
    assert beyond[0]["how"] == "bound" and beyond[0]["factor"] is None and not beyond[0]["within"]
    assert inside[0]["factor"] == 1.2e-2 / 1e-2 and inside[0]["within"]


def test_judge_reads_the_carried_rate_and_its_width_from_a_ladder_record(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import optuna

    url = f"sqlite:///{tmp_path / 'run.db'}"
    for name, record in (("w", {"carried": {"learning_rate": 6e-3}, "lr_width": 64}),
                         ("old", {"carried": {"learning_rate": 6e-3}})):
        optuna.create_study(study_name=name, storage=url).set_user_attr(sweep.LADDER_KEY, record)
    argv = ["judge", "--table", str(TABLE), "--budget", "400K", "--ladder", url, "--study"]
    assert sweep.main([*argv, "w"]) == 0, "6e-3 at d_model 64 is 3e-3 at 128: within at all three"
    assert "carried 0.006 (at d_model 64, moved per width)" in capsys.readouterr().out
    assert sweep.main([*argv, "old"]) == 1, "6e-3 at every width: x2.5 from rank 1's vertex"
    assert "(one rate for every width)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="either --ladder STORAGE --study NAME or --carried RATE"):
        sweep.main(["judge", "--table", str(TABLE), "--budget", "400K"])
    with pytest.raises(SystemExit, match="no rows of budget 1M"):
        sweep.main(["judge", "--table", str(TABLE), "--budget", "1M", "--carried", "3e-3"])


def test_today_recomputes_a_runs_carried_rate_from_its_smaller_budgets(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The committed T1 learning-rate run: its 400K was planned by a rule today's keeps (the prior on 2
    budgets), so the recomputed rate is the stored one; its 800K stored N^+0.064 fitted through two
    budgets whose best rates were one trial's, which today's rule does not fit on."""
    db = tmp_path / "run.db"
    shutil.copy(ROOT / "bench" / "truths" / "realrun" / "t1lr" / "t1lrreal.db", db)
    url = f"sqlite:///{db}"
    stored, width = sweep.ladder_rate(url, "t1lrreal_400K-h2+4+8-t10")
    assert sweep.todays_rate(url, "t1lrreal_400K-h2+4+8-t10")[:2] == (pytest.approx(stored, rel=1e-9), width)
    assert sweep.ladder_rate(url, "t1lrreal_800K-h2+4+8-t10") == (pytest.approx(4.9078e-3, rel=1e-4), 128)
    rate, width, exponent = sweep.todays_rate(url, "t1lrreal_800K-h2+4+8-t10")
    assert (round(rate, 7), width) == (2.5598e-3, 128) and exponent.startswith("N^-0.406 (prior: 1 of 3 budgets located")
    argv = ["judge", "--table", str(TABLE), "--budget", "400K", "--ladder", url, "--study", "t1lrreal_400K-h2+4+8-t10"]
    assert sweep.main([*argv, "--today"]) == sweep.main(argv), "the same verdict where the rule did not change"
    assert "today's rule, from t1lrreal_400K-h2+4+8-t10's smaller budgets: N^-0.406 (prior: 2 budgets fit" in (
        capsys.readouterr().out)
    with pytest.raises(SystemExit, match="--today recomputes a --ladder run's rate"):
        sweep.main(["judge", "--table", str(TABLE), "--budget", "400K", "--carried", "3e-3", "--today"])
    with pytest.raises(SystemExit, match="is not a --ladder budget above the smallest"):
        sweep.todays_rate(url, "t1lrreal_100K-h2+4+8-t10")


@pytest.mark.postgres
def test_today_reads_a_run_on_postgresql_as_on_sqlite(tmp_path: Path, pg_url: str) -> None:
    """The committed T1 learning-rate run copied study by study into PostgreSQL: today's rule carries
    the same rate, at the same width, for the same reason (the storage is only read)."""
    import optuna

    db = tmp_path / "run.db"
    shutil.copy(ROOT / "bench" / "truths" / "realrun" / "t1lr" / "t1lrreal.db", db)
    url = f"sqlite:///{db}"
    for name in optuna.get_all_study_names(url):
        optuna.copy_study(from_study_name=name, from_storage=url, to_storage=pg_url)
    study = "t1lrreal_800K-h2+4+8-t10"
    on_sqlite = sweep.todays_rate(url, study)
    assert sweep.todays_rate(pg_url, study) == (pytest.approx(on_sqlite[0], rel=1e-12), *on_sqlite[1:])
    assert round(on_sqlite[0], 7) == 2.5598e-3


def test_a_bare_path_or_a_missing_sqlite_file_is_refused_in_one_sentence(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A path where a storage URL belongs was a SQLAlchemy traceback, and a missing SQLite file would
    have been created empty: both are now one sentence, exit 2, and no file is written."""
    out = tmp_path / "t.csv"
    missing = tmp_path / "none.db"
    for bad, says in ((str(missing), "is not a storage URL; give sqlite:///PATH"),
                      (f"sqlite:///{missing}", "names no SQLite file")):
        with pytest.raises(SystemExit) as exc:
            sweep.main(["table", "--truth", bad, "--sweep", bad, "--budget", "400K", "--out", str(out)])
        assert exc.value.code == 2
        assert says in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == []


def test_the_committed_sweep_table_is_remade_exactly_from_the_committed_databases(tmp_path: Path) -> None:
    """bench/truths/t1_lr.csv is `table`'s output on the committed truth and sweep databases (copied:
    the test only reads), row for row and digit for digit."""
    for name in ("t1.db", "t1lr.db"):
        shutil.copy(ROOT / "bench" / "truths" / "studies" / name, tmp_path / name)
    out = tmp_path / "t1_lr.csv"
    assert sweep.main(["table", "--truth", f"sqlite:///{tmp_path / 't1.db'}", "--sweep",
                       f"sqlite:///{tmp_path / 't1lr.db'}", "--budget", "400K", "--budget", "800K",
                       "--out", str(out)]) == 0
    assert out.read_text() == TABLE.read_text()


def test_t1s_learning_rate_target_at_800k(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rate the committed learning-rate run stored for
    800K (4.91e-3, an older rule's fitted N^+0.064) is x2.19 from the best architecture's swept best
    and so outside; the rate today's rule carries from the same run's smaller budgets (2.56e-3, Step
    Law's prior) is within x/÷1.5 of all three swept architectures' best rates."""
    db = tmp_path / "run.db"
    shutil.copy(ROOT / "bench" / "truths" / "realrun" / "t1lr" / "t1lrreal.db", db)
    argv = ["judge", "--table", str(TABLE), "--budget", "800K", "--ladder", f"sqlite:///{db}",
            "--study", "t1lrreal_800K-h2+4+8-t10"]
    assert sweep.main(argv) == 1
    stored = capsys.readouterr().out
    assert "rank 1 128x4 h2 ff512: carried 0.00491, best 0.00224 (parabola vertex): x2.19, outside" in stored
    assert sweep.main([*argv, "--today"]) == 0
    today = capsys.readouterr().out
    assert [line.split(": ")[-1] for line in today.splitlines() if "rank" in line] == [
        "x1.14, within", "x1.33, within", "x1.43, within"]
