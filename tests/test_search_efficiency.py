"""bench/search_efficiency.py replays search strategies on a ground-truth table; these tables are
made up so that the right answer is known: its FLOPs arithmetic, its regret under a real study's
noise (the data fixed, leave-one-seed-out truths), the plan shapes and extremes of archhpo's own
code, eta read from the table, both table schemas and its refusals; one test reads the committed
bench/search_truth.csv."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from archhpo.schema import LADDER_CARRY_FINALISTS, LADDER_CONFIRM_AT_RUNG

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


se = _load("search_efficiency")
po = sys.modules["_paired_options"]  # the options' paired comparison, as search_efficiency imported it
truth = _load("search_truth")
OLD_COLUMNS = truth.COLUMNS[:17]  # bench/search_truth.csv's schema: no train_tokens, ..., data_seed, duration_s


def _table(tmp_path: Path, budgets: dict[str, int], n_archs: int, rung_sign: float | dict[str, float] = 1.0) -> Path:
    """Architecture a of every budget has loss 3 - 0.1a (+0.001 per seed); its rung scores follow
    the same order (rung_sign 1) or the reverse (-1; a dict: per budget); rungs at epochs 1, 3, 9
    with branches of a quarter of the epochs so far, one FLOP per epoch."""
    rows: list[dict[str, Any]] = []
    for budget, params in budgets.items():
        sign = rung_sign[budget] if isinstance(rung_sign, dict) else rung_sign
        for a in range(n_archs):
            for seed in range(3):
                loss = 3 - 0.1 * a + 0.001 * seed
                curve = [loss + 1 - e / 9 for e in range(1, 10)]
                rungs = [3.5 - sign * 0.1 * a + 0.001 * seed] * 2  # the final order, or its reverse
                rows.append({
                    "budget": budget, "budget_params": params, "arch_idx": a, "d_model": 64 * (1 + a % 3),
                    "n_layers": 2 + a // 3, "n_heads": 2, "d_ff": 128, "param_count": params, "seed": seed,
                    "epochs": 9, "flops_per_epoch": 1, "loss": loss, "curve": ";".join(map(repr, curve)),
                    "rung_epochs": "1;3;9", "rung_loss": ";".join(map(repr, [*rungs, loss])),
                    "branch_epochs": "0.25;0.75;0.0", "cosine_rung_loss": "",
                })
    path = tmp_path / "truth.csv"
    truth.write_table(rows, path)
    return path


def test_halving_finds_the_best_when_rung_scores_rank_as_the_final_losses(tmp_path: Path) -> None:
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9))
    result = se.replay(budgets, repeats=5, seed=0)
    for name in ("design", "halving", "halving_ladder"):
        assert result[name]["regret_std_per_budget"] == [0.0, 0.0], name
        assert result[name]["share_within_1std"] == 1.0


def test_halving_is_misled_when_rung_scores_rank_the_other_way(tmp_path: Path) -> None:
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000}, 9, rung_sign=-1.0))
    result = se.replay(budgets, repeats=3, seed=0)
    assert result["halving"]["share_within_1std"] == 0.0 and result["design"]["share_within_1std"] == 1.0


def test_the_flops_of_halving_are_the_rungs_trained_plus_their_branches(tmp_path: Path) -> None:
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000}, 9))
    result = se.replay(budgets, repeats=1, seed=0)
    # 9 architectures, 50 trials: all 9 twice = 18 trials. Rung 0: 18 x (1 + 0.25); 6 go on:
    # 6 x (2 + 0.75); 2 go on: 2 x 6. The design trains 18 x 9.
    assert result["halving"]["flops_ratio"] == pytest.approx((18 * 1.25 + 6 * 2.75 + 2 * 6) / (18 * 9), abs=1e-12)
    assert result["topk_one_epoch"]["flops_ratio"] == pytest.approx((18 + 5 * 8) / (18 * 9), abs=1e-12)


def test_the_flops_per_budget_weigh_into_the_overall_ratio_by_the_designs_shares(tmp_path: Path) -> None:
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9))
    result = se.replay(budgets, repeats=2, seed=0)
    # one FLOP per epoch at both budgets: the design trains the same 18 x 9 epochs at each, half its total
    assert result["design"]["flops_share_per_budget"] == [0.5, 0.5]
    assert result["design"]["flops_ratio_per_budget"] == [1.0, 1.0]
    # halving is the same at both budgets (see the test above): its ratio per budget is its overall ratio
    halving = (18 * 1.25 + 6 * 2.75 + 2 * 6) / (18 * 9)
    assert result["halving"]["flops_ratio_per_budget"] == pytest.approx([halving, halving], abs=1e-12)
    for name, m in result.items():
        overall = sum(r * w for r, w in zip(m["flops_ratio_per_budget"], result["design"]["flops_share_per_budget"],
                                            strict=True))
        assert overall == pytest.approx(m["flops_ratio"], abs=1e-12), name


def test_lr_probe_adds_rank_0_retrained_at_each_factor_below_the_largest_budget(tmp_path: Path) -> None:
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9))
    result = se.replay(budgets, repeats=2, seed=0)["archhpo"]
    # at 1M (the smallest: every rung scored in passing) each probe costs 9 epochs + branches 0.25 + 0.75;
    # none at 2M, the largest; the design trains 18 x 9 epochs at each budget
    probe = len(se.LR_PROBE_FACTORS) * (9 + 0.25 + 0.75)
    assert result["lr_probe_flops_ratio"] - result["flops_ratio"] == pytest.approx(probe / (2 * 18 * 9), abs=1e-12)
    one = se.replay(se.load_table(_table(tmp_path, {"1M": 1_000_000}, 9)), repeats=2, seed=0)["archhpo"]
    assert one["lr_probe_flops_ratio"] == one["flops_ratio"], "a single budget is the largest: no probe"


def test_keeping_every_trial_after_one_epoch_chooses_as_the_design_does(tmp_path: Path) -> None:
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000}, 6))
    every = se.replay(budgets, repeats=3, seed=1, topk=1000)
    assert every["topk_one_epoch"]["regret_std_per_budget"] == every["design"]["regret_std_per_budget"]


def test_the_command_writes_the_json_interface(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 6)
    assert se.main(["--truth", str(path), "--repeats", "2", "--seed", "3", "--json", str(tmp_path / "o.json")]) == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    assert list(doc["strategies"]) == list(se.STRATEGIES) and "archhpo" in doc["strategies"]
    for name, measures in doc["strategies"].items():  # exactly MEASURES: regret_std the mean over the 2 budgets
        assert set(measures) == set(se.MEASURES) == {
            "flops_ratio", "share_within_1std", "regret_std", "regret_nats", "regret_std_top", "regret_std_per_budget",
            "paired_regret_vs_design", "flops_vs_grid_once"}, name
        assert len(measures["regret_std_per_budget"]) == 2 and 0 <= measures["share_within_1std"] <= 1
        assert measures["regret_std"] == pytest.approx(sum(measures["regret_std_per_budget"]) / 2)
        assert measures["regret_std_top"] == measures["regret_std_per_budget"][-1]
        assert set(measures["paired_regret_vs_design"]) == {"estimate", "ci90"}
    assert doc["noise"] == "fresh" and doc["rho"] == 1.0 and doc["noise_data"] == "seed changes the data"
    assert doc["strategies"]["design"]["paired_regret_vs_design"] == {"estimate": 0.0, "ci90": [0.0, 0.0]}
    assert doc["oracle"]["share_within_1std"] == 1.0 and doc["oracle"]["regret_std"] == 0.0, "fresh: best by construction"
    assert doc["per_budget"]["design"]["same_winner_as_design"] == [1.0, 1.0]
    assert doc["archhpo_fidelity"]["budgets"] == ["1M", "2M"] and doc["archhpo_fidelity"]["pruned_at_rung"][0] == 0.0
    assert doc["command"].startswith(f"python bench/search_efficiency.py --truth {path} --repeats 2 --seed 3")
    assert set(doc["noise_ceiling"]) == {"every_arch_x1", "every_arch_x2"}
    assert doc["truth_ceiling"] == {"runs": 3, **se.truth_ceilings(se.load_table(path), 3)}
    assert doc["intervals"]["level"] == 0.9 and set(doc["intervals"]["archhpo"]) == {
        "flops_ratio", "share_within_1std", "share_minus_design"}
    assert "interval" not in doc["per_budget"]["archhpo"]
    out = capsys.readouterr().out
    assert "target" in out and "targets (archhpo): share_within_1std" in out


def test_the_targets_are_judged_on_an_interval_over_the_repeats(tmp_path: Path) -> None:
    """Each measure's bootstrap interval over repeats: the design's FLOPs ratio is 1 in every resample,
    every interval holds its point estimate, and a target is met or missed only when the whole
    interval lies on one side of it, else not resolved (the T3 replay's 0.254 against 0.25)."""
    path = _table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 6)
    result = se.replay(se.load_table(path), 20, 3)
    assert result["design"]["interval"]["flops_ratio"] == [1.0, 1.0]
    for name in se.STRATEGIES:
        for key in ("flops_ratio", "share_within_1std"):
            lo, hi = result[name]["interval"][key]
            assert lo <= result[name][key] <= hi, (name, key)
    a = {"flops_ratio": 0.254, "interval": {"flops_ratio": [0.231, 0.279]}}
    assert se._against("flops_ratio 0.254", "<=", 0.25, a, "flops_ratio") == (
        "flops_ratio 0.254 [0.231, 0.279] <= 0.25", None)
    assert se._against("x", "<=", 0.25, {**a, "interval": {"flops_ratio": [0.20, 0.249]}}, "flops_ratio")[1] is True
    assert se._against("x", "<=", 0.25, {**a, "interval": {"flops_ratio": [0.251, 0.3]}}, "flops_ratio")[1] is False
    share = {"share_within_1std": 0.82, "interval": {"share_within_1std": [0.70, 0.92]}}
    assert se._against("s", ">=", 0.9, share, "share_within_1std") == ("s [0.70, 0.92] >= 0.9", None)
    assert se._against("s", ">=", 0.9, {"share_within_1std": 0.82}, "share_within_1std")[1] is False, \
        "no interval: the point estimate"
    gap = {"share_minus_design": -0.01, "interval": {"share_minus_design": [-0.04, 0.02]}}
    assert se._against("share 0.77 minus design's 0.78", ">=", 0.0, gap, "share_minus_design") == (
        "share 0.77 minus design's 0.78 [-0.04, +0.02] >= 0.0", None), "a paired tie with the design"
    for name in se.STRATEGIES:  # the design minus itself is 0 in every resample
        lo, hi = result[name]["interval"]["share_minus_design"]
        assert (lo, hi) == (0.0, 0.0) if name == "design" else lo <= hi
    assert "not resolved (the target lies inside the interval)" in se.archhpo_verdict(
        {**result, "archhpo": {**result["archhpo"], "flops_ratio": 0.25, "interval": {
            **result["archhpo"]["interval"], "flops_ratio": [0.24, 0.26]}}})


