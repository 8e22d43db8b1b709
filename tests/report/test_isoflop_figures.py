"""The report of an IsoFLOP table: several trials (sizes) share each compute budget's FLOPs exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

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


def _fitted_iso() -> dict:
    """Approach 2 on a known law's table: 3 budgets of 7 sizes each around Chinchilla's optimum."""
    from archhpo.report._isoflop import fit_isoflops

    cs, ns, ls = [], [], []
    for c in (1e18, 1e19, 1e20):
        for i in range(7):
            n = 1.345 * (c / 6) ** 0.4516 * 10 ** (i / 6 - 0.5)
            cs.append(c)
            ns.append(n)
            ls.append(1.69 + 406.4 * n ** -0.34 + 410.7 * (c / (6 * n)) ** -0.28)
    return fit_isoflops(cs, ns, ls, k=6.0, n_boot=100)


def test_the_frontier_draws_bands_the_extrapolation_dotted_and_twenty_tokens_per_parameter() -> None:
    """Solid lines over the budgets, dotted ones on to 4x the largest C, a band under each, and the
    20-tokens-per-parameter reference line across the whole range."""
    from archhpo.report._isoflop_figures import EXTRAPOLATE, isoflop_plots

    iso = _fitted_iso()
    assert iso["status"] == "fitted"
    ax = isoflop_plots(None, iso)["frontier"]().axes[0]
    solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert len(solid) == 2 and len(dotted) == 2, "N_opt and D_opt, over the budgets and beyond"
    for ln in dotted:
        assert min(ln.get_xdata()) == pytest.approx(1e20) and max(ln.get_xdata()) == pytest.approx(EXTRAPOLATE * 1e20)
    assert len(ax.collections) >= 4 + 2, "a's band under each of the 4 segments, and the two vertex scatters"
    ref = next(ln for ln in ax.get_lines() if ln.get_label() == "N at 20 tokens/param")
    c, n = np.asarray(ref.get_xdata()), np.asarray(ref.get_ydata())
    assert np.allclose(c / (6.0 * n) / n, 20.0) and max(c) == pytest.approx(EXTRAPOLATE * 1e20)


def test_the_profiles_draw_each_vertex_with_its_interval() -> None:
    from archhpo.report._isoflop_figures import plot_isoflop_profiles

    iso = _fitted_iso()
    ax = plot_isoflop_profiles(iso).axes[0]
    assert len([ln for ln in ax.get_lines() if ln.get_label().startswith("C = ")]) == 3, "a parabola per C"
    assert len(ax.containers) == 3, "an error bar (the vertex's 95% interval) per C"


def test_a_report_pools_two_experiments_only_when_named_and_never_from_a_database(tmp_path: Path,
                                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A re-centred IsoFLOP plan is another experiment: `--experiment a,b` pools their CSVs (files
    prefixed a+b); without it two experiments are refused, and a database report reads one."""
    from archhpo.cli import main

    rows = isoflop_rows()
    first = _write([r for r in rows if r["compute_budget"] != COMPUTES[-1]], tmp_path / "a.csv")
    second = _write([{**r, "experiment": "iso_r"} for r in rows if r["compute_budget"] == COMPUTES[-1]],
                    tmp_path / "b.csv")
    assert main(["report", "--csv", str(first), "--csv", str(second), "--out", str(tmp_path / "no")]) == 2
    assert "pass --experiment NAME to pick one, or --experiment iso,iso_r to pool them." in capsys.readouterr().err
    out = tmp_path / "r"
    assert main(["report", "--csv", str(first), "--csv", str(second), "--experiment", "iso,iso_r",
                 "--out", str(out)]) == 0
    fit = json.loads((out / "iso+iso_r_scaling_fit.json").read_text())["isoflop_fit"]
    assert [v["compute_budget"] for v in fit["vertices"]] == list(COMPUTES)  # both experiments' budgets
    capsys.readouterr()
    assert main(["report", "--experiment", "iso,iso_r", "--storage", f"sqlite:///{tmp_path / 'x.db'}",
                 "--out", str(tmp_path / "db")]) == 2
    err = capsys.readouterr().err
    assert "A database report reads one experiment, not 'iso,iso_r'" in err and err.count("\n") == 1
