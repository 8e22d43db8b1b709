"""The answer for a compute budget: which N, which D and which shape, from the fitted L(N, D).

`nd_fit` fits the law (``archhpo.report._ndfit``) to the best trial of every (budget, tokens per
parameter) study; `compute_answer` turns it into the recommended N* and D* for a compute budget C
(archhpo's exact training FLOPs; by default the largest budget's), with 95% intervals, the best
shape at the searched budget nearest N*, and how far the answer extrapolates beyond the largest
compute trained.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from archhpo.report._fit import known_floor, seed_noise
from archhpo.report._frame import ranked
from archhpo.report._ndfit import allocation, fit_nd_law


def nd_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The best COMPLETE trial of every study that states its tokens per parameter."""
    need = ("tokens_per_param", "train_tokens", "train_flops", "param_count", "val_loss")
    if frame.empty or any(c not in frame.columns for c in need):
        return pd.DataFrame(columns=[*need, "budget", "budget_value"])
    done = frame[(frame["state"] == "COMPLETE") & frame[list(need)].notna().all(axis=1)]
    best = done.sort_values(["val_loss", "trial"], kind="stable").drop_duplicates("budget")
    return best.sort_values(["budget_value", "train_tokens"], kind="stable")


def nd_fit(frame: pd.DataFrame, n_boot: int = 1000) -> dict[str, Any]:
    """The ``nd_fit`` of the scaling-fit JSON (``samples`` kept in memory for the figures)."""
    pts = nd_points(frame)
    if pts.empty:
        return {"law": "L(N, D) = E + A/N^alpha + B/D^beta", "status": "too_few_points", "n_points": 0,
                "reason": "no study of this experiment states its data per parameter (--tokens-per-param)",
                "samples": np.empty((0, 5))}
    return fit_nd_law(pts["param_count"], pts["train_tokens"], pts["val_loss"], pts["train_flops"],
                      budgets=[float(v) for v in pts["budget_value"]], n_boot=n_boot,
                      noise=seed_noise(ranked(frame, include_confirmation=True)),
                      floor=known_floor(frame.attrs.get("truth")))


def _shape(row: Any) -> str:
    """Every architecture key and categorical choice of the trial (report/_arch.py)."""
    from archhpo.report._arch import arch_fields, arch_text

    return arch_text(arch_fields(row))


def compute_answer(frame: pd.DataFrame, fit: dict[str, Any], compute: float | None = None) -> dict[str, Any]:
    """N*, D* (with intervals), the nearest searched budget's best shape and the extrapolation for
    `compute` FLOPs (default: the best trial of the largest budget's training FLOPs)."""
    pts = nd_points(frame)
    if pts.empty:
        return {"status": "none", "sentence": "No compute-optimal answer: no study states its tokens per parameter."}
    largest = pts[pts["budget_value"] == pts["budget_value"].max()].iloc[0]
    c = float(compute) if compute is not None else float(largest["train_flops"])
    trained = float(frame["train_flops"].max())
    out: dict[str, Any] = {"compute": c, "extrapolation": c / trained}
    if fit.get("status") != "fitted":
        out.update(status=fit.get("status"),
                   sentence=(f"No compute-optimal answer for C = {c:.3g} FLOPs: L(N, D) is not fitted "
                             f"({fit.get('status')}: {fit.get('reason')})."))
        return out
    alloc = allocation(fit["samples"], float(fit["flops_per_param_token"]), c)
    n_star = alloc["N"]["estimate"]
    near = pts.iloc[int(np.argmin(np.abs(np.log(pts["budget_value"].astype(float)) - math.log(n_star))))]
    out.update(status="fitted", **alloc, nearest_budget=str(near["budget"]), best_shape=_shape(near))
    n_lo, n_hi = alloc["N"]["ci95"]
    d_lo, d_hi = alloc["D"]["ci95"]
    where = (f"{out['extrapolation']:.3g}x the largest compute trained" if out["extrapolation"] > 1
             else "within the compute trained")
    out["sentence"] = (
        f"For C = {c:.3g} FLOPs: N* = {n_star:.3g} parameters [{n_lo:.3g}, {n_hi:.3g}] and D* = "
        f"{alloc['D']['estimate']:.3g} tokens [{d_lo:.3g}, {d_hi:.3g}] (N* ∝ C^{alloc['a']['estimate']:.3f} "
        f"[{alloc['a']['ci95'][0]:.3f}, {alloc['a']['ci95'][1]:.3f}], D* ∝ C^{alloc['b']['estimate']:.3f}); "
        f"the best shape at the nearest searched budget ({near['budget']}): {_shape(near)}; {where}.")
    return out


def isoflop_curves(fit: dict[str, Any], computes: list[float], n: np.ndarray) -> dict[float, np.ndarray]:
    """Loss of the fitted law against N at each fixed C (D = C / (k N)): IsoFLOP curves."""
    e, a, b, alpha, beta = (fit[k]["estimate"] for k in ("E", "A", "B", "alpha", "beta"))
    k = float(fit["flops_per_param_token"])
    return {c: e + a * n**-alpha + b * (c / (k * n)) ** -beta for c in computes}


__all__ = ["compute_answer", "isoflop_curves", "nd_fit", "nd_points"]
