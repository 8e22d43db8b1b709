"""bench/frontier/extrapolate.py: the prediction at C_big (at least 4x the largest budget) from a
frontier's fitted L(N, D), the launch of N* and its x/÷2 and x/÷4 flanks at C_big, the grade of what was
trained against the prediction, and the extra seeds at the resolved vertices. The frontier is a
synthetic IsoFLOP table from Chinchilla's law; the planner and the launch are the real ones."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from archhpo.report._frame import trials_frame
from tests.conftest import REPO, load_script
from tests.report.test_compute_optimal_page import CHINCHILLA, isoflop_study_rows
from tests.report.test_report import _write

TRAINING = ["--family", "lm", "--data", "synthetic:tokens=100000", "--seq-len", "128", "--epochs", "3",
            "--learning-rate", "3e-3", "--batch-size", "16"]
COMPUTES = (1e12, 3e12, 1e13, 3e13, 1e14)


def _load() -> ModuleType:
    return load_script(REPO / "bench" / "frontier" / "extrapolate.py", "extrapolate")


x = _load()


@pytest.fixture(scope="module")
def frontier(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """A database holding the frontier's largest study (its settings plan C_big) and the trials frame
    of a known-law table over 5 budgets, 1e12 to 1e14."""
    from archhpo.cli import main

    tmp = tmp_path_factory.mktemp("frontier")
    url = f"sqlite:///{tmp / 'f.db'}"
    assert main(["launch", "--experiment", "f", "--isoflop", "1e14", "--centre", "1e6", "--sizes", "5", "--span", "4",
                 *TRAINING, "--storage", url]) == 0
    rows = isoflop_study_rows(COMPUTES)
    for r in rows:
        r["experiment"] = "f"
    return url, trials_frame("f", csv=_write(rows, tmp / "f.csv"))


@pytest.fixture
def patched(frontier: tuple[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    url, frame = frontier
    monkeypatch.setattr(x, "_frame", lambda task, storage, also=(): frame)
    monkeypatch.setattr(x, "_largest_study", lambda frame: "f_C1e14")
    return url


def _truth(n: float, d: float) -> float:
    return CHINCHILLA["E"] + CHINCHILLA["A"] * n ** -CHINCHILLA["alpha"] + CHINCHILLA["B"] * d ** -CHINCHILLA["beta"]


def test_the_prediction_plans_n_star_and_its_flanks_at_four_times_the_largest_budget(patched: str) -> None:
    entry = x.predict("f", patched, n_boot=200)
    assert entry["compute"] == 4e14 and entry["factor"] == pytest.approx(4.0) and entry["measured_loss"] is None
    pred, planned = entry["predicted"], entry["planned"]
    assert len(planned) == 5 and pred["n"] == planned[2]["n"]
    ns = [p["n"] for p in planned]
    assert ns == sorted(ns) and 10 < ns[-1] / ns[0] < 26, "N*/4 to 4N* on the grid's rows"
    assert all(abs(p["train_flops"] - 4e14) <= 0.01 * 4e14 for p in planned), "every size costs C_big"
    assert abs(pred["n"] / pred["n_star"]["estimate"] - 1) < 0.3, "the middle size is the row nearest N*"
    for p in planned:
        lo, hi = p["loss"]["ci95"]
        assert lo <= _truth(p["n"], p["train_tokens"]) <= hi, p
        assert lo <= p["loss"]["law_ci95"][0] <= p["loss"]["estimate"] <= p["loss"]["law_ci95"][1] <= hi
    assert entry["launch"] == ["--experiment", "f_x", "--isoflop", "4e+14", "--centre",
                               f"{pred['n_star']['estimate']:.6g}", "--sizes", "5", "--span", "16"]


def test_the_json_keeps_one_entry_per_task_in_the_issues_shape(patched: str, tmp_path: Path) -> None:
    path = tmp_path / "extrapolation.json"
    assert x.main(["predict", "--task", "f", "--storage", patched, "--json", str(path), "--n-boot", "100"]) == 0
    assert x.main(["predict", "--task", "f", "--storage", patched, "--json", str(path), "--n-boot", "100"]) == 0
    entries = json.loads(path.read_text())
    assert [e["task"] for e in entries] == ["f"], "predicting again replaces the task's entry"
    e = entries[0]
    assert {"task", "compute", "predicted", "measured_loss", "prediction_commit"} <= set(e)
    assert {"n_star", "loss"} <= set(e["predicted"]) and {"estimate", "ci95"} <= set(e["predicted"]["loss"])
    assert e["measured_loss"] is None


def test_a_c_big_under_four_times_the_largest_budget_is_refused_and_nothing_written(
        patched: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "extrapolation.json"
    assert x.main(["predict", "--task", "f", "--storage", patched, "--json", str(path), "--factor", "2"]) == 2
    assert "under 4x the largest budget 1e+14; give --factor 4 or more" in capsys.readouterr().err
    assert not path.exists()


def test_the_launch_plans_the_predicted_sizes_at_c_big(patched: str, tmp_path: Path) -> None:
    """`launch --run` with the frontier's training flags stores a study whose trials are exactly the
    predicted ones: the same exact N and tokens per size."""
    import optuna

    path = tmp_path / "extrapolation.json"
    assert x.main(["predict", "--task", "f", "--storage", patched, "--json", str(path), "--n-boot", "100"]) == 0
    big = f"sqlite:///{tmp_path / 'x.db'}"
    assert x.main(["launch", "--task", "f", "--storage", patched, "--to", big, "--json", str(path), "--run",
                   "--", *TRAINING]) == 0
    planned = json.loads(path.read_text())[0]["planned"]
    queued = optuna.load_study(study_name="f_x_C4e14", storage=big).get_trials(deepcopy=False)
    assert sorted((t.user_attrs["param_count"], t.user_attrs["train_tokens"]) for t in queued) == \
        [(p["n"], p["train_tokens"]) for p in planned]


@pytest.mark.parametrize("flag", ["--sizes", "--span=8", "--centre", "--storage"])
def test_a_launch_given_a_flag_of_its_plan_after_the_dashes_is_refused_and_nothing_launched(
        patched: str, tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """frontier.sh's COMMON holds --sizes 7: given after --, it would silently replace the 5 sizes
    the prediction planned, so the launch refuses it in one sentence and creates no database."""
    path = tmp_path / "extrapolation.json"
    assert x.main(["predict", "--task", "f", "--storage", patched, "--json", str(path), "--n-boot", "100"]) == 0
    big = tmp_path / "x.db"
    extra = [flag] if "=" in flag else [flag, "7"]
    assert x.main(["launch", "--task", "f", "--storage", patched, "--to", f"sqlite:///{big}", "--json", str(path),
                   "--run", "--", *TRAINING, *extra]) == 2
    assert f"{flag.split('=')[0]} after -- would change the predicted plan" in capsys.readouterr().err
    assert not big.exists()


def _entry() -> dict[str, Any]:
    planned = [{"n": n, "loss": {"estimate": 2.0 + i / 100, "ci95": [1.98 + i / 100, 2.02 + i / 100]}}
               for i, n in enumerate((100, 200, 300))]
    return {"task": "t", "planned": planned, "measured_loss": None,
            "predicted": {"n": 200, "loss": {"estimate": 2.01, "ci95": [1.99, 2.03]}}}


def test_the_grade_states_the_error_and_whether_the_flanks_beat_n_star_beyond_noise() -> None:
    runs = {100: {"loss": 2.02, "runs": 1}, 200: {"loss": 2.0, "runs": 3}, 300: {"loss": 2.05, "runs": 1}}
    graded = x.grade(_entry(), runs)
    g = graded["grade"]
    assert graded["measured_loss"] == 2.0 and g["inside_interval"] and g["runs_at_n_star"] == 3
    assert g["error_nats"] == pytest.approx(-0.01) and g["error_percent"] == pytest.approx(-100 * 0.01 / 2.01)
    assert g["flanks_not_better"] and [f["n"] for f in g["flanks"]] == [100, 300]
    runs[100]["loss"] = 1.9  # a flank 0.1 nats better: beyond twice the interval's sd (0.0204)
    assert not x.grade(_entry(), runs)["grade"]["flanks_not_better"]
    runs[200]["loss"] = 2.1
    assert not x.grade(_entry(), runs)["grade"]["inside_interval"]


def test_grading_before_n_star_is_trained_is_refused() -> None:
    with pytest.raises(x.Refused, match="no finished trial of N\\* \\(200 parameters\\)"):
        x.grade(_entry(), {100: {"loss": 2.0, "runs": 1}})


def test_the_seeds_launch_each_resolved_vertexs_nearest_size_on_its_own_data(patched: str) -> None:
    """One launch per resolved vertex: the trained size nearest it, its shape pinned, --budget its
    exact N and --tokens-per-param its D/N, so the seeds repeat that trial's data."""
    launches = x.vertex_seeds("f", patched, 3)
    rows = {int(r["param_count"]): r for r in isoflop_study_rows(COMPUTES)}
    assert 3 <= len(launches) <= len(COMPUTES)
    for launch in launches:
        flags = dict(zip(launch[::2], launch[1::2], strict=True))
        n = int(flags["--budget"])
        assert flags["--paired-seeds"] == "3" and flags["--experiment"] == "f" and n in rows
        assert float(flags["--tokens-per-param"]) * n == pytest.approx(int(rows[n]["train_tokens"]), rel=1e-9)
        assert flags["--d-model"] == str(rows[n]["d_model"]) and flags["--n-layers"] == str(rows[n]["n_layers"])


