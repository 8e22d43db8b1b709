"""The scaling law L(N) = E + A * N^-alpha, fitted to the best trial of each budget.

Fit (after Hoffmann et al. 2022 and the replication of Besiroglu et al. 2024): parameters
e = log E, a = log A and alpha; the predicted log loss is logsumexp(e, a - alpha log N); the
objective is the Huber loss (delta 1e-3) of the residuals log L_pred - log L_obs, minimised by
L-BFGS-B from a grid of starting points (the best end point wins).  95% intervals: percentile
intervals over bootstrap refits on budget points resampled with replacement (resamples with
fewer than three distinct budgets cannot identify three parameters and are drawn again), each
budget's point itself redrawn from a resample of that budget's trials (seeds, where there are
any, as whole units), so three budgets give real intervals.

``status`` says what the fit can claim, the first that applies (``reason`` lists every failed
condition):

- ``too_few_budgets``: under three budgets, no fit at all;
- ``no_scaling``: no measurable trend: the 95% interval of the loss ratio between the largest and
  the smallest budget includes 1 (or lies above it), or A is not distinguishable from 0;
- ``interpolation``: no more points than the law's 3 free parameters (L(N) needs 4 budgets): a
  curve through the points is an interpolation, not a fit;
- ``unresolved``: an exponent's interval touches a bound of its range, a prefactor's interval
  reaches the bound of its (log) range (it is not finite), E's interval reaches 0 (under 0.1% of
  the lowest loss: no irreducible loss is resolved), or the intervals collapse to a point;
- ``fitted``: none of these. Only a ``fitted`` law is printed as a law anywhere.
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
MIN_BUDGETS = 3  # the least points a fit is attempted on
N_PARAMS = 3  # E, A, alpha: a law is fitted only on more points than this
_ALPHA_BOUNDS = (1e-4, 4.0)
LOG_FLOOR = -30.0  # the bottom of every prefactor's log range (E, A, B): e^-30 stands for 0
NEGLIGIBLE = 1e-3  # a loss term under 0.1% of the observed loss counts as none (A's reducible loss, E)
STATUSES = ("fitted", "unresolved", "interpolation", "no_scaling", "too_few_budgets")


def touches(interval: Any, lo: float, hi: float, rel: float = 0.005) -> bool:
    """Whether a 95% interval reaches within `rel` of the range [lo, hi] of a bound (or is not finite)."""
    a, b = (float(x) for x in interval)
    if not (math.isfinite(a) and math.isfinite(b)):
        return True
    margin = rel * (hi - lo)
    return a <= lo + margin or b >= hi - margin


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
    return [(LOG_FLOOR, top), (LOG_FLOOR, top + _ALPHA_BOUNDS[1] * float(logn.max()) + 5.0), _ALPHA_BOUNDS]


def _per_problem(theta: np.ndarray, logn: np.ndarray, logl: np.ndarray, weights: np.ndarray,
                 delta: float) -> np.ndarray:
    """The objective of B problems at once: theta (B, 3), weights (B, k) = each point's count;
    logn and logl are (k,) points shared by every problem or (B, k), one row per problem."""
    t = theta[:, 1:2] - theta[:, 2:3] * logn
    r = np.logaddexp(theta[:, 0:1], t) - logl
    absr = np.abs(r)
    return (weights * np.where(absr <= delta, 0.5 * r * r / delta, absr - 0.5 * delta)).sum(1)


def _lm_batch(logn: np.ndarray, logl: np.ndarray, weights: np.ndarray, theta0: np.ndarray, delta: float,
              iters: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the same Huber objective for B problems at once (the bootstrap refits) by
    Levenberg-Marquardt steps on its iteratively reweighted least-squares form, vectorised in
    numpy: a step is kept only where it lowers that problem's objective, so every problem
    descends monotonically from its start.  logn/logl: (k,) shared points or (B, k) per problem."""
    shape = (len(theta0), weights.shape[1])
    logn, logl = np.broadcast_to(logn, shape), np.broadcast_to(logl, shape)
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
        th, w, ln, ll = theta[active], weights[active], logn[active], logl[active]
        e, a, alpha = th[:, 0:1], th[:, 1:2], th[:, 2:3]
        pred = np.logaddexp(e, a - alpha * ln)
        r = pred - ll
        absr = np.abs(r)
        irls = w * np.where(absr <= delta, 1.0 / delta, 1.0 / np.maximum(absr, delta))
        w_e = np.exp(e - pred)
        w_t = 1.0 - w_e
        jac = np.stack([w_e, w_t, -w_t * ln], axis=-1)  # (b, k, 3)
        grad = np.einsum("bk,bkj->bj", irls * r, jac)
        hess = np.einsum("bk,bki,bkj->bij", irls, jac, jac)
        diag = np.einsum("bii->bi", hess)[:, :, None] * eye
        damped = hess + lam[active, None, None] * (diag + 1e-12 * eye)
        try:
            step = -np.linalg.solve(damped, grad[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            step = -grad * 1e-3
        new = np.clip(th + step, lo, hi)
        f_new = _per_problem(new, ln, ll, w, delta)
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
    replicates: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Fit L(N) = E + A N^-alpha to points (N, L); see the module docstring.

    `replicates` are resamples within each point's own data: (N, L) arrays of shape (R, k), row
    r a redraw of every point (`within_budget_replicates`); bootstrap refit i uses row i mod R.
    Returns the keys of ``{experiment}_scaling_fit.json`` (``status``, ``reason``, ``law``,
    ``n_budgets``, ``points``, ``E``, ``A``, ``alpha`` as ``{"estimate", "ci95"}``,
    ``loss_ratio``, ``method``) plus ``samples``, an (n_boot, 3) array of bootstrap (E, A,
    alpha) (not written to JSON).
    """
    with _one_blas_thread():
        return _fit_law(n, loss, n_boot, seed, delta, labels, replicates)


def _skeleton(n: np.ndarray, loss: np.ndarray, labels: list[str], n_boot: int, seed: int,
              delta: float, within: bool) -> dict[str, Any]:
    points = [{"budget": b, "param_count": int(x), "val_loss": float(v)} for b, x, v in zip(labels, n, loss, strict=True)]
    resampled = ("the trials of each budget (seeds, where there are any, as whole units) and the budget points"
                 if within else "the budget points")
    method: dict[str, Any] = {
        "objective": f"Huber loss (delta {delta:g}) of log(L_pred) - log(L_obs)",
        "parametrisation": "E = exp(e), A = exp(a); log L_pred = logsumexp(e, a - alpha log N)",
        "optimizer": "scipy.optimize.minimize L-BFGS-B from a grid of starting points",
        "interval": f"95% percentile bootstrap, {n_boot} resamples of {resampled} "
                    f"(resamples with fewer than {MIN_BUDGETS} distinct budgets redrawn), seed {seed}; "
                    "each refit minimises the same objective from the full-data estimate and from a "
                    "grid start by vectorised Levenberg-Marquardt (IRLS) steps, keeping the better end",
    }
    return {"status": "too_few_budgets", "reason": None, "law": LAW, "n_budgets": len(points), "points": points,
            "E": None, "A": None, "alpha": None, "loss_ratio": None, "method": method}


def _too_few(out: dict[str, Any], ok: np.ndarray, n_distinct: int) -> dict[str, Any]:
    why = "positive finite losses" if not np.all(ok) else "different parameter counts"
    out["reason"] = (f"fitting E, A and alpha needs at least {MIN_BUDGETS} budgets with a finished trial "
                     f"(and {why}); this experiment has {n_distinct}")
    out["samples"] = np.empty((0, 3))
    return out


def _draws(k: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap counts of the k budget points, (R, k): resamples with fewer than three distinct
    budgets cannot identify three parameters and are drawn again."""
    chosen: list[np.ndarray] = []
    draws = 0
    while len(chosen) < n_boot and draws < 50 * n_boot:
        draws += 1
        idx = rng.integers(0, k, size=k)
        if len(set(idx.tolist())) >= MIN_BUDGETS:
            chosen.append(np.bincount(idx, minlength=k))
    return np.array(chosen, dtype=float).reshape(-1, k)


def _bootstrap(logn: np.ndarray, logl: np.ndarray, theta: np.ndarray, weights: np.ndarray,
               within: tuple[np.ndarray, np.ndarray] | None, delta: float) -> np.ndarray:
    """(E, A, alpha) of every bootstrap refit: the budget counts `weights`, each row's points
    redrawn within their budgets when `within` (log N, log L rows) is given."""
    i = len(weights)
    if not i:
        return np.empty((0, 3))
    start = _starts(logn, logl, coarse=True)[0]
    if within is not None:
        rows = np.arange(i) % len(within[0])
        logn, logl = within[0][rows], within[1][rows]
    # every refit from the full-data estimate and from a second start; each keeps its better end
    best_t, best_f = _lm_batch(logn, logl, weights, np.tile(theta, (i, 1)), delta)
    t2, f2 = _lm_batch(logn, logl, weights, np.tile(start, (i, 1)), delta)
    better = f2 < best_f
    best_t[better] = t2[better]
    return np.column_stack([np.exp(best_t[:, 0]), np.exp(best_t[:, 1]), best_t[:, 2]])


def _ratio(logn: np.ndarray, logl: np.ndarray, within: tuple[np.ndarray, np.ndarray] | None,
           samples: np.ndarray) -> dict[str, Any]:
    """The loss of the largest budget over that of the smallest, with a 95% interval over the
    within-budget resamples, or (without them) over the bootstrap laws at those two budgets."""
    big, small = int(np.argmax(logn)), int(np.argmin(logn))
    est = float(math.exp(logl[big] - logl[small]))
    if within is not None:
        draws = np.exp(within[1][:, big] - within[1][:, small])
    elif len(samples):
        ends = np.exp(logn[[big, small]])
        curves = samples[:, 0:1] + samples[:, 1:2] * ends[None, :] ** -samples[:, 2:3]
        draws = curves[:, 0] / curves[:, 1]
    else:
        return {"estimate": est, "ci95": [est, est]}
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return {"estimate": est, "ci95": [float(lo), float(hi)]}


def _verdict(theta: np.ndarray, samples: np.ndarray, ratio: dict[str, Any], logn: np.ndarray,
             logl: np.ndarray) -> tuple[list[str], list[str]]:
    """(why there is no measurable trend, why the law is not resolved); both empty: fitted."""
    flat, unresolved = [], []
    alpha = float(theta[2])
    lo, hi = _ALPHA_BOUNDS
    if len(samples) and touches(np.percentile(samples[:, 2], [2.5, 97.5]), lo, hi):
        a_lo, a_hi = np.percentile(samples[:, 2], [2.5, 97.5])
        unresolved.append(f"alpha's 95% interval [{a_lo:.3g}, {a_hi:.3g}] touches a bound of its range [{lo:g}, {hi:g}]")
    elif alpha <= lo * 1.01 or alpha >= hi * 0.99:
        unresolved.append(f"alpha = {alpha:.3g} sits at a bound of its range [{lo:g}, {hi:g}]")
    a_top = _bounds(logn, logl)[1][1]
    if len(samples):
        unresolved += e_unresolved(samples[:, 0], math.exp(float(logl.min())))
    if len(samples) and float(np.log(np.percentile(samples[:, 1], 97.5))) >= a_top - 1e-6 * abs(a_top):
        unresolved.append(f"A's 95% interval reaches the bound of its range ({math.exp(a_top):.3g}): the prefactor "
                          "is not finite")
    small = int(np.argmin(logn))
    n_min, l_min = math.exp(logn[small]), math.exp(logl[small])
    reducible = math.exp(theta[1]) * n_min ** -alpha
    low = float(np.percentile(samples[:, 1] * n_min ** -samples[:, 2], 2.5)) if len(samples) else reducible
    if min(reducible, low) < NEGLIGIBLE * l_min:
        flat.append(f"A is not distinguishable from 0: the reducible loss A·N^-alpha at the smallest budget "
                    f"is {reducible:.3g} (95% interval down to {low:.3g}), under {NEGLIGIBLE:.1%} of the loss there")
    if not len(samples) or np.ptp(samples[:, 2]) <= 1e-9 * max(abs(alpha), 1.0):
        unresolved.append("the 95% intervals collapse to a point: no budget has a second trial or seed to resample "
                          "and the budget points alone cannot be resampled")
    r_lo, r_hi = ratio["ci95"]
    where = "includes 1" if r_lo <= 1.0 else "lies above 1: the largest budget's loss is higher than the smallest's"
    if r_hi >= 1.0:
        flat.append(f"the 95% interval of the loss ratio between the largest and the smallest budget, "
                    f"[{r_lo:.4g}, {r_hi:.4g}], {where}")
    return flat, unresolved


def e_unresolved(e_draws: np.ndarray, lowest_loss: float) -> list[str]:
    """Why E is not resolved, or []: its 95% interval reaches down to 0 (under 0.1% of the lowest
    observed loss; the fit's floor is e^-30), so the points do not separate the irreducible loss
    from the power law: E and the exponents trade off along a ridge (T2's real run printed
    E = 0.85 [9.4e-14, 1.53] as a law). Shared by L(N) and L(N, D)."""
    lo, hi = np.percentile(e_draws, [2.5, 97.5])
    if lo >= NEGLIGIBLE * lowest_loss:
        return []
    return [f"E's 95% interval [{lo:.3g}, {hi:.3g}] reaches 0: the points do not bound the irreducible loss "
            "away from zero, so E is not separated from the power-law terms"]


def law_status(flat: list[str], unresolved: list[str], n_points: int, n_params: int) -> tuple[str, str | None]:
    """The status and reason of a fit (module docstring), shared by L(N) and L(N, D)."""
    few = ([f"{n_points} points for {n_params} free parameters: a curve through them is an interpolation, not a "
            f"fit (at least {n_params + 1} are needed)"] if n_points <= n_params else [])
    reasons = [*flat, *few, *unresolved]
    status = ("no_scaling" if flat else "interpolation" if few else "unresolved" if unresolved else "fitted")
    return status, "; ".join(reasons) if reasons else None


def _fit_law(n: Any, loss: Any, n_boot: int, seed: int, delta: float, labels: list[str] | None,
             replicates: tuple[np.ndarray, np.ndarray] | None) -> dict[str, Any]:
    n, loss = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    out = _skeleton(n, loss, labels or [str(int(x)) for x in n], n_boot, seed, delta, replicates is not None)
    ok = np.isfinite(n) & np.isfinite(loss) & (n > 0) & (loss > 0)
    n_distinct = len(set(n[ok].tolist()))
    if n_distinct < MIN_BUDGETS:
        return _too_few(out, ok, n_distinct)
    logn, logl = np.log(n[ok]), np.log(loss[ok])
    within = None
    if replicates is not None:
        rn, rl = (np.asarray(r, dtype=float)[:, ok] for r in replicates)
        within = (np.log(rn), np.log(rl))
    starts = _starts(logn, logl, coarse=False)
    theta, fun = _fit_once(logn, logl, starts, delta)
    weights = _draws(len(logn), n_boot, np.random.default_rng(seed))
    samples = _bootstrap(logn, logl, theta, weights, within, delta)
    e, a, alpha = _natural(theta)
    for name, est, col in (("E", e, 0), ("A", a, 1), ("alpha", alpha, 2)):
        lo, hi = (np.percentile(samples[:, col], [2.5, 97.5]) if len(samples) else (math.nan, math.nan))
        out[name] = {"estimate": est, "ci95": [float(lo), float(hi)]}
    out["method"].update(starts=len(starts), bootstrap_resamples=len(samples))
    out["loss_ratio"] = _ratio(logn, logl, within, samples)
    flat, unresolved = _verdict(theta, samples, out["loss_ratio"], logn, logl)
    out["status"], out["reason"] = law_status(flat, unresolved, len(logn), N_PARAMS)
    out["objective"] = fun
    if out["status"] == "fitted":
        out["formula"] = f"L(N) = {e:.4g} + {a:.4g} * N^-{alpha:.4g}"
    out["samples"] = samples
    return out


def within_budget_replicates(units: list[tuple[np.ndarray, np.ndarray]], n_boot: int,
                             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Resamples of each budget's best trial within its own data: per budget, `units` holds
    the best (parameter count, loss) of each resampling unit (a seed, or a trial where there
    are no seeds).  A bootstrap resample of u units keeps its minimum; its rank among the
    sorted units follows P(rank > j) = ((u - j) / u)^u, drawn exactly by inverse transform
    (no (n_boot, u) index array, so 20,000 trials cost nothing).  Returns (N, L), (n_boot, k)."""
    rng = np.random.default_rng(seed + 1)
    ns, ls = [], []
    for counts, losses in units:
        order = np.argsort(losses, kind="stable")
        u = len(order)
        j = u * (1.0 - (1.0 - rng.random(n_boot)) ** (1.0 / u))
        rank = np.clip(np.ceil(j).astype(int), 1, u) - 1
        ns.append(np.asarray(counts, dtype=float)[order][rank])
        ls.append(np.asarray(losses, dtype=float)[order][rank])
    return np.column_stack(ns), np.column_stack(ls)


def _units(group: Any) -> tuple[np.ndarray, np.ndarray]:
    """(parameter count, loss) of the best trial of each seed, or of each trial without seeds."""
    seeded = group[group["seed"].notna()]
    if len(seeded) and seeded["seed"].nunique() > 1:
        best = seeded.sort_values(["val_loss", "trial"], kind="stable").drop_duplicates("seed")
        group = best
    return group["param_count"].to_numpy(dtype=float), group["val_loss"].to_numpy(dtype=float)


def fit_scaling_law(frame: Any, *, n_boot: int = N_BOOT, seed: int = 0, delta: float = DELTA) -> dict[str, Any]:
    """Fit L(N) = E + A N^-alpha to the best trial of each budget of a `trials_frame` frame
    (N = its exact parameter count).  Budgets without a finished trial are left out; with
    fewer than three points E, A and alpha are None and ``reason`` says why.  Intervals
    resample the trials of each budget (`within_budget_replicates`) as well as the budgets.
    The returned dict is what ``{experiment}_scaling_fit.json`` holds, plus ``samples``
    (bootstrap (E, A, alpha) rows) for drawing the band with `band`."""
    from archhpo.report._frame import best_and_runner_up, ranked

    labels, ns, losses, trials, units = [], [], [], [], []
    pool = ranked(frame)
    for budget, (best, _) in best_and_runner_up(frame).items():
        if best is None:
            continue
        labels.append(budget)
        ns.append(best["param_count"])
        losses.append(best["val_loss"])
        trials.append(int(best["trial"]))
        units.append(_units(pool[(pool["budget"] == budget) & pool["param_count"].notna()]))
    replicates = within_budget_replicates(units, n_boot, seed) if units else None
    out = fit_law(ns, losses, n_boot=n_boot, seed=seed, delta=delta, labels=labels, replicates=replicates)
    for point, trial in zip(out["points"], trials, strict=True):
        point["trial"] = trial
    return out


def fit_json(fit: dict[str, Any]) -> dict[str, Any]:
    """The fit without its in-memory bootstrap samples, NaN written as null."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if k != "samples"}  # bootstrap rows: in memory only
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return clean(fit)


__all__ = ["LAW", "STATUSES", "law_status", "touches", "band", "fit_json", "fit_law", "fit_scaling_law", "predict", "within_budget_replicates"]
