"""The HTML page of `archhpo report` (`render_html`): the head, the answer per budget with the
law, the confirmation, baseline and paired-choice tables, the embedded figures and the file list."""

from __future__ import annotations

import base64
import datetime as dt
import html
import os
import urllib.parse
from collections.abc import Sequence
from typing import Any

import pandas as pd

from archhpo.report._arch import arch_fields, arch_html
from archhpo.report._choices import _diff_text
from archhpo.report._compute import compute_rows, compute_text, data_rows, data_text
from archhpo.report._confirm import MIN_PAIRS
from archhpo.report._decisions import decision_accuracy, decision_left_out, decision_rows
from archhpo.report._frame import best_and_runner_up
from archhpo.report._isoflop import isoflop_lines
from archhpo.report._law import compute_lead, law_text, nd_text
from archhpo.report._notes import _arch_text, gap_text
from archhpo.report._probe import probe_notes
from archhpo.report._summary import _count, _f, _fmt, _i
from archhpo.report._truth import below_floor, truth_text
from archhpo.report._units import METRIC, short_unit, value_text

# ----------------------------------------------------------------------------- HTML
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1180px;
color:#222;line-height:1.4;padding:0 1em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em}
th,td{border:1px solid #ccc;padding:.3em .55em;text-align:left;vertical-align:top}
th{background:#f2f2f2} td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1.2em 0} figure img{max-width:100%;border:1px solid #eee} figcaption{color:#555;font-size:.9em}
.law{background:#f7f7fb;border-left:4px solid #6a5acd;padding:.6em 1em} .muted{color:#666}
.first{border:1px solid #ddd;padding:0 1em .3em;margin-bottom:1.5em}
"""


class Markup(str):
    """A cell already written as HTML (an architecture with its differences in bold): not escaped."""


def _cell(c: Any) -> str:
    return c if isinstance(c, Markup) else html.escape(str(c))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f"<td class='n'>{_cell(c)}</td>" if i in numeric else f"<td>{_cell(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _head(experiment: str, frame: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    source = frame.attrs.get("source", "?")
    fams = ", ".join(sorted({str(f) for f in frame["family"].dropna()})) or "unknown"
    return [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(experiment)}: archhpo report</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(experiment)}: architecture search report</h1>",
        f"<p class='muted'>{len(frame):,} trials over {len(summary)} budgets, family {html.escape(fams)}, read from "
        f"the {html.escape(source)}; written {when} by archhpo.</p>",
    ]


def _answer_row(s: pd.Series, best: pd.Series | None, runner: pd.Series | None = None) -> list[Any]:
    base = _fmt(s.get("baseline_val_loss"))
    counts = f"{s['n_complete']}/{s['n_pruned']}/{s['n_failed']}"
    if best is None:
        return [s["budget"], "no finished trial", "–", "–", "–", base, "–", "–", "–", counts]
    trained = (f"lr {_fmt(best['learning_rate'], 3)}, {_count(best['epochs'])} ep, batch {_count(best['batch_size'])}, "
               f"wd {_fmt(best['weight_decay'], 3)}, warm-up {_count(best['warmup_steps'])}")
    other: Any = "–"
    if runner is not None and _f(s["runner_up_val_loss"]) is not None:
        # every key and choice, the ones that are not the winner's in bold
        other = Markup(f"{_fmt(s['runner_up_val_loss'])} (trial {_i(s['runner_up_trial'])}: "
                       f"{arch_html(arch_fields(runner), arch_fields(best))})")
    conf = "–"
    if _f(s["confirm_mean"]) is not None:
        conf = f"{s['confirm_mean']:.4g} ± {_fmt(s['confirm_std'], 3)} ({_i(s['confirm_n'])} seeds)"
    return [s["budget"], f"trial {_i(best['trial'])}: {_arch_text(best)}", _count(best["param_count"]),
            trained, _fmt(best["val_loss"]), base, other, gap_text(s), conf, counts]


def _first_screen(frame: pd.DataFrame, summary: pd.DataFrame, fit: dict[str, Any]) -> list[str]:
    """What a reader sees before scrolling: each budget's winner in one line and the law's status,
    with its interval, or the sentence that replaces the law."""
    picks = best_and_runner_up(frame)
    unit = short_unit(frame)
    items = []
    for _, s in summary.iterrows():
        best = picks.get(s["budget"], (None, None))[0]
        if best is None:
            items.append(f"<li><b>{html.escape(str(s['budget']))}</b>: no finished trial</li>")
            continue
        tie = "; a tie within noise with the runner-up" if s.get("tie_within_noise") is True else ""
        items.append(f"<li><b>{html.escape(str(s['budget']))}</b>: {html.escape(_arch_text(best))} "
                     f"(trial {_i(best['trial'])}, {_count(best['param_count'])} parameters), {METRIC} "
                     f"<b>{_fmt(best['val_loss'])}</b> {html.escape(unit)}{tie}</li>")
    failed = frame.attrs.get("all_failed")  # every trial failed: why comes first
    lead = [f"<p class='failed'><b>No result.</b> {html.escape(failed)}</p>"] if failed else []
    iso = [f"<p class='law isoflop'>{html.escape(line)}</p>" for line in isoflop_lines(fit.get("isoflop_fit") or {})]
    # A compute-optimal study leads with its answer for a compute budget (report/_law.py compute_lead).
    lead += [f"<p class='law compute-optimal'>{'<b>Compute-optimal answer.</b> ' if not i else ''}"
             f"{html.escape(line)}</p>" for i, line in enumerate(compute_lead(fit))]
    return ["<div class='first'><h2>The answer</h2>", *lead, f"<ul>{''.join(items)}</ul>",
            f"<p class='law'><b>Scaling law.</b> {html.escape(law_text(fit))}</p>", *iso, "</div>"]


def _answer_section(frame: pd.DataFrame, summary: pd.DataFrame, fit: dict[str, Any]) -> list[str]:
    picks = best_and_runner_up(frame)
    rows = [_answer_row(s, *picks.get(s["budget"], (None, None))) for _, s in summary.iterrows()]
    parts = ["<h2>The answer, per budget</h2>",
             f"<p class='value'>{html.escape(value_text(frame))}</p>",
             _table(["budget", "best architecture", "parameters", "trained with", f"{METRIC} ({short_unit(frame)})",
                     "trivial baseline", "runner-up (not the winner's in bold)", "gap", "confirmation mean ± std",
                     "complete/pruned/failed"], rows, {2, 4, 5}),
             "<p class='muted'>Trivial baseline: the validation loss of a model that ignores its input (the "
             "training base rate, or the unigram entropy of a language). A gap smaller than the budget's noise "
             "(the spread of repeated runs of one configuration: seeds, or phase-1 repeats) is a tie within "
             "noise, not a win.</p>"]
    metrics = [c for c in summary.columns if c.startswith("val_") and c != "val_loss"]
    if metrics:
        parts.append("<p>Family metrics of each budget's best trial (at its best epoch):</p>")
        parts.append(_table(["budget", *metrics], [[s["budget"], *(_fmt(s[m]) for m in metrics)]
                                                    for _, s in summary.iterrows()], set(range(1, len(metrics) + 1))))
    nd = fit.get("nd_fit") or {}
    if nd.get("n_points"):
        parts.append(f"<p class='law'><b>L(N, D).</b> {html.escape(nd_text(nd))}</p>")  # its answer leads the page
        if truth_text(nd):
            flag = " style='color:#b00020'" if below_floor(nd) else ""
            parts.append(f"<p class='truth'{flag}>L(N, D): {html.escape(truth_text(nd))}</p>")
    if truth_text(fit):
        flag = " style='color:#b00020'" if below_floor(fit) else ""
        parts.append(f"<p class='truth'{flag}>{html.escape(truth_text(fit))}</p>")
    parts += _decisions_section(frame)
    parts += _ladder_section(frame)
    if data_text(frame):
        parts += ["<h3>Data: tokens per parameter and passes</h3>",
                  _table(["budget", "data per parameter", "D (trained to full length)", "passes over the data"],
                         data_rows(frame)), f"<p class='data'>{html.escape(str(data_text(frame)))}</p>"]
    if compute_text(frame):
        parts += [f"<p class='compute'>{html.escape(_sentence(str(compute_text(frame))))}.</p>",
                  _table(["budget", "FLOPs spent", "FLOPs of the full plan", "share"], compute_rows(frame), {1, 2, 3})]
    return parts


def _decisions_section(frame: pd.DataFrame) -> list[str]:
    """The decision-accuracy table of the budget pairs with enough matched shapes, and one line
    naming those left out and why (the line alone when every pair is left out)."""
    accuracy = decision_accuracy(frame)
    if not accuracy:
        return []
    rows, dropped = decision_rows(accuracy), decision_left_out(accuracy)
    parts = ["<h3>Decision accuracy: does a smaller budget's ranking hold at a larger one?</h3>"]
    if rows:
        parts += [_table(["budgets", "matched shapes", "rankings that agree [95% interval]"], rows),
                  "<p class='muted'>A shape is a number of layers and heads (and a choice) found at both budgets; "
                  "a pair of shapes agrees when the same one has the lower mean loss at both (DataDecide's "
                  "measure). High agreement is the evidence for planning larger budgets from smaller ones "
                  "(--ladder); 50% is chance.</p>"]
    if dropped:
        parts.append(f"<p class='decisions-left-out'>{html.escape(dropped)}</p>")
    return parts


def _ladder_section(frame: pd.DataFrame) -> list[str]:
    """What each ladder budget carried up, and what each one's learning-rate probe found (--lr-probe)."""
    parts = []
    if frame.attrs.get("ladder"):
        parts += ["<h3>Ladder: what each budget carried up</h3>",
                  _table(["budget", "carried up"], [[b, text] for b, text in frame.attrs["ladder"].items()])]
    if probes := probe_notes(frame):
        parts += ["<h3>Learning-rate probe: the best architecture at other rates</h3>",
                  _table(["budget", "mean loss per factor of its rate"], [[b, text] for b, text in probes.items()])]
    return parts


def _sentence(text: str) -> str:
    """`text` with its first letter capitalised and the rest as it was (FLOPs stays FLOPs)."""
    return text[:1].upper() + text[1:]


def _figures_section(images: dict[str, bytes], omitted: dict[str, str] | None = None,
                     fit: dict[str, Any] | None = None) -> list[str]:
    """The figures drawn, each captioned with what it draws (of the law: `fit`), then one line per
    figure left out (nothing to compare, or no fit to draw), with why."""
    from archhpo.report import _figures

    parts = ["<h2>Figures</h2>"]
    for name in _figures.FIGURES:
        if name not in images:
            continue
        caption = _figures.caption(name, fit)
        data = base64.b64encode(images[name]).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(caption)} ({html.escape(name)}.png / .pdf)</figcaption></figure>")
    if omitted:
        parts.append("<p>Left out:</p><ul class='omitted'>" + "".join(
            f"<li>{html.escape(name)}: {html.escape(why)}.</li>" for name, why in omitted.items()) + "</ul>")
    return parts


def _files_section(files: Sequence[str], missing: str = "", experiment: str = "") -> list[str]:
    """The files as links relative to the page (written beside it, or where the CSV and the best
    JSONs were found); a trials CSV, which holds every experiment exported into its folder, says
    which of its rows are this page's; `missing` says where those are when they were not found."""
    from archhpo.report._export import RESULTS_CSV

    def rows(f: str) -> str:
        shared = os.path.basename(f) == RESULTS_CSV
        return f" (this experiment's rows: experiment = {html.escape(experiment)})" if shared else ""

    links = "".join(f"<li><a href='{html.escape(urllib.parse.quote(f), quote=True)}'>{html.escape(f)}</a>"
                    f"{rows(f)}</li>" for f in files)
    note = f"<p class='muted'>{html.escape(missing)}</p>" if missing else ""
    return [f"<h2>Files</h2><ul>{links}</ul>{note}"]


def render_html(experiment: str, frame: pd.DataFrame, summary: pd.DataFrame, fit: dict[str, Any],
                confirm: dict[str, dict[str, Any]], choices: pd.DataFrame, images: dict[str, bytes],
                files: Sequence[str], omitted: dict[str, str] | None = None, missing: str = "") -> str:
    """The report page: head, the answer and the law's status (the first screen), the answer
    table (with baseline and noise), the confirmation and paired-choice tables, the figures (and
    those `omitted`, with why) and the linked file list."""
    parts = [*_head(experiment, frame, summary), *_first_screen(frame, summary, fit),
             *_answer_section(frame, summary, fit), *confirmation_html(confirm), *choices_html(choices),
             *_figures_section(images, omitted, fit), *_files_section(files, missing, experiment), "</body></html>\n"]
    return "\n".join(parts)


def confirmation_html(confirm: dict[str, dict[str, Any]]) -> list[str]:
    """Per budget: each confirmed architecture's mean ± std over its seeds, rank 0 against rank 1
    seed by seed with the number of complete pairs, and the confirmation's statement."""
    if not confirm:
        return []
    parts = ["<h2>Confirmation (phase 3: the best architectures retrained with new seeds)</h2>"]
    for budget, c in confirm.items():
        arows = []
        top = _confirmed_fields(c["architectures"][0]) if c["architectures"] else None
        for a in c["architectures"]:
            label = Markup(arch_html(_confirmed_fields(a), top if a["rank"] != 0 else None))
            arows.append([a["rank"], label, _fmt(a.get("selection_value")), _fmt(a["mean"]), _fmt(a["std"], 3),
                          f"{a['n']} of {len(c['seeds'])}"])
        parts.append(f"<h3>{html.escape(budget)}</h3>")
        parts.append(_table(["rank", "architecture (not rank 0's in bold)", "selection loss", "mean", "std", "seeds"], arows, {0, 2, 3, 4}))
        comp = c.get("comparison")
        if comp:
            by_rank = {a["rank"]: a["values"] for a in c["architectures"]}
            prow = [[s, _fmt(by_rank[0][str(s)]), _fmt(by_rank[1][str(s)]), f"{d:+.4f}"]
                    for s, d in zip(comp["seeds"], comp["differences"], strict=True)]
            parts.append(f"<p>Rank 0 against rank 1, seed by seed: {comp['n_pairs']} complete pairs of "
                         f"{len(c['seeds'])} seeds.</p>")
            parts.append(_table(["seed", "rank 0 loss", "rank 1 loss", "rank 1 − rank 0"], prow, {0, 1, 2, 3}))
        parts.append(f"<p>{html.escape(c['statement'])}</p>")
        parts += baselines_html(c.get("baselines") or [], len(c["seeds"]), top)
    return parts


def _confirmed_fields(a: dict[str, Any]) -> dict[str, Any]:
    """Every key and choice of a confirmation or baseline entry ({"architecture", "choices"})."""
    return arch_fields(a.get("architecture") or {}, a.get("choices") or {})


def baselines_html(baselines: list[dict[str, Any]], n_seeds: int, winner: dict[str, Any] | None = None) -> list[str]:
    """The --baselines table of one budget: each rule's shape, its mean over the confirmation seeds and
    its paired difference from the searched best (rank 0) with the 95% interval, and the verdicts."""
    if not baselines:
        return []
    rows = []
    for b in baselines:
        d = b["difference"]
        ci = d["ci95"]
        diff = "" if d["mean"] is None else f"{d['mean']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")
        rows.append([b["rule"], b["rule_text"], Markup(arch_html(_confirmed_fields(b), winner)), _fmt(b["mean"]),
                     _fmt(b["std"], 3), f"{b['n']} of {n_seeds}", diff])
    parts = ["<p>Rule-of-thumb baselines: the shape each rule picks from this budget's grid, trained with the "
             "confirmation seeds and the best's training parameters; the difference is the rule's loss minus "
             "the searched best's, seed by seed.</p>",
             _table(["rule", "what it picks", "architecture", "mean", "std", "seeds", "rule − best [95% interval]"],
                    rows, {3, 4})]
    parts.append("<ul>" + "".join(f"<li>{html.escape(b['statement'])}</li>" for b in baselines) + "</ul>")
    return parts


def choices_html(choices: pd.DataFrame) -> list[str]:
    """The paired-choice table per budget; every difference names its number of pairs."""
    if choices.empty:
        return []
    parts = ["<h2>Categorical choices over paired seeds</h2>",
             "<p>Per choice, the best validation loss of each seed; the difference is paired seed by seed "
             f"against the reference, with a bootstrap 95% interval over seeds from {MIN_PAIRS} pairs on.</p>"]
    for budget, group in choices.groupby("budget", sort=False):
        ref = group["reference"].iloc[0]
        crow = []
        for _, r in group.iterrows():
            crow.append([r["choice"], f"{r['mean']:.4f} ± {_fmt(r['std'], 3)}", r["n_seeds"],
                         _fmt(r["best_epoch"], 3), _count(r["param_count"]), _diff_text(r, ref), r["n_pairs"]])
        parts.append(f"<h3>{html.escape(str(budget))}</h3>")
        parts.append(_table(["choice", "mean ± std", "seeds", "best epoch", "params", f"Δ vs {ref} [95% CI]",
                             "pairs"], crow, {2, 3, 4, 6}))
    return parts


__all__ = [
    "baselines_html",
    "choices_html",
    "confirmation_html",
    "render_html",
]
