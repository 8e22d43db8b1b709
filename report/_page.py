"""`archhpo report`: the answer per budget, the scaling-law fit, figures and tables, in one place.

`write_report` reads an experiment (database or CSV files, via `trials_frame`) and writes into
the output directory ``{experiment}_report.html``, one self-contained page (figures embedded,
nothing fetched from the network): per budget the best architecture and how it was trained, its
loss, the runner-up and the gap, the confirmation result, the fitted law, the paired-choice table
of a study with categorical choices and paired seeds, then the figures; beside it
``{experiment}_figures/`` (`archhpo.report._figures.FIGURES` as PNG and PDF),
``{experiment}_scaling_fit.json`` (`archhpo.report._fit`, with the data's truth when known),
``{experiment}_summary.csv`` (one row per budget, `SUMMARY_COLUMNS` first) and, for choices crossed
with paired seeds, ``{experiment}_choices.md`` and ``.csv`` (per choice the mean over seeds and the
paired difference from a reference choice, with a bootstrap interval from 3 pairs on).  Read from a
database, each budget's answer is also saved as the study's note in optuna-dashboard.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from archhpo._io import atomic_write
from archhpo.errors import StudyError
from archhpo.report._answer import compute_answer, nd_fit, scaling_fit
from archhpo.report._choices import CHOICE_COLUMNS, choice_markdown, choice_table
from archhpo.report._compute import compute_text
from archhpo.report._export import RESULTS_CSV
from archhpo.report._fit import fit_json
from archhpo.report._frame import load_curves, ranked, trials_frame
from archhpo.report._html import render_html
from archhpo.report._isoflop import isoflop_fit
from archhpo.report._law import fit_line
from archhpo.report._notes import _write_notes, budget_note
from archhpo.report._summary import SUMMARY_COLUMNS, budget_summary, confirmation

CURVES_SHOWN = 5  # validation curves drawn per budget (the best trials)


@dataclass
class Report:
    """What `write_report` produced (paths) and computed (for callers that print a line)."""

    html: Path
    files: list[Path] = field(default_factory=list)
    fit: dict[str, Any] = field(default_factory=dict)
    summary: pd.DataFrame | None = None
    notes_written: int = 0
    compute: str | None = None  # FLOPs spent against the full plan (report/_compute.py), if recorded
    baselines: list[str] = field(default_factory=list)  # "budget: verdict" per --baselines rule


def _png_data(fig: Any, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def ladder_notes(storage: Any, studies: dict[str, str]) -> dict[str, str]:
    """Per ladder budget (--ladder), what it carried up from the smaller one (search/_ladder.py),
    and the trials that diverged at the carried rate (report/_failures.py)."""
    from archhpo.report._failures import why_diverged
    from archhpo.search._ladder import describe
    from archhpo.search._study import LADDER_KEY

    out = {}
    for budget, name in studies.items():
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
        if attrs.get(LADDER_KEY):
            diverged = why_diverged(storage, name)
            out[budget] = describe(attrs[LADDER_KEY]) + (f"; {diverged}" if diverged else "")
    return out


# ----------------------------------------------------------------------------- writing
def _csv_text(df: pd.DataFrame) -> str:
    buf = io.StringIO()
    df.to_csv(buf, index=False, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    return buf.getvalue()


def result_files(out: Path, experiment: str, budgets: Sequence[str],
                 csv_paths: Sequence[str | Path] = ()) -> tuple[list[str], str]:
    """The trials CSV and each budget's best JSON, as paths relative to the page in `out`: the CSV
    files read (or `out`'s experiment_results.csv) and the best JSONs beside them or in `out`; and
    a sentence naming what was not found there (empty when everything was)."""
    csvs = [Path(p) for p in csv_paths] or [p for p in [out / RESULTS_CSV] if p.is_file()]
    folders = list(dict.fromkeys([out, *(p.parent for p in csvs)]))
    found, lacking = [], []
    for budget in budgets:
        hits = [d / f"{experiment}_{budget}_best.json" for d in folders]
        hit = next((h for h in hits if h.is_file()), None)
        found += [hit] if hit else []
        lacking += [] if hit else [budget]
    links = [os.path.relpath(p, out) for p in [*csvs, *found]]
    jsons = f"the best JSON{'s' if len(lacking) > 1 else ''} of {', '.join(lacking)}"
    missing = ([] if csvs else [RESULTS_CSV]) + ([jsons] if lacking else [])
    if not missing:
        return links, ""
    return links, (f"Not found beside this page: {' and '.join(missing)}; archhpo export --experiment "
                   f"{experiment} --out {out} writes them.")


def report_frame(frame: pd.DataFrame, out: str | Path = "results", experiment: str | None = None,
                 reference: str | None = None, n_boot: int = 1000, storage: Any = None,
                 png_dpi: int = 110, compute: float | None = None,
                 csv_paths: Sequence[str | Path] = ()) -> Report:
    """Write every report file for a `trials_frame` frame into `out` (see the module docstring);
    with `storage` (the frame's database) also the dashboard notes; `csv_paths` the CSV files the
    frame was read from (linked from the page)."""
    experiment = experiment or frame.attrs.get("experiment") or "experiment"
    out = Path(out)
    fig_dir = out / f"{experiment}_figures"
    confirm = confirmation(frame)
    summary = budget_summary(frame, confirm)
    fit = scaling_fit(frame, n_boot=n_boot)  # per ratio where the budgets train several (report/_answer.py)
    fit.update(frame.attrs.get("truth") or {})  # a synthetic language's exact entropy rate, beside E
    nd = nd_fit(frame, n_boot)
    nd.update(frame.attrs.get("truth") or {})
    nd["compute_optimal"] = compute_answer(frame, nd, compute)
    fit["nd_fit"] = nd  # its bootstrap samples stay in memory (figures); fit_json drops them
    fit["isoflop_fit"] = isoflop_fit(frame, nd, n_boot)  # Approach 2 (report/_isoflop.py)
    choices = choice_table(frame, reference)
    files: list[Path] = []

    images, omitted = _write_figures(frame, fit, fig_dir, png_dpi, files)
    fit_path = out / f"{experiment}_scaling_fit.json"
    atomic_write(fit_path, json.dumps(fit_json(fit), indent=2) + "\n")
    summary_path = out / f"{experiment}_summary.csv"
    atomic_write(summary_path, _csv_text(summary))
    files += [fit_path, summary_path]
    if not choices.empty:
        md_path, csv_path = out / f"{experiment}_choices.md", out / f"{experiment}_choices.csv"
        atomic_write(md_path, f"# {experiment}: categorical choices over paired seeds\n\n" + choice_markdown(choices))
        atomic_write(csv_path, _csv_text(choices))
        files += [md_path, csv_path]
    html_path = out / f"{experiment}_report.html"
    shown = [str(p.relative_to(out)) for p in files]
    results, missing = result_files(out, experiment, list(summary["budget"]), csv_paths)
    atomic_write(html_path, render_html(experiment, frame, summary, fit, confirm, choices, images,
                                        [*results, *shown], omitted, missing))
    report = Report(html=html_path, files=[html_path, *files], fit=fit, summary=summary,
                    compute=compute_text(frame),
                    baselines=[f"{budget}: {b['statement']}" for budget, c in confirm.items()
                               for b in c.get("baselines") or []])
    if storage is not None and frame.attrs.get("studies"):
        report.notes_written = _write_notes(storage, frame, summary, confirm, fit)
    return report


def _write_figures(frame: pd.DataFrame, fit: dict[str, Any], fig_dir: Path, png_dpi: int,
                   files: list[Path]) -> tuple[dict[str, bytes], dict[str, str]]:
    """Every figure with something to compare as PNG and PDF (appended to `files`); returns the
    PNGs the page embeds and the figures left out, with why.  A left-out figure's files from an
    earlier report are removed, so the folder holds what the page shows."""
    from archhpo.report._figures import left_out, make_figures

    omitted = left_out(frame, fit)
    for name in omitted:
        for ext in ("png", "pdf"):
            (fig_dir / f"{name}.{ext}").unlink(missing_ok=True)

    images: dict[str, bytes] = {}
    for name, fig in make_figures(frame, fit).items():
        png = _png_data(fig, png_dpi)
        atomic_write(fig_dir / f"{name}.png", png)
        buf = io.BytesIO()
        fig.savefig(buf, format="pdf", dpi=150)
        atomic_write(fig_dir / f"{name}.pdf", buf.getvalue())
        images[name] = png
        files += [fig_dir / f"{name}.png", fig_dir / f"{name}.pdf"]
    return images, omitted


def write_report(experiment: str | None, storage: Any = None, csv: str | Path | Sequence[str | Path] | None = None,
                 out: str | Path = "results", reference: str | None = None, n_boot: int = 1000,
                 notes: bool = True, compute: float | None = None) -> Report:
    """`archhpo report`: read the experiment (database, or `csv` files) and write its report
    into `out`.  From CSV files `experiment` may be None when they hold one experiment.  Read from a database, each budget's answer also becomes its study's note in
    optuna-dashboard (unless `notes` is False)."""
    if csv:
        frame = trials_frame(experiment, csv=csv)
        names = sorted(set(frame["experiment"].astype(str)))
        if experiment is None and len(names) > 1:
            raise StudyError(f"The CSV files hold {len(names)} experiments ({', '.join(names)}); pass "
                             f"--experiment NAME to pick one, or --experiment {','.join(names)} to pool them.")
        label = experiment.replace(",", "+") if experiment else (names[0] if names else None)  # the files' prefix
        return report_frame(frame, out, label, reference, n_boot,
                            compute=compute, csv_paths=[csv] if isinstance(csv, str | Path) else list(csv))
    if experiment is None:
        raise StudyError("Reading a database needs --experiment NAME (only a CSV file with one experiment "
                         "names its own).")
    if "," in experiment:
        raise StudyError(f"A database report reads one experiment, not {experiment!r}; to pool several, export "
                         "each (archhpo export) and pass their CSVs: report --csv A --csv B --experiment "
                         f"{experiment}.")
    from archhpo.report._failures import why_all_failed
    from archhpo.search._storage import open_storage, resolve_storage_url

    if storage is None or isinstance(storage, str):
        storage = open_storage(resolve_storage_url(storage), create=False)
    frame = trials_frame(experiment, storage=storage, curves=False)
    frame.attrs["all_failed"] = why_all_failed(storage, experiment=experiment)
    frame.attrs["ladder"] = ladder_notes(storage, frame.attrs.get("studies") or {})
    top = ranked(frame).groupby("budget", sort=False).head(CURVES_SHOWN)
    load_curves(frame, storage, top.index)  # only the curves the figures draw
    return report_frame(frame, out, experiment, reference, n_boot, storage if notes else None, compute=compute)


__all__ = [
    "CHOICE_COLUMNS",
    "SUMMARY_COLUMNS",
    "Report",
    "budget_note",
    "budget_summary",
    "choice_markdown",
    "choice_table",
    "confirmation",
    "fit_line",
    "ladder_notes",
    "report_frame",
    "result_files",
    "write_report",
]
