"""Rule-of-thumb baselines (--baselines): each rule picks a deterministic shape from the grid, the
shapes are planned as confirmation slots with the confirmation seeds, trained with the searched
best's training parameters, and the report gives each one's paired difference from the best."""

from __future__ import annotations

import csv
import html
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from archhpo.cli import main
from archhpo.errors import StudyError
from archhpo.report import confirmation_summary
from archhpo.report._confirm import baseline_statement, paired_difference
from archhpo.report._frame import trials_frame
from archhpo.schema import TRAINING_PARAMS
from archhpo.search import TrialQueue, prepare_settings
from archhpo.search._baselines import BASELINE_RULES, MOBILELLM_ASPECT, pick_baseline
from tests.conftest import TINY_DATA


def _row(idx: int, d_model: int, n_layers: int, params: int = 1000, choices: dict[str, Any] | None = None,
         n_heads: int = 4) -> dict:
    return {"arch_idx": idx, "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads, "d_ff": 4 * d_model,
            "param_count": params, "choices": choices or {}}


GRID = [_row(0, 64, 8), _row(1, 128, 4), _row(2, 256, 2), _row(3, 512, 1), _row(4, 96, 6), _row(5, 384, 4)]
# aspect ratios:  8,         32,           128,          512,          16,          96


def test_each_rule_picks_the_row_nearest_its_aspect_ratio() -> None:
    assert pick_baseline("kaplan", GRID, {}, 1000) == 5, "96 is nearest 100 in log ratio"
    assert pick_baseline("mobilellm", GRID, {}, 1000) == 4, f"16 is nearest {MOBILELLM_ASPECT:.1f}"
    # sorted aspects 8, 16, 32, 96, 128, 512: the lower median is 32
    assert pick_baseline("median", GRID, {}, 1000) == 1
    assert list(BASELINE_RULES) == ["kaplan", "mobilellm", "median"]


def test_ties_go_to_the_best_choices_then_the_count_nearest_the_budget_then_the_lower_index() -> None:
    rows = [_row(0, 200, 2, 900, {"enc": "a"}), _row(1, 200, 2, 990, {"enc": "a"}),
            _row(2, 200, 2, 1000, {"enc": "b"}), _row(3, 100, 1, 990, {"enc": "a"})]
    assert pick_baseline("kaplan", rows, {"enc": "a"}, 1000) == 1, "same aspect: count nearest the budget"
    assert pick_baseline("kaplan", rows, {"enc": "b"}, 1000) == 2, "the best's choices first"
    assert pick_baseline("kaplan", rows, {"enc": "c"}, 1000) == 2, "no row has them: all rows compete"
    assert pick_baseline("kaplan", rows[:2] + [_row(5, 200, 2, 990, {"enc": "a"})], {"enc": "a"}, 1000) == 1


def test_among_one_aspect_ratio_the_head_dimension_nearest_64_goes_first() -> None:
    """Head counts change neither the aspect ratio nor the count: the rules' own models use 64-wide heads."""
    rows = [_row(0, 256, 2, 1000, n_heads=2), _row(1, 256, 2, 1000, n_heads=4), _row(2, 256, 2, 1000, n_heads=32),
            _row(3, 256, 2, 1000, n_heads=8)]
    # head dimensions 128, 64, 8, 32
    assert pick_baseline("kaplan", rows, {}, 1000) == 1
    assert pick_baseline("kaplan", [rows[0], rows[2], rows[3]], {}, 1000) == 0, "128 and 32 tie in log ratio: the lower index"
    assert pick_baseline("kaplan", [rows[2], rows[3]], {}, 1000) == 3, "32 is nearer 64 than 8"
    narrow = [_row(0, 64, 2, 1000, n_heads=32), _row(1, 64, 2, 2000, n_heads=2)]
    assert pick_baseline("mobilellm", narrow, {}, 1000) == 1, "the head dimension before the count"


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown baseline rule"):
        pick_baseline("chinchilla", GRID, {}, 1000)


def test_baseline_slots_follow_each_seeds_confirmation_slots() -> None:
    plain = prepare_settings("b", "200K", data=TINY_DATA, quick=True, n_trials=4, confirm=2, confirm_seeds=2)
    s = prepare_settings("b", "200K", data=TINY_DATA, quick=True, n_trials=4, confirm=2, confirm_seeds=2,
                         baselines=True)
    p3 = [(e.seed, e.rank, e.baseline) for e in s.plan if e.phase == 3]
    assert p3 == [(0, 0, None), (0, 1, None), (0, 2, "kaplan"), (0, 3, "mobilellm"), (0, 4, "median"),
                  (1, 0, None), (1, 1, None), (1, 2, "kaplan"), (1, 3, "mobilellm"), (1, 4, "median")]
    assert s.options.baselines == ("kaplan", "mobilellm", "median") and "baselines" not in plain.options.keys
    assert all("baseline" not in e.as_dict() for e in plain.plan), "a plan without baselines keeps its old entries"
    assert [e for e in s.plan if e.phase != 3] == [e for e in plain.plan if e.phase != 3]


