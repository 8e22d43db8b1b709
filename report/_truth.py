"""The data's known truth beside the fitted law: a synthetic language's exact entropy rate.

A family whose data has a computable entropy rate (the ``lm`` family's synthetic language) stores
it in the study's data info (``entropy_rate``, and ``loss_floor``: the least expected loss on the
training windows, whose first positions see a shorter context).  The report copies both into the
scaling-fit JSON and says where the fitted irreducible loss E lies against them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

TRUTH_KEYS = ("entropy_rate", "loss_floor")


def known_truth(infos: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The truth keys that every study's data info holds with one value (else none: no mixed truths)."""
    infos = list(infos)
    out: dict[str, float] = {}
    for key in TRUTH_KEYS:
        values = {float(i[key]) if isinstance(i.get(key), (int, float)) else None for i in infos}
        if len(values) == 1 and None not in values:
            out[key] = values.pop()  # type: ignore[assignment]
    return out


def truth_text(fit: Mapping[str, Any]) -> str:
    """One sentence: the known entropy rate (and floor) beside the fitted E, or '' when unknown."""
    rate = fit.get("entropy_rate")
    if rate is None or not math.isfinite(rate):
        return ""
    floor = fit.get("loss_floor")
    text = f"Known truth: the data's entropy rate is {rate:.4f} nats/token"
    if floor is not None:
        text += f" (the least reachable loss on its training windows: {floor:.4f})"
    e = fit.get("E")
    if not e:
        return text + "; no law was fitted to compare E with."
    est, (lo, hi) = e["estimate"], e["ci95"]
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (est, lo, hi)):
        return text + "; the fitted E has no finite interval to compare with."
    target = floor if floor is not None else rate
    where = "contains" if lo <= target <= hi else ("lies above" if lo > target else "lies below")
    what = "the floor" if floor is not None else "the entropy rate"
    status = fit.get("status", "fitted")  # a fit stored before statuses existed was printed as a law
    # E of a fit that is not a law is still informative against the floor, but it is not "the fitted E"
    name = "the fitted E" if status == "fitted" else f"E of the fit, which is no law ({status.replace('_', ' ')}),"
    text += f"; {name} is {est:.4f} [{lo:.4f}, {hi:.4f}], an interval that {where} {what}."
    if where == "lies below":
        text += (f" Warning: E below {what} is impossible for any model: the law is fitted to undertrained "
                 "models (more tokens per parameter move E up) or does not describe these points.")
    return text


def below_floor(fit: Mapping[str, Any]) -> bool:
    """Whether the fitted E's whole interval lies below the data's known floor (flagged on the page)."""
    return "Warning: E below" in truth_text(fit)
