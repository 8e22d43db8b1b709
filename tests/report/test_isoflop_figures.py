"""The report of an IsoFLOP table: several trials (sizes) share each compute budget's FLOPs exactly."""

from __future__ import annotations

import json
from pathlib import Path

from tests.report.test_report import _rows, _write

COMPUTES = (1e13, 1e14, 1e15)
SIZES = (1e5, 2e5, 4e5, 8e5, 1.6e6)


def isoflop_rows(experiment: str = "iso") -> list[dict]:
    """3 compute budgets x 5 sizes, 2 trials per size, each trial's FLOPs exactly its C."""
    rows = []
    for ci, c in enumerate(COMPUTES):
        for n in SIZES:
            for row in _rows(experiment, {f"C{c:.0e}-N{int(n)}": n}, per=2, seed=ci):
                d = c / (6 * row["param_count"])
                row.update(tokens_per_param=d / row["param_count"], train_tokens=int(d), train_flops=c,
                           compute_budget=c, data_passes=1.0,
                           val_loss=1.7 + 400 * row["param_count"] ** -0.34 + 410 * d ** -0.28)
                rows.append(row)
    return rows


def test_report_on_an_isoflop_table_with_several_trials_per_compute_budget_draws_its_isoflops(tmp_path: Path) -> None:
    from archhpo.cli import main

    path = _write(isoflop_rows(), tmp_path / "iso.csv")
    out = tmp_path / "r"
    assert main(["report", "--csv", str(path), "--out", str(out)]) == 0
    assert (out / "iso_figures" / "isoflops.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((out / "iso_scaling_fit.json").read_text())["nd_fit"]["status"] == "fitted"


def test_the_scaling_fit_json_gains_isoflop_fit_and_the_page_its_profiles_and_frontier(tmp_path: Path) -> None:
    """Noise-free losses of a known law around each C's optimum: Approach 2 resolves a, the JSON
    holds isoflop_fit in the issue's shape (no bootstrap draws), and both figures are drawn."""
    from archhpo.cli import main

    rows = []
    for ci, c in enumerate((1e16, 1e17, 1e18)):  # (FLOPs above 9.2e18 overflow the summary's Int64 columns)
        centre = 1.345 * (c / 6) ** 0.4516  # Chinchilla's law's N_opt(C)
        for si, n in enumerate(centre * 10 ** (i / 6 - 0.5) for i in range(7)):
            for row in _rows("front", {f"C{ci}-S{si}": n}, per=1, seed=ci * 7 + si):
                d = c / (6 * row["param_count"])
                row.update(tokens_per_param=d / row["param_count"], train_tokens=int(d), train_flops=c,
                           compute_budget=c, data_passes=1.0,
                           val_loss=1.69 + 406.4 * row["param_count"] ** -0.34 + 410.7 * d ** -0.28)
                rows.append(row)
    out = tmp_path / "r"
    assert main(["report", "--csv", str(_write(rows, tmp_path / "f.csv")), "--out", str(out)]) == 0
    iso = json.loads((out / "front_scaling_fit.json").read_text())["isoflop_fit"]
    assert {"status", "reason", "a", "vertices", "recentre"} <= set(iso)
    assert iso["status"] == "fitted" and abs(iso["a"]["estimate"] - 0.4516) < 0.05
    assert set(iso["a"]) == {"estimate", "ci95"} and len(iso["vertices"]) == 3
    assert all({"compute_budget", "n_opt", "edge"} <= set(v) and "samples" not in v for v in iso["vertices"])
    for name in ("isoflop_profiles", "frontier"):
        assert (out / "front_figures" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
