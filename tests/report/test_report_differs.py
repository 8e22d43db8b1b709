"""A report that shows what differs: every architecture key and choice wherever an
architecture is named, with what is not the winner's marked; the loss's metric and unit; one value per
pruned trial in the CSV, the tables and the figures; pruned trials drawn apart; the known floor drawn;
figures with nothing to compare left out with a reason; the CSV and best JSONs linked; the answer and
the law's status on the first screen."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.report._figures import plot_loss_vs_params, plot_val_curves
from archhpo.report._frame import trials_frame
from archhpo.report._page import budget_summary, write_report
from archhpo.report._summary import SUMMARY_EXTRA
from archhpo.search import TrialQueue, launch, prepare_settings
from tests.conftest import TINY_DATA
from tests.report.test_report import _rows, _write


def _heads_rows() -> list[dict]:
    """One budget: the winner (trial 0: 64 wide, 2 layers, 4 heads) and a runner-up that differs
    from it only in heads (trial 1: 8 heads), then a third architecture."""
    rows = _rows("heads", budgets={"1M": 1e6}, per=3)
    for r in rows:
        r.update(d_model=64, n_layers=2, d_ff=256, n_heads=4)
    rows[0]["val_loss"], rows[1]["val_loss"], rows[2]["val_loss"] = 1.0, 1.1, 1.2
    rows[1]["n_heads"] = 8
    rows[2].update(d_model=128, d_ff=512)
    return rows


def test_a_runner_up_that_differs_in_heads_reads_as_another_architecture(tmp_path: Path) -> None:
    report = write_report("heads", csv=_write(_heads_rows(), tmp_path / "h.csv"), out=tmp_path / "r", n_boot=50)
    html = report.html.read_text()
    assert ("<td>1.1 (trial 1: d_model 64, 2 layers, <b>8 heads (winner 4)</b>, d_ff 256)</td>") in html
    with open(tmp_path / "r" / "heads_summary.csv") as fh:
        row = next(csv.DictReader(fh))
    assert (row["runner_up_n_heads"], row["runner_up_d_ff"], row["runner_up_differs"]) == ("8", "256", "n_heads")
    assert SUMMARY_EXTRA.index("runner_up_differs") == SUMMARY_EXTRA.index("runner_up_param_count") + 2


def test_choices_are_named_and_a_different_choice_is_marked(tmp_path: Path) -> None:
    from archhpo.report._frame import best_and_runner_up
    from archhpo.report._notes import budget_note

    rows = _heads_rows()
    for r, enc in zip(rows, ("sum", "linear", "sum"), strict=True):
        r.update(n_heads=4, choices=json.dumps({"encoder": enc}))
    frame = trials_frame("heads", csv=_write(rows, tmp_path / "c.csv"))
    summary = budget_summary(frame)
    assert summary.loc[0, "runner_up_differs"] == "encoder" and summary.loc[0, "runner_up_choice"] == "linear"
    best, runner = best_and_runner_up(frame)["1M"]
    note = budget_note("1M", summary.iloc[0], best, None, {"status": "too_few_budgets"}, runner, "nats per sample")
    assert ("**Best:** trial 0: d_model 64, 2 layers, 4 heads, d_ff 256, encoder sum, " in note)
    assert ("**Runner-up:** trial 1 (d_model 64, 2 layers, 4 heads, d_ff 256, **encoder linear (winner sum)**), "
            "val_loss 1.1 nats per sample; gap " in note)
    assert "**Importance plot:**" in note and "with 3 the bars are not a measurement" in note


def test_the_metric_and_its_unit_are_named(tmp_path: Path) -> None:
    report = write_report("heads", csv=_write(_heads_rows(), tmp_path / "h.csv"), out=tmp_path / "r", n_boot=50)
    html = report.html.read_text()
    assert "<th>val_loss (nats/sample)</th>" in html
    assert "Every loss on this page is val_loss, the validation cross-entropy in nats per sample" in html
    frame = trials_frame("heads", csv=tmp_path / "h.csv")
    assert plot_loss_vs_params(frame).axes[0].get_ylabel() == "val_loss (nats/sample)"
    lm = _write([{**r, "family": "lm"} for r in _heads_rows()], tmp_path / "lm.csv")
    lm_frame = trials_frame("heads", csv=lm)
    assert plot_loss_vs_params(lm_frame).axes[0].get_ylabel() == "val_loss (nats/token)"
    lm_frame.attrs["data_kinds"] = ["text"]
    assert plot_loss_vs_params(lm_frame).axes[0].get_ylabel() == "val_loss (nats/byte)"


def _pruned_study(url: str) -> None:
    """Three trials: two complete, and one pruned whose stored value (its rung score after the
    cooldown, 2.4) is lower than its un-cooled epoch-1 loss (2.46)."""
    settings = prepare_settings("pr", "200K", family="patchtst", data=TINY_DATA, quick=True, n_trials=3)
    launch(url, settings)
    q = TrialQueue(url, settings.study_name)
    for i in range(3):
        claim = q.claim({"host": "test", "device": "cpu"})
        assert claim is not None
        if i == 1:
            q.report(claim, 1, 2.46)
            q.finish(claim, TrialState.PRUNED, 2.4, {"duration_s": 0.1, "baseline_val_loss": 2.5})
            continue
        for epoch, loss in ((1, 2.3 + i / 10), (2, 2.2 + i / 10)):
            q.report(claim, epoch, loss)
        q.finish(claim, TrialState.COMPLETE, 2.2 + i / 10, {"duration_s": 0.1, "best_epoch": 2,
                                                             "baseline_val_loss": 2.5})


def test_a_pruned_trial_has_one_value_in_the_csv_the_tables_and_the_figures(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _pruned_study(url)
    out = tmp_path / "out"
    assert main(["export", "--experiment", "pr", "--storage", url, "--out", str(out), "--report"]) == 0
    with open(out / "experiment_results.csv") as fh:
        pruned = [r for r in csv.DictReader(fh) if r["state"] == "PRUNED"]
    assert [float(r["val_loss"]) for r in pruned] == [2.4]
    frame = trials_frame("pr", storage=url)
    assert frame.loc[frame["state"] == "PRUNED", "val_loss"].tolist() == [2.4]
    fig = plot_loss_vs_params(frame)
    hollow = [c for c in fig.axes[0].collections if c.get_label().startswith("pruned (1, hollow")]
    assert len(hollow) == 1 and hollow[0].get_offsets()[:, 1].tolist() == [2.4]
    full = [c for c in fig.axes[0].collections if c.get_label() == "200K (2 full-length)"]
    assert sorted(full[0].get_offsets()[:, 1].tolist()) == pytest.approx([2.2, 2.4])
    html = (out / "pr_report.html").read_text()
    assert ("a pruned trial&#x27;s (1 here) is its score at the rung where it was stopped (after the rung&#x27;s "
            "cooldown under a WSD schedule), or the best loss it reached when it has no score.") in html
    assert "<td>2/1/0</td>" in html


def test_the_known_floor_is_drawn_on_the_loss_figures(tmp_path: Path) -> None:
    frame = trials_frame("heads", csv=_write(_heads_rows(), tmp_path / "h.csv"))
    frame.attrs["truth"] = {"entropy_rate": 1.8496, "loss_floor": 1.8723}
    for fig in (plot_loss_vs_params(frame), plot_val_curves(frame)):
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert "loss floor 1.872" in labels
        floor = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "loss floor 1.872"]
        assert floor[0].get_ydata()[0] == 1.8723
    frame.attrs["truth"] = {}
    labels = [t.get_text() for t in plot_loss_vs_params(frame).axes[0].get_legend().get_texts()]
    assert not any(t.startswith(("loss floor", "entropy rate")) for t in labels)


def test_figures_with_nothing_to_compare_are_left_out_and_curves_say_how_many(tmp_path: Path) -> None:
    report = write_report("heads", csv=_write(_heads_rows(), tmp_path / "h.csv"), out=tmp_path / "r", n_boot=50)
    html = report.html.read_text()
    assert ("<li>phase1_params: every training parameter was fixed (learning_rate 0.0003, epochs 3, batch_size 64, "
            "weight_decay 0.0001, warmup_steps 10).</li>") in html
    assert not (tmp_path / "r" / "heads_figures" / "phase1_params.png").exists()
    frame = trials_frame("heads", csv=tmp_path / "h.csv")
    curves = plot_val_curves(frame)
    assert curves.axes[0].get_title() == "1M: 3 of 5 (only 3 complete)"
    assert len([ln for ln in curves.axes[0].get_lines() if ln.get_label().startswith("#")]) == 3
    one = _rows("one", budgets={"1M": 1e6, "5M": 5e6}, per=2)
    for r in one:
        r.update(d_model=64, n_layers=2)
    html = write_report("one", csv=_write(one, tmp_path / "o.csv"), out=tmp_path / "o", n_boot=20).html.read_text()
    assert "<li>arch_plane: one (d_model, n_layers) cell per budget: a single point per panel.</li>" in html


def test_the_files_list_links_the_csv_and_the_best_jsons(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _pruned_study(url)
    out = tmp_path / "out"
    assert main(["export", "--experiment", "pr", "--storage", url, "--out", str(out)]) == 0
    assert main(["report", "--experiment", "pr", "--storage", url, "--out", str(out)]) == 0
    html = (out / "pr_report.html").read_text()
    assert ("<h2>Files</h2><ul><li><a href='experiment_results.csv'>experiment_results.csv</a>"
            " (this experiment's rows: experiment = pr)</li>"
            "<li><a href='pr_200K_best.json'>pr_200K_best.json</a></li>") in html
    elsewhere = tmp_path / "elsewhere"
    assert main(["report", "--csv", str(out / "experiment_results.csv"), "--out", str(elsewhere)]) == 0
    html = (elsewhere / "pr_report.html").read_text()
    assert ("<li><a href='../out/experiment_results.csv'>../out/experiment_results.csv</a>"
            " (this experiment's rows: experiment = pr)</li>"
            "<li><a href='../out/pr_200K_best.json'>../out/pr_200K_best.json</a></li>") in html
    fresh = tmp_path / "fresh"
    assert main(["report", "--experiment", "pr", "--storage", url, "--out", str(fresh)]) == 0
    assert (f"Not found beside this page: experiment_results.csv and the best JSON of 200K; "
            f"archhpo export --experiment pr --out {fresh} writes them.") in (fresh / "pr_report.html").read_text()


def test_the_first_screen_holds_the_answer_and_the_law(tmp_path: Path) -> None:
    report = write_report("heads", csv=_write(_heads_rows(), tmp_path / "h.csv"), out=tmp_path / "r", n_boot=50)
    html = report.html.read_text()
    first = html[html.index("<div class='first'>"):html.index("</div>")]
    assert ("<li><b>1M</b>: d_model 64, 2 layers, 4 heads, d_ff 256 (trial 0, " in first
            and "val_loss <b>1</b> nats/sample</li>" in first)
    assert "<p class='law'><b>Scaling law.</b> No scaling law fitted: " in first
    assert html.index("<div class='first'>") < html.index("The answer, per budget") < html.index("<h2>Figures</h2>")
    law = _rows("law", budgets={"200K": 2e5, "1M": 1e6, "5M": 5e6, "25M": 2.5e7, "125M": 1.25e8, "625M": 6.25e8})  # a law needs 6 budgets
    report = write_report("law", csv=_write(law, tmp_path / "l.csv"), out=tmp_path / "l", n_boot=100)
    html = report.html.read_text()
    first = html[html.index("<div class='first'>"):html.index("</div>")]
    e = report.fit["E"]
    assert report.fit["status"] == "fitted"
    assert f"E = {e['estimate']:.4g} [{e['ci95'][0]:.4g}, {e['ci95'][1]:.4g}]" in first
    assert np.isfinite(e["ci95"][0])


def test_confirmed_ranks_name_every_key_and_mark_what_is_not_rank_0s(tmp_path: Path) -> None:
    rows = _heads_rows()
    n = 100
    for s in range(3):
        for src in rows[:2]:  # rank 1 differs from rank 0 in heads only
            rows.append({**src, "trial": n, "phase": 3, "seed": s, "val_loss": src["val_loss"] + 0.01 * s})
            n += 1
    html = write_report("heads", csv=_write(rows, tmp_path / "c.csv"), out=tmp_path / "r", n_boot=20).html.read_text()
    assert "<th>architecture (not rank 0&#x27;s in bold)</th>" in html
    assert "<tr><td class='n'>0</td><td>d_model 64, 2 layers, 4 heads, d_ff 256</td>" in html
    assert "<tr><td class='n'>1</td><td>d_model 64, 2 layers, <b>8 heads (winner 4)</b>, d_ff 256</td>" in html
