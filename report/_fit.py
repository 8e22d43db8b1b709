"""The scaling law L(N) = E + A * N^-alpha, fitted to the best trial of each budget.

Fit (after Hoffmann et al. 2022 and the replication of Besiroglu et al. 2024): parameters
e = log E, a = log A and alpha; the predicted log loss is logsumexp(e, a - alpha log N); the
objective is the Huber loss (delta 1e-3) of the residuals log L_pred - log L_obs, minimised by
L-BFGS-B from a grid of starting points (the best end point wins).  95% intervals: percentile
intervals over bootstrap refits on budget points resampled with replacement (resamples with
fewer than three distinct budgets cannot identify three parameters and are drawn again).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from scipy.optimize import minimize

LAW = "L(N) = E + A * N^-alpha"
DELTA = 1e-3
N_BOOT = 1000
MIN_BUDGETS = 3
_ALPHA_BOUNDS = (1e-4, 4.0)


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """OpenBLAS threads make L-BFGS-B's tiny BLAS calls slow (on a busy 2-core machine ~10x):
    run the fit with one BLAS thread in every OpenBLAS this process loaded, then restore."""
    restore = []
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line.lower() and "/" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, put in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                         ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
                         ("openblas_get_num_threads", "openblas_set_num_threads")):
            if hasattr(lib, get) and hasattr(lib, put):
                before = getattr(lib, get)()
                getattr(lib, put)(1)
                restore.append((getattr(lib, put), before))
                break
    try:
        yield
    finally:
        for put_fn, before in restore:
            put_fn(before)


def _objective(theta: np.ndarray, logn: np.ndarray, logl: np.ndarray, delta: float) -> tuple[float, np.ndarray]:
    e, a, alpha = theta
    t = a - alpha * logn
    pred = np.logaddexp(e, t)
    r = pred - logl
    absr = np.abs(r)
    # Huber, divided by delta so its scale does not depend on delta (gradients of order 1).
    inner = absr <= delta
    loss = np.where(inner, 0.5 * r * r / delta, absr - 0.5 * delta).sum()
    dr = np.where(inner, r / delta, np.sign(r))
    w_e = np.exp(e - pred)  # d pred / d e
    w_t = 1.0 - w_e  # d pred / d t
    grad = np.array([(dr * w_e).sum(), (dr * w_t).sum(), -(dr * w_t * logn).sum()])
    return float(loss), grad


def _starts(logn: np.ndarray, logl: np.ndarray, coarse: bool) -> list[np.ndarray]:
    lmin = float(np.exp(logl.min()))
    n_mid = float(np.exp(np.median(logn)))
    l_mid = float(np.exp(np.median(logl)))
    fractions = (0.5, 0.9) if coarse else (0.1, 0.6, 0.9)
    alphas = (0.1, 0.4) if coarse else (0.08, 0.2, 0.4, 0.8)
    out = []
    for frac, alpha in itertools.product(fractions, alphas):
        e0 = frac * lmin
        a0 = max(l_mid - e0, 1e-6 * l_mid) * n_mid**alpha
        out.append(np.array([math.log(e0), math.log(a0), alpha]))
    return out


def _bounds(logn: np.ndarray, logl: np.ndarray) -> list[tuple[float, float]]:
    top = float(logl.max()) + 1.0
    return [(-30.0, top), (-30.0, top + _ALPHA_BOUNDS[1] * float(logn.max()) + 5.0), _ALPHA_BOUNDS]


def _per_problem(theta: np.ndarray, logn: np.ndarray, logl: np.ndarray, weights: np.ndarray,
                 delta: float) -> np.ndarray:
    """The objective of B problems at once: theta (B, 3), weights (B, k) = each point's count."""
    t = theta[:, 1:2] - theta[:, 2:3] * logn[None, :]
    r = np.logaddexp(theta[:, 0:1], t) - logl[None, :]
    absr = np.abs(r)
    return (weights * np.where(absr <= delta, 0.5 * r * r / delta, absr - 0.5 * delta)).sum(1)