def test_a_malformed_table_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="") as fh:
        csv.writer(fh).writerows([["budget", "loss"], ["1M", "2.0"]])
    with pytest.raises(SystemExit, match="is not a ground-truth table"):
        se.main(["--truth", str(bad)])
    with pytest.raises(SystemExit, match="cannot read"):
        se.main(["--truth", str(tmp_path / "missing.csv")])


def test_spearman_is_exact_with_ties() -> None:
    assert truth.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert truth.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert truth.spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


# ------------------------------------------------------------------------------ issue 32 part 2
def _arch_rows(budget: str, params: int, archs: list[tuple[int, int, int, list[float]]], rungs: str = "1;3;9",
               epochs: int = 9, data_seed: str = "") -> list[dict[str, Any]]:
    """One row per (architecture, seed): archs are (d_model, n_layers, param_count, losses by seed);
    the curve falls to the loss, every rung score is the loss (rungs rank as the end does)."""
    n_rungs = len(rungs.split(";"))
    rows = []
    for a, (d, layers, count, losses) in enumerate(archs):
        for seed, loss in enumerate(losses):
            rows.append({
                "budget": budget, "budget_params": params, "arch_idx": a, "d_model": d, "n_layers": layers,
                "n_heads": 2, "d_ff": 2 * d, "param_count": count, "seed": seed, "epochs": epochs,
                "flops_per_epoch": 1, "loss": loss, "curve": ";".join(repr(loss + 1 - e / epochs)
                                                                      for e in range(1, epochs + 1)),
                "rung_epochs": rungs, "rung_loss": ";".join([repr(loss)] * n_rungs),
                "branch_epochs": ";".join(["0.0"] * n_rungs), "cosine_rung_loss": "", "train_tokens": "",
                "tokens_per_param": "", "data_seed": data_seed, "duration_s": "",
            })
    return rows


