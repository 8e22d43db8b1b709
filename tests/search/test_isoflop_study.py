"""`launch/run --isoflop C`: one study per compute budget, whose trials are the planner's sizes
(budgets/_isoflop.py), each with its own data (the whole samples that put its FLOPs within 1% of C),
stored like every study (launching twice never duplicates), its trials carrying compute_budget,
param_count, train_tokens and isoflop_size; the CSV's compute_budget column; the refusals; and a
real `archhpo run` whose trials' FLOPs lie within 1% of C."""

from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path
from typing import Any

import pytest

from archhpo.budgets._isoflop import plan_isoflops
from archhpo.cli import main
from archhpo.config import StudyConfig
from archhpo.models import get_family
from archhpo.report import CSV_COLUMNS, SPEC_COLUMNS
from archhpo.schema import isoflop_key
from archhpo.search._isoflop_study import compute_label, isoflop_settings
from archhpo.search._storage import open_storage
from archhpo.search._study import read_settings
from tests.conftest import run_cli

DATA = "synthetic:tokens=100000"
# Two compute budgets of five sizes over 3x around 130K parameters (the lm grid starts at 77K).
LINE = ["--family", "lm", "--isoflop", "1e10", "--isoflop", "2e10", "--sizes", "5", "--span", "3",
        "--centre", "1.3e5", "--epochs", "1", "--quick", "--data", DATA, "--learning-rate", "3e-3",
        "--batch-size", "16"]


