"""The report's figures as saved: every legend inside the canvas, captions that
say what is drawn of the law, and one "left out" line, with its reason, for each figure not drawn."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from archhpo.report._figures import FIGURES, caption, left_out, make_figures
from archhpo.report._frame import trials_frame
from archhpo.report._html import _figures_section
from archhpo.report._page import write_report
from tests.report.test_isoflop_figures import isoflop_rows
from tests.report.test_report import _rows, _write

# One xdist worker runs this module: its module-scoped fixtures are built once, not once per worker.
pytestmark = pytest.mark.xdist_group("figures_layout")

REPORT_DPI = 110  # write_report's png_dpi default
PDF_DPI = 150  # the dpi write_report saves the PDFs (their rasterised points) at
SIX = {"200K": 2e5, "1M": 1e6, "5M": 5e6, "25M": 2.5e7, "125M": 1.25e8, "625M": 6.25e8}


def _law_rows() -> list[dict]:
    """Six budgets on a known law (fitted), a third of the trials pruned, three learning rates."""
    rows = _rows("law", budgets=SIX)
    for i, r in enumerate(rows):
        r.update(learning_rate=(1e-4, 3e-4, 1e-3)[i % 3], state="PRUNED" if i % 3 == 0 else "COMPLETE")
    return rows


def _frontier_rows() -> list[dict]:
    """Three compute budgets, seven sizes each around Chinchilla's N_opt(C): Approach 2 is fitted."""
    rows = []
    for ci, c in enumerate((1e16, 1e17, 1e18)):
        centre = 1.345 * (c / 6) ** 0.4516
        for si, n in enumerate(centre * 10 ** (i / 6 - 0.5) for i in range(7)):
            for row in _rows("front", {f"C{ci}-S{si}": n}, per=1, seed=ci * 7 + si):
                d = c / (6 * row["param_count"])
                row.update(tokens_per_param=d / row["param_count"], train_tokens=int(d), train_flops=c,
                           compute_budget=c, data_passes=1.0,
                           val_loss=1.69 + 406.4 * row["param_count"] ** -0.34 + 410.7 * d ** -0.28)
                rows.append(row)
    return rows


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any, str]]:
    """name -> (frame, fit, page) of a report on each synthetic table (every figure drawn by one)."""
    tmp = tmp_path_factory.mktemp("layout")
    out = {}
    for name, rows in (("law", _law_rows()), ("iso", isoflop_rows()), ("front", _frontier_rows())):
        path = _write(rows, tmp / f"{name}.csv")
        report = write_report(name, csv=path, out=tmp / name, n_boot=20)
        out[name] = (trials_frame(name, csv=path), report.fit, report.html.read_text())
    return out


def test_every_legend_and_title_lies_inside_its_figure_at_the_reports_resolution(reports: dict[str, Any]) -> None:
    drawn: set[str] = set()
    for frame, fit, _ in reports.values():
        for name, fig in make_figures(frame, fit).items():
            legends = [leg for ax in fig.axes if (leg := ax.get_legend()) is not None and leg.get_visible()]
            title = [fig._suptitle] if legends and fig._suptitle is not None else []  # a long title clips too
            for dpi in (REPORT_DPI, PDF_DPI):
                fig.set_dpi(dpi)
                fig.canvas.draw()  # the figures carry an Agg canvas: this lays out what savefig writes
                renderer = fig.canvas.get_renderer()
                for leg in legends + title:
                    box, page = leg.get_window_extent(renderer), fig.bbox
                    assert (box.x0 >= page.x0 and box.y0 >= page.y0 and box.x1 <= page.x1 and box.y1 <= page.y1), \
                        f"{name} at {dpi} dpi: legend {box.bounds} outside the canvas {page.bounds}"
            drawn |= {name} if legends else set()
    assert drawn == set(FIGURES) - {"arch_plane"}, "every figure with a legend was checked"


def test_the_loss_vs_params_caption_names_the_law_only_when_it_is_drawn(reports: dict[str, Any]) -> None:
    assert caption("loss_vs_params", {"status": "fitted"}) == (
        "Validation loss against exact parameter count, with the fitted law and its 95% band")
    assert caption("loss_vs_params", {"status": "unresolved"}) == (
        "Validation loss against exact parameter count; the law is not drawn: law not resolved")
    assert caption("loss_vs_params", None) == (
        "Validation loss against exact parameter count; the law is not drawn: no law fitted")
    assert caption("arch_plane", {"status": "fitted"}) == FIGURES["arch_plane"]
    for name, want in (("law", "fitted"), ("iso", "no_scaling")):
        frame, fit, page = reports[name]
        assert fit["status"] == want
        law_lines = [ln for ln in make_figures(frame, fit)["loss_vs_params"].axes[0].get_lines()
                     if ln.get_label().startswith("L = ")]
        assert len(law_lines) == (1 if want == "fitted" else 0)
        said = f"<figcaption>{caption('loss_vs_params', fit)} (loss_vs_params.png / .pdf)</figcaption>"
        assert said in page
    assert "with the fitted law" not in reports["iso"][2]
    # its loss falls (the loss ratio's interval lies below 1): never "no measurable scaling"
    assert reports["iso"][1]["loss_ratio"]["ci95"][1] < 1
    assert "the law is not drawn: the loss falls, but no law is resolved" in reports["iso"][2]


