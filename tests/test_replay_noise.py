"""bench/search_efficiency.py's noise modes (bench/_replay_table.py `make_draw`), its regret measures
and its --carry-finalists replay: under fresh noise no value a trial
sees is a truth, under split the truth seed is never trained, the table-best oracle is graded as a
strategy, and the largest budget under --carry-finalists trains exactly the rule's shapes."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_search_efficiency import BENCH, se, truth

T3 = BENCH / "truths" / "t3.csv"


rt = sys.modules["_replay_table"]  # as search_efficiency (loaded by tests/test_search_efficiency.py) imported it


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, list[tuple[Any, dict[str, Any]]]]]:
    """Every draw the replay makes, each with every (architecture, run) its trials were handed."""
    made: list[tuple[Any, list[tuple[Any, dict[str, Any]]]]] = []
    original = se.make_draw

    def make(*args: Any, **kwargs: Any) -> Any:
        noise, seen = original(*args, **kwargs), []
        inner = noise.run

        def run(arch: Any, occurrence: int) -> dict[str, Any]:
            out = inner(arch, occurrence)
            seen.append((arch, out))
            return out

        noise.run = run
        made.append((noise, seen))
        return noise

    monkeypatch.setattr(se, "make_draw", make)
    return made


def _values(run: dict[str, Any]) -> set[float]:
    return {run["loss"], *run["curve"], *run["rung_loss"]}


def test_under_fresh_noise_no_value_a_trial_sees_is_the_truth_that_grades_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every strategy and every option of --ladder on T3, 3 repeats: each loss, curve point and rung
    score handed to a trial (phase 1's second runs and confirmation runs included) differs from its
    architecture's truth and from every seed's run in the table."""
    budgets = se.load_table(T3)
    made = _recording(monkeypatch)
    se.replay(budgets, 3, 11, options=tuple(se.OPTIONS), noise_mode="fresh")
    assert len(made) == 3 * len(budgets) and all(seen for _, seen in made)
    occurrences = 0
    for noise, seen in made:
        assert isinstance(noise, se.FreshDraw)
        for arch, run in seen:
            table = {v for r in arch.runs for v in _values(r)}
            assert noise.truth[arch.idx] == arch.mean and noise.truth[arch.idx] not in _values(run)
            assert not _values(run) & table, "a fresh run is no seed of the table"
        occurrences = max(occurrences, max(k for _, k in noise.runs))
    assert occurrences >= 2, "second runs and confirmation runs were drawn as further fresh runs"


def test_a_fresh_run_depends_only_on_its_key_so_every_strategy_sees_the_same_one() -> None:
    budget = se.load_table(T3)[1]
    arch = budget.archs[min(budget.archs)]
    one, two = se.make_draw(budget, 4, 9, "fresh"), se.make_draw(budget, 4, 9, "fresh")
    two.run(budget.archs[max(budget.archs)], 0)  # another architecture drawn first changes nothing
    assert one.run(arch, 1) == two.run(arch, 1) and one.run(arch, 1) is one.run(arch, 1)
    assert one.run(arch, 0) != one.run(arch, 1) != se.make_draw(budget, 5, 9, "fresh").run(arch, 1)


@pytest.mark.parametrize("rho", [1.0, 0.5, 0.0])
def test_a_fresh_run_is_its_architectures_mean_shifted_by_the_seed_std(rho: float) -> None:
    """Loss = mean + sd z; curve and rungs shifted by sd (rho z + sqrt(1 - rho^2) z2), their last value
    the loss (T3's runs end there); over 4,000 draws z has mean 0 and std 1, and the shift's
    correlation with z is rho."""
    budget = se.load_table(T3)[2]
    arch, sd = budget.archs[min(budget.archs)], budget.seed_std
    mean = budget.mean_runs[arch.idx]
    assert mean["curve"][3] == statistics.fmean(r["curve"][3] for r in arch.runs)
    noise = se.make_draw(budget, 0, 1, "fresh", rho=rho)
    z, shift = [], []
    for k in range(4000):
        run = noise.run(arch, k)
        z.append((run["loss"] - mean["loss"]) / sd)
        shift.append((run["curve"][0] - mean["curve"][0]) / sd)
        assert run["curve"][-1] == run["rung_loss"][-1] == run["loss"]
        assert run["rung_loss"][0] - mean["rung_loss"][0] == pytest.approx(run["curve"][0] - mean["curve"][0], abs=1e-12)
        assert (run["rung_epochs"], run["branch_epochs"]) == (arch.runs[0]["rung_epochs"], arch.runs[0]["branch_epochs"])
    assert abs(statistics.fmean(z)) < 0.06 and abs(statistics.stdev(z) - 1) < 0.04
    assert statistics.correlation(z, shift) == pytest.approx(rho, abs=0.04)
    if rho == 1.0:
        assert shift == pytest.approx(z, abs=1e-9), "rho 1: the whole curve shifted with its end"


