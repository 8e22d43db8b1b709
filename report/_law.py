"""The laws in words: one sentence for the page and the dashboard note, one line for a terminal.

A law is stated with its 95% intervals only when its status is ``fitted``; otherwise the sentence
says why not and quotes what the data do resolve (the loss ratio between the largest and the
smallest budget). A compute-optimal study's page leads with `compute_lead`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from archhpo.report._summary import _fmt


def _ratio_text(fit: dict[str, Any]) -> str:
    ratio = fit.get("loss_ratio") or {}
    if not ratio:
        return ""
    lo, hi = ratio["ci95"]
    return f"loss of the largest budget over the smallest {_fmt(ratio['estimate'])} [{_fmt(lo)}, {_fmt(hi)}]"


def _intervals(fit: dict[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k} = {_fmt(fit[k]['estimate'])} [{_fmt(fit[k]['ci95'][0])}, {_fmt(fit[k]['ci95'][1])}]"
                     for k in keys)


_NO_LAW = {"no_scaling": "No measurable scaling", "interpolation": "No law: an interpolation, not a fit",
           "unresolved": "No law: not resolved"}
FALLS = "The loss falls, but no law is resolved"


def loss_falls(fit: dict[str, Any]) -> bool:
    """Whether the loss ratio's 95% interval (largest budget over smallest) lies below 1."""
    ci = (fit.get("loss_ratio") or {}).get("ci95") or [None, None]
    return ci[1] is not None and float(ci[1]) < 1.0


def no_law(fit: dict[str, Any]) -> str:
    """The words that replace a law: never "No measurable scaling" where the loss ratio's interval
    excludes 1 (the loss measurably falls; what fails is the law's other conditions)."""
    status = str(fit.get("status"))
    return FALLS if status == "no_scaling" and loss_falls(fit) else _NO_LAW[status]


def law_text(fit: dict[str, Any]) -> str:
    """The fit in one sentence: a law with its intervals only when its status is ``fitted``;
    otherwise why not, and what the data do resolve (the loss ratio); per ratio where the fit is
    (``per_ratio``: a study of several tokens per parameter, never pooled)."""
    if fit.get("per_ratio"):
        return (f"L(N) fitted per {fit.get('ratio_unit', 'tokens per parameter')} ratio (budgets of different "
                "ratios are not pooled: D/N differs between them). "
                + " ".join(f"{label}: {law_text(sub)}" for label, sub in fit["per_ratio"].items()))
    status = fit.get("status")
    if status == "too_few_budgets" or not fit.get("E"):
        return f"No scaling law fitted: {fit.get('reason') or 'no fit'}."
    ratio = _ratio_text(fit)
    if status in _NO_LAW:
        what = f" What the data resolve: the {ratio}." if ratio else ""
        return (f"{no_law(fit)} over {fit['n_budgets']} budgets: {fit['reason']}.{what} A curve through "
                "these points would be an interpolation, so none is drawn.")
    return (f"L(N) = E + A·N^-alpha fitted to the best trial of {fit['n_budgets']} budgets: "
            + _intervals(fit, ("E", "A", "alpha"))
            + f" (95% bootstrap intervals, {fit['method'].get('bootstrap_resamples', 0)} resamples)."
            + (f" The {ratio}." if ratio else ""))


def compute_lead(fit: dict[str, Any]) -> list[str]:
    """What the page of a compute-optimal study (tokens per parameter or IsoFLOP) leads with: the
    compute-optimal answer or why there is none, how to ask for another C, the tokens per parameter
    as trained beside the nominal, and a collinear design's warning; [] for other studies."""
    nd = fit.get("nd_fit") or {}
    answer = nd.get("compute_optimal") or {}
    if not nd.get("n_points") or not answer.get("sentence"):
        return []
    lines = [answer["sentence"], "archhpo report --compute C answers for another compute budget C."]
    trained = [t for t in answer.get("trained_tokens_per_param") or [] if t["nominal"] is not None]
    if trained:
        lines.append("Tokens per parameter as trained (D over the best trial's exact N), beside the nominal: "
                     + ", ".join(f"{t['budget']} {t['trained']:.3g} (nominal {t['nominal']:g})" for t in trained) + ".")
    if nd.get("collinear"):
        lines.append(str(nd["collinear"]))
    return lines


def nd_text(nd: dict[str, Any]) -> str:
    """L(N, D) in one sentence: the law with its intervals when fitted, else why not."""
    if nd.get("status") != "fitted":
        return f"No L(N, D) law ({nd.get('status')}): {nd.get('reason')}."
    return (f"L(N, D) = E + A/N^alpha + B/D^beta fitted to {nd['n_points']} (N, D) points: "
            + _intervals(nd, ("E", "A", "B", "alpha", "beta"))
            + f" (95% bootstrap intervals, {nd['method'].get('bootstrap_resamples', 0)} resamples).")


def fit_line(fit: dict[str, Any]) -> str:
    """One line for a terminal (`run` and `report` end with it): the law with its intervals, or
    the sentence that replaces it."""
    if fit.get("per_ratio"):
        return "\n".join(f"{fit_line(sub)} [{label}]" for label, sub in fit["per_ratio"].items())
    status = fit.get("status")
    if status == "fitted":
        return f"scaling: L(N) = E + A*N^-alpha with {_intervals(fit, ('E', 'A', 'alpha'))} (95% intervals)"
    if status in _NO_LAW:
        ratio = _ratio_text(fit)
        return f"scaling: {no_law(fit).lower()} ({fit['reason']})" + (f"; {ratio}" if ratio else "")
    return f"scaling: no law fitted ({fit.get('reason') or 'no fit'})"


__all__ = ["compute_lead", "fit_line", "law_text", "loss_falls", "nd_text", "no_law"]
