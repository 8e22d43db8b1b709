"""The law L(N, D) = E + A/N^alpha + B/D^beta and the compute-optimal allocation it implies.

Fitted as Epoch AI's replication of Chinchilla's approach 3 (Besiroglu et al. 2024, arXiv
2404.10102): e = log E, a = log A, b = log B, alpha, beta; log L_pred = logsumexp(e, a - alpha log
N, b - beta log D); the Huber loss (delta 1e-3) of log L_pred - log L_obs, minimised by L-BFGS-B
from a grid of starts; 95% intervals over a parametric bootstrap as for L(N) (`archhpo.report._fit`,
points minus 5 degrees of freedom).  A point is the best trial of one (budget, tokens per parameter)
study: N its exact parameter count, D its tokens, C its exact training FLOPs.

With C = k N D (k the points' median FLOPs per parameter per token), minimising L at fixed C gives
N*(C) = G (C/k)^a and D*(C) = (C/k)/N*, a = beta/(alpha+beta), G = (alpha A / (beta B))^(1/(alpha+beta)),
with intervals from the same refits.  Status as for L(N) (`law_status`): ``too_few_points`` (at
least two D per budget, or D varying with N over 4 points), ``interpolation`` (no more points than
5), ``unresolved`` (as for L(N), or a prefactor's interval at its bound), or ``fitted``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from scipy.optimize import minimize

from archhpo.report._fit import (
    DELTA,
    LS_DELTA,
    N_BOOT,
    e_unresolved,
    exponent_unresolved,
    floor_unresolved,
    law_status,
    noisy_losses,
    residual_noise,
)
from archhpo.report._fitopt import LOG_FLOOR, _one_blas_thread

LAW = "L(N, D) = E + A/N^alpha + B/D^beta"
N_PARAMS = 5
EXP_BOUNDS = (1e-4, 3.0)
MIN_POINTS = 4


def _pred(theta: np.ndarray, logn: np.ndarray, logd: np.ndarray) -> tuple[np.ndarray, ...]:
    """log L_pred and the softmax weights of its three terms; theta (B, 5), points (B, k) or (k,)."""
    terms = np.stack([np.broadcast_to(theta[:, 0:1], np.broadcast_shapes(theta[:, 0:1].shape, logn.shape)),
                      theta[:, 1:2] - theta[:, 3:4] * logn, theta[:, 2:3] - theta[:, 4:5] * logd])
    top = terms.max(0)
    w = np.exp(terms - top)
    total = w.sum(0)
    return top + np.log(total), w / total


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r / delta, a - 0.5 * delta)


def _objective(theta: np.ndarray, logn: np.ndarray, logd: np.ndarray, logl: np.ndarray,
               delta: float) -> tuple[float, np.ndarray]:
    pred, w = _pred(theta[None, :], logn, logd)
    r = pred[0] - logl
    dr = np.clip(r / delta, -1.0, 1.0)
    grad = np.array([(dr * w[0, 0]).sum(), (dr * w[1, 0]).sum(), (dr * w[2, 0]).sum(),
                     -(dr * w[1, 0] * logn).sum(), -(dr * w[2, 0] * logd).sum()])
    return float(_huber(r, delta).sum()), grad


def _bounds(logn: np.ndarray, logd: np.ndarray, logl: np.ndarray) -> list[tuple[float, float]]:
    top = float(logl.max()) + 1.0
    return [(LOG_FLOOR, top), (LOG_FLOOR, top + EXP_BOUNDS[1] * float(logn.max()) + 5.0),
            (LOG_FLOOR, top + EXP_BOUNDS[1] * float(logd.max()) + 5.0), EXP_BOUNDS, EXP_BOUNDS]


def _starts(logn: np.ndarray, logd: np.ndarray, logl: np.ndarray) -> list[np.ndarray]:
    lmin, l_mid = float(np.exp(logl.min())), float(np.exp(np.median(logl)))
    n_mid, d_mid = float(np.exp(np.median(logn))), float(np.exp(np.median(logd)))
    out = []
    for frac, alpha, beta, share in itertools.product((0.3, 0.6, 0.9), (0.2, 0.5, 1.0), (0.2, 0.5, 1.0),
                                                      (0.25, 0.75)):
        e0 = frac * lmin
        reducible = max(l_mid - e0, 1e-6 * l_mid)
        out.append(np.array([math.log(e0), math.log(share * reducible * n_mid**alpha),
                             math.log((1 - share) * reducible * d_mid**beta), alpha, beta]))
    return out


def _fit_once(logn: np.ndarray, logd: np.ndarray, logl: np.ndarray, delta: float,
              starts: list[np.ndarray]) -> np.ndarray:
    bounds = _bounds(logn, logd, logl)
    lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    best_x, best_f = starts[0], math.inf
    for x0 in starts:
        res = minimize(_objective, np.clip(x0, lo, hi), args=(logn, logd, logl, delta), jac=True,
                       method="L-BFGS-B", bounds=bounds, options={"maxiter": 500})
        if np.all(np.isfinite(res.x)) and res.fun < best_f:
            best_x, best_f = res.x, float(res.fun)
    return np.asarray(best_x, dtype=float)


def _refits(logn: np.ndarray, logd: np.ndarray, logl: np.ndarray, theta: np.ndarray, weights: np.ndarray,
            delta: float, iters: int = 200) -> np.ndarray:
    """Every bootstrap problem at once (weights (B, k) = each point's count), by damped Gauss-Newton
    steps on the IRLS form of the Huber objective from the full-data estimate; a step is kept only
    where it lowers that problem's objective."""
    bounds = _bounds(logn, logd, logl)
    lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    th = np.tile(theta, (len(weights), 1))

    def objective(t: np.ndarray) -> np.ndarray:
        return (weights * _huber(_pred(t, logn, logd)[0] - logl, delta)).sum(1)

    f, lam = objective(th), np.full(len(th), 1e-3)
    for _ in range(iters):
        pred, w = _pred(th, logn, logd)
        r = pred - logl
        irls = weights * np.where(np.abs(r) <= delta, 1.0 / delta, 1.0 / np.maximum(np.abs(r), delta))
        jac = np.stack([w[0], w[1], w[2], -w[1] * logn, -w[2] * logd], axis=-1)  # (B, k, 5)
        grad = np.einsum("bk,bkj->bj", irls * r, jac)
        hess = np.einsum("bk,bki,bkj->bij", irls, jac, jac)
        diag = np.einsum("bii->bi", hess)[:, :, None] * np.eye(5)[None]
        step = -np.linalg.solve(hess + lam[:, None, None] * (diag + 1e-9 * np.eye(5)[None]), grad[:, :, None])[..., 0]
        new = np.clip(th + step, lo, hi)
        f_new = objective(new)
        ok = f_new < f
        th[ok], f[ok] = new[ok], f_new[ok]
        lam = np.where(ok, np.maximum(lam * 0.3, 1e-9), lam * 10.0)
        if np.all(lam > 1e8) or np.abs(step).max() < 1e-10:
            break
    return th


def enough_data(n: np.ndarray, d: np.ndarray, budgets: list[Any]) -> str | None:
    """None when the points can separate N from D; else why not (module docstring)."""
    per_budget: dict[Any, set[float]] = {}
    for b, x in zip(budgets, d, strict=True):
        per_budget.setdefault(b, set()).add(round(float(x), 6))
    if any(len(v) >= 2 for v in per_budget.values()):
        return None
    if len(set(np.round(d, 6))) >= 2 and len(n) >= MIN_POINTS:
        return None
    return ("fitting L(N, D) needs at least two token counts D at one budget (several --tokens-per-param), "
            f"or D varying with N over at least {MIN_POINTS} (N, D) points; this experiment has {len(n)} point(s)")


def _interval(values: np.ndarray) -> list[float]:
    return [float(x) for x in np.percentile(values, [2.5, 97.5])] if len(values) else [math.nan, math.nan]


def optimum_rows(samples: np.ndarray, k: float, compute: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N*(C), D*(C) and the law's loss there, per row (E, A, B, alpha, beta) of `samples`."""
    e, a, b, alpha, beta = (samples[:, i] for i in range(5))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        g = (alpha * a / (beta * b)) ** (1.0 / (alpha + beta))
        n_opt = g * (compute / k) ** (beta / (alpha + beta))
        d_opt = (compute / k) / n_opt
        return n_opt, d_opt, e + a * n_opt**-alpha + b * d_opt**-beta


def allocation(samples: np.ndarray, k: float, compute: float) -> dict[str, Any]:
    """N*(C), D*(C), their ratio D*/N*, the law's loss there and the exponents a, b for bootstrap
    rows (E, A, B, alpha, beta); estimate = row 0, each interval over the other rows (each row at
    its own N* and D*)."""
    alpha, beta = samples[:, 3], samples[:, 4]
    n_opt, d_opt, loss = optimum_rows(samples, k, compute)
    out = {}
    for name, v in (("a", beta / (alpha + beta)), ("b", alpha / (alpha + beta)), ("N", n_opt), ("D", d_opt),
                    ("tokens_per_param", d_opt / n_opt), ("loss", loss)):
        rest = v[1:][np.isfinite(v[1:])]
        out[name] = {"estimate": float(v[0]), "ci95": _interval(rest)}
    return out


def fit_nd_law(n: Any, d: Any, loss: Any, flops: Any, *, budgets: list[Any] | None = None, n_boot: int = N_BOOT,
               seed: int = 0, delta: float = DELTA, noise: tuple[float, int] | None = None,
               floor: float | None = None) -> dict[str, Any]:
    """Fit L(N, D) to points (N, D, L) with C their training FLOPs; the ``nd_fit`` of
    ``{experiment}_scaling_fit.json`` plus ``samples`` (bootstrap rows) and ``k``. `noise`
    (measured seed noise: sd of log L, degrees of freedom) and `floor` (the data's known least
    loss) as for `archhpo.report._fit.fit_law`."""
    with _one_blas_thread():
        return _fit_nd(n, d, loss, flops, budgets, n_boot, seed, delta, noise, floor)


def _nd_skeleton(n: np.ndarray, d: np.ndarray, loss: np.ndarray, flops: np.ndarray, delta: float,
                 seed: int) -> dict[str, Any]:
    return {"law": LAW, "status": "too_few_points", "reason": None, "n_points": int(len(n)),
            "points": [{"param_count": int(a), "train_tokens": int(b), "val_loss": float(c), "train_flops": float(f)}
                       for a, b, c, f in zip(n, d, loss, flops, strict=True)],
            **{k: None for k in ("E", "A", "B", "alpha", "beta", "compute_optimal")},
            "method": {"objective": f"Huber loss (delta {delta:g}) of log(L_pred) - log(L_obs)",
                       "optimizer": "L-BFGS-B from a grid of starting points",
                       "interval": "95% percentile parametric bootstrap: refits on the fitted log losses plus "
                                   "Gaussian noise at the same (N, D) points, of the sd in noise widened by "
                                   f"t(0.975, dof) / z(0.975), seed {seed}"}}


def _nd_unresolved(out: dict[str, Any], boot: np.ndarray, bounds: list[tuple[float, float]], loss: np.ndarray,
                   floor: float | None) -> list[str]:
    """Why L(N, D) is not resolved (the exponents, E against the floor, the prefactors, E's interval)."""
    unresolved = [r for name in ("alpha", "beta") for r in exponent_unresolved(name, out[name]["ci95"], EXP_BOUNDS)]
    unresolved += floor_unresolved(out["E"]["estimate"], floor)
    unresolved += [f"{name}'s 95% interval reaches the bound of its range: the prefactor is not finite"
                   for name, col in (("A", 1), ("B", 2)) if len(boot) and boot[:, col].max() >= bounds[col][1] - 1e-6]
    if len(boot):
        unresolved += e_unresolved(np.exp(boot[:, 0]), float(loss.min()))
    return unresolved


def _fit_nd(n: Any, d: Any, loss: Any, flops: Any, budgets: list[Any] | None, n_boot: int, seed: int,
            delta: float, measured: tuple[float, int] | None, floor: float | None) -> dict[str, Any]:
    n, d, loss, flops = (np.asarray(x, dtype=float) for x in (n, d, loss, flops))
    out = _nd_skeleton(n, d, loss, flops, delta, seed)
    why = enough_data(n, d, budgets or list(range(len(n))))
    if why:
        out["reason"], out["samples"] = why, np.empty((0, 5))
        return out
    logn, logd, logl = np.log(n), np.log(d), np.log(loss)
    theta = _fit_once(logn, logd, logl, delta, _starts(logn, logd, logl))
    pred = _pred(theta[None, :], logn, logd)[0][0]
    ls = _refits(logn, logd, logl, theta, np.ones((1, len(logl))), LS_DELTA)  # the noise from least squares
    out["noise"] = residual_noise(logl - _pred(ls, logn, logd)[0][0], N_PARAMS, measured)
    draws = noisy_losses(pred, out["noise"], n_boot, np.random.default_rng(seed))
    boot = _refits(logn, logd, draws, theta, np.ones_like(draws), delta) if n_boot else np.empty((0, 5))
    natural = lambda t: np.column_stack([np.exp(t[:, :3]), t[:, 3:]])  # noqa: E731
    samples = natural(np.vstack([theta[None, :], boot]))
    for i, name in enumerate(("E", "A", "B", "alpha", "beta")):
        out[name] = {"estimate": float(samples[0, i]), "ci95": _interval(samples[1:, i])}
    unresolved = _nd_unresolved(out, boot, _bounds(logn, logd, logl), loss, floor)
    out["residual_dof"] = int(len(n) - N_PARAMS)
    out["status"], out["reason"] = law_status([], unresolved, len(n), N_PARAMS)
    out["flops_per_param_token"] = float(np.median(flops / (n * d)))
    out["samples"] = samples
    out["method"]["bootstrap_resamples"] = int(len(boot))
    return out


__all__ = ["LAW", "allocation", "enough_data", "fit_nd_law", "optimum_rows"]
