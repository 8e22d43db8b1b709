"""bench/search_efficiency.py replays search strategies on a ground-truth table; these tables are
made up so that the right answer is known: its FLOPs arithmetic, its regret and its refusals."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


se = _load("search_efficiency")
truth = _load("search_truth")


def _table(tmp_path: Path, budgets: dict[str, int], n_archs: int, rung_sign: float = 1.0) -> Path:
    """Architecture a of every budget has loss 3 - 0.1a (+0.001 per seed); its rung scores follow
    the same order (rung_sign 1) or the reverse (-1); rungs at epochs 1, 3, 9 with branches of a
    quarter of the epochs so far, one FLOP per epoch."""
    rows: list[dict[str, Any]] = []
    for budget, params in budgets.items():
        for a in range(n_archs):
            for seed in range(3):
                loss = 3 - 0.1 * a + 0.001 * seed
                curve = [loss + 1 - e / 9 for e in range(1, 10)]
                rungs = [3.5 - rung_sign * 0.1 * a + 0.001 * seed] * 2  # the final order, or its reverse
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
        assert result[name]["regret_std"] == [0.0, 0.0], name
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


def test_keeping_every_trial_after_one_epoch_chooses_as_the_design_does(tmp_path: Path) -> None:
    budgets = se.load_table(_table(tmp_path, {"1M": 1_000_000}, 6))
    every = se.replay(budgets, repeats=3, seed=1, topk=1000)
    assert every["topk_one_epoch"]["regret_std"] == every["design"]["regret_std"]


def test_the_command_writes_the_json_interface(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _table(tmp_path, {"1M": 1_000_000, "2M": 2_000_000}, 6)
    assert se.main(["--truth", str(path), "--repeats", "2", "--seed", "3", "--json", str(tmp_path / "o.json")]) == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    assert set(doc["strategies"]) == set(se.STRATEGIES)
    assert {"flops_ratio", "share_within_1std", "regret_std"} <= set(doc["strategies"]["halving"])
    assert doc["strategies"]["design"]["same_winner_as_design"] == [1.0, 1.0]
    assert "target" in capsys.readouterr().out


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
