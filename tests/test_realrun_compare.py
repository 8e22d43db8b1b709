"""bench/truths/realrun/compare.py: a real `run --ladder` graded by its truth, from what the run wrote
(results CSV, best JSONs), committed beside it; the T1 run's figures in docs/searching.md."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
TRUTHS = ROOT / "bench" / "truths"
REALRUN = TRUTHS / "realrun"


def _load() -> ModuleType:
    return load_script(REALRUN / "compare.py", "realrun_compare")


compare = _load()


def _graded(capsys: pytest.CaptureFixture[str], truth: str, run: str, experiment: str, *extra: str) -> list[str]:
    """compare.py's lines for a committed real run (bench/truths/realrun/<run>) graded by a truth table."""
    assert compare.main(["--truth", str(TRUTHS / truth), "--results", str(REALRUN / run),
                         "--experiment", experiment, *extra]) == 0
    return capsys.readouterr().out.splitlines()


def _chosen(lines: list[str]) -> list[str]:
    """The architecture each budget's line says the run chose."""
    return [line.split(" trials, chose ")[1].split(" ")[0] for line in lines]


def test_the_t1_run_is_graded_by_its_truth_from_its_committed_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("100K-h2+4+8-t10: 16 trials, chose d64-L3-h2 (truth mean 2.3970; best d64-L2-h8 2.3949; "
                             "regret 1.82 std")
    assert out[1].startswith("200K-h2+4+8-t10: 8 trials, chose d64-L4-h2") and "regret 0.00 std" in out[1]
    assert out[-1] == "total FLOPs ratio 0.886"


def test_a_results_folder_without_the_run_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no best JSON of t1real in"):
        compare.main(["--results", str(tmp_path)])


def test_the_replay_spread_places_the_run_among_the_strategys_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare.main(["--replay", "3"]) == 0  # the run's studies store no two-wave confirmation: replayed at once
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("replay (3 repeats, seeds 20261126+k, confirming every finalist at once): FLOPs ratio min 0.725, "
                    "5-95% 0.725-0.727, max 0.727; within 1 std per budget: 100% / 100%")
    assert compare.main(["--replay", "3", "--confirmation", "waves"]) == 0  # today's --ladder default: cheaper
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("replay (3 repeats, seeds 20261126+k, confirming in two waves): FLOPs ratio min 0.662, "
                    "5-95% 0.662-0.664, max 0.664; within 1 std per budget: 100% / 100%")


def test_the_t3_run_is_graded_by_its_truth_from_its_committed_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    """The run on T3's whole ladder (bench/truths/realrun/t3/run.sh): the truth's best at every budget."""
    out = _graded(capsys, "t3.csv", "t3", "t3real")
    assert _chosen(out[:4]) == ["d64-L3-h8", "d64-L4-h8", "d128-L2-h8", "d128-L2-h8"]
    assert all("regret 0.00 std" in line for line in out[:4]), "the truth's best at every budget"
    assert out[-1] == "total FLOPs ratio 0.217"


def test_the_t2_run_is_graded_by_its_partial_truth(capsys: pytest.CaptureFixture[str]) -> None:
    """The run on T2's 100K, 200K and 400K (bench/truths/realrun/t2/run.sh): within 1 std at each."""
    out = _graded(capsys, "t2_partial_100K-400K.csv", "t2", "t2real")
    assert _chosen(out[:3]) == ["d64-L2-h4", "d64-L6-h4", "d128-L2-h8"]
    assert "regret 0.05 std" in out[0] and "regret 0.50 std" in out[1] and "regret 0.00 std" in out[2]
    assert out[-1] == "total FLOPs ratio 0.362"