def _write(tmp_path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...] = truth.COLUMNS) -> Path:
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


# A beats B on seed 0 only; the pooled seed std is sqrt((1/3 + 0) / 2).
A_AND_B = [(64, 2, 100_000, [1.0, 2.0, 2.0]), (64, 3, 100_000, [1.5, 1.5, 1.5])]
STD = math.sqrt(1 / 6)


def test_a_repeat_fixes_the_data_and_leaves_its_seed_out_of_the_truth(tmp_path: Path) -> None:
    # Seeds that changed the data: repeat k sees seed k's data. k = 0: the design picks A (1.0 < 1.5),
    # whose truth without seed 0 is 2.0 against B's 1.5: regret 0.5 / std. k = 1, 2: it picks B, regret 0.
    budgets = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, A_AND_B), OLD_COLUMNS))
    assert not budgets[0].fixed_data and budgets[0].seed_std == pytest.approx(STD)
    result = se.replay(budgets, repeats=3, seed=0)
    assert result["design"]["share_within_1std"] == pytest.approx(2 / 3)
    assert result["design"]["regret_std_per_budget"] == [pytest.approx(0.5 / STD / 3)]
    # Judged by every seed's mean (A 5/3, B 1.5), picking A on seed 0 costs only 1/6 nats: within 1 std.
    every = se.replay(budgets, repeats=3, seed=0, held_out=False)
    assert every["design"]["share_within_1std"] == 1.0
    assert every["design"]["regret_std_per_budget"] == [pytest.approx((5 / 3 - 1.5) / STD / 3)]


def test_on_fixed_data_each_trial_is_an_init_seed_and_the_first_is_held_out(tmp_path: Path) -> None:
    budgets = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, A_AND_B, data_seed="0")))
    budget = budgets[0]
    assert budget.fixed_data
    result = se.replay(budgets, repeats=12, seed=5)
    held_zero = 0
    for rep in range(12):
        noise = se.draw(budget, rep, se.noise_rng(5, rep, budget))
        trials = se.trials_of(budget, se.design_plan(budget, 50, 0), noise)
        assert [t.arch.idx for t in trials] == [0, 1, 0, 1]  # both extremes, twice (phase 1)
        assert trials[0].run["seed"] != trials[2].run["seed"]  # a second trial is a new initialisation
        assert noise.truth[0] == pytest.approx((sum(A_AND_B[0][3]) - A_AND_B[0][3][trials[0].run["seed"]]) / 2)
        held_zero += noise.order[0][0] == 0
    # The design is more than 1 std off exactly when A's held-out seed is seed 0 (its truth is then 2.0);
    # when seed 0 is A's second trial A is picked but its truth is 1.5, a tie with B.
    assert 0 < held_zero < 12
    assert result["design"]["share_within_1std"] == pytest.approx(1 - held_zero / 12)
    assert result["design"]["regret_std_per_budget"] == [pytest.approx(held_zero * 0.5 / STD / 12)]
    # The noise ceiling on the same draws: every architecture once picks A exactly when its held-out
    # seed is seed 0 (a miss); twice, A's mean 1.5 ties B's and the tie goes to A (index 0), again a
    # miss exactly then: both shares are the design's here.
    assert se.noise_ceiling(budgets, 12, 5) == {"every_arch_x1": 1 - held_zero / 12, "every_arch_x2": 1 - held_zero / 12}