def _lm_batch(logn: np.ndarray, logl: np.ndarray, weights: np.ndarray, theta0: np.ndarray, delta: float,
              iters: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the same Huber objective for B problems at once (the bootstrap refits) by
    Levenberg-Marquardt steps on its iteratively reweighted least-squares form, vectorised in
    numpy: a step is kept only where it lowers that problem's objective, so every problem
    descends monotonically from its start."""
    lo = np.array([b[0] for b in _bounds(logn, logl)])
    hi = np.array([b[1] for b in _bounds(logn, logl)])
    theta = np.clip(theta0.astype(float).copy(), lo, hi)
    f = _per_problem(theta, logn, logl, weights, delta)
    lam = np.full(len(theta), 1e-3)
    eye = np.eye(3)[None]
    active = np.ones(len(theta), dtype=bool)
    for _ in range(iters):
        if not active.any():
            break
        th, w = theta[active], weights[active]
        e, a, alpha = th[:, 0:1], th[:, 1:2], th[:, 2:3]
        pred = np.logaddexp(e, a - alpha * logn[None, :])
        r = pred - logl[None, :]
        absr = np.abs(r)
        irls = w * np.where(absr <= delta, 1.0 / delta, 1.0 / np.maximum(absr, delta))
        w_e = np.exp(e - pred)
        w_t = 1.0 - w_e
        jac = np.stack([w_e, w_t, -w_t * logn[None, :]], axis=-1)  # (b, k, 3)
        grad = np.einsum("bk,bkj->bj", irls * r, jac)
        hess = np.einsum("bk,bki,bkj->bij", irls, jac, jac)
        diag = np.einsum("bii->bi", hess)[:, :, None] * eye
        damped = hess + lam[active, None, None] * (diag + 1e-12 * eye)
        try:
            step = -np.linalg.solve(damped, grad[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            step = -grad * 1e-3
        new = np.clip(th + step, lo, hi)
        f_new = _per_problem(new, logn, logl, w, delta)
        ok = f_new < f[active]
        idx = np.flatnonzero(active)
        theta[idx[ok]] = new[ok]
        small = np.abs(step).max(1) < 1e-10
        f[idx[ok]] = f_new[ok]
        lam[idx[ok]] = np.maximum(lam[idx[ok]] * 0.3, 1e-9)
        lam[idx[~ok]] *= 10.0
        active[idx[small | (lam[idx] > 1e10)]] = False
    return theta, f


def _fit_once(logn: np.ndarray, logl: np.ndarray, starts: list[np.ndarray], delta: float) -> tuple[np.ndarray, float]:
    """L-BFGS-B from every starting point of the grid; the best end point, polished by a few
    Levenberg-Marquardt steps (which can only lower the objective)."""
    bounds = _bounds(logn, logl)
    best_x, best_f = None, math.inf
    for x0 in starts:
        x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
        res = minimize(_objective, x0, args=(logn, logl, delta), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": 300})
        if np.all(np.isfinite(res.x)) and res.fun < best_f:
            best_x, best_f = res.x, float(res.fun)
    assert best_x is not None
    theta, f = _lm_batch(logn, logl, np.ones((1, len(logn))), best_x[None, :], delta)
    return theta[0], float(f[0])


def _natural(theta: np.ndarray) -> tuple[float, float, float]:
    return float(math.exp(theta[0])), float(math.exp(theta[1])), float(theta[2])


def predict(fit: dict[str, Any], n: Any, params: tuple[float, float, float] | None = None) -> np.ndarray:
    """L(N) of a fit (or of explicit (E, A, alpha)) at the parameter counts `n`."""
    if params is None:
        params = (fit["E"]["estimate"], fit["A"]["estimate"], fit["alpha"]["estimate"])
    e, a, alpha = params
    return e + a * np.asarray(n, dtype=float) ** -alpha


def band(fit: dict[str, Any], n: Any, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise interval of L(N) over the bootstrap refits (``fit["samples"]``)."""
    samples = np.asarray(fit.get("samples", []), dtype=float)
    n = np.asarray(n, dtype=float)
    if samples.size == 0:
        mid = predict(fit, n)
        return mid, mid
    curves = samples[:, 0:1] + samples[:, 1:2] * n[None, :] ** -samples[:, 2:3]
    tail = (1 - level) / 2 * 100
    return np.percentile(curves, tail, axis=0), np.percentile(curves, 100 - tail, axis=0)


def fit_law(
    n: Any,
    loss: Any,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    delta: float = DELTA,
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Fit L(N) = E + A N^-alpha to points (N, L); see the module docstring.

    Returns the keys of ``{experiment}_scaling_fit.json`` (``law``, ``n_budgets``, ``points``,
    ``E``, ``A``, ``alpha`` as ``{"estimate", "ci95"}``, ``method``; ``reason`` when there is no
    fit) plus ``samples``, an (n_boot, 3) array of bootstrap (E, A, alpha) (not written to JSON).
    """
    with _one_blas_thread():
        return _fit_law(n, loss, n_boot, seed, delta, labels)


def _fit_law(n: Any, loss: Any, n_boot: int, seed: int, delta: float, labels: list[str] | None) -> dict[str, Any]:
    n = np.asarray(n, dtype=float)
    loss = np.asarray(loss, dtype=float)
    labels = labels or [str(int(x)) for x in n]
    points = [{"budget": b, "param_count": int(x), "val_loss": float(v)} for b, x, v in zip(labels, n, loss, strict=True)]
    method: dict[str, Any] = {
        "objective": f"Huber loss (delta {delta:g}) of log(L_pred) - log(L_obs)",
        "parametrisation": "E = exp(e), A = exp(a); log L_pred = logsumexp(e, a - alpha log N)",
        "optimizer": "scipy.optimize.minimize L-BFGS-B from a grid of starting points",
        "interval": f"95% percentile bootstrap, {n_boot} resamples of the budget points "
                    f"(resamples with fewer than {MIN_BUDGETS} distinct budgets redrawn), seed {seed}; "
                    "each refit minimises the same objective from the full-data estimate and from a "
                    "grid start by vectorised Levenberg-Marquardt (IRLS) steps, keeping the better end",
    }
    out: dict[str, Any] = {"law": LAW, "n_budgets": len(points), "points": points,
                           "E": None, "A": None, "alpha": None, "method": method}
    ok = np.isfinite(n) & np.isfinite(loss) & (n > 0) & (loss > 0)
    n_distinct = len(set(n[ok].tolist()))
    if n_distinct < MIN_BUDGETS:
        if not np.all(ok):
            why = "positive finite losses"
        else:
            why = "different parameter counts"
        out["reason"] = (f"fitting E, A and alpha needs at least {MIN_BUDGETS} budgets with a finished trial "
                         f"(and {why}); this experiment has {n_distinct}")
        out["samples"] = np.empty((0, 3))
        return out
    logn, logl = np.log(n[ok]), np.log(loss[ok])
    theta, fun = _fit_once(logn, logl, _starts(logn, logl, coarse=False), delta)
    method["starts"] = len(_starts(logn, logl, coarse=False))
    rng = np.random.default_rng(seed)
    k = len(logn)
    chosen: list[np.ndarray] = []
    draws = 0
    while len(chosen) < n_boot and draws < 50 * n_boot:
        draws += 1
        idx = rng.integers(0, k, size=k)
        if len(set(logn[idx].tolist())) >= MIN_BUDGETS:
            chosen.append(np.bincount(idx, minlength=k))
    i = len(chosen)
    samples = np.empty((0, 3))
    if i:
        weights = np.array(chosen, dtype=float)
        # every refit from the full-data estimate and from a second start; each keeps its better end
        best_t, best_f = _lm_batch(logn, logl, weights, np.tile(theta, (i, 1)), delta)
        for start in _starts(logn, logl, coarse=True)[:1]:
            t2, f2 = _lm_batch(logn, logl, weights, np.tile(start, (i, 1)), delta)
            better = f2 < best_f
            best_t[better], best_f[better] = t2[better], f2[better]
        samples = np.column_stack([np.exp(best_t[:, 0]), np.exp(best_t[:, 1]), best_t[:, 2]])
    e, a, alpha = _natural(theta)
    for name, est, col in (("E", e, 0), ("A", a, 1), ("alpha", alpha, 2)):
        lo, hi = (np.percentile(samples[:, col], [2.5, 97.5]) if i else (math.nan, math.nan))
        out[name] = {"estimate": est, "ci95": [float(lo), float(hi)]}
    method["bootstrap_resamples"] = i
    out["objective"] = fun
    out["formula"] = f"L(N) = {e:.4g} + {a:.4g} * N^-{alpha:.4g}"
    out["samples"] = samples
    return out


def fit_scaling_law(frame: Any, *, n_boot: int = N_BOOT, seed: int = 0, delta: float = DELTA) -> dict[str, Any]:
    """Fit L(N) = E + A N^-alpha to the best trial of each budget of a `trials_frame` frame
    (N = its exact parameter count).  Budgets without a finished trial are left out; with
    fewer than three points E, A and alpha are None and ``reason`` says why.  The returned
    dict is what ``{experiment}_scaling_fit.json`` holds, plus ``samples`` (bootstrap
    (E, A, alpha) rows) for drawing the band with `band`."""
    from archhpo.report._frame import best_and_runner_up

    labels, ns, losses, trials = [], [], [], []
    for budget, (best, _) in best_and_runner_up(frame).items():
        if best is None:
            continue
        labels.append(budget)
        ns.append(best["param_count"])
        losses.append(best["val_loss"])
        trials.append(int(best["trial"]))
    out = fit_law(ns, losses, n_boot=n_boot, seed=seed, delta=delta, labels=labels)
    for point, trial in zip(out["points"], trials, strict=True):
        point["trial"] = trial
    return out


def fit_json(fit: dict[str, Any]) -> dict[str, Any]:
    """The fit without its in-memory bootstrap samples, NaN written as null."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return clean({k: v for k, v in fit.items() if k != "samples"})


__all__ = ["LAW", "band", "fit_json", "fit_law", "fit_scaling_law", "predict"]
