"""The answer for a compute budget: which N, which D and which shape, from the fitted L(N, D).

`nd_fit` fits the law (``archhpo.report._ndfit``) to the best trial of every (budget, tokens per
parameter) study and to every size of every IsoFLOP budget; `compute_answer` turns it into the
recommended N* and D* for a compute budget C (archhpo's exact training FLOPs; by default the largest
budget's), with 95% intervals: tokens per parameter D*/N*, the law's loss there (and one run's, with
the fit's noise), the best shape at N* (an IsoFLOP study's trained size nearest N*, else the searched
budget nearest N*), and how far the answer extrapolates beyond the largest compute trained.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from archhpo.report._fit import fit_scaling_law, known_floor, noisy_losses, seed_noise
from archhpo.report._frame import ranked
from archhpo.report._isoflop import COLUMN as ISO_COLUMN
from archhpo.report._isoflop import collinear, isoflop_points, with_compute_budgets
from archhpo.report._ndfit import allocation, fit_nd_law, optimum_rows

LOG_TIE = 1e-9  # sizes within this of the nearest in log N are the same size (its --shapes K rows)


def nd_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The points L(N, D) is fitted to: the best COMPLETE trial of every study that states its
    tokens per parameter, and every size of every IsoFLOP budget (``isoflop_points``: one point per
    (C, architecture), its mean over seeds), ``budget_value`` there the compute budget."""
    need = ("tokens_per_param", "train_tokens", "train_flops", "param_count", "val_loss")
    empty = pd.DataFrame(columns=[*need, "budget", "budget_value"])
    if frame.empty or any(c not in frame.columns for c in need[1:]):
        return empty
    frame = with_compute_budgets(frame)
    iso = frame[ISO_COLUMN].notna()
    parts = []
    if need[0] in frame:
        done = frame[~iso & (frame["state"] == "COMPLETE") & frame[list(need)].notna().all(axis=1)]
        best = done.sort_values(["val_loss", "trial"], kind="stable").drop_duplicates("budget")
        parts += [best.sort_values(["budget_value", "train_tokens"], kind="stable")] if len(best) else []
    if iso.any():
        pts = isoflop_points(frame[iso])
        pts = pts[pts[["train_tokens", "train_flops"]].notna().all(axis=1)].copy()
        budgets = frame[iso].assign(**{ISO_COLUMN: pd.to_numeric(frame.loc[iso, ISO_COLUMN])})
        label = budgets.drop_duplicates(ISO_COLUMN).set_index(ISO_COLUMN)["budget"]
        pts["budget"] = pts[ISO_COLUMN].map(label)
        pts["budget_value"] = pts[ISO_COLUMN]
        pts["tokens_per_param"] = pts["train_tokens"] / pts["param_count"]
        parts.append(pts)
    return pd.concat(parts, ignore_index=True) if parts else empty


def nd_fit(frame: pd.DataFrame, n_boot: int = 1000) -> dict[str, Any]:
    """The ``nd_fit`` of the scaling-fit JSON (``samples`` kept in memory for the figures), with
    ``collinear`` where every point trains one tokens-per-parameter ratio."""
    pts = nd_points(frame)
    if pts.empty:
        return {"law": "L(N, D) = E + A/N^alpha + B/D^beta", "status": "too_few_points", "n_points": 0,
                "reason": "no study of this experiment states its data per parameter (--tokens-per-param) "
                          "or plans a compute budget (--isoflop)", "samples": np.empty((0, 5))}
    out = fit_nd_law(pts["param_count"], pts["train_tokens"], pts["val_loss"], pts["train_flops"],
                     budgets=[float(v) for v in pts["budget_value"]], n_boot=n_boot,
                     noise=seed_noise(ranked(frame, include_confirmation=True)),
                     floor=known_floor(frame.attrs.get("truth")))
    ratios = pts["tokens_per_param"] if ISO_COLUMN not in pts or pts[ISO_COLUMN].isna().all() else []
    if (why := collinear(list(ratios))) is not None:
        out["collinear"] = why
    return out


RATIO_COLUMNS = {"tokens_per_param": "tokens per parameter", "samples_per_param": "samples per parameter"}