def _lacking(figure: str) -> list[dict]:
    """Four budgets (_rows: one set of training parameters) made to lack what `figure` draws."""
    rows = _rows("lack")
    for r in rows:
        if figure == "loss_vs_params":
            r.update(param_count=1_000_000)
        elif figure in ("arch_plane", "loss_vs_depth_width"):
            r.update(d_model=64, n_layers=2)
        elif figure == "val_curves":
            r.update(val_curve="")
        elif figure == "loss_vs_compute":
            r.update(train_flops="")
    return rows


@pytest.mark.parametrize("figure", ["loss_vs_params", "arch_plane", "val_curves", "loss_vs_compute"])
def test_a_frame_lacking_a_figures_data_yields_one_left_out_line_naming_it(tmp_path: Path, figure: str) -> None:
    frame = trials_frame("lack", csv=_write(_lacking(figure), tmp_path / "lack.csv"))
    omitted = left_out(frame)
    images = {name: b"" for name in make_figures(frame)}
    assert set(images) | set(omitted) == set(FIGURES) and not set(images) & set(omitted), \
        "each figure is drawn or left out, never both"
    page = "\n".join(_figures_section(images, omitted))
    expected = {figure, "phase1_params", "isoflops", "isoflop_profiles", "frontier"}
    if figure == "arch_plane":
        expected.add("loss_vs_depth_width")  # one cell is also one depth-to-width ratio
    assert set(omitted) == expected
    for name in FIGURES:
        assert len(re.findall(rf"<li>{name}: [^<]+\.</li>", page)) == (name in expected), name


def test_the_isoflop_figures_not_drawn_are_left_out_with_their_reason(reports: dict[str, Any]) -> None:
    page = reports["law"][2]
    assert "<li>isoflops: no fitted L(N, D) to draw (its status: too_few_points).</li>" in page
    for name, what in (("isoflop_profiles", "IsoFLOP profile"), ("frontier", "fitted N_opt(C)")):
        assert (f"<li>{name}: no {what} to draw (no trial records a compute budget: not an IsoFLOP "
                "study).</li>") in page
    drawn = {n for n in FIGURES if f"({n}.png / .pdf)</figcaption>" in reports["front"][2]}
    assert {"isoflop_profiles", "frontier"} <= drawn
    for frame, fit, page in reports.values():
        shown = {n for n in FIGURES if f"({n}.png / .pdf)</figcaption>" in page}
        said = set(re.findall(r"<li>(\w+): [^<]+\.</li>", page.split("<h2>Figures</h2>")[1]))
        assert shown | said == set(FIGURES) and not shown & said
        assert left_out(frame, fit).keys() == said


def test_decision_accuracy_shows_pairs_of_budgets_with_five_pairs_of_shapes_and_names_the_others() -> None:
    from archhpo.report._decisions import decision_accuracy, decision_left_out, decision_rows
    from archhpo.report._html import _decisions_section
    from tests.report.test_decisions import _frame

    four = {(2, 2): 1.0, (2, 4): 1.1, (3, 2): 1.2, (3, 4): 1.3}  # 4 shapes: 6 pairs, shown
    frame = _frame({"200K": four, "400K": {k: v - 0.1 for k, v in four.items()},
                    "1M": {(2, 2): 0.7, (2, 4): 0.8, (3, 2): 0.9}})  # 3 shapes in common: 3 pairs
    result = decision_accuracy(frame)
    assert [(r["small"], r["large"], r["shapes"], r["pairs"]) for r in result] == [
        ("200K", "400K", 4, 6), ("200K", "1M", 3, 3), ("400K", "1M", 3, 3)]
    assert decision_rows(result) == [["200K → 400K", "4", "100% [100%, 100%] of 6 pairs"]]
    said = ("Left out: 200K → 1M (3 matched shapes), 400K → 1M (3 matched shapes): fewer than 5 pairs of shapes "
            "to compare (that takes 4 matched shapes); with so few the agreement moves in steps of a third or "
            "more and its interval collapses.")
    assert decision_left_out(result) == said
    page = "\n".join(_decisions_section(frame))
    assert page.count("<tr>") == 2 and "not enough matched shapes" not in page and said in page
    alone = _frame({"200K": {(2, 2): 1.0, (2, 4): 1.1}, "400K": {(2, 2): 0.9, (2, 4): 1.0}})
    page = "\n".join(_decisions_section(alone))
    assert "<table>" not in page, "every pair left out: the sentence replaces the table"
    assert page.endswith("<p class='decisions-left-out'>Left out: 200K → 400K (2 matched shapes): fewer than 5 "
                         "pairs of shapes to compare (that takes 4 matched shapes); with so few the agreement "
                         "moves in steps of a third or more and its interval collapses.</p>")
    assert decision_left_out(decision_accuracy(_frame({"200K": four, "400K": four}))) is None