def test_the_frontier_pools_its_recentred_budgets_from_the_same_database(tmp_path: Path) -> None:
    """The second pass (experiment f_r, frontier.sh) is read with the first; without one, the first alone."""
    from archhpo.cli import main

    url = f"sqlite:///{tmp_path / 'f.db'}"
    tiny = ["--isoflop", "1e10", "--sizes", "5", "--span", "4", "--d-model", "16,32,48,64", "--n-layers", "1,2",
            "--n-heads", "2,4", *TRAINING, "--storage", url]  # below the grid: seconds a trial
    for name, centre in (("f", "2.5e4"), ("f_r", "1.5e4")):
        assert main(["launch", "--experiment", name, "--centre", centre, *tiny]) == 0
    assert main(["worker", "--study", "f_C1e10", "--storage", url, "--threads", "1"]) == 0
    alone = x._frame("f", url)
    assert set(alone["experiment"]) == {"f"} and len(alone) == 5
    assert main(["worker", "--study", "f_r_C1e10", "--storage", url, "--threads", "1"]) == 0
    pooled = x._frame("f", url)
    assert set(pooled["experiment"]) == {"f", "f_r"} and len(pooled) == 10
    # the data's known truth survives the pooling: the fits check E against its loss floor
    truth = pooled.attrs["truth"]
    assert truth == alone.attrs["truth"] and truth["loss_floor"] > truth["entropy_rate"] > 0
    # a C_big study in its own database (extrapolate.py launch --to) pools in with --also
    big = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["launch", "--experiment", "f_x", "--centre", "2e4", *tiny[:-1], big]) == 0
    assert main(["worker", "--study", "f_x_C1e10", "--storage", big, "--threads", "1"]) == 0
    also = x._frame("f", url, [big])
    assert set(also["experiment"]) == {"f", "f_r", "f_x"} and len(also) == 15 and also.attrs["truth"] == truth
    assert also.attrs["study_storage"] == {"f_C1e10": url, "f_r_C1e10": url, "f_x_C1e10": big}
    with pytest.raises(x.Refused, match="holds no study of experiment f_x"):
        x._frame("f", url, [url.replace("f.db", "none.db")])