def test_the_noise_ceiling_rises_with_runs_and_marks_a_target_above_it(tmp_path: Path) -> None:
    # A wins on its held-out seed 0 only (truth 2.0, a miss); B is best. Two runs of A average 1.5 or
    # 2.0 against B's 1.4, so twice always picks B: 100%, once misses whenever A's held-out seed is 0.
    archs = [(64, 2, 100_000, [1.0, 2.0, 2.0]), (64, 3, 100_000, [1.4, 1.4, 1.4])]
    budgets = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, archs, data_seed="0")))
    held_zero = sum(se.draw(budgets[0], rep, se.noise_rng(5, rep, budgets[0])).order[0][0] == 0 for rep in range(12))
    ceiling = se.noise_ceiling(budgets, 12, 5)
    assert 0 < held_zero < 12 and ceiling == {"every_arch_x1": 1 - held_zero / 12, "every_arch_x2": 1.0}
    assert "below the 90% target" not in se.ceiling_line(ceiling)
    assert "seeds the truth averages" in se.ceiling_line({"every_arch_x1": 0.5, "every_arch_x2": 0.84})
    assert "one run per architecture" in se.ceiling_line({"every_arch_x1": 0.66, "every_arch_x2": 0.66}, False)


def test_what_a_truth_of_each_size_can_show_matches_the_normal_arithmetic(tmp_path: Path) -> None:
    """Two architectures tied (means 2, seed std 1): against the exact truth every choice is within
    1 std; against a 3-seed truth (two other runs each) the truths differ by N(0, 1), so the choice is
    within 1 std with probability Phi(1), and at two such budgets Phi(1)^2.  Ten stds apart: always."""
    phi1 = 0.5 * (1 + math.erf(1 / math.sqrt(2)))
    tied = [(64, 2, 100_000, [1.0, 2.0, 3.0]), (64, 3, 100_000, [1.0, 2.0, 3.0])]
    one = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, tied, data_seed="0")))
    assert one[0].seed_std == 1.0
    assert se.truth_ceiling(one, None, 3) == 1.0
    assert se.truth_ceiling(one, 3, 3) == pytest.approx(phi1, abs=0.012)  # 20,000 repeats: 4.5 standard errors
    two = se.load_table(_write(tmp_path, [*_arch_rows("100K", 100_000, tied, data_seed="0"),
                                          *_arch_rows("200K", 200_000, tied, data_seed="0")]))
    assert se.truth_ceiling(two, 3, 1) == pytest.approx(phi1**2, abs=0.012)
    apart = [(64, 2, 100_000, [1.0, 2.0, 3.0]), (64, 3, 100_000, [11.0, 12.0, 13.0])]
    far = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, apart, data_seed="0")))
    assert se.truth_ceiling(far, 3, 1) == 1.0 and se.truth_ceiling(far, 5, 1) == 1.0
    assert se.truth_ceilings(one, 0) == {k: se.truth_ceiling(one, s, se.CEILING_RUNS)
                                         for k, s in zip(("3", "5", "10", "exact"), se.TRUTH_SEEDS, strict=True)}


def test_the_truth_size_line_names_the_smallest_truth_that_could_show_the_target() -> None:
    line = se.truth_ceiling_line({"3": 0.5, "5": 0.92, "10": 0.95, "exact": 0.99})
    assert "3 seeds 50%, 5 seeds 92%, 10 seeds 95%, an exact truth 99%" in line
    assert line.endswith("needs a truth of 5 seeds per architecture")
    assert se.truth_ceiling_line({"3": 0.5, "5": 0.6, "10": 0.8, "exact": 0.95}).endswith(
        "needs more than 10 seeds per architecture (only the exact limit reaches it)")
    assert "remain even in the exact limit" in se.truth_ceiling_line({"3": 0.5, "5": 0.6, "10": 0.7, "exact": 0.8})


@pytest.mark.parametrize(("rungs", "epochs", "eta"), [("1;3;9", 9, 3), ("1;2;4;8", 8, 2), ("3;9", 9, 3), ("1;9", 9, 9)])
def test_eta_is_read_from_the_rungs_of_the_table(tmp_path: Path, rungs: str, epochs: int, eta: int) -> None:
    archs = [(64, n, 100_000, [3 - 0.1 * n] * 2) for n in (2, 3, 4, 5)]
    budgets = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, archs, rungs, epochs)))
    assert budgets[0].eta == eta


def test_halving_promotes_the_best_1_over_the_tables_eta(tmp_path: Path) -> None:
    # 4 architectures twice = 8 trials, rungs at epochs 1, 2, 4, 8 (eta 2), no branches, one FLOP an
    # epoch: 8 x 1, then 4 x 1 more, 2 x 2 more, 1 x 4 more = 20, against the design's 8 x 8.
    archs = [(64, n, 100_000, [3 - 0.1 * n] * 2) for n in (2, 3, 4, 5)]
    budgets = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, archs, "1;2;4;8", 8)))
    result = se.replay(budgets, repeats=1, seed=0)
    assert result["halving"]["flops_ratio"] == pytest.approx(20 / 64)
    assert result["halving"]["regret_std_per_budget"] == [0.0]


def test_the_extremes_are_archhpos_the_rows_closest_to_the_budget(tmp_path: Path) -> None:
    # At n_layers 2 and 4 the rows closest to 100K are 1 and 3 (not the first of each, 0 and 2);
    # every row has d_model 64, so the d_model extremes are the closest of all: 1 (a tie with 3, the lower).
    archs = [(64, 2, 80_000, [2.0, 2.1]), (64, 2, 99_000, [2.0, 2.1]), (64, 4, 120_000, [2.0, 2.1]),
             (64, 4, 101_000, [2.0, 2.1])]
    budget = se.load_table(_write(tmp_path, _arch_rows("100K", 100_000, archs)))[0]
    assert se.extremes(budget) == {1, 3}


