"""Each budget's answer in words (`budget_note`, `gap_text`), saved as its study's note in
optuna-dashboard (`save_dashboard_notes`) when `archhpo report` reads a database."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import pandas as pd

from archhpo.report._arch import arch_fields, arch_markdown, arch_text
from archhpo.report._frame import best_and_runner_up
from archhpo.report._law import law_text
from archhpo.report._summary import _count, _f, _fmt, _i
from archhpo.schema import ARCH_KEYS


# ----------------------------------------------------------------------------- text pieces
def _arch_text(row: Any) -> str:
    """Every architecture key and categorical choice of a trial (report/_arch.py)."""
    return arch_text(arch_fields(row))


# PED-ANOVA (optuna-dashboard's importance evaluator) scores the top 10% of the trials; Optuna's
# documentation advises at least 5 trials there, so 50 complete trials.
IMPORTANCE_MIN_TRIALS = 50


def importance_note(n_complete: int) -> str:
    """What the dashboard's hyperparameter-importance plot is worth for a study of `n_complete` trials."""
    head = (f"**Importance plot:** the dashboard ranks parameters with Optuna's PED-ANOVA on the best 10% of "
            f"this study's {n_complete} complete trials. ")
    if n_complete < IMPORTANCE_MIN_TRIALS:
        head += (f"Optuna advises at least 5 trials in that 10%, so {IMPORTANCE_MIN_TRIALS} complete trials; with "
                 f"{n_complete} the bars are not a measurement. ")
    return head + ("arch_idx and d_model, n_layers, n_heads, d_ff name the same architecture, so they share one "
                   "importance, and a parameter the plan fixed has none: compare architectures with the report's "
                   "runner-up, noise and confirmation instead.")


def budget_note(budget: str, srow: pd.Series, best: pd.Series | None, confirm: dict[str, Any] | None,
                fit: dict[str, Any], runner: pd.Series | None = None, unit: str = "") -> str:
    """The Markdown answer of one budget (the optuna-dashboard study note); `runner` the runner-up
    trial (else its architecture keys are read from `srow`), `unit` the loss's unit."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Answer for budget {budget} (archhpo report, {when})", ""]
    in_unit = f" {unit}" if unit else ""
    if best is None:
        lines.append(f"No finished trial: {_count(srow['n_failed'])} failed, {_count(srow['n_pruned'])} pruned.")
    else:
        lines.append(f"**Best:** trial {_i(best['trial'])}: {_arch_text(best)}, {_count(best['param_count'])} "
                     f"parameters, val_loss **{_fmt(best['val_loss'])}**{in_unit}; trained with learning rate "
                     f"{_fmt(best['learning_rate'], 3)}, {_i(best['epochs'])} epochs, batch {_i(best['batch_size'])}, "
                     f"weight decay {_fmt(best['weight_decay'], 3)}, warm-up {_i(best['warmup_steps'])} steps.")
        if _f(srow.get("runner_up_val_loss")) is not None:
            lines.append("")
            fields, winner = arch_fields(best), arch_fields(best)
            if runner is not None:
                fields = arch_fields(runner)
            else:  # a summary row alone: the architecture keys (its choices are a label there)
                fields = {k: _i(srow.get(f"runner_up_{k}")) for k in ARCH_KEYS}
                winner = {k: winner[k] for k in ARCH_KEYS}
            lines.append(f"**Runner-up:** trial {_i(srow['runner_up_trial'])} "
                         f"({arch_markdown(fields, winner)}), val_loss "
                         f"{_fmt(srow['runner_up_val_loss'])}{in_unit}; gap {gap_text(srow)}.")
        if _f(srow.get("baseline_val_loss")) is not None:
            lines += ["", f"**Trivial baseline:** loss {_fmt(srow['baseline_val_loss'])} (a model that ignores "
                          "its input)."]
    if confirm:
        lines += ["", f"**Confirmation:** {confirm['statement']}"]
    lines += ["", f"**Scaling law:** {law_text(fit)}", "",
              f"Trials: {_count(srow['n_complete'])} complete, {_count(srow['n_pruned'])} pruned, "
              f"{_count(srow['n_failed'])} failed.", "", importance_note(_i(srow["n_complete"]) or 0)]
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

    from archhpo.report._units import METRIC
    from archhpo.search._study import load_study

    n = 0
    for budget, name in studies.items():
        if budget not in notes:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = load_study(storage, name)
            save_note(study, notes[budget])
            if study.metric_names != [METRIC]:  # the dashboard names the objective, not "Objective 0"
                study.set_metric_names([METRIC])
        n += 1
    return n


def _write_notes(storage: Any, frame: pd.DataFrame, summary: pd.DataFrame, confirm: dict[str, Any],
                 fit: dict[str, Any]) -> int:
    """Each budget's answer as its study's note in optuna-dashboard; a warning, never a failure."""
    from archhpo.report._units import loss_unit

    picks = best_and_runner_up(frame)
    answer = ((fit.get("nd_fit") or {}).get("compute_optimal") or {}).get("sentence")
    extra = f"\n\n**Compute-optimal answer:** {answer}" if answer and (fit.get("nd_fit") or {}).get("n_points") else ""
    unit = loss_unit(frame)
    notes = {s["budget"]: budget_note(s["budget"], s, *picks.get(s["budget"], (None, None))[:1],
                                      confirm.get(s["budget"]), fit, picks.get(s["budget"], (None, None))[1],
                                      unit) + extra
             for _, s in summary.iterrows()}
    try:
        return save_dashboard_notes(storage, frame.attrs["studies"], notes)
    except Exception as exc:  # the files are written; a read-only database keeps its notes
        print(f"archhpo: warning: dashboard notes not written ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 0


__all__ = [
    "IMPORTANCE_MIN_TRIALS",
    "budget_note",
    "importance_note",
    "gap_text",
    "save_dashboard_notes",
]
