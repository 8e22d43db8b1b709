"""Each budget's answer in words (`budget_note`, `gap_text`), saved as its study's note in
optuna-dashboard (`save_dashboard_notes`) when `archhpo report` reads a database."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import pandas as pd

from archhpo.report._frame import best_and_runner_up
from archhpo.report._law import law_text
from archhpo.report._summary import _count, _f, _fmt, _i


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


__all__ = [
    "budget_note",
    "gap_text",
    "save_dashboard_notes",
]
