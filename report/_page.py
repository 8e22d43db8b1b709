"""`archhpo report`: the answer per budget, the scaling-law fit, figures and tables, in one place.

`write_report` reads an experiment (database or CSV files, via `trials_frame`) and writes into
the output directory:

- ``{experiment}_report.html``: one self-contained page (figures embedded as base64 PNG,
  nothing fetched from the network): per budget the best architecture and how it was trained,
  its loss, the runner-up (the best trial of another architecture) and the gap, the
  confirmation result when one was run, the fitted law; the paired-choice table of a study with
  categorical choices and paired seeds; then the figures.
- ``{experiment}_figures/{name}.png`` and ``.pdf`` (see `archhpo.report._figures.FIGURES`).
- ``{experiment}_scaling_fit.json`` (see `archhpo.report._fit`; with ``entropy_rate`` and ``loss_floor``
  when the data knows them, see `archhpo.report._truth`).
- ``{experiment}_summary.csv``: one row per budget (`SUMMARY_COLUMNS` first).
- ``{experiment}_choices.md`` and ``.csv`` when the experiment has categorical choices crossed
  with paired seeds: per choice mean ± std over seeds, best epoch, parameter count and the
  paired difference against a reference choice with its number of pairs and a bootstrap 95%
  interval over seeds (none from fewer than 3 pairs).

Read from a database, each budget's answer is also saved as the study's note in
optuna-dashboard, so the dashboard opens on it.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import html
import io
import json
import math
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from archhpo._io import atomic_write
from archhpo.errors import StudyError
from archhpo.report._answer import compute_answer, nd_fit
from archhpo.report._compute import compute_rows, compute_text, data_rows, data_text
from archhpo.report._confirm import MIN_PAIRS, confirmation_summary
from archhpo.report._decisions import decision_accuracy, decision_rows
from archhpo.report._fit import fit_json, fit_scaling_law
from archhpo.report._frame import best_and_runner_up, budgets_in, load_curves, ranked, trials_frame
from archhpo.report._law import fit_line, law_text, nd_text
from archhpo.report._truth import below_floor, truth_text
from archhpo.schema import ARCH_KEYS, ARCH_RECORD, TRAINING_PARAMS

SUMMARY_COLUMNS = (
    "budget", "best_trial", *ARCH_RECORD, "val_loss",
    "runner_up_val_loss", "n_complete", "n_pruned", "n_failed", "confirm_mean", "confirm_std",
)
SUMMARY_EXTRA = (
    "gap", "runner_up_trial", *(f"runner_up_{k}" for k in ARCH_RECORD), "choice", *TRAINING_PARAMS,
    "best_epoch", "train_flops", "confirm_n", "confirm_lead", "confirm_lead_ci95_lo", "confirm_lead_ci95_hi",
    "confirm_within_noise", "baseline_val_loss", "noise_std", "noise_source", "tie_within_noise",
)
CHOICE_COLUMNS = (
    "budget", "choice", "n_seeds", "mean", "std", "best_epoch", "param_count", "reference", "n_pairs",
    "diff_mean", "diff_ci95_lo", "diff_ci95_hi",
)
ARCH = ARCH_KEYS
CURVES_SHOWN = 5  # validation curves drawn per budget (the best trials)
_INT_COLUMNS = (
    "best_trial", *ARCH, "param_count", "n_complete", "n_pruned", "n_failed", "runner_up_trial",
    *(f"runner_up_{k}" for k in (*ARCH, "param_count")), "epochs", "batch_size", "warmup_steps", "best_epoch",
    "train_flops", "confirm_n",
)


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


# ----------------------------------------------------------------------------- numbers
def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _i(x: Any) -> int | None:
    v = _f(x)
    return int(v) if v is not None else None


def _fmt(x: Any, digits: int = 4) -> str:
    v = _f(x)
    return "–" if v is None else f"{v:.{digits}g}"


def _count(x: Any) -> str:
    v = _i(x)
    return "–" if v is None else f"{v:,}"


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of the mean of `values` over resamples (with replacement)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


# ----------------------------------------------------------------------------- confirmation
def confirmation(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per budget with phase-3 trials: `archhpo.report._confirm.confirmation_summary` of them."""
    out: dict[str, dict[str, Any]] = {}
    if not (frame["phase"] == 3).any():
        return out
    cols = [*ARCH, "param_count", "trial", "state", "phase", "seed", "val_loss", "choices", "best_epoch", "fail_reason",
            "baseline"]
    for budget, group in frame.groupby("budget", sort=False):
        if not (group["phase"] == 3).any():
            continue
        rows = group[cols].assign(rank=group["confirm_rank"]).to_dict("records")
        out[str(budget)] = confirmation_summary(rows)
    return out