def test_a_ladder_budget_is_planned_by_archhpos_carry_up(tmp_path: Path) -> None:
    # The smaller budget's one finished trial has aspect ratio 64/2 = 32: the region is 21.3-48 (L2, L3)
    # plus the extremes (L2, L12); ladder_trials(6, 1, 2 extremes) = 4 slots, one per region architecture
    # in spread order (extremes first): the 4th slot, beyond the region's 3, gets none.
    small = [(64, 2, 50_000, [2.0, 2.1])]
    large = [(64, n, 100_000, [2.0, 2.1]) for n in (2, 3, 6, 12)]
    rows = _arch_rows("50K", 50_000, small) + _arch_rows("100K", 100_000, large)
    smaller, budget = se.load_table(_write(tmp_path, rows))
    finished = [se.Trial(0, smaller.archs[0], smaller.archs[0].runs[0])]
    archs = se.ladder_plan_archs(budget, smaller, finished, step=1, n_trials=6, seed=0)
    assert len(archs) == 3 and set(archs[:2]) == {0, 3} and archs[2] == 1
    # The design's plan of the same budget: every architecture twice (phase 1), extremes first.
    assert sorted(se.design_plan(budget, 50, 0)) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_both_schemas_are_read(tmp_path: Path) -> None:
    rows = _arch_rows("100K", 100_000, A_AND_B)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = se.load_table(_write(tmp_path / "old", rows, OLD_COLUMNS))
    new = se.load_table(_write(tmp_path / "new", [{**r, "data_seed": "0", "train_tokens": 10} for r in rows]))
    assert (old[0].fixed_data, new[0].fixed_data) == (False, True)
    assert [a.mean for a in old[0].archs.values()] == [a.mean for a in new[0].archs.values()]


def test_the_committed_truth_under_a_real_studys_noise(tmp_path: Path) -> None:
    # bench/search_truth.csv: d_model 64 in every row, pooled seed std 0.016-0.028 nats (docs/benchmarks.md
    # §12), seeds that changed the data; 3 repeats replay each seed's data once.
    path = BENCH / "search_truth.csv"
    budgets = se.load_table(path)
    assert {a.d_model for b in budgets for a in b.archs.values()} == {64}
    assert [round(b.seed_std, 3) for b in budgets] == [0.016, 0.024, 0.023, 0.028]
    assert [b.eta for b in budgets] == [3, 3, 3, 3] and not any(b.fixed_data for b in budgets)
    held = se.replay(budgets, repeats=3, seed=0)
    every = se.replay(budgets, repeats=3, seed=0, held_out=False)
    # Seed 0's data misleads the design at 100K (it picks d64-L3-h2, 1.4 std off without seed 0,
    # 0.85 std with it); halving is misled on every seed's data.
    assert held["design"]["within_1std_per_budget"] == [1.0, pytest.approx(2 / 3), 1.0, 1.0]
    assert every["design"]["share_within_1std"] == 1.0
    assert held["halving"]["share_within_1std"] == every["halving"]["share_within_1std"] == 0.0
    assert se.main(["--truth", str(path), "--repeats", "3", "--json", str(tmp_path / "o.json")]) == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    assert list(doc["strategies"]) == list(se.STRATEGIES) and doc["noise_data"] == "seed changes the data"


# ------------------------------------------------------------------------------ issue 32 part 5: archhpo
def _budgets_of_one_repeat(budgets: list[Any], seed: int = 0, rep: int = 0, at_rung: bool = se.AT_RUNG
                           ) -> list[dict[str, Any]]:
    """Every strategy's Outcome at each budget of one replayed study, as replay() runs it (without
    --carry-finalists: the largest budget planned as the others)."""
    below: dict[str, Any] = {}
    out = []
    for step, budget in enumerate(budgets):
        noise = se.draw(budget, rep, se.noise_rng(seed, rep, budget))
        below = se.strategies(budget, budgets[step - 1] if step else None, below, step, noise, 50, 5, seed,
                              at_rung=at_rung)
        out.append(below)
    return out


def test_archhpo_halves_at_the_rungs_its_smallest_budget_trusts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rung scores rank the 9 architectures as their final losses do: the smallest budget trusts a rung,
    # so the larger budget's ladder plan is halved there and costs less than the same plan at full length.
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9))
    small, large = _budgets_of_one_repeat(budgets)
    a = small["archhpo"]
    assert a.trust["trusted"] == [0, 1] and not a.pruned and a.winner.idx == 8  # arch 8: the lowest loss
    # The smallest budget: the design's 18 trials (9 architectures twice) at 9 epochs + 0.25 + 0.75 branch
    # epochs, and 2 confirmation runs for each of 2 finalists (the counts are set here, not the defaults): 22 x 10.
    monkeypatch.setattr(se, "FINALISTS", 2)
    monkeypatch.setattr(se, "CONFIRM_SEEDS", 2)
    small, large = _budgets_of_one_repeat(budgets, at_rung=True)
    a = small["archhpo"]
    assert (a.flops, small["design"].flops) == (22 * 10, 18 * 9)
    # The larger budget: the ladder's 8 trials (one per architecture of its region, 8 of the 9), halved at
    # both trusted rungs with hard cuts (the seeds changed the data: no seed noise within a repeat):
    # 8 x (1 + 0.25), 2 x (2 + 0.75), 1 x 6 to full length, arch 8, the one finalist, confirmed at rung 0,
    # the lowest trusted (--confirm-at-rung): 2 x (1 + 0.25) more.
    assert large["archhpo"].pruned and large["archhpo"].flops == 8 * 1.25 + 2 * 2.75 + 1 * 6 + 2 * 1.25
    assert large["ladder"].flops == 8 * 9 and len(large["ladder"].finished) == 8
    assert [t.arch.idx for t in large["archhpo"].finished] == [8], "confirmation runs ended at the rung"
    assert large["archhpo"].winner.idx == large["ladder"].winner.idx == 8
    result = se.replay(budgets, repeats=3, seed=0, at_rung=True, carry_finalists=False)
    assert result["archhpo"]["regret_std_per_budget"] == [0.0, 0.0] and result["archhpo"]["share_within_1std"] == 1.0
    assert result["archhpo"]["fidelity"]["pruned_at_rung"] == [0.0, 1.0]


