"""The figures of an IsoFLOP study (Approach 2, `archhpo.report._isoflop`), drawn from its fit.

- `plot_isoflop_profiles`: loss against N at each compute budget C, the trials' points, each
  budget's robust parabola over its sizes, and its vertex N_opt(C) with its 95% interval (a hollow
  vertex is at the grid's edge: not resolved, see the fit's ``recentre``).
- `plot_isoflops`: the fitted L(N, D)'s curve at each compute budget (Approach 3), with the trials.
- `plot_frontier`: N_opt and D_opt against C, the fitted N_opt = G·C^a (and D_opt = C/(k N_opt))
  with the band a's interval spans, dotted beyond the largest C, and Chinchilla's 20 tokens per
  parameter as a reference line.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from archhpo.report._canvas import _figure, _legend, _styled
from archhpo.report._figures import _draw_baseline, _finished, _loss_label

TOKENS_PER_PARAM_REFERENCE = 20.0
EXTRAPOLATE = 4.0  # the frontier's lines go on, dotted, to this many times the largest C (no answer beyond)


def _parabola(vertex: dict[str, Any], n: np.ndarray) -> np.ndarray:
    c0, c1, c2 = vertex["parabola"]["coefficients"]
    x = np.log(n) - vertex["parabola"]["x_mean"]
    return c0 + c1 * x + c2 * x * x


@_styled
def plot_isoflop_profiles(iso: dict[str, Any], points: Any = None) -> Figure:
    """Loss against N per C with the parabolas and the vertices (`points`: the fit's points,
    columns compute_budget, param_count, val_loss; without them only the curves are drawn)."""
    fig = _figure(8.2, right=2.0)
    ax = fig.add_subplot()
    vertices = iso.get("vertices") or []
    colors = matplotlib.colormaps["viridis"](np.linspace(0, 0.9, max(1, len(vertices))))
    for color, v in zip(colors, vertices, strict=False):
        c = v["compute_budget"]
        n = np.geomspace(min(v["sizes"]), max(v["sizes"]), 100)
        ax.plot(n, _parabola(v, n), color=color, lw=1.2, label=f"C = {c:.3g}" + (" (edge)" if v["edge"] else ""))
        if points is not None:
            at = points[points["compute_budget"] == c]
            ax.scatter(at["param_count"], at["val_loss"], s=14, color=color, alpha=0.8)
        est, (lo, hi) = v["n_opt"]["estimate"], v["n_opt"]["ci95"]
        if not (est is not None and math.isfinite(est)):
            continue
        lo = lo if lo is not None and math.isfinite(lo) else est
        hi = hi if hi is not None and math.isfinite(hi) else est
        y = v["loss_opt"]
        ax.errorbar([est], [y], xerr=[[est - lo], [hi - est]], fmt="o", ms=6, color=color, capsize=3,
                    mfc="white" if v["edge"] else color, mec="black", zorder=5)
    ax.set_xscale("log")
    ax.set_xlabel("parameters N (exact count)")
    ax.set_ylabel("validation loss")
    _legend(ax)
    fig.suptitle("IsoFLOP profiles: loss against N at each compute budget (vertex: N_opt with its 95% interval)")
    return fig


def _law(iso: dict[str, Any], c: np.ndarray, a: float) -> np.ndarray:
    """N_opt = G·C^a through the fit's centre of mass (a band pivots about the budgets' mean log C)."""
    g, a0 = float(iso["G"]), float(iso["a"]["estimate"])
    pivot = float(np.mean(np.log([v["compute_budget"] for v in iso["vertices"] if not v["edge"]])))
    return np.exp(math.log(g) + a0 * pivot + a * (np.log(c) - pivot))


@_styled
def plot_frontier(iso: dict[str, Any], extrapolate_to: float | None = None) -> Figure:
    """N_opt and D_opt against C: the vertices, the fitted lines with a's band, the extrapolation
    to `extrapolate_to` dotted, and 20 tokens per parameter for reference (needs a fitted law)."""
    fig = _figure(7.4, right=2.0)
    ax = fig.add_subplot()
    k = iso.get("k") or 6.0
    resolved = [v for v in iso["vertices"] if not v["edge"]]
    c_obs = np.array([v["compute_budget"] for v in resolved])
    n_obs = np.array([v["n_opt"]["estimate"] for v in resolved])
    ax.scatter(c_obs, n_obs, color="C0", zorder=5, label="N_opt (vertices)")
    ax.scatter(c_obs, c_obs / (k * n_obs), color="C1", zorder=5, label="D_opt = C/(k N_opt)")
    top = max(float(c_obs.max()), extrapolate_to or 0.0)
    for c, style in ((np.geomspace(c_obs.min(), c_obs.max(), 50), "-"), (np.geomspace(c_obs.max(), top, 50), ":")):
        n_fit = _law(iso, c, float(iso["a"]["estimate"]))
        band = [_law(iso, c, float(a)) for a in iso["a"]["ci95"]]
        ax.plot(c, n_fit, "C0" + style, lw=1.3)
        ax.plot(c, c / (k * n_fit), "C1" + style, lw=1.3)
        ax.fill_between(c, np.minimum(*band), np.maximum(*band), color="C0", alpha=0.15, lw=0)
        ax.fill_between(c, c / (k * np.maximum(*band)), c / (k * np.minimum(*band)), color="C1", alpha=0.15, lw=0)
    c_all = np.geomspace(c_obs.min(), top, 50)
    ax.plot(c_all, np.sqrt(c_all / (k * TOKENS_PER_PARAM_REFERENCE)), color="grey", ls="--", lw=1,
            label=f"N at {TOKENS_PER_PARAM_REFERENCE:g} tokens/param")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("compute C (training FLOPs)")
    ax.set_ylabel("parameters N / tokens D")
    _legend(ax)
    a, (lo, hi) = iso["a"]["estimate"], iso["a"]["ci95"]
    fig.suptitle(f"Compute-optimal frontier: N_opt ∝ C^{a:.3f} [{lo:.3f}, {hi:.3f}] (dotted: extrapolated)")
    return fig


@_styled
def plot_isoflops(frame: pd.DataFrame, nd: dict[str, Any]) -> Figure:
    """IsoFLOP curves of the fitted L(N, D): loss against N at fixed compute C (D = C/(kN)), one
    curve per (budget, tokens per parameter) point's C, with the trials of that point on it; each
    curve's minimum (N* at that C) starred. Curves span the trials' N range only."""
    from archhpo.report._answer import isoflop_curves, nd_points  # it imports report/_isoflop.py

    fig = _figure(8.2, right=2.0)
    ax = fig.add_subplot()
    pts = nd_points(frame)
    done = _finished(frame)
    n = np.logspace(math.log10(done["param_count"].min()), math.log10(done["param_count"].max()), 200)
    # One curve per distinct C: an IsoFLOP budget's trials lie within 1% of its C, so they share its
    # compute_budget's curve; a tokens-per-param point is its own C.
    by = "compute_budget" if "compute_budget" in pts and pts["compute_budget"].notna().all() else "train_flops"
    curves = isoflop_curves(nd, sorted(set(pts[by].astype(float))), n)
    colors = matplotlib.colormaps["viridis"](np.linspace(0, 0.9, max(1, len(curves))))
    for color, (c, curve) in zip(colors, curves.items(), strict=True):
        at = pts[pts[by].astype(float) == c]
        names = list(dict.fromkeys(at["budget"]))
        shown = ", ".join(names) if len(names) <= 2 else f"{len(names)} budgets"
        ax.plot(n, curve, color=color, lw=1.3, label=f"C = {c:.2g} ({shown})")
        i = int(np.argmin(curve))
        ax.scatter([n[i]], [curve[i]], marker="*", s=110, color=color, edgecolor="black", zorder=5)
        trials = done[done["budget"].isin(names)]
        ax.scatter(trials["param_count"], trials["val_loss"], s=14, color=color, alpha=0.7)
    ax.set_xscale("log")
    ax.set_xlabel("parameters N (exact count)")
    ax.set_ylabel(_loss_label(frame))
    _draw_baseline(ax, frame)
    _legend(ax)
    fig.suptitle("IsoFLOP curves of the fitted L(N, D) (stars: the compute-optimal N at each C)")
    return fig


def isoflop_plots(frame: Any, iso: dict[str, Any], compute: float | None = None) -> dict[str, Any]:
    """The report's IsoFLOP figures, by file stem, as functions that draw them: the profiles (any
    vertex) and the frontier (a fitted law), extrapolated to `compute` (the page's answer) where it
    lies beyond the budgets, else EXTRAPOLATE times the largest; `frame` gives the points."""
    from archhpo.report._isoflop import isoflop_points

    out: dict[str, Any] = {}
    if iso.get("vertices"):
        out["isoflop_profiles"] = lambda: plot_isoflop_profiles(iso, isoflop_points(frame))
    if iso.get("status") == "fitted":
        top = max(v["compute_budget"] for v in iso["vertices"])
        to = compute if compute is not None and compute > top else EXTRAPOLATE * top
        out["frontier"] = lambda: plot_frontier(iso, to)
    return out


__all__ = ["isoflop_plots", "plot_frontier", "plot_isoflop_profiles", "plot_isoflops"]