# ----------------------------------------------------------------------------- summary
def _failed(group: pd.DataFrame) -> int:
    fails = group[group["state"] == "FAIL"]
    if "fail_reason" in fails and fails["fail_reason"].notna().any():
        return int(fails["fail_reason"].notna().sum())  # a trial lost with its worker is retried, not final
    return len(fails)


def budget_noise(group: pd.DataFrame) -> tuple[float | None, str]:
    """The measured noise of one budget: the pooled standard deviation (n-1) of the validation
    loss over every configuration (architecture, choices and training parameters) that ran more
    than once: seeds, confirmation retrains, repeated phase-1 runs.  (None, "") when none did."""
    from archhpo.report._frame import TRAINING_COLUMNS

    ok = group[(group["state"] == "COMPLETE") & group["val_loss"].notna()]
    runs = ok.groupby([*ARCH, "choice", *TRAINING_COLUMNS], dropna=False)
    n, var = runs["val_loss"].count(), runs["val_loss"].var(ddof=1)
    rep = n >= 2
    if not rep.any():
        return None, ""
    pooled = math.sqrt(float(((n[rep] - 1) * var[rep]).sum() / (n[rep] - 1).sum()))
    seeded = bool((runs["seed"].nunique() > 1)[rep].any())
    kind = "seed spread" if seeded else "spread of repeated runs"
    n_conf = int(rep.sum())
    return pooled, f"{kind}: {n_conf} configuration{'s' if n_conf > 1 else ''} run {int(n[rep].sum())} times"


def _noise_columns(group: pd.DataFrame, row: dict[str, Any]) -> dict[str, Any]:
    noise, source = budget_noise(group)
    base = group["baseline_val_loss"].dropna()
    gap = _f(row.get("gap"))
    return {"noise_std": noise, "noise_source": source or None,
            "tie_within_noise": (gap < noise) if noise is not None and gap is not None else None,
            "baseline_val_loss": float(base.median()) if len(base) else None}