def test_no_confirm_at_rung_retrains_the_finalists_to_full_length(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The table of the test above: under --no-confirm-at-rung the larger budget (trusting rungs 0 and 1)
    # confirms its one finalist's 2 new seeds at full length (10 each) instead of at rung 0 (1 epoch + its
    # 0.25-epoch branch each, under --confirm-at-rung); the smallest budget, which measures the trust, confirms at full
    # length either way.
    monkeypatch.setattr(se, "FINALISTS", 2)
    monkeypatch.setattr(se, "CONFIRM_SEEDS", 2)
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9))
    below: dict[str, Any] = {}
    out = []
    for step, budget in enumerate(budgets):
        noise = se.draw(budget, 0, se.noise_rng(0, 0, budget))
        below = se.strategies(budget, budgets[step - 1] if step else None, below, step, noise, 50, 5, 0, at_rung=False)
        out.append(below)
    small, large = out
    assert small["archhpo"].flops == 22 * 10, "the smallest budget: at full length, as with the option"
    a = large["archhpo"]
    assert a.pruned and a.flops == 8 * 1.25 + 2 * 2.75 + 1 * 6 + 2 * 10
    assert [t.arch.idx for t in a.finished] == [8, 8, 8] and a.winner.idx == 8, "confirmation runs at full length"
    once, at = (se.replay(budgets, repeats=3, seed=0, at_rung=r, carry_finalists=False)["archhpo"]
                for r in (False, True))
    assert at["flops_ratio"] < once["flops_ratio"] and at["share_within_1std"] == once["share_within_1std"] == 1.0
    default = se.replay(budgets, repeats=3, seed=0, at_rung=LADDER_CONFIRM_AT_RUNG,
                        carry_finalists=LADDER_CARRY_FINALISTS)["archhpo"]
    assert default == se.replay(budgets, repeats=3, seed=0)["archhpo"], "the replay's default is --ladder's"


def test_archhpo_trains_full_length_where_the_rungs_rank_the_other_way(tmp_path: Path) -> None:
    # Reversed rung scores: no rung is trusted, every planned trial of the larger budget is trained to
    # full length and scores no rung (9 epochs each; the smallest budget paid 0.25 + 0.75 branch epochs).
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9, rung_sign=-1.0))
    small, large = _budgets_of_one_repeat(budgets)
    assert small["archhpo"].trust["trusted"] == []
    a = large["archhpo"]
    assert not a.pruned and a.winner.idx == 8 and large["halving_ladder"].winner.idx != 8
    assert len(a.finished) >= len(large["ladder"].finished) and a.flops == 9 * len(a.finished)
    assert small["archhpo"].flops == 10 * len(small["archhpo"].finished)
    result = se.replay(budgets, repeats=3, seed=0)
    assert result["archhpo"]["share_within_1std"] == 1.0 and result["archhpo"]["fidelity"]["full_length"] == [1.0, 1.0]
    assert result["archhpo"]["fidelity"]["rung_trusted"] == [0.0, 0.0]


def test_the_finalists_confirmation_runs_are_counted_and_decide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    # Two architectures on fixed data, both extremes: A (1.0 on seed 0, else 2.0) and B (1.4 on every seed).
    # The design trains each twice (4 x 9 epochs); archhpo also pays each trial's branches (0.25 + 0.75) and
    # retrains both finalists with 2 new seeds (set here): 8 trials x 10 against the design's 4 x 9.
    monkeypatch.setattr(se, "CONFIRM_SEEDS", 2)
    archs = [(64, 2, 100_000, [1.0, 2.0, 2.0]), (64, 3, 100_000, [1.4, 1.4, 1.4])]
    rows = _arch_rows("100K", 100_000, archs, data_seed="0")
    for r in rows:
        r["branch_epochs"] = "0.25;0.75;0.0"
    budgets = se.load_table(_write(tmp_path, rows))
    result = se.replay(budgets, repeats=12, seed=5)
    assert result["archhpo"]["flops_ratio"] == pytest.approx(80 / 36, abs=1e-12)
    # A's mean over its 4 full-length runs (2 planned, 2 confirmation: its held-out seed twice) is 1.5 or 1.75,
    # never below B's 1.4: archhpo always picks B, the best by every truth; the design picks A whenever it saw
    # A's seed 0, and is more than 1 std off when that seed is A's held-out one (A's truth then 2.0).
    assert result["archhpo"]["regret_std_per_budget"] == [0.0] and result["archhpo"]["share_within_1std"] == 1.0
    assert result["design"]["share_within_1std"] < 1.0
    (only,) = _budgets_of_one_repeat(budgets, seed=5)
    confirmation = only["archhpo"].finished[4:]
    assert [t.slot for t in confirmation] == [4, 5, 6, 7] and only["archhpo"].winner.idx == 1
    for t in confirmation[::2]:  # the draw's next run of its architecture: the seed its two trials did not use
        seen = {u.run["seed"] for u in only["archhpo"].finished[:4] if u.arch.idx == t.arch.idx}
        assert seen | {t.run["seed"]} == {0, 1, 2}


