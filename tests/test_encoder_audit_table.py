"""The encoder audit's table (scripts/encoder_audit_table.py, docs/encoder_audit.md) is computed,
not typed: the Welch interval is scipy's, an encoder off the aim is flagged, one that did not run
says so, and a broken tier order is reported as broken."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

SCRIPT = Path(__file__).parent.parent / "scripts" / "encoder_audit_table.py"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("encoder_audit_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_interval_is_welchs() -> None:
    a, b = [2.20, 2.25, 2.21, 2.27, 2.23], [2.15 + 0.01 * (i % 7) for i in range(20)]
    diff, lo, hi = _script().welch(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(sum(a) / 5 - sum(b) / 20, abs=1e-12)
    assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert _script().welch([2.2], b) is None, "no interval from one seed"


def _export(path: Path, runs: dict[str, dict[int, float]]) -> None:
    lines = ["state,choices,seed,val_loss,best_epoch,duration_s"]
    for enc, seeds in runs.items():
        for s, v in seeds.items():
            choices = json.dumps({"encoder": enc}).replace('"', '""')
            lines.append(f'COMPLETE,"{choices}",{s},{v},300,600.0')
    lines.append(f'FAIL,"{json.dumps({"encoder": "ci"}).replace(chr(34), 2 * chr(34))}",0,,,')  # not counted
    path.write_text("\n".join(lines) + "\n")


def test_the_table_flags_misses_missing_encoders_and_a_broken_tier_order(tmp_path: Path) -> None:
    paper = tmp_path / "paper.csv"
    rows = ["# a comment line", "encoder,seed,best_val_nll,best_epoch"]
    means = {"linear-ppe": 2.11, "linear": 2.15, "linear-ortho": 2.15, "concat": 2.17, "mlp": 2.18,
             "cat": 2.35, "ci": 3.05, "sum": 3.26}
    rows += [f"{e},{s},{m + (0.01 if s % 2 else -0.01)},300" for e, m in means.items() for s in range(4)]
    paper.write_text("\n".join(rows) + "\n")
    ours = {e: {0: m, 1: m} for e, m in means.items() if e not in ("ci", "cat")}
    ours["mlp"] = {0: 2.25, 1: 2.27}  # 0.08 above: off the aim
    ours["sum"] = {0: 2.10, 1: 2.12}  # below the linear family: the tiers are broken
    results = tmp_path / "experiment_results.csv"
    _export(results, ours)
    out = subprocess.run([sys.executable, str(SCRIPT), str(results), "--paper", str(paper)],
                         capture_output=True, text=True, check=True).stdout
    line = {ln.split(" | ")[0].strip("| "): ln for ln in out.splitlines() if ln.startswith("| ") and " | 0,1 | " in ln}
    assert "+0.0800 [" in line["mlp"] and "| **no** |" in line["mlp"]
    assert "| 2.1500 ± 0.0000 | 0,1 |" in line["linear"] and "| +0.0000 [" in line["linear"]
    assert "| yes |" in line["linear"] and "| 10 |" in line["linear"], "ten-minute trials"
    assert "| ci | not run | 0 |" in out and "| cat | not run | 0 |" in out
    tiers = next(ln for ln in out.splitlines() if ln.startswith("- archhpo:"))
    assert tiers == ("- archhpo: linear family 2.110–2.260, sum 2.110: **not** in the paper's order "
                     "(cat, ci not run) (linear family < sum by -0.150).")
    assert "- paper (20 seeds):" in out and "in the paper's order (linear family < cat by" in out


def test_subsets_as_far_counts_every_subset_of_the_papers_seeds() -> None:
    # Paper runs 1, 2, 3, 4 (mean 2.5); the 6 pairs have means 1.5, 2, 2.5, 2.5, 3, 3.5.
    count = _script().subsets_as_far
    assert count([1.0, 2.0, 3.0, 4.0], [2.9, 3.1]) == 4  # 0.5 off: the pairs at 1.5, 2, 3, 3.5
    assert count([1.0, 2.0, 3.0, 4.0], [3.4, 3.6]) == 2  # 1.0 off: only 1.5 and 3.5
    assert count([1.0, 2.0, 3.0, 4.0], [2.5, 2.5]) == 6  # on the mean: every pair is as far
    assert count([1.0, 2.0, 3.0, 4.0], [9.0, 9.0]) == 0  # farther than any pair


def test_the_table_says_how_often_the_papers_own_seeds_land_as_far(tmp_path: Path) -> None:
    paper = tmp_path / "paper.csv"
    rows = ["encoder,seed,best_val_nll,best_epoch"]
    encoders = _script().ENCODERS
    rows += [f"{e},{s},{2.0 + 0.01 * s},300" for e in encoders for s in range(20)]  # each: mean 2.095
    paper.write_text("\n".join(rows) + "\n")
    results = tmp_path / "experiment_results.csv"
    _export(results, {"linear": {0: 2.095, 1: 2.095}, "mlp": {0: 2.30, 1: 2.30}})
    out = subprocess.run([sys.executable, str(SCRIPT), str(results), "--paper", str(paper)],
                         capture_output=True, text=True, check=True).stdout
    assert "| linear | +0.0000 | 2 | 190 of 190 (100.00%) |" in out  # on the mean: every pair as far
    assert "| mlp | +0.2050 | 2 | 0 of 190 (0.00%) |" in out  # far outside any two of the paper's seeds