def test_the_t2_run_is_graded_by_the_complete_t2(capsys: pytest.CaptureFixture[str]) -> None:
    """The same run with its 800K (added 2026-11-28, finished 2026-11-29) graded by T2's whole ladder:
    within 1 std at every budget and the truth's best at 400K and 800K; its 800K trained one trial's
    first part twice after a stop without its checkpoint, which the line prices and sets apart."""
    out = _graded(capsys, "t2.csv", "t2", "t2real")
    assert _chosen(out[:4]) == ["d64-L2-h4", "d64-L6-h4", "d128-L2-h8", "d64-L16-h8"]
    assert [line.split("regret ")[1].split(" std")[0] for line in out[:4]] == ["0.05", "0.50", "0.00", "0.00"]
    assert out[3].endswith("= 0.385 (0.368 without 2.074e+13 trained again after a restart)")
    assert out[-1] == ("total FLOPs ratio 0.379 (0.366 without the work trained again after restarts, "
                       "which the replay does not model)")


def test_the_replay_plans_with_the_runs_own_trials() -> None:
    """A run launched with --trials 12 (T1's learning-rate run) is placed among replays of a 12-trial
    plan: the design it is compared with, and the replay's, are that plan's, not the default 50's."""
    budgets = compare.load_table(compare.HERE.parent / "t1_partial_100K-400K.csv")
    twelve = compare.replay_spread(budgets, 2, 5, True, trials=12)
    ratios = sorted(compare.se.replay(budgets, 1, 5 + k, 12, sequential=True, carry_finalists=False)["archhpo"][
        "flops_ratio"] for k in (0, 1))
    assert twelve["flops_ratio"] == [ratios[0], ratios[0], ratios[1], ratios[1]]
    assert compare.replay_spread(budgets, 2, 5, True)["flops_ratio"] != twelve["flops_ratio"], "50 plans a larger design"