def test_baselines_without_the_confirmation_phase_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="add --confirm 1"):
        prepare_settings("b", "200K", data=TINY_DATA, quick=True, baselines=True)
    db = tmp_path / "b.db"
    rc = main(["launch", "--experiment", "b", "--budget", "200K", "--quick", "--data", TINY_DATA, "--baselines",
               "--storage", f"sqlite:///{db}"])
    assert rc != 0 and not db.exists(), "one sentence, a non-zero exit and nothing written"


@pytest.mark.parametrize(("values", "expect"), [
    ({0: 1.0, 1: 1.1, 2: 0.9}, "within seed noise"),
    ({0: 1.5, 1: 1.52, 2: 1.49}, "The search beats"),
    ({0: 0.5, 1: 0.52, 2: 0.49}, "the search missed it"),
])
def test_the_verdict_follows_the_paired_interval(values: dict[int, float], expect: str) -> None:
    best = {0: 1.0, 1: 1.0, 2: 1.0}
    lead = paired_difference(best, values)
    assert expect in baseline_statement("kaplan", lead, same_shape=False)
    assert "itself" in baseline_statement("kaplan", lead, same_shape=True)


def test_baselines_end_to_end_with_a_real_worker(tmp_path: Path) -> None:
    """launch --confirm 1 --seeds 3 --baselines → a worker trains every slot → each rule's shape was
    trained with the best's parameters and the confirmation seeds, and the summary pairs it with the best."""
    import torch

    from archhpo.workers import Worker

    torch.set_num_threads(1)
    url, out = f"sqlite:///{tmp_path / 'b.db'}", tmp_path / "res"
    assert main(["launch", "--experiment", "b", "--budget", "200K", "--trials", "4", "--quick", "--epochs", "2",
                 "--data", TINY_DATA, "--pruner", "none", "--confirm", "1", "--seeds", "3", "--baselines",
                 "--storage", url]) == 0
    q = TrialQueue(url, "b_200K")
    summary = Worker([q], device="cpu", threads=1).run()
    assert summary.complete == 4 + 3 + 3 * 3 and summary.failed == 0
    trials = q.storage.get_all_trials(q.study_id)
    rank0 = [t for t in trials if t.user_attrs.get("rank") == 0]
    best_params = {k: rank0[0].params[k] for k in TRAINING_PARAMS if k in rank0[0].params}
    assert best_params, "the plan draws training parameters"
    archs, budget = q.settings.archs, q.settings.budget_value
    choices = archs[rank0[0].params["arch_idx"]]["choices"]
    for rule in BASELINE_RULES:
        mine = [t for t in trials if t.user_attrs.get("baseline") == rule]
        assert sorted(t.user_attrs["seed"] for t in mine) == [0, 1, 2]
        assert {t.params["arch_idx"] for t in mine} == {pick_baseline(rule, archs, choices, budget)}
        assert all({k: t.params[k] for k in best_params} == best_params for t in mine), "same training as the best"
    conf = confirmation_summary(trials, archs)
    assert [a["rank"] for a in conf["architectures"]] == [0], "the baselines are not confirmed ranks"
    assert conf["unfinished"] == []
    best_values = {t.user_attrs["seed"]: t.value for t in rank0}
    for b in conf["baselines"]:
        vals = {t.user_attrs["seed"]: t.value for t in trials if t.user_attrs.get("baseline") == b["rule"]}
        diffs = [vals[s] - best_values[s] for s in range(3)]
        d = b["difference"]
        assert b["n"] == 3 and b["mean"] == statistics.fmean(vals.values())
        assert d["n_pairs"] == 3 and d["differences"] == diffs
        half = 4.302652729911275 * statistics.stdev(diffs) / math.sqrt(3)  # t(0.975, df=2) * se
        assert d["ci95"] == pytest.approx([statistics.fmean(diffs) - half, statistics.fmean(diffs) + half])
    # The export, the CSV-read report and the page carry the same baselines.
    assert main(["export", "--experiment", "b", "--storage", url, "--out", str(out)]) == 0
    best_json = json.loads((out / "b_200K_best.json").read_text())
    assert best_json["confirmation"]["baselines"] == json.loads(json.dumps(conf["baselines"]))
    rows = list(csv.DictReader((out / "experiment_results.csv").open()))
    assert sorted(r["baseline"] for r in rows if r["baseline"]) == sorted(list(BASELINE_RULES) * 3)
    from_csv = trials_frame(None, csv=[out / "experiment_results.csv"])
    assert sorted(from_csv["baseline"].dropna()) == sorted(list(BASELINE_RULES) * 3)
    assert main(["report", "--experiment", "b", "--storage", url, "--out", str(out)]) == 0
    page = (out / "b_report.html").read_text()
    assert "Rule-of-thumb baselines" in page
    assert all(html.escape(b["statement"]) in page for b in conf["baselines"])