def test_a_budget_planned_but_not_trained_sets_neither_c_big_nor_the_study_it_plans_from() -> None:
    """The frontier's 1e14 study is planned and left untrained: C_big counts from the largest budget
    with finished trials, and the plan's settings come from that budget's study."""
    import pandas as pd

    frame = pd.DataFrame({"study": ["f_C1e13", "f_C3e13", "f_C1e14"], "state": ["COMPLETE", "COMPLETE", "WAITING"],
                          "compute_budget": [1e13, 3e13, 1e14]})
    assert x._largest_study(frame) == "f_C3e13"
    assert float(x._trained(frame)["compute_budget"].max()) == 3e13
    with pytest.raises(x.Refused, match="no finished IsoFLOP trial"):
        x._trained(frame[frame["state"] == "WAITING"])


def test_the_regime_cut_keeps_the_trials_of_at_least_min_steps_and_zero_keeps_all() -> None:
    import pandas as pd

    frame = pd.DataFrame({"train_samples": [4000, 8000, 16000], "batch_size": [16, 16, 16], "study": list("abc")})
    frame.attrs["truth"] = {"entropy_rate": 1.85}
    assert list(x.in_regime(frame, 500)["study"]) == ["b", "c"], "250 steps out; 500 and 1,000 in"
    assert x.in_regime(frame, 500).attrs == frame.attrs, "the known floor travels with the cut"
    assert x.in_regime(frame, 0) is frame