def test_the_t3_run_confirming_at_its_trusted_rung_is_graded_from_its_committed_outputs(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The same ladder with --confirm-at-rung (bench/truths/realrun/t3rung/run.sh): the truth's best at
    every budget for 0.184 of the design's FLOPs instead of 0.217, inside its replay's spread, and its
    larger budgets' confirmations say they were made at a rung."""
    out = _graded(capsys, "t3.csv", "t3rung", "t3rung", "--replay", "3")
    assert all("regret 0.00 std" in line for line in out[:4]), "the truth's best at every budget"
    assert out[4] == "total FLOPs ratio 0.184"
    assert out[5].startswith("replay (3 repeats, seeds 20261126+k, confirming in two waves, at the trusted rung)")
    rungs = [json.loads((REALRUN / "t3rung" / f"t3rung_{b}-h2+4+8-t10_best.json").read_text())["confirmation"]["at_rung"]
             for b in ("100K", "150K", "250K", "400K")]
    assert rungs == [None, 1, 1, 1], "the smallest budget measures the trust at full length"


def test_a_run_launched_with_trust_each_budget_or_confirm_at_rung_is_replayed_so(tmp_path: Path) -> None:
    """The run's best JSONs store the ladder options; the T3 run's do not (the defaults), and a copy of
    them whose larger budgets store --trust-each-budget (then --confirm-at-rung) is read as such."""
    budgets = compare.load_table(TRUTHS / "t3.csv")
    run = REALRUN / "t3"
    assert compare.run_trusts_each_budget(run, "t3real", budgets) is False
    for b in budgets:
        best = json.loads((run / f"t3real_{b.name}_best.json").read_text())
        if best["options"].get("ladder"):
            best["options"]["ladder"] = {**best["options"]["ladder"], "trust": "each", "largest": False}
        (tmp_path / f"t3real_{b.name}_best.json").write_text(json.dumps(best))
    assert compare.run_trusts_each_budget(tmp_path, "t3real", budgets) is True
    assert compare.run_confirms_at_rung(run, "t3real", budgets) is False
    for b in budgets:
        best = json.loads((run / f"t3real_{b.name}_best.json").read_text())
        if best["options"].get("ladder"):
            best["options"]["ladder"] = {**best["options"]["ladder"], "confirm": "rung"}
        (tmp_path / f"t3real_{b.name}_best.json").write_text(json.dumps(best))
    assert compare.run_confirms_at_rung(tmp_path, "t3real", budgets) is True


def test_a_run_extended_after_the_waves_is_replayed_per_budget_as_it_confirmed(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """T2's run confirmed 100K-400K every finalist at once and its 800K, added later, in two waves: a
    copy of its best JSONs whose 400K stores the waves is read per budget, replayed so (the budgets
    before it as at once, the one with waves as in waves) and said so."""
    budgets = compare.load_table(TRUTHS / "t2_partial_100K-400K.csv")
    run = REALRUN / "t2"
    assert compare.run_confirms_in_waves(run, "t2real", budgets) == [False, False, False]
    for b in budgets:
        best = json.loads((run / f"t2real_{b.name}_best.json").read_text())
        best["options"]["confirm_sequential"] = b.name.startswith("400K")
        (tmp_path / f"t2real_{b.name}_best.json").write_text(json.dumps(best))
    (tmp_path / "experiment_results.csv").write_text((run / "experiment_results.csv").read_text())
    waves = compare.run_confirms_in_waves(tmp_path, "t2real", budgets)
    assert waves == [False, False, True]
    mixed = compare.se.replay(budgets, 4, 3, sequential=waves)["archhpo"]["flops_ratio_per_budget"]
    at_once = compare.se.replay(budgets, 4, 3, sequential=False)["archhpo"]["flops_ratio_per_budget"]
    assert mixed[:2] == at_once[:2] and mixed[2] != at_once[2], "only the largest budget confirms in waves"
    assert compare.main(["--truth", str(TRUTHS / "t2_partial_100K-400K.csv"), "--results",
                         str(tmp_path), "--experiment", "t2real", "--replay", "2"]) == 0
    assert ("confirming as each budget stored it: at once at 100K-h2+4+8-t10, 200K-h2+4+8-t10, in two waves at "
            "400K-h2+4+8-t10)") in capsys.readouterr().out.splitlines()[-1]


def test_work_trained_again_after_a_restart_is_priced_but_set_apart_from_the_method(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial stopped without its checkpoint trains its first steps twice: flops_spent counts them (the
    run's real cost) and the line says what the run cost without them, which is what the replay models.
    A copy of T2's run in which one 400K trial that scored no rung spent half a training more."""
    truth = TRUTHS / "t2_partial_100K-400K.csv"
    run = REALRUN / "t2"
    for f in run.glob("t2real_*_best.json"):
        (tmp_path / f.name).write_text(f.read_text())
    with open(run / "experiment_results.csv") as fh:
        reader = csv.DictReader(fh)
        rows, fields = list(reader), reader.fieldnames
    assert fields is not None
    hit = next(r for r in rows if r["budget"].startswith("400K") and r["state"] == "COMPLETE" and r["rung_scores"] == "[]"
               and r["flops_spent"] == r["flops_full"])
    full = float(hit["flops_full"])
    hit["flops_spent"] = str(1.5 * full)
    with open(tmp_path / "experiment_results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    args = ["--truth", str(truth), "--experiment", "t2real"]
    assert compare.main([*args, "--results", str(run)]) == 0
    before = capsys.readouterr().out.splitlines()
    assert compare.main([*args, "--results", str(tmp_path)]) == 0
    after = capsys.readouterr().out.splitlines()
    assert after[:2] == before[:2], "the budgets without a restart are graded as before"
    assert after[2].split("; FLOPs ")[0] == before[2].split("; FLOPs ")[0], "the same choice and grade"
    assert after[2].endswith(f"(0.336 without {0.5 * full:.3e} trained again after a restart)")
    assert before[-1] == "total FLOPs ratio 0.362"
    assert after[-1].startswith("total FLOPs ratio 0.") and after[-1].endswith(
        "(0.362 without the work trained again after restarts, which the replay does not model)")
