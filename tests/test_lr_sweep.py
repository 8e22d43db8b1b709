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