def test_the_finalists_search_runs_count_in_the_means_they_are_chosen_on(tmp_path: Path) -> None:
    # A (1.0 on seeds 0 and 1, 2.0 on seed 2) and B (1.4 on every seed), each planned twice; A's runs in the
    # order seed 1, 0, 2, B's 0, 1, 2. The confirmation (the default: 1 new seed each) retrains A on seed 2
    # (2.0) and B on seed 2 (1.4): alone it would pick B. With each finalist's two planned full-length runs
    # (every trial of a truth has the same training parameters) A's mean is (1 + 1 + 2) / 3 = 1.33: A.
    rows = _arch_rows("100K", 100_000, [(64, 2, 100_000, [1.0, 1.0, 2.0]), (64, 3, 100_000, [1.4] * 3)],
                      data_seed="0")
    (budget,) = se.load_table(_write(tmp_path, rows))
    noise = se.Draw(order={0: [1, 0, 2], 1: [0, 1, 2]}, truth={0: 1.5, 1: 1.4})
    planned = se.trials_of(budget, [0, 1, 0, 1], noise)
    assert [t.run["loss"] for t in planned] == [1.0, 1.4, 1.0, 1.4]
    flops, winner, done = se.confirmed(budget, planned, list(planned), noise)
    assert (se.FINALISTS, se.CONFIRM_SEEDS) == (3, 1), "the --ladder default (archhpo.schema)"
    assert [(t.arch.idx, t.run["seed"]) for t in done[4:]] == [(0, 2), (1, 2)]
    assert winner.idx == 0 and flops == 2 * 9


def test_the_replay_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    path = _table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9)
    docs = []
    for run in range(2):
        assert se.main(["--truth", str(path), "--repeats", "4", "--seed", "7", "--json", str(tmp_path / f"{run}.json")]) == 0
        doc = json.loads((tmp_path / f"{run}.json").read_text())
        doc.pop("wall_s")
        docs.append(doc)
    assert docs[0] == docs[1]


def test_a_trusted_rung_cuts_with_ties_within_its_own_noise() -> None:
    # The record as rung_trust stores it: rung 0 trusted, its scores' own noise 0.05 (the finals' 0.1);
    # eta 3 keeps 1 of 3, and the slot 0.04 behind the cut is a tie; rung 1 is not trusted: no decision.
    trust = {"trusted": [0], "noise": 0.1, "rungs": [{"rung": 0, "noise": 0.05}, {"rung": 1, "noise": 0.02}]}
    decide = se.trusted_decision(trust, 3)
    assert decide(0, {4: 1.0, 5: 1.04, 6: 1.2}) == [4, 5]
    assert decide(1, {4: 1.0, 5: 1.04, 6: 1.2}) is None
    assert se.trusted_decision({**trust, "rungs": []}, 3)(0, {4: 1.0, 5: 1.04, 6: 1.2}) == [4, 5]  # the finals' 0.1
    assert se.trusted_decision({**trust, "noise": None, "rungs": []}, 3)(0, {4: 1.0, 5: 1.04, 6: 1.2}) == [4]


def test_trust_each_budget_prunes_where_a_larger_budgets_rungs_predict(tmp_path: Path) -> None:
    """The smallest budget's rungs rank the reverse of its finals (a plateau's chance order), the
    larger budgets' rungs as their finals do: measured once, at the smallest budget, no rung is
    trusted and nothing is pruned; measured again at the middle budget (--trust-each-budget), whose
    region then pays its cooldown branches (10/9 of its FLOPs: 1 epoch of branches per 9), the
    largest budget prunes at both rungs in every repeat. The largest scores nothing in passing: on a
    two-budget ladder the option changes nothing. (Without --carry-finalists, which plans the largest
    budget without pruning.)"""
    three = {"1M": 1_000_000, "2M": 2_000_000, "4M": 4_000_000}
    budgets = se.load_table(_table(tmp_path, three, 9, {"1M": -1.0, "2M": 1.0, "4M": 1.0}))
    once, each = (se.replay(budgets, repeats=3, seed=0, each_budget=e, carry_finalists=False)["archhpo"]
                  for e in (False, True))
    assert once["fidelity"]["pruned_at_rung"] == [0.0, 0.0, 0.0] and once["fidelity"]["rung_trusted"] == [0.0, 0.0]
    assert each["fidelity"]["pruned_at_rung"] == [0.0, 0.0, 1.0] and each["fidelity"]["rung_trusted"] == [1.0, 1.0]
    # the trust the largest budget read: the smallest's by default, the middle's under the option
    assert once["fidelity"]["measured_at"] == [1.0, 0.0, 0.0] and each["fidelity"]["measured_at"] == [0.0, 1.0, 0.0]
    assert "the largest budget's trust, at 1M:" in se.fidelity_line({"archhpo": once})
    assert "the largest budget's trust, at 2M:" in se.fidelity_line({"archhpo": each})
    assert each["flops_ratio_per_budget"][:2] == [once["flops_ratio_per_budget"][0],
                                                  pytest.approx(once["flops_ratio_per_budget"][1] * 10 / 9)]
    assert each["flops_ratio_per_budget"][2] < once["flops_ratio_per_budget"][2] / 2
    assert each["flops_ratio"] < once["flops_ratio"] and each["share_within_1std"] == once["share_within_1std"] == 1.0
    two = se.load_table(_table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 9, {"1M": -1.0, "2M": 1.0}))
    assert (se.replay(two, repeats=3, seed=0, each_budget=True, carry_finalists=False)
            == se.replay(two, repeats=3, seed=0, carry_finalists=False))


