"""The laws in words: one sentence for the page and the dashboard note, one line for a terminal.

A law is stated with its 95% intervals only when its status is ``fitted``; otherwise the sentence
says why not and quotes what the data do resolve (the loss ratio between the largest and the
smallest budget).
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


def law_text(fit: dict[str, Any]) -> str:
    """The fit in one sentence: a law with its intervals only when its status is ``fitted``;
    otherwise why not, and what the data do resolve (the loss ratio)."""
    status = fit.get("status")
    if status == "too_few_budgets" or not fit.get("E"):
        return f"No scaling law fitted: {fit.get('reason') or 'no fit'}."
    ratio = _ratio_text(fit)
    if status in _NO_LAW:
        what = f" What the data resolve: the {ratio}." if ratio else ""
        return (f"{_NO_LAW[status]} over {fit['n_budgets']} budgets: {fit['reason']}.{what} A curve through "
                "these points would be an interpolation, so none is drawn.")
    return (f"L(N) = E + A·N^-alpha fitted to the best trial of {fit['n_budgets']} budgets: "
            + _intervals(fit, ("E", "A", "alpha"))
            + f" (95% bootstrap intervals, {fit['method'].get('bootstrap_resamples', 0)} resamples)."
            + (f" The {ratio}." if ratio else ""))


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
    status = fit.get("status")
    if status == "fitted":
        return f"scaling: L(N) = E + A*N^-alpha with {_intervals(fit, ('E', 'A', 'alpha'))} (95% intervals)"
    if status in _NO_LAW:
        ratio = _ratio_text(fit)
        return f"scaling: {_NO_LAW[status].lower()} ({fit['reason']})" + (f"; {ratio}" if ratio else "")
    return f"scaling: no law fitted ({fit.get('reason') or 'no fit'})"


__all__ = ["fit_line", "law_text", "nd_text"]