def ratio_column(frame: pd.DataFrame) -> str | None:
    """The data-per-parameter column that designs the study: one ratio per budget (a study), more
    than one ratio, and some ratio shared by budgets; None otherwise (an IsoFLOP study's trials,
    whose ratios follow from C and N, are not a design of ratios)."""
    done = frame[frame["state"] == "COMPLETE"] if "state" in frame else frame
    if ISO_COLUMN in done:
        done = done[pd.to_numeric(done[ISO_COLUMN], errors="coerce").isna()]
    for col in RATIO_COLUMNS:
        if col not in done or done[col].dropna().nunique() < 2:
            continue
        per_budget = done.dropna(subset=[col]).groupby("budget")[col].nunique()
        shared = done.dropna(subset=[col]).groupby(col)["budget"].nunique()
        if (per_budget == 1).all() and (shared > 1).any():
            return col
    return None


def scaling_fit(frame: pd.DataFrame, n_boot: int = 1000) -> dict[str, Any]:
    """L(N) over the budgets' best trials, never pooling data-per-parameter ratios: with several,
    one fit per ratio (``per_ratio``, by label), the top level the ratio with the most budgets (the
    largest ratio on a tie) with its label under ``ratio``. An IsoFLOP study's budgets are its C,
    so its L(N) is fitted on the frontier's minima (each C's best trial)."""
    col = ratio_column(frame)
    if col is None:
        return fit_scaling_law(frame, n_boot=n_boot)
    unit = RATIO_COLUMNS[col].split(" per ")[0]
    fits: dict[str, dict[str, Any]] = {}
    for r in sorted(frame[col].dropna().unique()):
        sub = frame[frame[col] == r].copy()
        sub.attrs = dict(frame.attrs)
        fits[f"{r:g} {unit}/param"] = fit_scaling_law(sub, n_boot=n_boot)
    label = max(fits, key=lambda k: (int(fits[k].get("n_budgets") or 0), float(k.split()[0])))
    return {**fits[label], "ratio": label, "ratio_unit": RATIO_COLUMNS[col], "per_ratio": fits}