def budget_summary(frame: pd.DataFrame, confirm: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per budget (`SUMMARY_COLUMNS`, then `SUMMARY_EXTRA` and the best trial's family
    metrics); budgets without a finished trial keep empty cells."""
    confirm = confirmation(frame) if confirm is None else confirm
    metrics = [c for c in frame.columns if c.startswith("val_") and c not in ("val_loss", "val_curve")]
    picks = best_and_runner_up(frame)
    rows = []
    for budget in budgets_in(frame):
        group = frame[frame["budget"] == budget]
        best, runner = picks.get(budget, (None, None))
        row: dict[str, Any] = {
            "budget": budget,
            "n_complete": int((group["state"] == "COMPLETE").sum()),
            "n_pruned": int((group["state"] == "PRUNED").sum()),
            "n_failed": _failed(group),
        }
        if best is not None:
            row.update(best_trial=_i(best["trial"]), **{k: _i(best[k]) for k in (*ARCH, "param_count")},
                       val_loss=_f(best["val_loss"]), choice=best["choice"],
                       **{k: best[k] for k in (*TRAINING_PARAMS, "best_epoch", "train_flops")},
                       **{m: best[m] for m in metrics})
        if runner is not None:
            row.update(runner_up_val_loss=_f(runner["val_loss"]), runner_up_trial=_i(runner["trial"]),
                       **{f"runner_up_{k}": _i(runner[k]) for k in (*ARCH, "param_count")})
            row["gap"] = row["runner_up_val_loss"] - row["val_loss"]
        row.update(_noise_columns(group, row))
        c = confirm.get(budget)
        if c and c["architectures"]:
            top = c["architectures"][0]
            row.update(confirm_mean=top["mean"], confirm_std=top["std"], confirm_n=top["n"])
            comp = c.get("comparison")
            if comp:
                ci = comp.get("ci95") or [None, None]
                row.update(confirm_lead=comp["lead"], confirm_lead_ci95_lo=ci[0], confirm_lead_ci95_hi=ci[1],
                           confirm_within_noise=comp["within_noise"])
        rows.append(row)
    columns = [*SUMMARY_COLUMNS, *SUMMARY_EXTRA, *metrics]
    table = pd.DataFrame(rows, columns=columns)
    for col in _INT_COLUMNS:  # whole numbers stay whole in the CSV although some budgets lack them
        table[col] = pd.to_numeric(table[col], errors="coerce").round().astype("Int64")
    return table


# ----------------------------------------------------------------------------- paired choices
def _choice_order(frame: pd.DataFrame, labels: list[str]) -> list[str]:
    order = frame.attrs.get("choice_order") or {}
    if len(order) == 1:
        listed = [str(v) for v in next(iter(order.values()))]
        return sorted(labels, key=lambda v: listed.index(v) if v in listed else len(listed))
    return labels  # several choice dimensions: first appearance


def choice_table(frame: pd.DataFrame, reference: str | None = None, n_boot: int = 2000,
                 seed: int = 0) -> pd.DataFrame:
    """The paired-choice table (like the encoder audit's Table 1) for budgets whose trials
    carry categorical choices crossed with paired seeds.

    Per budget and choice: over seeds, the value of a seed is the best COMPLETE validation loss
    of that choice's trials with that seed (confirmation retrains left out); ``mean``, ``std``
    (n-1), ``best_epoch`` (mean over seeds of the selected trials' best epoch), ``param_count``
    (median), and the paired difference ``choice - reference`` over the ``n_pairs`` seeds both
    have, with a percentile bootstrap 95% interval over seeds (`n_boot` resamples) when there are
    MIN_PAIRS pairs or more.  The reference is
    `reference` (a choice label) or the first choice listed at launch.  Empty when no budget
    has two or more choices with seeds.
    """
    ok = (frame["state"] == "COMPLETE") & frame["val_loss"].notna() & frame["seed"].notna()
    ok &= frame["phase"].ne(3) | frame["phase"].isna()
    df = frame[ok & (frame["choice"] != "")]
    rows: list[dict[str, Any]] = []
    # Every planned choice, finished or not: a reference whose seeds are still running is valid.
    all_labels = set(frame.loc[frame["choice"] != "", "choice"])
    for budget, group in df.groupby("budget", sort=False):
        labels = _choice_order(frame, list(dict.fromkeys(group.sort_values("trial")["choice"])))
        if len(labels) < 2:
            continue
        per: dict[str, pd.DataFrame] = {}
        for label in labels:
            sub = group[group["choice"] == label].sort_values(["val_loss", "trial"], kind="stable")
            per[label] = sub.drop_duplicates("seed").set_index("seed")
        ref = reference if reference is not None else labels[0]
        rows += [_choice_row(budget, label, per, ref, n_boot, seed) for label in labels]
    if reference is not None and all_labels and reference not in all_labels:
        raise StudyError(f"--reference {reference!r} is not one of the choices ({', '.join(sorted(all_labels))}); "
                         "pick one of them.")
    return pd.DataFrame(rows, columns=list(CHOICE_COLUMNS))


def _choice_row(budget: Any, label: str, per: dict[str, pd.DataFrame], ref: str, n_boot: int,
                seed: int) -> dict[str, Any]:
    """One choice's row: its seeds' mean and std, and its paired difference from the reference."""
    # A study still running may have no finished reference seed yet: its rows are shown, with
    # no pairs, rather than the budget left out.
    base = per[ref]["val_loss"] if ref in per else pd.Series(dtype=float)
    sel = per[label]
    vals = sel["val_loss"]
    common = vals.index.intersection(base.index)
    diffs = (vals.loc[common] - base.loc[common]).to_numpy()
    # No interval from fewer than MIN_PAIRS pairs: a bootstrap of two values is two points.
    lo, hi = (bootstrap_ci(diffs, n_boot, seed) if label != ref and len(diffs) >= MIN_PAIRS
              else (math.nan, math.nan))
    epochs = sel["best_epoch"].dropna()
    return {
        "budget": budget, "choice": label, "n_seeds": len(vals), "mean": float(vals.mean()),
        "std": float(vals.std(ddof=1)) if len(vals) > 1 else math.nan,
        "best_epoch": float(epochs.mean()) if len(epochs) else math.nan,
        "param_count": float(sel["param_count"].median()), "reference": ref, "n_pairs": len(common),
        "diff_mean": float(diffs.mean()) if len(diffs) and label != ref else (0.0 if label == ref else math.nan),
        "diff_ci95_lo": lo, "diff_ci95_hi": hi,
    }


def _diff_text(r: pd.Series, ref: str) -> str:
    """A choice's paired difference against the reference: "+0.0123 [-0.0010, +0.0250]", or the
    bare mean where fewer than MIN_PAIRS pairs give no interval, "–" where no seed is shared."""
    if r["choice"] == ref:
        return "reference"
    if _f(r["diff_mean"]) is None:
        return "–"
    if _f(r["diff_ci95_lo"]) is None:
        return f"{r['diff_mean']:+.4f}"
    return f"{r['diff_mean']:+.4f} [{r['diff_ci95_lo']:+.4f}, {r['diff_ci95_hi']:+.4f}]"


def choice_markdown(table: pd.DataFrame, metric: str = "val_loss") -> str:
    """The paired-choice table as Markdown, one section per budget."""
    out = []
    for budget, group in table.groupby("budget", sort=False):
        ref = group["reference"].iloc[0]
        out.append(f"### {budget}\n")
        out.append(f"| choice | {metric} mean ± std (seeds) | best epoch | params | Δ vs {ref} [95% CI] (pairs) |")
        out.append("|---|---|---|---|---|")
        for _, r in group.iterrows():
            std = f" ± {r['std']:.4f}" if _f(r["std"]) is not None else ""
            diff = _diff_text(r, ref)
            diff += f" ({r['n_pairs']})" if diff != "reference" else ""
            out.append(f"| {r['choice']} | {r['mean']:.4f}{std} ({r['n_seeds']}) | {_fmt(r['best_epoch'], 3)} | "
                       f"{_count(r['param_count'])} | {diff} |")
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- text pieces
def _arch_text(row: Any) -> str:
    text = f"d_model {_i(row['d_model'])}, {_i(row['n_layers'])} layers, {_i(row['n_heads'])} heads, d_ff {_i(row['d_ff'])}"
    choice = row.get("choice") if hasattr(row, "get") else None
    return f"{text} ({choice})" if choice else text


def budget_note(budget: str, srow: pd.Series, best: pd.Series | None, confirm: dict[str, Any] | None,
                fit: dict[str, Any]) -> str:
    """The Markdown answer of one budget (the optuna-dashboard study note)."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Answer for budget {budget} (archhpo report, {when})", ""]
    if best is None:
        lines.append(f"No finished trial: {_count(srow['n_failed'])} failed, {_count(srow['n_pruned'])} pruned.")
    else:
        lines.append(f"**Best:** trial {_i(best['trial'])}: {_arch_text(best)}, {_count(best['param_count'])} "
                     f"parameters, validation loss **{_fmt(best['val_loss'])}**; trained with learning rate "
                     f"{_fmt(best['learning_rate'], 3)}, {_i(best['epochs'])} epochs, batch {_i(best['batch_size'])}, "
                     f"weight decay {_fmt(best['weight_decay'], 3)}, warm-up {_i(best['warmup_steps'])} steps.")
        if _f(srow.get("runner_up_val_loss")) is not None:
            lines.append("")
            lines.append(f"**Runner-up:** trial {_i(srow['runner_up_trial'])} (d_model {_i(srow['runner_up_d_model'])}, "
                         f"{_i(srow['runner_up_n_layers'])} layers), loss {_fmt(srow['runner_up_val_loss'])}; "
                         f"gap {gap_text(srow)}.")
        if _f(srow.get("baseline_val_loss")) is not None:
            lines += ["", f"**Trivial baseline:** loss {_fmt(srow['baseline_val_loss'])} (a model that ignores "
                          "its input)."]
    if confirm:
        lines += ["", f"**Confirmation:** {confirm['statement']}"]
    lines += ["", f"**Scaling law:** {law_text(fit)}", "",
              f"Trials: {_count(srow['n_complete'])} complete, {_count(srow['n_pruned'])} pruned, "
              f"{_count(srow['n_failed'])} failed."]
    return "\n".join(lines)


def save_dashboard_notes(storage: Any, studies: dict[str, str], notes: dict[str, str]) -> int:
    """Write each budget's answer as its study's optuna-dashboard note; returns how many."""
    import warnings

    from optuna_dashboard import save_note

    from archhpo.search._study import load_study

    n = 0
    for budget, name in studies.items():
        if budget not in notes:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            save_note(load_study(storage, name), notes[budget])
        n += 1
    return n


# ----------------------------------------------------------------------------- HTML
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1180px;
color:#222;line-height:1.4;padding:0 1em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em}
th,td{border:1px solid #ccc;padding:.3em .55em;text-align:left;vertical-align:top}
th{background:#f2f2f2} td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1.2em 0} figure img{max-width:100%;border:1px solid #eee} figcaption{color:#555;font-size:.9em}
.law{background:#f7f7fb;border-left:4px solid #6a5acd;padding:.6em 1em} .muted{color:#666}
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f"<td class='n'>{html.escape(str(c))}</td>" if i in numeric else f"<td>{html.escape(str(c))}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _png_data(fig: Any, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


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


def gap_text(s: pd.Series) -> str:
    """The winner's lead over the runner-up, flagged as a tie when it is smaller than the
    measured noise of the budget (`budget_noise`)."""
    if _f(s.get("gap")) is None or not s["val_loss"]:
        return "–"
    text = f"{s['gap']:.4g} ({s['gap'] / s['val_loss']:+.2%})"
    if s.get("tie_within_noise") is True:
        text += f"; tie within noise (noise {_fmt(s['noise_std'], 2)}, {s['noise_source']})"
    elif _f(s.get("noise_std")) is not None:
        text += f"; noise {_fmt(s['noise_std'], 2)} ({s['noise_source']})"
    else:
        text += "; noise not measured (no repeated run: --paired-seeds or --confirm measure it)"
    return text


def _answer_row(s: pd.Series, best: pd.Series | None) -> list[Any]:
    base = _fmt(s.get("baseline_val_loss"))
    counts = f"{s['n_complete']}/{s['n_pruned']}/{s['n_failed']}"
    if best is None:
        return [s["budget"], "no finished trial", "–", "–", "–", base, "–", "–", "–", counts]
    trained = (f"lr {_fmt(best['learning_rate'], 3)}, {_count(best['epochs'])} ep, batch {_count(best['batch_size'])}, "
               f"wd {_fmt(best['weight_decay'], 3)}, warm-up {_count(best['warmup_steps'])}")
    runner = (f"{_fmt(s['runner_up_val_loss'])} (trial {_i(s['runner_up_trial'])}: d_model "
              f"{_i(s['runner_up_d_model'])}, {_i(s['runner_up_n_layers'])} layers)"
              if _f(s["runner_up_val_loss"]) is not None else "–")
    conf = "–"
    if _f(s["confirm_mean"]) is not None:
        conf = f"{s['confirm_mean']:.4g} ± {_fmt(s['confirm_std'], 3)} ({_i(s['confirm_n'])} seeds)"
    return [s["budget"], f"trial {_i(best['trial'])}: {_arch_text(best)}", _count(best["param_count"]),
            trained, _fmt(best["val_loss"]), base, runner, gap_text(s), conf, counts]


def _answer_section(frame: pd.DataFrame, summary: pd.DataFrame, fit: dict[str, Any]) -> list[str]:
    picks = best_and_runner_up(frame)
    rows = [_answer_row(s, picks.get(s["budget"], (None, None))[0]) for _, s in summary.iterrows()]
    parts = ["<h2>The answer, per budget</h2>",
             _table(["budget", "best architecture", "parameters", "trained with", "val loss", "trivial baseline",
                     "runner-up", "gap", "confirmation mean ± std", "complete/pruned/failed"], rows, {2, 4, 5}),
             "<p class='muted'>Trivial baseline: the validation loss of a model that ignores its input (the "
             "training base rate, or the unigram entropy of a language). A gap smaller than the budget's noise "
             "(the spread of repeated runs of one configuration: seeds, or phase-1 repeats) is a tie within "
             "noise, not a win.</p>"]
    metrics = [c for c in summary.columns if c.startswith("val_") and c != "val_loss"]
    if metrics:
        parts.append("<p>Family metrics of each budget's best trial (at its best epoch):</p>")
        parts.append(_table(["budget", *metrics], [[s["budget"], *(_fmt(s[m]) for m in metrics)]
                                                    for _, s in summary.iterrows()], set(range(1, len(metrics) + 1))))
    parts.append(f"<p class='law'><b>Scaling law.</b> {html.escape(law_text(fit))}</p>")
    nd = fit.get("nd_fit") or {}
    if nd.get("n_points"):
        parts.append(f"<p class='law'><b>L(N, D).</b> {html.escape(nd_text(nd))}</p>")
        answer = (nd.get("compute_optimal") or {}).get("sentence")
        if answer:
            parts.append(f"<p class='law'><b>Compute-optimal answer.</b> {html.escape(answer)}</p>")
        if truth_text(nd):
            flag = " style='color:#b00020'" if below_floor(nd) else ""
            parts.append(f"<p class='truth'{flag}>L(N, D): {html.escape(truth_text(nd))}</p>")
    if truth_text(fit):
        flag = " style='color:#b00020'" if below_floor(fit) else ""
        parts.append(f"<p class='truth'{flag}>{html.escape(truth_text(fit))}</p>")
    accuracy = decision_accuracy(frame)
    if accuracy:
        parts += ["<h3>Decision accuracy: does a smaller budget's ranking hold at a larger one?</h3>",
                  _table(["budgets", "matched shapes", "rankings that agree [95% interval]"], decision_rows(accuracy)),
                  "<p class='muted'>A shape is a number of layers and heads (and a choice) found at both budgets; "
                  "a pair of shapes agrees when the same one has the lower mean loss at both (DataDecide's "
                  "measure). High agreement is the evidence for planning larger budgets from smaller ones "
                  "(--ladder); 50% is chance.</p>"]
    if frame.attrs.get("ladder"):
        parts += ["<h3>Ladder: what each budget carried up</h3>",
                  _table(["budget", "carried up"], [[b, text] for b, text in frame.attrs["ladder"].items()])]
    if data_text(frame):
        parts += ["<h3>Data: tokens per parameter and passes</h3>",
                  _table(["budget", "data per parameter", "D (trained to full length)", "passes over the data"],
                         data_rows(frame)), f"<p class='data'>{html.escape(str(data_text(frame)))}</p>"]
    if compute_text(frame):
        parts += [f"<p class='compute'>{html.escape(_sentence(str(compute_text(frame))))}.</p>",
                  _table(["budget", "FLOPs spent", "FLOPs of the full plan", "share"], compute_rows(frame), {1, 2, 3})]
    return parts


def _sentence(text: str) -> str:
    """`text` with its first letter capitalised and the rest as it was (FLOPs stays FLOPs)."""
    return text[:1].upper() + text[1:]


def ladder_notes(storage: Any, studies: dict[str, str]) -> dict[str, str]:
    """Per ladder budget (--ladder), what it carried up from the smaller one (search/_ladder.py)."""
    from archhpo.search._ladder import describe
    from archhpo.search._study import LADDER_KEY

    out = {}
    for budget, name in studies.items():
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
        if attrs.get(LADDER_KEY):
            out[budget] = describe(attrs[LADDER_KEY])
    return out


def _figures_section(images: dict[str, bytes]) -> list[str]:
    from archhpo.report._figures import FIGURES

    parts = ["<h2>Figures</h2>"]
    for name, caption in FIGURES.items():
        if name not in images:
            continue
        data = base64.b64encode(images[name]).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(caption)} ({html.escape(name)}.png / .pdf)</figcaption></figure>")
    return parts


def _files_section(files: Sequence[str]) -> list[str]:
    """The written files as links relative to the page (they sit beside it)."""
    links = "".join(f"<li><a href='{html.escape(urllib.parse.quote(f), quote=True)}'>{html.escape(f)}</a></li>"
                    for f in files)
    return [f"<h2>Files</h2><ul>{links}</ul>"]


def render_html(experiment: str, frame: pd.DataFrame, summary: pd.DataFrame, fit: dict[str, Any],
                confirm: dict[str, dict[str, Any]], choices: pd.DataFrame, images: dict[str, bytes],
                files: Sequence[str]) -> str:
    """The report page: head, the answer table (with baseline and noise), the law, the
    confirmation and paired-choice tables, the figures and the linked file list."""
    parts = [*_head(experiment, frame, summary), *_answer_section(frame, summary, fit),
             *confirmation_html(confirm), *choices_html(choices), *_figures_section(images),
             *_files_section(files), "</body></html>\n"]
    return "\n".join(parts)


def confirmation_html(confirm: dict[str, dict[str, Any]]) -> list[str]:
    """Per budget: each confirmed architecture's mean ± std over its seeds, rank 0 against rank 1
    seed by seed with the number of complete pairs, and the confirmation's statement."""
    if not confirm:
        return []
    parts = ["<h2>Confirmation (phase 3: the best architectures retrained with new seeds)</h2>"]
    for budget, c in confirm.items():
        arows = []
        for a in c["architectures"]:
            arch = a["architecture"]
            label = f"d_model {arch.get('d_model')}, {arch.get('n_layers')} layers, {arch.get('n_heads')} heads"
            arows.append([a["rank"], label, _fmt(a.get("selection_value")), _fmt(a["mean"]), _fmt(a["std"], 3),
                          f"{a['n']} of {len(c['seeds'])}"])
        parts.append(f"<h3>{html.escape(budget)}</h3>")
        parts.append(_table(["rank", "architecture", "selection loss", "mean", "std", "seeds"], arows, {0, 2, 3, 4}))
        comp = c.get("comparison")
        if comp:
            by_rank = {a["rank"]: a["values"] for a in c["architectures"]}
            prow = [[s, _fmt(by_rank[0][str(s)]), _fmt(by_rank[1][str(s)]), f"{d:+.4f}"]
                    for s, d in zip(comp["seeds"], comp["differences"], strict=True)]
            parts.append(f"<p>Rank 0 against rank 1, seed by seed: {comp['n_pairs']} complete pairs of "
                         f"{len(c['seeds'])} seeds.</p>")
            parts.append(_table(["seed", "rank 0 loss", "rank 1 loss", "rank 1 − rank 0"], prow, {0, 1, 2, 3}))
        parts.append(f"<p>{html.escape(c['statement'])}</p>")
        parts += baselines_html(c.get("baselines") or [], len(c["seeds"]))
    return parts


def _arch_label(arch: dict[str, Any]) -> str:
    return f"d_model {arch.get('d_model')}, {arch.get('n_layers')} layers, {arch.get('n_heads')} heads"


def baselines_html(baselines: list[dict[str, Any]], n_seeds: int) -> list[str]:
    """The --baselines table of one budget: each rule's shape, its mean over the confirmation seeds and
    its paired difference from the searched best (rank 0) with the 95% interval, and the verdicts."""
    if not baselines:
        return []
    rows = []
    for b in baselines:
        d = b["difference"]
        ci = d["ci95"]
        diff = "" if d["mean"] is None else f"{d['mean']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")
        rows.append([b["rule"], b["rule_text"], _arch_label(b["architecture"]), _fmt(b["mean"]),
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


# ----------------------------------------------------------------------------- writing
def _csv_text(df: pd.DataFrame) -> str:
    buf = io.StringIO()
    df.to_csv(buf, index=False, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    return buf.getvalue()


def report_frame(frame: pd.DataFrame, out: str | Path = "results", experiment: str | None = None,
                 reference: str | None = None, n_boot: int = 1000, storage: Any = None,
                 png_dpi: int = 110, compute: float | None = None) -> Report:
    """Write every report file for a `trials_frame` frame into `out` (see the module docstring);
    with `storage` (the frame's database) also the dashboard notes."""
    experiment = experiment or frame.attrs.get("experiment") or "experiment"
    out = Path(out)
    fig_dir = out / f"{experiment}_figures"
    confirm = confirmation(frame)
    summary = budget_summary(frame, confirm)
    fit = fit_scaling_law(frame, n_boot=n_boot)
    fit.update(frame.attrs.get("truth") or {})  # a synthetic language's exact entropy rate, beside E
    nd = nd_fit(frame, n_boot)
    nd.update(frame.attrs.get("truth") or {})
    nd["compute_optimal"] = compute_answer(frame, nd, compute)
    fit["nd_fit"] = nd  # its bootstrap samples stay in memory (figures); fit_json drops them
    choices = choice_table(frame, reference)
    files: list[Path] = []

    images = _write_figures(frame, fit, fig_dir, png_dpi, files)
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
    atomic_write(html_path, render_html(experiment, frame, summary, fit, confirm, choices, images, shown))
    report = Report(html=html_path, files=[html_path, *files], fit=fit, summary=summary,
                    compute=compute_text(frame),
                    baselines=[f"{budget}: {b['statement']}" for budget, c in confirm.items()
                               for b in c.get("baselines") or []])
    if storage is not None and frame.attrs.get("studies"):
        report.notes_written = _write_notes(storage, frame, summary, confirm, fit)
    return report


def _write_figures(frame: pd.DataFrame, fit: dict[str, Any], fig_dir: Path, png_dpi: int,
                   files: list[Path]) -> dict[str, bytes]:
    """Every figure as PNG and PDF (appended to `files`); returns the PNGs the page embeds."""
    from archhpo.report._figures import make_figures

    images: dict[str, bytes] = {}
    for name, fig in make_figures(frame, fit).items():
        png = _png_data(fig, png_dpi)
        atomic_write(fig_dir / f"{name}.png", png)
        buf = io.BytesIO()
        fig.savefig(buf, format="pdf", dpi=150)
        atomic_write(fig_dir / f"{name}.pdf", buf.getvalue())
        images[name] = png
        files += [fig_dir / f"{name}.png", fig_dir / f"{name}.pdf"]
    return images


def _write_notes(storage: Any, frame: pd.DataFrame, summary: pd.DataFrame, confirm: dict[str, Any],
                 fit: dict[str, Any]) -> int:
    """Each budget's answer as its study's note in optuna-dashboard; a warning, never a failure."""
    picks = best_and_runner_up(frame)
    answer = ((fit.get("nd_fit") or {}).get("compute_optimal") or {}).get("sentence")
    extra = f"\n\n**Compute-optimal answer:** {answer}" if answer and (fit.get("nd_fit") or {}).get("n_points") else ""
    notes = {s["budget"]: budget_note(s["budget"], s, picks.get(s["budget"], (None, None))[0],
                                      confirm.get(s["budget"]), fit) + extra
             for _, s in summary.iterrows()}
    try:
        return save_dashboard_notes(storage, frame.attrs["studies"], notes)
    except Exception as exc:  # the files are written; a read-only database keeps its notes
        print(f"archhpo: warning: dashboard notes not written ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 0


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
                             "--experiment NAME to pick one.")
        return report_frame(frame, out, experiment or (names[0] if names else None), reference, n_boot,
                            compute=compute)
    if experiment is None:
        raise StudyError("Reading a database needs --experiment NAME (only a CSV file with one experiment "
                         "names its own).")
    from archhpo.search._storage import open_storage, resolve_storage_url

    if storage is None or isinstance(storage, str):
        storage = open_storage(resolve_storage_url(storage), create=False)
    frame = trials_frame(experiment, storage=storage, curves=False)
    frame.attrs["ladder"] = ladder_notes(storage, frame.attrs.get("studies") or {})
    top = ranked(frame).groupby("budget", sort=False).head(CURVES_SHOWN)
    load_curves(frame, storage, top.index)  # only the curves the figures draw
    return report_frame(frame, out, experiment, reference, n_boot, storage if notes else None, compute=compute)


__all__ = [
    "CHOICE_COLUMNS",
    "SUMMARY_COLUMNS",
    "Report",
    "budget_summary",
    "choice_markdown",
    "choice_table",
    "confirmation",
    "fit_line",
    "report_frame",
    "write_report",
]