def test_each_option_compared_on_the_defaults_draws_is_the_option_replayed_alone(tmp_path: Path) -> None:
    """--compare-options replays every option of --ladder beside its default on the same plans and
    draws: each option's measures are exactly those of a replay made with that option alone, and its
    differences from the default are paired (the same repeats in every resample)."""
    three = {"1M": 1_000_000, "2M": 2_000_000, "4M": 4_000_000}
    budgets = se.load_table(_table(tmp_path, three, 9, {"1M": -1.0, "2M": 1.0, "4M": 1.0}))
    result = se.replay(budgets, repeats=4, seed=5, options=tuple(se.OPTIONS))
    assert se.replay(budgets, repeats=4, seed=5) == {**result, "archhpo": {
        k: v for k, v in result["archhpo"].items() if k != "options"}}, "the options change nothing else"
    options = result["archhpo"]["options"]
    assert list(options) == ["trust_each_budget", "confirm_at_rung", "no_carry_finalists",
                             "trust_each_budget+confirm_at_rung", "trust_each_budget+no_carry_finalists",
                             "confirm_at_rung+no_carry_finalists", "trust_each_budget+confirm_at_rung+no_carry_finalists"]
    assert po.DEFAULT == (False, LADDER_CONFIRM_AT_RUNG, LADDER_CARRY_FINALISTS) == (False, False, True)
    assert se.OPTIONS == {"trust_each_budget": (True, False, True), "confirm_at_rung": (False, True, True),
                          "no_carry_finalists": (False, False, False),
                          "trust_each_budget+confirm_at_rung": (True, True, True),
                          "trust_each_budget+no_carry_finalists": (True, False, False),
                          "confirm_at_rung+no_carry_finalists": (False, True, False),
                          "trust_each_budget+confirm_at_rung+no_carry_finalists": (True, True, False)}, \
        "every other setting, by its flags"
    assert po.flags(*po.DEFAULT) == "" and po.flags(True, True) == "--trust-each-budget --confirm-at-rung"
    assert po.flags(False, False, False) == "--no-carry-finalists"
    for name, (each, at_rung, carry) in se.OPTIONS.items():
        alone = se.replay(budgets, repeats=4, seed=5, each_budget=each, at_rung=at_rung, carry_finalists=carry)["archhpo"]
        for key in ("flops_ratio", "share_within_1std", "flops_ratio_per_budget", "within_1std_per_budget",
                    "regret_std", "regret_std_top", "paired_regret_vs_design"):
            assert options[name][key] == alone[key], (name, key)
        for key in ("flops_ratio", "share_within_1std"):
            assert options[name]["interval"][key] == alone["interval"][key], (name, key)
    # trusting the middle budget's rungs prunes the largest (planned as the others) in every repeat: a
    # saving in every resample, at the same share (every choice is the best here): "saves FLOPs, share tied"
    each = options["trust_each_budget+no_carry_finalists"]
    assert options["no_carry_finalists"]["flops_ratio"] > each["flops_ratio"]
    assert each["flops_minus_default"] < 0 and each["interval"]["flops_minus_default"][1] < 0
    assert each["interval"]["share_minus_default"] == [0.0, 0.0]
    assert (each["flops"], each["share"]) == ("lower", "tied")
    assert po.reading(each) == "saves FLOPs, share tied"


def test_the_default_choosing_rule_reads_each_side_of_zero() -> None:
    reading = po.reading
    assert reading({"share": "lower", "flops": "lower"}) == "loses share: not a default"
    assert reading({"share": "tied", "flops": "higher"}) == "costs FLOPs: not a default"
    assert reading({"share": "higher", "flops": "lower"}) == "saves FLOPs, share higher"
    assert reading({"share": "tied", "flops": "tied"}) == "no resolved difference"
    assert po._judge(-0.02, -0.01, "lower", "higher") == "lower"
    assert po._judge(-0.02, 0.0, "lower", "higher") == "tied", "an interval touching 0 is a tie"
    assert po._judge(0.01, 0.02, "lower", "higher") == "higher"


def test_compare_options_prints_and_writes_the_comparison_and_refuses_an_option_beside_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 6)
    out = tmp_path / "o.json"
    assert se.main(["--truth", str(path), "--repeats", "3", "--seed", "1", "--compare-options", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"].endswith("--compare-options") and set(doc["options"]) == set(se.OPTIONS)
    assert list(doc["strategies"]) == list(se.STRATEGIES) and "options" not in doc["per_budget"]["archhpo"]
    assert "| --trust-each-budget --confirm-at-rung |" in capsys.readouterr().out
    for flag in ("--trust-each-budget", "--confirm-at-rung", "--no-confirm-at-rung", "--carry-finalists"):
        with pytest.raises(SystemExit, match=r"leave out --trust-each-budget, --\(no-\)confirm-at-rung and --carry"):
            se.main(["--truth", str(path), "--compare-options", flag, "--json", str(tmp_path / "no.json")])
    assert not (tmp_path / "no.json").exists(), "nothing written"
    off = tmp_path / "off.json"
    assert se.main(["--truth", str(path), "--repeats", "3", "--seed", "1", "--no-carry-finalists", "--json", str(off)]) == 0
    assert json.loads(off.read_text())["command"].endswith("--noise fresh --rho 1 --no-carry-finalists")
    alone = se.replay(se.load_table(path), 3, 1, carry_finalists=False, noise_mode="fresh")["archhpo"]
    assert json.loads(off.read_text())["strategies"]["archhpo"] == {k: alone[k] for k in se.MEASURES}