def trained_ratios(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per data-budget study, its best trial's tokens per parameter as trained (D over its exact N)
    beside the nominal ratio the study states (a grid row's N is not the budget's)."""
    pts = nd_points(frame)
    if ISO_COLUMN in pts:
        pts = pts[pts[ISO_COLUMN].isna()]
    return [{"budget": str(p["budget"]), "nominal": float(p["tokens_per_param"]),
             "trained": float(p["train_tokens"]) / float(p["param_count"])} for _, p in pts.iterrows()]


def _shape(row: Any) -> str:
    """Every architecture key and categorical choice of the trial (report/_arch.py)."""
    from archhpo.report._arch import arch_fields, arch_text

    return arch_text(arch_fields(row))


def _nearest(pts: pd.DataFrame, n_star: float, compute: float) -> pd.Series:
    """The point whose shape answers "which shape at N*": an IsoFLOP study's trained size nearest N*
    (at the budget nearest C, its best shape there with --shapes K); else the searched budget nearest N*."""
    if ISO_COLUMN in pts and pts[ISO_COLUMN].notna().any():
        iso = pts[pts[ISO_COLUMN].notna()]
        c = iso[ISO_COLUMN].astype(float)
        at = iso[(np.log(c) - math.log(compute)).abs() == (np.log(c) - math.log(compute)).abs().min()]
        gap = (np.log(at["param_count"].astype(float)) - math.log(n_star)).abs()
        return at[gap <= gap.min() + LOG_TIE].sort_values("val_loss", kind="stable").iloc[0]
    return pts.iloc[int(np.argmin(np.abs(np.log(pts["budget_value"].astype(float)) - math.log(n_star))))]


def _default_compute(pts: pd.DataFrame) -> float:
    """An IsoFLOP study's largest C, else the best trial of the largest budget's training FLOPs."""
    if ISO_COLUMN in pts and pts[ISO_COLUMN].notna().any():
        return float(pts[ISO_COLUMN].max())
    return float(pts[pts["budget_value"] == pts["budget_value"].max()].iloc[0]["train_flops"])


def run_interval(loss: np.ndarray, noise: dict[str, Any] | None, seed: int = 0) -> list[float]:
    """95% interval of one training run's loss: the law's bootstrap losses (`loss`, row 0 the
    estimate) times the fit's noise in log L (its sd, Student-t widened as the bootstrap draws it)."""
    rest = loss[1:][np.isfinite(loss[1:])]
    if not len(rest):
        return [math.nan, math.nan]
    draws = np.log(rest)
    if noise and noise.get("sd_log", 0) > 0:
        draws = noisy_losses(draws, noise, 1, np.random.default_rng(seed))[0]
    return [float(x) for x in np.exp(np.percentile(draws, [2.5, 97.5]))]


def compute_answer(frame: pd.DataFrame, fit: dict[str, Any], compute: float | None = None) -> dict[str, Any]:
    """N*, D*, D*/N*, the predicted loss (with intervals), the best shape at N* and the extrapolation
    for `compute` FLOPs (default: an IsoFLOP study's largest C, else the best trial of the largest
    budget's training FLOPs)."""
    pts = nd_points(frame)
    if pts.empty:
        return {"status": "none", "sentence": "No compute-optimal answer: no study states its tokens per parameter "
                                              "or plans a compute budget."}
    c = float(compute) if compute is not None else _default_compute(pts)
    trained = float(pd.to_numeric(frame["train_flops"], errors="coerce").max())
    out: dict[str, Any] = {"compute": c, "extrapolation": c / trained, "trained_tokens_per_param": trained_ratios(frame)}
    if fit.get("status") != "fitted":
        out.update(status=fit.get("status"),
                   sentence=(f"No compute-optimal answer for C = {c:.3g} FLOPs: L(N, D) is not fitted "
                             f"({fit.get('status')}: {fit.get('reason')})."))
        return out
    samples = fit["samples"]
    alloc = allocation(samples, float(fit["flops_per_param_token"]), c)
    loss_rows = optimum_rows(samples, float(fit["flops_per_param_token"]), c)[2]
    alloc["loss"]["run_ci95"] = run_interval(loss_rows, fit.get("noise"))
    near = _nearest(pts, alloc["N"]["estimate"], c)
    out.update(status="fitted", **alloc, nearest_budget=str(near["budget"]), best_shape=_shape(near),
               best_shape_params=int(near["param_count"]))
    out["sentence"] = answer_sentence(out)
    return out


def answer_sentence(answer: dict[str, Any]) -> str:
    """The compute-optimal answer in one sentence (the page leads with it; the terminal prints it)."""
    n, d, loss = answer["N"], answer["D"], answer["loss"]
    lo, hi = loss["run_ci95"]
    ext = answer["extrapolation"]
    where = f"{ext:.3g}x the largest compute trained" if ext > 1 else "within the compute trained"
    return (f"For C = {answer['compute']:.3g} FLOPs: N* = {n['estimate']:.3g} parameters [{n['ci95'][0]:.3g}, "
            f"{n['ci95'][1]:.3g}], D* = {d['estimate']:.3g} tokens [{d['ci95'][0]:.3g}, {d['ci95'][1]:.3g}], "
            f"{answer['tokens_per_param']['estimate']:.3g} tokens per parameter; predicted loss "
            f"{loss['estimate']:.4g} [{lo:.4g}, {hi:.4g}] for one run ({loss['ci95'][0]:.4g}-{loss['ci95'][1]:.4g} "
            f"for the law); N* ∝ C^{answer['a']['estimate']:.3f} [{answer['a']['ci95'][0]:.3f}, "
            f"{answer['a']['ci95'][1]:.3f}]; the best shape at N* ({answer['nearest_budget']}, "
            f"{answer['best_shape_params']:,} parameters): {answer['best_shape']}; {where}.")


def isoflop_curves(fit: dict[str, Any], computes: list[float], n: np.ndarray) -> dict[float, np.ndarray]:
    """Loss of the fitted law against N at each fixed C (D = C / (k N)): IsoFLOP curves."""
    e, a, b, alpha, beta = (fit[k]["estimate"] for k in ("E", "A", "B", "alpha", "beta"))
    k = float(fit["flops_per_param_token"])
    return {c: e + a * n**-alpha + b * (c / (k * n)) ** -beta for c in computes}


__all__ = ["answer_sentence", "compute_answer", "isoflop_curves", "nd_fit", "nd_points", "ratio_column", "run_interval",
           "scaling_fit", "trained_ratios"]
