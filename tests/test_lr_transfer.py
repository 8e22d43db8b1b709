"""bench/transfer/sweep.py, the learning-rate transfer sweep: a tiny grid trains one CSV row per
run, a second start skips the rows already there and redoes a missing one exactly, a bad grid is
refused before anything trains, and the analysis finds a known optimum per width."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    return load_script(ROOT / "bench" / "transfer" / "sweep.py", "lr_transfer_sweep")


sweep = _load()
TINY = ["--widths", "8,16", "--rates", "1e-3,3e-3,1e-2", "--seeds", "0", "--seq-len", "8",
        "--tokens-per-param", "1", "--batch", "16", "--base-width", "8"]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_tiny_sweep_writes_a_row_per_run_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    assert sweep.main(["run", *TINY, "--csv", str(out)]) == 0
    rows = _rows(out)
    assert len(rows) == 2 * 3 * 2  # widths x rates x parametrizations, one seed
    assert list(rows[0]) == list(sweep.FIELDS)
    assert {(r["parametrization"], r["d_model"]) for r in rows} == {(p, w) for p in ("sp", "mup") for w in ("8", "16")}
    assert all(math.isfinite(float(r["val_loss"])) and int(r["tokens"]) > 0 and r["n_layers"] == "2" for r in rows)
    # mup at its base width (the smallest) is the standard model: the same losses, rate for rate.
    base = {(r["parametrization"], r["learning_rate"]): r["val_loss"] for r in rows if r["d_model"] == "8"}
    assert all(base[("mup", lr)] == base[("sp", lr)] for lr in ("0.001", "0.003", "0.01"))
    assert sweep.main(["run", *TINY, "--csv", str(out)]) == 0
    assert _rows(out) == rows  # nothing pending: nothing trained again
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-1]) + "\n")  # a run killed before its row was written
    assert sweep.main(["run", *TINY, "--csv", str(out)]) == 0
    again = _rows(out)
    assert len(again) == len(rows)
    assert {k: v for k, v in again[-1].items() if k != "seconds"} == {k: v for k, v in rows[-1].items() if k != "seconds"}


def test_shards_split_the_pending_runs_without_overlap(tmp_path: Path) -> None:
    runs = sweep.grid(("sp", "mup"), (8, 16), (1e-3, 3e-3, 1e-2), (0, 1))
    shards = [runs[i::3] for i in range(3)]
    keys = [r.key() for s in shards for r in s]
    assert sorted(keys) == sorted(r.key() for r in runs) and len(set(keys)) == len(runs)


@pytest.mark.parametrize(("flags", "needle"), [
    (["--widths", "8,10"], "widths must be multiples of 4 heads"),
    (["--parametrizations", "sp,ntk"], "--parametrizations takes sp, mup, completep"),
    (["--rates", "0,1e-3"], "--rates and --tokens-per-param must be finite and above 0"),
])
def test_a_bad_grid_is_refused_before_anything_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      flags: list[str], needle: str) -> None:
    out = tmp_path / "t.csv"
    assert sweep.main(["run", *TINY, *flags, "--csv", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not out.exists()


def _synthetic(optima: dict[tuple[str, int], float], rates: list[float], seeds: int = 3) -> list[dict[str, object]]:
    """Losses 1 + (log rate - log optimum)^2 with a seed offset that averages out."""
    rows: list[dict[str, object]] = []
    for (param, width), best in optima.items():
        for lr in rates:
            for seed in range(seeds):
                loss = 1.0 + (math.log(lr) - math.log(best)) ** 2 + 0.01 * (seed - 1)
                rows.append({"parametrization": param, "d_model": width, "learning_rate": lr, "seed": seed,
                             "val_loss": loss})
    return rows


def test_the_analysis_finds_each_widths_vertex_and_the_ratio(tmp_path: Path) -> None:
    rates = [1e-3 * 2 ** (k / 2) for k in range(9)]  # 1e-3 .. 1.6e-2
    optima = {("mup", 16): 4e-3, ("mup", 128): 6e-3, ("sp", 16): 8e-3, ("sp", 128): 1e-3 * 0.9}
    result = sweep.analyse(_synthetic(optima, rates))
    mup = result["mup"]
    assert mup["optima"]["16"]["learning_rate"] == pytest.approx(4e-3, rel=1e-9)
    assert mup["optima"]["128"]["learning_rate"] == pytest.approx(6e-3, rel=1e-9)
    assert mup["ratio"] == pytest.approx(1.5, rel=1e-9) and mup["ratio_is_bound"] is False
    assert mup["ratio_ci90"] == pytest.approx([1.5, 1.5], rel=1e-9)  # seed offsets move no vertex
    assert mup["optima"]["16"]["seeds"] == 3 and mup["optima"]["16"]["rates"] == 9
    sp = result["sp"]
    assert sp["optima"]["128"] ["bound"] == "low" and sp["optima"]["128"]["learning_rate"] == rates[0]
    assert sp["ratio_is_bound"] is True  # the smallest optimum is below the grid
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["parametrization", "d_model", "n_layers", "learning_rate", "seed",
                                                "val_loss"])
        writer.writeheader()
        writer.writerows({**r, "n_layers": sweep.N_LAYERS} for r in _synthetic(optima, rates))
    assert sweep.main(["analyse", "--csv", str(path), "--json", str(tmp_path / "t.json")]) == 0
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["mup"]["ratio"] == pytest.approx(1.5, rel=1e-9)


def test_a_diverged_rate_is_left_out_of_the_vertex() -> None:
    rates = [1e-3, 2e-3, 4e-3, 8e-3]
    rows = [{"parametrization": "sp", "d_model": 16, "learning_rate": lr, "seed": 0,
             "val_loss": math.inf if lr == 8e-3 else 1.0 + (math.log(lr) - math.log(2e-3)) ** 2} for lr in rates]
    assert sweep.analyse(rows)["sp"]["optima"]["16"]["learning_rate"] == pytest.approx(2e-3, rel=1e-9)


def test_a_depth_sweep_keys_its_runs_by_depth_and_reuses_none_of_another_depth(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    flags = [*TINY, "--widths", "8", "--depths", "1,2", "--rates", "3e-3", "--parametrizations", "mup"]
    assert sweep.main(["run", *flags, "--csv", str(out)]) == 0
    rows = _rows(out)
    assert sorted(r["n_layers"] for r in rows) == ["1", "2"]
    assert rows[0]["val_loss"] != rows[1]["val_loss"]  # two models, not one run written twice
    assert sweep.main(["run", *flags, "--depths", "1,2,3", "--csv", str(out)]) == 0
    assert sorted(r["n_layers"] for r in _rows(out)) == ["1", "2", "3"]  # only the new depth trained


def test_the_analysis_reads_the_depth_sweep_at_its_width_beside_the_width_sweep() -> None:
    rates = [1e-3 * 2 ** (k / 2) for k in range(9)]
    rows = _synthetic({("mup", 16): 4e-3, ("mup", 32): 5e-3, ("mup", 64): 6e-3}, rates)
    for r in rows:
        r["n_layers"] = sweep.N_LAYERS
    for layers, best in ((1, 2e-3), (4, 5e-3), (8, 8e-3)):
        for r in _synthetic({("mup", 32): best}, rates):
            rows.append({**r, "n_layers": layers})
    result = sweep.analyse(rows, n_layers=sweep.N_LAYERS, depth_width=32)["mup"]
    assert set(result["optima"]) == {"16", "32", "64"}  # the width sweep: its depth only
    assert result["ratio"] == pytest.approx(1.5, rel=1e-9)
    depth = result["depth"]
    assert depth["d_model"] == 32 and set(depth["optima"]) == {"1", "2", "4", "8"}
    assert depth["optima"]["2"]["learning_rate"] == pytest.approx(5e-3, rel=1e-9)  # shared with the width sweep
    assert depth["ratio"] == pytest.approx(4.0, rel=1e-9) and depth["ratio_is_bound"] is False
    assert "over depth, largest/smallest optimum = 4" in sweep.table(sweep.analyse(rows))


def test_a_depth_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert sweep.main(["run", *TINY, "--depths", "0,2", "--csv", str(out)]) == 2
    assert "--depths must be at least 1 layer" in capsys.readouterr().err and not out.exists()


def test_seeds_that_disagree_on_the_optimum_widen_the_ratios_bootstrap_interval() -> None:
    """At width 32 each seed's own optimum differs (x0.7, x1, x1.4): the mean's ratio lies inside
    the seed bootstrap's interval, which is wide; width 16's seeds agree."""
    rates = [1e-3 * 2 ** (k / 4) for k in range(24)]
    rows: list[dict[str, object]] = []
    for width, spread in ((16, (1.0, 1.0, 1.0)), (32, (0.7, 1.0, 1.4))):
        for seed, f in enumerate(spread):
            best = 4e-3 * f
            rows += [{"parametrization": "mup", "d_model": width, "learning_rate": lr, "seed": seed,
                      "val_loss": 1.0 + (math.log(lr) - math.log(best)) ** 2} for lr in rates]
    result = sweep.analyse(rows)["mup"]
    lo, hi = result["ratio_ci90"]
    assert lo <= result["ratio"] <= hi and hi / lo > 1.3


def test_completep_at_the_base_depth_is_mup_and_above_it_another_model(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    flags = [*TINY, "--widths", "16", "--depths", f"{sweep.BASE_DEPTH},{2 * sweep.BASE_DEPTH}", "--rates", "3e-3",
             "--parametrizations", "mup,completep"]
    assert sweep.main(["run", *flags, "--csv", str(out)]) == 0
    loss = {(r["parametrization"], int(r["n_layers"])): r["val_loss"] for r in _rows(out)}
    assert loss[("completep", sweep.BASE_DEPTH)] == loss[("mup", sweep.BASE_DEPTH)]
    assert loss[("completep", 2 * sweep.BASE_DEPTH)] != loss[("mup", 2 * sweep.BASE_DEPTH)]
