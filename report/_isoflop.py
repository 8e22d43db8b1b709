"""Chinchilla's Approach 2 on an IsoFLOP study: per compute budget C, the N that minimises the loss,
then N_opt = G·C^a (Hoffmann et al. 2022, arXiv 2203.15556, §3.2).

Per C, a parabola of the loss in x = log N is fitted by iteratively reweighted least squares with
Huber weights, so one bad trial cannot move the vertex x* = -b/(2c), N_opt(C).  Its interval is a
parametric bootstrap from the residuals, N fixed: the relative residuals pooled over the budgets
(the noise is a common fraction of the loss), widened per draw by sqrt(dof / chi2(dof)) for that
estimate's own uncertainty, each draw refitted the same robust way.  A vertex at or beyond the
smallest or largest size, a parabola opening downward, or a lowest loss at the smallest or largest
size is flagged ``edge``: the grid does not bracket the optimum, and `recentre` names the sizes
that would.  log N_opt = log G + a log C is
fitted by weighted least squares (weights 1/variance of each log vertex) over the non-edge
vertices, a's 95% interval by refitting each bootstrap draw.  Status ``fitted`` needs at least 3
non-edge vertices, 95% of the replicates with every vertex finite, and a's interval inside (0, 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from archhpo.schema import ARCH_KEYS

N_BOOT = 1000
MIN_SIZES = 5
MIN_VERTICES = 3
HUBER_K = 1.345
COLUMN = "compute_budget"
SIZE_COLUMN = "isoflop_size"
METHOD = {
    "parabola": f"loss against log N, IRLS with Huber weights (k = {HUBER_K} robust standard deviations)",
    "interval": "95% percentile, parametric bootstrap from the residuals with N fixed",
    "law": "log N_opt = log G + a log C, weighted least squares over the non-edge vertices",
}


def _wls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Quadratic coefficients (c0, c1, c2) of each row of y (B, n) in x (n,), weights w (B, n)."""
    design = np.stack([np.ones_like(x), x, x * x], axis=1)  # (n, 3)
    lhs = np.einsum("bn,ni,nj->bij", w, design, design)
    rhs = np.einsum("bn,ni,bn->bi", w, design, y)
    return np.linalg.solve(lhs, rhs[:, :, None])[:, :, 0]


def _huber_weights(r: np.ndarray) -> np.ndarray:
    """Huber weights of residuals r (B, n): 1 within HUBER_K robust (MAD) standard deviations."""
    mad = 1.4826 * np.median(np.abs(r - np.median(r, axis=1, keepdims=True)), axis=1, keepdims=True)
    scale = np.maximum(mad, 1e-12)
    return np.minimum(1.0, HUBER_K * scale / np.maximum(np.abs(r), 1e-300))


def robust_parabola(x: np.ndarray, y: np.ndarray, iters: int = 30) -> np.ndarray:
    """Huber-IRLS quadratics (B, 3) of each row of y (B, n) in x (n,)."""
    y = np.atleast_2d(y)
    coef = _wls(x, y, np.ones_like(y))
    design = np.stack([np.ones_like(x), x, x * x], axis=1)
    for _ in range(iters):
        new = _wls(x, y, _huber_weights(y - coef @ design.T))
        done = np.allclose(new, coef, rtol=1e-10, atol=1e-13)
        coef = new
        if done:
            break
    return coef