def _launch(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def _trials(url: str, name: str) -> list[Any]:
    storage = open_storage(url, create=False)
    study_id = storage.get_study_id_from_name(name)
    return storage.get_all_trials(study_id, deepcopy=False)


def test_compute_labels_name_each_budget_without_a_plus_sign() -> None:
    assert [compute_label(c) for c in (1e13, 3e12, 1.5e13, 1e11)] == ["C1e13", "C3e12", "C1.5e13", "C1e11"]


def test_each_compute_budget_is_one_study_whose_trials_are_the_planners_sizes(sqlite_url: str) -> None:
    code, err = _launch(["launch", "--experiment", "iso", *LINE, "--storage", sqlite_url])
    assert code == 0, err
    fam = get_family("lm")
    storage = open_storage(sqlite_url, create=False)
    for compute in (1e10, 2e10):
        name = f"iso_{compute_label(compute)}"
        settings = read_settings(storage, name)
        plan = plan_isoflops(fam, settings.info, [compute], {compute: 1.3e5}, sizes=5, span=3.0, intervals=1)[0]
        assert [a["param_count"] for a in settings.archs] == [t.param_count for t in plan.trials]
        assert settings.pruner == "none" and all(e.phase == 1 for e in settings.plan)
        stored = settings.options.isoflop
        assert stored is not None and stored["compute_budget"] == compute and stored["centre_source"] == "given"
        trials = sorted(_trials(sqlite_url, name), key=lambda t: t.user_attrs["plan_slot"])
        assert len(trials) == len(plan.trials) == 5
        fixed = [t.system_attrs["fixed_params"] for t in trials]  # a waiting trial's planned parameters
        params = {k: v for k, v in fixed[0].items() if k != "arch_idx"}
        for trial, planned, given in zip(trials, plan.trials, fixed, strict=True):
            arch = settings.archs[int(given["arch_idx"])]
            assert {k: trial.user_attrs[k] for k in ("compute_budget", "param_count", "train_tokens",
                                                      "isoflop_size")} == planned.user_attrs()
            assert settings.options.planned_samples(arch) == planned.samples
            assert abs(planned.samples * arch["flops_per_sample"] - compute) <= 0.01 * compute
            assert {k: v for k, v in given.items() if k != "arch_idx"} == params, "one set of parameters"
        assert params["learning_rate"] == 3e-3 and params["batch_size"] == 16 and params["epochs"] == 1


def test_an_isoflop_studys_sizes_are_queued_from_the_middle_outwards(sqlite_url: str) -> None:
    # A study stopped early (or an extrapolation trained only where affordable) holds its centre first.
    code, err = _launch(["launch", "--experiment", "iso", *LINE, "--storage", sqlite_url])
    assert code == 0, err
    trials = sorted(_trials(sqlite_url, "iso_C1e10"), key=lambda t: t.number)
    assert [t.user_attrs["isoflop_size"] for t in trials] == [2, 1, 3, 0, 4]
    assert sorted(t.user_attrs["plan_slot"] for t in trials) == [0, 1, 2, 3, 4], "the stored plan's slots"


def test_launching_twice_never_duplicates_and_other_sizes_are_refused(sqlite_url: str) -> None:
    argv = ["launch", "--experiment", "iso", *LINE, "--storage", sqlite_url]
    assert _launch(argv)[0] == 0
    before = {n: read_settings(open_storage(sqlite_url, create=False), n).to_attrs() for n in ("iso_C1e10", "iso_C2e10")}
    code, err = _launch(argv)
    assert code == 0 and err.count("0 newly queued") == 2
    assert [len(_trials(sqlite_url, n)) for n in before] == [5, 5]
    wider = [("4" if flag == "--span" else value) for flag, value in zip(["", *LINE], LINE, strict=False)]
    code, err = _launch(["launch", "--experiment", "iso", *wider, "--storage", sqlite_url])
    assert code == 2 and "Study 'iso_C1e10' already exists with different settings" in err
    storage = open_storage(sqlite_url, create=False)
    assert {n: read_settings(storage, n).to_attrs() for n in before} == before, "nothing written"
    assert [len(_trials(sqlite_url, n)) for n in before] == [5, 5]


def test_a_centre_from_an_earlier_law_is_its_n_opt_at_each_c() -> None:
    config = StudyConfig.from_options({"experiment": "x", "family": "lm", "isoflop": [1e10, 2e10], "sizes": 5,
                                       "span": 3.0, "epochs": 1, "quick": True, "data": DATA,
                                       "centre_from": "earlier"}, given=["isoflop", "sizes", "span", "centre_from"])
    law = {"status": "fitted", "G": 1.3, "a": {"estimate": 0.5, "ci95": [0.4, 0.6]}}
    studies = isoflop_settings(config, law)
    assert [s.study_name for s in studies] == ["x_C1e10", "x_C2e10"]
    for s, c in zip(studies, (1e10, 2e10), strict=True):
        assert s.options.isoflop is not None
        assert s.options.isoflop["centre"] == pytest.approx(1.3 * c ** 0.5, rel=1e-12)
        assert s.options.isoflop["centre_source"] == "law"
    with pytest.raises(Exception, match="is not fitted"):
        isoflop_settings(config, {"status": "unresolved", "reason": "too few", "G": None, "a": None})


def test_shapes_k_plans_k_architectures_per_size_each_with_its_own_samples() -> None:
    config = StudyConfig.from_options({"experiment": "x", "family": "lm", "isoflop": [2e10], "sizes": 5, "span": 3.0,
                                       "centre": [1.3e5], "shapes": 2, "epochs": 1, "quick": True, "data": DATA},
                                      given=["isoflop", "sizes", "span", "centre", "shapes"])
    (study,) = isoflop_settings(config)
    sizes = [e.attrs["isoflop_size"] for e in study.plan if e.attrs]
    per_size = {i: sizes.count(i) for i in range(5)}
    # up to 2 per size (a narrow band may hold a single body), more than one shape in all
    assert set(sizes) == set(range(5)) and max(per_size.values()) == 2 and len(sizes) > 5
    bodies = {(e.attrs["isoflop_size"], a["d_model"], a["n_layers"], a["d_ff"])
              for e, a in zip(study.plan, study.archs, strict=True)}
    assert len(bodies) == len(sizes)  # a size's shapes differ in width, depth or FFN
    keys = [isoflop_key(a) for a in study.archs]
    assert len(set(keys)) == len(keys) == len(sizes) and study.options.isoflop is not None
    assert set(study.options.isoflop["samples"]) == set(keys)


@pytest.mark.parametrize(("extra", "sentence"), [
    (["--isoflop", "0"], "--isoflop 0 must be a positive number of training FLOPs, e.g. --isoflop 1e13."),
    (["--isoflop", "-1e12"], "--isoflop -1e+12 must be a positive number of training FLOPs, e.g. --isoflop 1e13."),
    (["--isoflop", "1e10", "--sizes", "4"], "--sizes 4: an IsoFLOP profile needs at least 5 sizes per compute "
                                            "budget to fit its parabola; give --sizes 5 or more."),
    (["--isoflop", "1e10", "--span", "1"], "--span 1 must be above 1 (the largest size over the smallest, e.g. 10)."),
    (["--isoflop", "1e10", "--budget", "200K"], "--isoflop plans each compute budget's sizes and data itself, so it "
                                                "takes no --budget; drop it (--n-heads and --d-ff lists may filter "
                                                "its grid, --d-model and --n-layers lists replace its widths and "
                                                "depths)."),
    (["--isoflop", "1e10", "--tokens-per-param", "20"], "so it takes no --tokens-per-param; drop it"),
    (["--isoflop", "1e10", "--isoflop", "1e10"], "--isoflop lists a compute budget twice; give each C once."),
    (["--isoflop", "1e10", "--pruner", "halving"], "--pruner halving would stop an IsoFLOP study's trials before "
                                                   "their FLOPs reach C; drop --pruner"),
    (["--isoflop", "1e10", "--isoflop", "2e10", "--centre", "1e5", "--centre", "2e5", "--centre", "3e5"],
     "--centre is given 3 times for 2 --isoflop budgets; give one per --isoflop C"),
    (["--sizes", "5", "--budget", "200K"], "--sizes shapes an IsoFLOP study, so it needs --isoflop C; add --isoflop "
                                           "or drop --sizes."),
    (["--isoflop", "1e10", "--centre", "1e4"], "No lm architecture of the grid has between"),
])
def test_bad_isoflop_input_is_one_sentence_and_writes_nothing(tmp_path: Path, extra: list[str], sentence: str) -> None:
    db = tmp_path / "s.db"
    code, err = _launch(["launch", "--experiment", "x", "--family", "lm", "--quick", "--data", DATA, *extra,
                         "--storage", f"sqlite:///{db}"])
    assert code == 2 and not db.exists()
    assert err.count("\n") == 1 and sentence in err, err


def test_the_csv_appends_compute_budget_after_the_design_columns() -> None:
    assert CSV_COLUMNS.index("compute_budget") > CSV_COLUMNS.index("timestamp") == len(SPEC_COLUMNS) - 1
    assert CSV_COLUMNS[:len(SPEC_COLUMNS)] == SPEC_COLUMNS and "isoflop_size" in CSV_COLUMNS


@pytest.mark.ray
def test_a_real_isoflop_run_trains_each_size_to_within_one_percent_of_c(tmp_path: Path) -> None:
    out = tmp_path / "results"
    res = run_cli("run", "--experiment", "iso", *LINE[:4], *LINE[6:], "--workers", "1",
                  "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out),
                  "--checkpoint-dir", str(tmp_path / "ck"), cwd=tmp_path, timeout=480)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "iso_C1e10: 5 complete, 0 pruned, 0 failed" in res.stderr
    assert "IsoFLOP (Approach 2): no law:" in res.stderr and "C = 1e+10: N_opt = " in res.stderr
    with open(out / "experiment_results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 5 and {r["compute_budget"] for r in rows} == {"10000000000.0"}
    assert sorted(int(r["isoflop_size"]) for r in rows) == [0, 1, 2, 3, 4]
    from archhpo.report._frame import trials_frame

    frame = trials_frame("iso", storage=f"sqlite:///{tmp_path / 's.db'}")  # the report's read of the database
    assert sorted(frame["isoflop_size"]) == [0, 1, 2, 3, 4] and set(frame["compute_budget"]) == {1e10}
    for r in rows:
        assert abs(float(r["train_flops"]) - 1e10) <= 0.01 * 1e10, r
        assert int(r["train_samples"]) * int(float(r["flops_per_sample"])) == int(float(r["train_flops"]))


def test_the_budget_summary_keeps_train_flops_above_int64s_range_as_a_float(tmp_path: Path) -> None:
    """A 1e20-FLOP IsoFLOP trial: the summary's train_flops is a float (an Int64 cast overflowed at 9.2e18)."""
    from archhpo.report._frame import trials_frame
    from archhpo.report._summary import budget_summary
    from tests.report.test_isoflop_figures import isoflop_rows
    from tests.report.test_report import _write

    rows = [{**r, "train_flops": r["compute_budget"] * 1e6} for r in isoflop_rows()]  # 1e19 to 1e21
    summary = budget_summary(trials_frame(None, csv=_write(rows, tmp_path / "big.csv")))
    assert summary["train_flops"].dtype == float
    assert set(summary["train_flops"]) == {1e19, 1e20, 1e21}


def test_centre_from_an_experiment_without_a_fitted_law_is_one_sentence_and_writes_nothing(sqlite_url: str) -> None:
    assert _launch(["launch", "--experiment", "iso", *LINE, "--storage", sqlite_url])[0] == 0
    line = [x for x in LINE if x not in ("--centre", "1.3e5")]
    code, err = _launch(["launch", "--experiment", "next", *line, "--centre-from", "iso", "--storage", sqlite_url])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("archhpo: error: --centre-from iso: neither its IsoFLOP law (no trial records a compute "
                          "budget: not an IsoFLOP study) nor its L(N, D) law (")
    assert err.rstrip().endswith("is fitted; give --centre instead.")
    storage = open_storage(sqlite_url, create=False)
    assert [s.study_name for s in storage.get_all_studies()] == ["iso_C1e10", "iso_C2e10"]


def test_an_isoflop_studys_trials_validate_on_the_fixed_budget_windows() -> None:
    """Like a data-budget study's: 65,536 tokens of validation whatever the data's length (a tenth of
    20M tokens, evaluated at every interval, cost more than a small C's training)."""
    from archhpo.models.data.language import BUDGET_VAL_TOKENS

    config = StudyConfig.from_options({"experiment": "x", "family": "lm", "isoflop": [2e10], "sizes": 5, "span": 3.0,
                                       "centre": [1.3e5], "epochs": 1, "data": "synthetic:tokens=2000000"},
                                      given=["isoflop", "sizes", "span", "centre"])
    (study,) = isoflop_settings(config)
    fam = get_family("lm")
    data = fam.load_data(study.data, study.options.as_dict())
    plain = fam.load_data(study.data, {k: v for k, v in study.options.as_dict().items() if k != "isoflop"})
    seq_len = int(study.info["seq_len"])
    assert len(data.val_target) == BUDGET_VAL_TOKENS // seq_len < len(plain.val_target)
    assert data.n_train == plain.n_train


def test_a_retried_isoflop_trial_keeps_its_compute_budget_size_and_tokens(sqlite_url: str) -> None:
    from optuna.trial import TrialState

    from archhpo.search import TrialQueue

    assert _launch(["launch", "--experiment", "iso", *LINE, "--storage", sqlite_url])[0] == 0
    name = f"iso_{compute_label(1e10)}"
    queue = TrialQueue(sqlite_url, name)
    claim = queue.claim({"host": "test"})
    assert claim is not None
    first = next(t for t in _trials(sqlite_url, name) if t.number == claim.number)
    assert queue.finish(claim, TrialState.FAIL, None, {})  # lost (no final reason): retried
    queue.maintain()
    retry = next(t for t in _trials(sqlite_url, name) if t.user_attrs.get("retry_of") == claim.number)
    keys = ("compute_budget", "param_count", "train_tokens", "isoflop_size", "plan_slot")
    assert {k: retry.user_attrs[k] for k in keys} == {k: first.user_attrs[k] for k in keys}
    assert retry.user_attrs["attempt"] == 2
