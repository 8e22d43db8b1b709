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