def _vertex(coef: np.ndarray) -> np.ndarray:
    """x* per row of (c0, c1, c2): -c1/(2 c2); a downward parabola's is the lower-loss infinity."""
    coef = np.atleast_2d(coef)
    c1, c2 = coef[:, 1], coef[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = -c1 / (2 * c2)
    return np.where(c2 > 0, x, np.where(c1 < 0, np.inf, -np.inf))


def _interval(values: np.ndarray) -> list[float]:
    """2.5% and 97.5% of the draws, infinities kept (an open side); NaN without draws."""
    if not len(values):
        return [math.nan, math.nan]
    return [float(v) for v in np.quantile(values, [0.025, 0.975], method="inverted_cdf")]


def _centred(n: Sequence[float]) -> tuple[np.ndarray, float]:
    logn = np.log(np.asarray(n, dtype=float))
    return logn - logn.mean(), float(logn.mean())


def relative_residuals(n: Sequence[float], loss: Sequence[float]) -> tuple[float, int]:
    """Sum of squared relative residuals (r / fitted) of the robust parabola, and its n - 3 dof."""
    x, _ = _centred(n)
    y = np.asarray(loss, dtype=float)
    fitted = np.polyval(robust_parabola(x, y)[0][::-1], x)
    return float((((y - fitted) / fitted) ** 2).sum()), len(x) - 3


def noise_draws(ss: float, dof: int, n_boot: int, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """The relative noise s = sqrt(ss / dof) and per-draw factors sqrt(dof / chi2(dof)): each draw's
    noise is s times its factor, so the intervals carry s's own uncertainty (t-like, not normal)."""
    dof = max(1, dof)
    return math.sqrt(ss / dof), np.sqrt(dof / rng.chisquare(dof, n_boot))


def lowest_at_end(n: Sequence[float], loss: Sequence[float]) -> str | None:
    """"smallest" or "largest" where the size with the lowest mean loss (seeds of one size averaged)
    is the profile's smallest or largest, else None: a parabola's vertex inside the sizes is then
    its curvature's, read where the data have no minimum, so the grid does not bracket it."""
    sizes = np.asarray(n, dtype=float)
    values = np.asarray(loss, dtype=float)
    unique = np.unique(sizes)
    means = np.array([values[sizes == u].mean() for u in unique])
    best = int(np.argmin(means))
    return "smallest" if best == 0 else "largest" if best == len(unique) - 1 else None


def fit_profile(n: Sequence[float], loss: Sequence[float], n_boot: int = N_BOOT,
                rng: np.random.Generator | None = None,
                noise: tuple[float, np.ndarray] | None = None) -> dict[str, Any]:
    """One compute budget's profile: N_opt with its interval, the edge flag, the parabola (in
    log N minus ``x_mean``) and the bootstrap draws of log N_opt (``samples``). `noise`: the
    relative noise and per-draw factors (`noise_draws`; default: this profile's own residuals)."""
    x, x_mean = _centred(n)
    y = np.asarray(loss, dtype=float)
    rng = rng or np.random.default_rng(0)
    rel, scales = noise or noise_draws(*relative_residuals(n, loss), n_boot, rng)
    coef = robust_parabola(x, y)[0]
    fitted = np.polyval(coef[::-1], x)
    shocks = rng.normal(0.0, 1.0, (len(scales), len(x))) * (rel * scales)[:, None]
    samples = _vertex(robust_parabola(x, fitted[None, :] * (1 + shocks))) + x_mean
    est = float(_vertex(coef)[0])
    inside = bool(coef[2] > 0 and x.min() < est < x.max())
    lowest = lowest_at_end(n, loss) if inside else None  # only said where the vertex alone looks bracketed
    edge = lowest is not None or not inside
    n_ci = [float(np.exp(v)) if math.isfinite(v) else math.nan for v in _interval(samples)]
    return {"n_opt": {"estimate": float(np.exp(est + x_mean)) if math.isfinite(est) else math.nan, "ci95": n_ci},
            "edge": bool(edge), "opens_downward": bool(coef[2] <= 0), "lowest_at": lowest,
            "loss_opt": float(np.polyval(coef[::-1], est)) if math.isfinite(est) else math.nan,
            "parabola": {"coefficients": [float(c) for c in coef], "x_mean": x_mean, "relative_noise": rel},
            "sizes": [float(v) for v in np.exp(x + x_mean)], "samples": samples}


def _line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares (intercept, slope) of each row of y (B, m) on x (m,)."""
    design = np.stack([np.ones_like(x), x], axis=1)
    lhs = design.T @ (w[:, None] * design)
    return np.linalg.solve(lhs, design.T @ (w[:, None] * np.atleast_2d(y).T)).T


def _weights(draws: np.ndarray) -> np.ndarray:
    """1 / variance of each vertex's log N_opt, from its draws' central 68% (robust to far draws)."""
    lo, hi = np.quantile(draws, [0.16, 0.84], axis=1, method="inverted_cdf")
    sd = np.where(np.isfinite(hi - lo), (hi - lo) / 2, np.inf)
    return 1.0 / np.maximum(sd, 1e-9) ** 2


def fit_exponent(computes: np.ndarray, profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """N_opt = G·C^a over the non-edge vertices: a and G with a's interval from the vertices' draws."""
    keep = [i for i, p in enumerate(profiles) if not p["edge"]]
    out: dict[str, Any] = {"a": {"estimate": math.nan, "ci95": [math.nan, math.nan]}, "G": math.nan,
                           "n_vertices": len(keep)}
    if len(keep) < MIN_VERTICES:
        out["reason"] = (f"{len(keep)} of {len(profiles)} compute budgets have their vertex inside the sizes "
                         f"(at least {MIN_VERTICES} are needed); re-centre the edge budgets (recentre)")
        return out
    x = np.log(computes[keep])
    y = np.array([math.log(profiles[i]["n_opt"]["estimate"]) for i in keep])
    draws = np.stack([profiles[i]["samples"] for i in keep])  # (m, B)
    w = _weights(draws)
    intercept, slope = _line(x, y, w)[0]
    ok = np.isfinite(draws).all(axis=0)
    boot = _line(x, draws[:, ok].T, w)[:, 1] if ok.any() else np.empty(0)
    out.update(a={"estimate": float(slope), "ci95": _interval(boot)}, G=float(math.exp(intercept)),
               bootstrap_draws=int(ok.sum()))
    lo, hi = out["a"]["ci95"]
    if ok.mean() < 0.95:
        out["reason"] = (f"{int((~ok).sum())} of {len(ok)} bootstrap replicates put a vertex out of reach (a "
                         "parabola opening downward): a's interval is not resolved; add sizes or seeds")
    elif not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo and hi < 1):
        out["reason"] = f"a's 95% interval [{lo:.3g}, {hi:.3g}] is not inside (0, 1): the vertices do not resolve it"
    return out


def recentre(compute: float, profile: dict[str, Any], law: Mapping[str, Any] | None) -> dict[str, Any]:
    """The sizes that would centre an edge budget's grid on its optimum (the rule: docs/design.md §11)."""
    sizes = np.array(profile["sizes"])
    old, span, n = float(np.exp(np.log(sizes).mean())), float(sizes.max() / sizes.min()), len(set(sizes.round(6)))
    if law and math.isfinite(law.get("G", math.nan)) and law.get("status") == "fitted":
        centre, why = law["G"] * compute ** law["a"]["estimate"], "the fitted law's N_opt(C)"
    elif profile.get("lowest_at"):
        end = profile["lowest_at"]
        centre = float(sizes.min() if end == "smallest" else sizes.max())
        why = f"the lowest loss at the {end} size (the parabola's vertex inside is not the data's)"
    elif math.isfinite(profile["n_opt"]["estimate"]):
        centre = float(np.clip(profile["n_opt"]["estimate"], old / span, old * span))
        why = "the vertex beyond the sizes" + (" (at most one span away)" if centre != profile["n_opt"]["estimate"] else "")
    else:
        low_end = sizes.max() if profile["parabola"]["coefficients"][1] < 0 else sizes.min()
        centre, why = float(low_end), "the lower-loss edge (the parabola opens downward)"
    targets = [centre * span ** (i / (n - 1) - 0.5) for i in range(n)] if n > 1 else [centre]
    return {"compute_budget": float(compute), "centre": float(centre), "why": why, "sizes": targets,
            "command": f"--isoflop {compute:.3g} --centre {centre:.3g} --sizes {max(n, MIN_SIZES)} --span {span:.3g}"}


def windowed(c_all: np.ndarray, n_all: np.ndarray, l_all: np.ndarray,
             windows: Mapping[float, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points of each C trained by several plans (a re-centred one beside the first) cut to the
    `windows[C]` sizes nearest its lowest-loss size in log N (ties: the smaller size): a parabola in
    log N holds only near the minimum, so a pooled profile is fitted on one plan's worth of sizes,
    as a plan centred on its minimum would have trained. A C without a window, or within it, is whole."""
    keep = np.ones(len(n_all), dtype=bool)
    for c, count in windows.items():
        at = np.flatnonzero(c_all == c)
        if len(at) <= count:
            continue
        best = n_all[at][np.argmin(l_all[at])]
        order = sorted(range(len(at)), key=lambda i: (abs(math.log(n_all[at][i] / best)), n_all[at][i]))
        keep[at] = False
        keep[at[order[:count]]] = True
    return c_all[keep], n_all[keep], l_all[keep]


def fit_isoflops(computes: Sequence[float], n: Sequence[float], loss: Sequence[float], *, k: float | None = None,
                 n_boot: int = N_BOOT, seed: int = 0, windows: Mapping[float, int] | None = None) -> dict[str, Any]:
    """Approach 2 on points (C, N, L): the ``isoflop_fit`` of the scaling-fit JSON (bootstrap draws
    kept in memory under ``samples``); `k` the FLOPs per parameter-token for D_opt = C/(k N_opt);
    `windows`: per C, the most sizes one plan trained there (`windowed`; pooled plans only)."""
    c_all, n_all, l_all = (np.asarray(v, dtype=float) for v in (computes, n, loss))
    if windows:
        c_all, n_all, l_all = windowed(c_all, n_all, l_all, windows)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"status": "too_few_points", "reason": None, "approach": 2, "method": dict(METHOD),
                           "a": {"estimate": None, "ci95": None}, "G": None, "k": k, "vertices": [], "recentre": []}
    budgets = sorted(set(c_all))
    used = [c for c in budgets if len(set(n_all[c_all == c])) >= MIN_SIZES]
    short = len(budgets) - len(used)
    if not used:
        out["reason"] = (f"no compute budget has {MIN_SIZES} sizes or more (a parabola needs them); "
                         "plan --sizes 5 or more per --isoflop C")
        return out
    pooled = [relative_residuals(n_all[c_all == c], l_all[c_all == c]) for c in used]
    noise = noise_draws(sum(p[0] for p in pooled), sum(p[1] for p in pooled), n_boot, rng)
    profiles = [fit_profile(n_all[c_all == c], l_all[c_all == c], n_boot, rng, noise) for c in used]
    out["method"]["noise"] = (f"relative residual sd {noise[0]:.3g}, pooled over the compute budgets "
                              f"({sum(p[1] for p in pooled)} degrees of freedom)")
    law = fit_exponent(np.array(used), profiles)
    fitted = "reason" not in law
    out.update(status="fitted" if fitted else "unresolved", reason=law.pop("reason", None), **law)
    if short:
        out["skipped"] = f"{short} compute budget(s) with fewer than {MIN_SIZES} sizes left out"
    for c, p in zip(used, profiles, strict=True):
        vertex = {"compute_budget": float(c), **p}
        if k and math.isfinite(p["n_opt"]["estimate"]):
            vertex["d_opt"] = c / (k * p["n_opt"]["estimate"])
        out["vertices"].append(vertex)
    out["recentre"] = [recentre(v["compute_budget"], v, out) for v in out["vertices"] if v["edge"]]
    return out


def with_compute_budgets(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with ``compute_budget`` numeric, and filled in for a trial that lacks it but belongs
    to an IsoFLOP budget (one C per study): a retried trial may not carry its planned attributes."""
    out = frame.copy()
    if COLUMN not in out:
        out[COLUMN] = np.nan
    out[COLUMN] = pd.to_numeric(out[COLUMN], errors="coerce")
    known = out.dropna(subset=[COLUMN]).groupby("budget")[COLUMN].agg(lambda c: c.iloc[0] if c.nunique() == 1 else np.nan)
    out[COLUMN] = out[COLUMN].fillna(out["budget"].map(known))
    missing = out[SIZE_COLUMN].isna() & out[COLUMN].notna() if SIZE_COLUMN in out else None
    if missing is not None and missing.any():
        sizes = out.dropna(subset=[SIZE_COLUMN]).drop_duplicates(["budget", "param_count"])
        keyed = sizes.set_index(["budget", "param_count"])[SIZE_COLUMN]
        numeric = pd.api.types.is_numeric_dtype(out[SIZE_COLUMN])
        out[SIZE_COLUMN] = out[SIZE_COLUMN].astype(float if numeric else object)
        out.loc[missing, SIZE_COLUMN] = [keyed.get((b, n), np.nan) for b, n in zip(
            out.loc[missing, "budget"], out.loc[missing, "param_count"], strict=True)]
    return out


def isoflop_points(frame: pd.DataFrame) -> pd.DataFrame:
    """One point per (C, architecture): its mean loss over seeds; the best architecture per planned
    size (``isoflop_size``) where the frame records it (--shapes K)."""
    done = with_compute_budgets(frame)  # a retry's C and size from its study and its failed attempt
    done = done[(done["state"] == "COMPLETE") & done["val_loss"].notna() & done[COLUMN].notna()
                & done["param_count"].notna()]
    keys = [COLUMN, "param_count", *(c for c in ARCH_KEYS if c in done)]
    # A size's position is its own study's: a re-centred plan of the same C (another experiment,
    # pooled from CSVs) numbers its sizes afresh, so the best shape per size is taken per study.
    study = [c for c in ("experiment", "budget") if c in done]
    cols = {"val_loss": "mean", "train_tokens": "mean", "train_flops": "mean"}
    if SIZE_COLUMN in done:
        cols[SIZE_COLUMN] = "first"
    pts = done.groupby(study + keys, dropna=False, as_index=False).agg(cols)
    if SIZE_COLUMN in pts and pts[SIZE_COLUMN].notna().all():
        pts = pts.sort_values("val_loss", kind="stable").drop_duplicates(study + [COLUMN, SIZE_COLUMN])
    # one point per architecture at one C, whichever plans trained it
    pts = pts.groupby(keys, dropna=False, as_index=False).agg(cols)
    return pts.sort_values([COLUMN, "param_count"], kind="stable").reset_index(drop=True)


def plan_widths(frame: pd.DataFrame) -> dict[float, int]:
    """Per C trained by more than one plan (a study with at least MIN_SIZES sizes there), the most
    sizes one of them trained; a table whose studies hold one size each has no plans to pool."""
    done = with_compute_budgets(frame)
    done = done[(done["state"] == "COMPLETE") & done[COLUMN].notna() & done["param_count"].notna()]
    study = [c for c in ("experiment", "budget") if c in done]
    if not study or done.empty:
        return {}
    sizes = done.groupby([COLUMN, *study])["param_count"].nunique()
    plans = sizes[sizes >= MIN_SIZES]
    return {float(c): int(s.max()) for c, s in plans.groupby(level=0) if len(s) > 1}


def isoflop_fit(frame: pd.DataFrame, nd: Mapping[str, Any] | None = None, n_boot: int = N_BOOT,
                seed: int = 0) -> dict[str, Any]:
    """The ``isoflop_fit`` of an experiment's trials frame (its ``compute_budget`` column), with
    ``agreement``: whether Approach 2's a and Approach 3's (`nd`, the ``nd_fit``) agree."""
    if frame.empty or COLUMN not in frame.columns or pd.to_numeric(frame[COLUMN], errors="coerce").isna().all():
        out: dict[str, Any] = {"status": "none", "reason": "no trial records a compute budget: not an IsoFLOP study",
                               "a": {"estimate": None, "ci95": None}, "vertices": [], "recentre": []}
    else:
        pts = isoflop_points(frame)
        flops = pts["train_flops"] / (pts["param_count"] * pts["train_tokens"])
        k = float(flops.median()) if flops.notna().any() else None
        out = fit_isoflops(pts[COLUMN], pts["param_count"], pts["val_loss"], k=k, n_boot=n_boot, seed=seed,
                           windows=plan_widths(frame))
    out["agreement"] = agreement(out, nd)
    return out


def nd_exponent(nd: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Approach 3's a (``nd_fit.compute_optimal.a``, else from its bootstrap samples); None unfitted."""
    if not nd or nd.get("status") != "fitted":
        return None
    answer = (nd.get("compute_optimal") or {}).get("a")
    if answer:
        return dict(answer)
    samples = np.asarray(nd.get("samples", np.empty((0, 5))))
    if not len(samples):
        return None
    a = samples[:, 4] / (samples[:, 3] + samples[:, 4])
    return {"estimate": float(a[0]), "ci95": _interval(a[1:][np.isfinite(a[1:])])}


def agreement(iso: Mapping[str, Any], nd: Mapping[str, Any] | None) -> dict[str, Any]:
    """Whether the two a's agree: their 95% intervals overlap; a sentence either way."""
    a3 = nd_exponent(nd)
    if iso.get("status") != "fitted" or a3 is None:
        missing = [name for name, ok in (("Approach 2", iso.get("status") == "fitted"), ("Approach 3", a3 is not None))
                   if not ok]
        return {"agree": None, "sentence": f"The two estimates of a cannot be compared: {' and '.join(missing)} "
                                           f"{'is' if len(missing) == 1 else 'are'} not fitted."}
    (lo2, hi2), (lo3, hi3) = iso["a"]["ci95"], a3["ci95"]
    agree = bool(max(lo2, lo3) <= min(hi2, hi3))
    text = (f"Approach 2's a = {iso['a']['estimate']:.3f} [{lo2:.3f}, {hi2:.3f}] and Approach 3's a = "
            f"{a3['estimate']:.3f} [{lo3:.3f}, {hi3:.3f}] " + ("agree (their 95% intervals overlap)." if agree else
                                                             "disagree (their 95% intervals do not overlap)."))
    return {"agree": agree, "approach_2": iso["a"], "approach_3": a3, "sentence": text}


def collinear(tokens_per_param: Sequence[float]) -> str | None:
    """A sentence when every point trains one tokens-per-parameter ratio: D is then a fixed multiple
    of N, so L(N, D) cannot tell the N term from the D term (None when the ratios differ)."""
    ratios = {round(float(r), 6) for r in tokens_per_param if r is not None and math.isfinite(float(r))}
    if len(ratios) != 1:
        return None
    return (f"Every point trains {next(iter(ratios)):g} tokens per parameter: D is collinear with N, so L(N, D) "
            "cannot separate its N and D terms; add a second --tokens-per-param or plan an IsoFLOP study.")


def _n_text(n_opt: Mapping[str, Any]) -> str:
    est, (lo, hi) = n_opt["estimate"], n_opt["ci95"]
    side = lambda v: f"{v:.3g}" if v is not None and math.isfinite(v) else "open"  # noqa: E731
    return f"{side(est)} [{side(lo)}, {side(hi)}]"


def isoflop_lines(iso: Mapping[str, Any]) -> list[str]:
    """The fit in words, for the page and the terminal: the law or why none, each vertex (edge ones
    said so), the command that would re-centre each edge budget, and the agreement of the two a's."""
    if iso.get("status") == "none":
        return []
    if iso.get("status") == "fitted":
        a, (lo, hi) = iso["a"]["estimate"], iso["a"]["ci95"]
        k = f"{iso['k']:.3g}" if iso.get("k") else "k"
        lines = [f"IsoFLOP (Approach 2): N_opt = {iso['G']:.3g}·C^{a:.3f}, a's 95% interval [{lo:.3f}, {hi:.3f}], over "
                 f"{iso['n_vertices']} compute budgets; D_opt = C/({k}·N_opt)."]
    else:
        lines = [f"IsoFLOP (Approach 2): no law: {iso.get('reason')}."]
    for v in iso.get("vertices") or []:
        edge = ("" if not v["edge"] else f" (edge: the lowest loss is at the {v['lowest_at']} size)"
                if v.get("lowest_at") else " (edge: the optimum is not inside the sizes)")
        lines.append(f"C = {v['compute_budget']:.3g}: N_opt = {_n_text(v['n_opt'])}{edge}")
    for r in iso.get("recentre") or []:
        sizes = ", ".join(f"{x:.3g}" for x in r["sizes"])
        lines.append(f"re-centre C = {r['compute_budget']:.3g} on {r['why']}: {r['command']} (sizes {sizes})")
    said = (iso.get("agreement") or {}).get("sentence")
    return [*lines, *([said] if said else [])]


__all__ = ["agreement", "collinear", "fit_exponent", "fit_isoflops", "fit_profile", "isoflop_fit", "isoflop_lines", "isoflop_points",
           "lowest_at_end", "nd_exponent",
           "with_compute_budgets",
           "recentre", "robust_parabola"]