def test_under_split_noise_the_truth_seed_is_never_trained(monkeypatch: pytest.MonkeyPatch) -> None:
    budgets = se.load_table(T3)
    made = _recording(monkeypatch)
    se.replay(budgets, 4, 2, options=("no_carry_finalists",), noise_mode="split")
    held = []
    for noise, seen in made:
        assert set(noise.held) == set(noise.truth)
        for arch, run in seen:
            assert run["seed"] != noise.held[arch.idx] and run is arch.run(run["seed"])
            assert noise.truth[arch.idx] == arch.run(noise.held[arch.idx])["loss"]
        held += noise.held.values()
    assert set(held) == {0, 1, 2}, "the held-out seed is drawn per repeat"
    one = [(a.idx, r["seed"]) for a, r in made[0][1]]
    a = one[0][0]
    assert {s for i, s in one if i == a} <= {0, 1, 2} - {made[0][0].held[a]}


def _ab(tmp_path: Path) -> list[Any]:
    """A (1.0 on seed 0, else 2.0; mean 5/3) and B (1.5 on every seed): the table's best is B."""
    rows = [{"budget": "100K", "budget_params": 100_000, "arch_idx": a, "d_model": 64, "n_layers": 2 + a,
             "n_heads": 2, "d_ff": 128, "param_count": 100_000, "seed": s, "epochs": 3, "flops_per_epoch": 1,
             "loss": loss, "curve": ";".join(repr(loss + 2 - e) for e in (1, 2)) + f";{loss!r}",
             "rung_epochs": "1;3", "rung_loss": f"{loss + 1!r};{loss!r}", "branch_epochs": "0.0;0.0",
             "cosine_rung_loss": "", "data_seed": "0"}
            for a, losses in enumerate(([1.0, 2.0, 2.0], [1.5, 1.5, 1.5])) for s, loss in enumerate(losses)]
    path = tmp_path / "ab.csv"
    truth.write_table(rows, path)
    return se.load_table(path)


def test_the_table_best_oracle_is_graded_as_a_strategy_is(tmp_path: Path) -> None:
    """B, the lowest table mean, is the best by construction under fresh noise; under split it is
    more than 1 std off (0.5 / sqrt(1/6) = 1.22) exactly in the repeats whose held-out seed of A is 0."""
    budgets = _ab(tmp_path)
    fresh = se.oracle(budgets, 20, 3, "fresh")
    assert (fresh["arch_idx"], fresh["share_within_1std"], fresh["regret_std"]) == ([1], 1.0, 0.0)
    misses = sum(se.make_draw(budgets[0], rep, 3, "split").held[0] == 0 for rep in range(20))
    split = se.oracle(budgets, 20, 3, "split")
    assert 0 < misses < 20 and split["share_within_1std"] == 1 - misses / 20
    assert split["regret_std"] == split["regret_std_top"] == pytest.approx(misses / 20 * 0.5 / math.sqrt(1 / 6))
    assert split["regret_nats"] == pytest.approx(misses / 20 * 0.5)


def test_the_regret_measures_are_means_over_budgets_paired_with_the_design() -> None:
    budgets = se.load_table(T3)
    result = se.replay(budgets, 6, 1, noise_mode="fresh")
    design = result["design"]
    assert design["paired_regret_vs_design"] == {"estimate": 0.0, "ci90": [0.0, 0.0]}
    for name, m in result.items():
        per = m["regret_std_per_budget"]
        assert m["regret_std"] == pytest.approx(statistics.fmean(per)) and m["regret_std_top"] == per[-1]
        assert m["regret_nats"] == pytest.approx(statistics.fmean(r * b.seed_std for r, b in zip(per, budgets, strict=True)))
        p = m["paired_regret_vs_design"]
        assert p["estimate"] == pytest.approx(m["regret_std"] - design["regret_std"], abs=1e-12), name
        assert p["ci90"][0] <= p["estimate"] <= p["ci90"][1]
        assert m["flops_vs_grid_once"] == pytest.approx(
            m["flops_ratio"] * design["flops_vs_grid_once"], rel=1e-12)
    # the design trains each of its planned trials once to full length: its FLOPs over the grid's once
    plans = [se.design_plan(b, 50, 0) for b in budgets]
    assert all(len(p) >= len(b.archs) for p, b in zip(plans, budgets, strict=True)) and design["flops_vs_grid_once"] > 1


def _arch(idx: int, d: int, layers: int, heads: int, ff: int, count: int) -> Any:
    return se.Arch(idx, d, layers, heads, ff, count, 3, 1.0, [{"seed": 0, "loss": 1.0}])


def test_carry_finalists_plans_the_top_3_by_mean_at_their_nearest_rows_and_the_centred_extremes() -> None:
    """Below: a0 (64x2, runs 1.0, 1.0), a1 (64x8: 1.1), a2 (32x2: 1.2, 1.2) and a3 (32x4: 1.0 and 1.6,
    mean 1.3: out of the top 3 by mean although its best run ties a0's).  Above, by the summed |log|
    of aspect ratio, head dim and d_ff ratio (depth left out): a0 (32, 32, 2) -> r5 (96x3 with 3
    heads: the same proportions, as r6 has: the tie goes to the earlier row), a1 (8, 32, 2) -> r2 (its
    own shape), a2 (16, 16, 2) -> r4 (64x4 with 4 heads; r3, its twin with 2, has head dim 32).  The
    grid's extremes: r0 (largest d_model, closest to the budget), r1
    (fewest layers), r2 (smallest d_model and most layers); centred on a0's head dim 32, r0's mark
    moves to its twin r6 (128x4 with 4 heads).  r2 is reached twice and planned once."""
    below = [_arch(0, 64, 2, 2, 128, 50_000), _arch(1, 64, 8, 2, 128, 50_000), _arch(2, 32, 2, 2, 64, 50_000),
             _arch(3, 32, 4, 2, 64, 50_000)]
    runs = [(0, 1.0), (0, 1.0), (1, 1.1), (2, 1.2), (2, 1.2), (3, 1.0), (3, 1.6)]
    finished = [se.Trial(k, below[i], {"loss": loss}) for k, (i, loss) in enumerate(runs)]
    shapes = [(128, 4, 2, 256, 100_000), (128, 2, 2, 256, 90_000), (64, 8, 2, 128, 100_000),
              (64, 4, 2, 128, 80_000), (64, 4, 4, 128, 100_000), (96, 3, 3, 192, 95_000), (128, 4, 4, 256, 99_000)]
    large = se.Budget("100K", 100_000, {10 + k: _arch(10 + k, *s) for k, s in enumerate(shapes)}, True)
    assert se.extremes(large) == {10, 11, 12}
    assert se.carried_finalists(large, finished) == [15, 12, 14, 11, 16]


def test_carry_finalists_changes_only_the_largest_budget_which_trains_its_plan_once_then_confirms() -> None:
    budgets = se.load_table(T3)
    default = se.replay(budgets, 3, 4, noise_mode="fresh", carry_finalists=False)["archhpo"]
    carry = se.replay(budgets, 3, 4, noise_mode="fresh", carry_finalists=True)["archhpo"]
    assert carry["flops_ratio_per_budget"][:-1] == default["flops_ratio_per_budget"][:-1]
    assert carry["regret_std_per_budget"][:-1] == default["regret_std_per_budget"][:-1]
    assert carry["flops_ratio_per_budget"][-1] != default["flops_ratio_per_budget"][-1]
    below: dict[str, Any] = {}
    for step, budget in enumerate(budgets):
        top = step == len(budgets) - 1
        noise = se.make_draw(budget, 0, 4, "fresh")
        plan = se.carried_finalists(budget, below["archhpo"].finished) if top else None
        below = se.strategies(budget, budgets[step - 1] if step else None, below, step, noise, 50, 5, 7, carry=top)
    out = below["archhpo"]
    assert plan is not None and [t.arch.idx for t in out.finished[:len(plan)]] == plan
    assert len(out.finished) > len(plan) and not out.pruned, "confirmation runs follow, none pruned"
    assert out.flops == sum(t.arch.epochs * t.arch.flops_per_epoch for t in out.finished), "full length, no branch"


def test_the_command_names_its_noise_and_refuses_bad_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    assert se.main(["--truth", str(T3), "--repeats", "2", "--noise", "split", "--no-carry-finalists", "--json",
                    str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["noise"], doc["rho"], doc["noise_data"]) == ("split", None, "fixed data")
    assert doc["command"].endswith("--noise split --no-carry-finalists")
    assert doc["strategies"]["archhpo"] == {k: v for k, v in se.replay(
        se.load_table(T3), 2, 0, noise_mode="split", carry_finalists=False)["archhpo"].items() if k in se.MEASURES}
    assert set(doc["oracle"]) >= {"share_within_1std", "regret_std", "regret_nats", "regret_std_top"}
    assert "| table-best oracle |" in capsys.readouterr().out
    for argv, message in ((["--rho", "1.5"], "--rho is a correlation"),
                          (["--truth-mean", "all"], "--truth-mean applies to --noise table only"),
                          (["--noise", "shuffled"], None)):
        with pytest.raises(SystemExit, match=message):
            se.main(["--truth", str(T3), *argv, "--json", str(tmp_path / "no.json")])
    assert not (tmp_path / "no.json").exists(), "nothing written"
    table = tmp_path / "t.json"
    assert se.main(["--truth", str(T3), "--repeats", "2", "--noise", "table", "--json", str(table)]) == 0
    assert json.loads(table.read_text())["strategies"]["design"]["regret_std_per_budget"] == \
        se.replay(se.load_table(T3), 2, 0)["design"]["regret_std_per_budget"], "table: today's replay"
