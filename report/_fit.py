"""The scaling law L(N) = E + A * N^-alpha, fitted to the best trial of each budget.

After Hoffmann et al. 2022 and Besiroglu et al. 2024: e = log E, a = log A and alpha; the predicted
log loss is logsumexp(e, a - alpha log N), and the Huber loss (delta 1e-3) of log L_pred - log L_obs
is minimised by Levenberg-Marquardt steps from a grid of starts. 95% intervals: a parametric
bootstrap refitting the fitted log losses plus Gaussian noise at the same parameter counts (budgets
are never resampled: E is not identified on 3-4 distinct ones). The noise sd is the study's measured
seed noise unless an F test says the residuals are larger, else the residuals'; the draws are
widened by t(0.975, dof) / z(0.975), so a linear model's interval is Student's t.

``status`` (the first that applies; ``reason`` lists all): ``too_few_budgets`` (under 3);
``no_scaling`` (the loss ratio's interval not below 1, or A not told from 0); ``interpolation`` (no
residual degree of freedom); ``unresolved`` (under 2, an exponent's interval at a bound of its range
or over 3-fold wide, E below the data's known floor or its interval reaching 0, A not finite, or
collapsed intervals); else ``fitted``, the only law ever printed as one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from archhpo.report._fitopt import ALPHA_BOUNDS as _ALPHA_BOUNDS
from archhpo.report._fitopt import _bounds, _lm_batch, _one_blas_thread, _starts, box_of, fit_batch

LAW = "L(N) = E + A * N^-alpha"
DELTA = 1e-3
N_BOOT = 1000
MIN_BUDGETS = 3  # the least points a fit is attempted on
N_PARAMS = 3  # E, A, alpha: a law is fitted only on more points than this
NEGLIGIBLE = 1e-3  # a loss term under 0.1% of the observed loss counts as none (A's reducible loss, E)
LS_DELTA = 10.0  # a Huber delta no residual of log L reaches: least squares, for the noise estimate
MIN_DOF = 2  # residual degrees of freedom (points minus free parameters) a law needs
RESOLVED_RATIO = 3.0  # an exponent is resolved when its 95% interval's ends differ at most this much
FLOOR_TOL = 1e-4  # E's estimate may lie this fraction below the known floor (rounding), no more
STATUSES = ("fitted", "unresolved", "interpolation", "no_scaling", "too_few_budgets")


def touches(interval: Any, lo: float, hi: float, rel: float = 0.005) -> bool:
    """Whether a 95% interval reaches within `rel` of the range [lo, hi] of a bound (or is not finite)."""
    a, b = (float(x) for x in interval)
    if not (math.isfinite(a) and math.isfinite(b)):
        return True
    margin = rel * (hi - lo)
    return a <= lo + margin or b >= hi - margin


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
    noise: tuple[float, int] | None = None,
    floor: float | None = None,
) -> dict[str, Any]:
    """Fit L(N) = E + A N^-alpha to points (N, L); see the module docstring.

    `replicates` are resamples within each point's own data: (N, L) arrays of shape (R, k), row
    r a redraw of every point (`within_budget_replicates`); they give the loss ratio's interval.
    `noise` is measured seed noise, (sd of log L, its degrees of freedom) (`seed_noise`), drawn
    unless the residuals are significantly larger (`residual_noise`); `floor` the data's known least loss
    (E's estimate may not lie below it).  Returns the keys of ``{experiment}_scaling_fit.json``
    (``status``, ``reason``, ``law``, ``n_budgets``, ``points``, ``E``, ``A``, ``alpha`` as
    ``{"estimate", "ci95"}``, ``loss_ratio``, ``residual_dof``, ``noise``, ``method``) plus
    ``samples``, an (n_boot, 3) array of bootstrap (E, A, alpha) (not written to JSON).
    """
    with _one_blas_thread():
        return _fit_many([(n, loss, labels, replicates, noise, seed)], n_boot, delta, floor)[0]


def _skeleton(n: np.ndarray, loss: np.ndarray, labels: list[str], n_boot: int, seed: int,
              delta: float) -> dict[str, Any]:
    points = [{"budget": b, "param_count": int(x), "val_loss": float(v)} for b, x, v in zip(labels, n, loss, strict=True)]
    method: dict[str, Any] = {
        "objective": f"Huber loss (delta {delta:g}) of log(L_pred) - log(L_obs)",
        "parametrisation": "E = exp(e), A = exp(a); log L_pred = logsumexp(e, a - alpha log N)",
        "optimizer": "vectorised Levenberg-Marquardt (IRLS) steps from every point of a grid of starts, the best end",
        "interval": f"95% percentile parametric bootstrap, {n_boot} refits on the fitted log losses plus "
                    "Gaussian noise at the same parameter counts (budgets not resampled), of the sd in noise widened "
                    "by t(0.975, dof) / z(0.975), seed "
                    f"{seed}; each refit minimises the same objective from the full-data estimate and from a "
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


def residual_noise(resid: np.ndarray, n_params: int, measured: tuple[float, int] | None) -> dict[str, Any]:
    """The noise the parametric bootstrap draws (module docstring): sd of log L, degrees of
    freedom and source.  Measured seed noise where the study has it, unless the residuals are
    significantly larger (lack of fit: F test at 95%, the points carry more than seed noise); else
    the residuals; none (sd 0) without either. Shared with L(N, D)."""
    from scipy import stats

    dof = len(resid) - n_params
    res_sd = math.sqrt(float(np.sum(resid**2)) / dof) if dof > 0 else 0.0
    if measured is not None and measured[1] > 0:
        sd, m_dof = float(measured[0]), int(measured[1])
        if dof <= 0 or res_sd**2 <= sd**2 * float(stats.f.ppf(0.95, dof, m_dof)):
            return {"sd_log": sd, "dof": m_dof, "source": "seed noise"}
        return {"sd_log": res_sd, "dof": dof, "source": "residuals (significantly above the seed noise)"}
    if dof > 0:
        return {"sd_log": res_sd, "dof": dof, "source": "residuals"}
    return {"sd_log": 0.0, "dof": 0, "source": None}


def noisy_losses(pred: np.ndarray, noise: dict[str, Any], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, k) log losses: the fitted `pred` plus Gaussian noise of sd the estimate's sd times
    t(0.975, dof) / z(0.975): the Student-t widening for an sd estimated on `dof` degrees of
    freedom (for a linear model the percentile interval is then the t interval exactly)."""
    k = len(pred)
    if noise["dof"] <= 0 or noise["sd_log"] <= 0:
        return np.tile(pred, (n_boot, 1))
    from scipy import stats

    widen = float(stats.t.ppf(0.975, noise["dof"]) / stats.norm.ppf(0.975))
    return pred[None, :] + noise["sd_log"] * widen * rng.standard_normal((n_boot, k))


def _bootstrap(studies: list[dict[str, Any]], n_boot: int, delta: float) -> list[np.ndarray]:
    """(E, A, alpha) of every parametric bootstrap refit of studies with k points each (module
    docstring), all refits in one vectorised batch: each study's draws at its fixed log N, within
    its own bounds, from its full-data estimate and from a coarse grid start, keeping the better end."""
    if not n_boot:
        return [np.empty((0, 3)) for _ in studies]
    logn, logl, theta0, start, lo, hi = [], [], [], [], [], []
    for st in studies:
        pred = np.logaddexp(st["theta"][0], st["theta"][1] - st["theta"][2] * st["logn"])
        logl.append(noisy_losses(pred, st["noise"], n_boot, np.random.default_rng(st["seed"])))
        logn.append(np.tile(st["logn"], (n_boot, 1)))
        theta0.append(np.tile(st["theta"], (n_boot, 1)))
        start.append(np.tile(_starts(st["logn"], pred, coarse=True)[0], (n_boot, 1)))
        box = box_of(st["logn"], st["logl"])
        lo.append(np.tile(box[0], (n_boot, 1)))
        hi.append(np.tile(box[1], (n_boot, 1)))
    rows_n, rows_l, bounds = np.vstack(logn), np.vstack(logl), (np.vstack(lo), np.vstack(hi))
    weights = np.ones_like(rows_l)
    best_t, best_f = _lm_batch(rows_n, rows_l, weights, np.vstack(theta0), delta, box=bounds)
    t2, f2 = _lm_batch(rows_n, rows_l, weights, np.vstack(start), delta, box=bounds)
    better = f2 < best_f
    best_t[better] = t2[better]
    natural = np.column_stack([np.exp(best_t[:, 0]), np.exp(best_t[:, 1]), best_t[:, 2]])
    return np.split(natural, len(studies))


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


def exponent_unresolved(name: str, ci: Any, bounds: tuple[float, float]) -> list[str]:
    """Why an exponent is not resolved, or []: its 95% interval touches a bound of its range, or
    its ends differ more than RESOLVED_RATIO-fold. Shared by L(N) and L(N, D)."""
    lo, hi = (float(x) for x in ci)
    if touches(ci, *bounds):
        return [f"{name}'s 95% interval [{lo:.3g}, {hi:.3g}] touches a bound of its range "
                f"[{bounds[0]:g}, {bounds[1]:g}]"]
    if hi > RESOLVED_RATIO * lo:
        return [f"{name}'s 95% interval [{lo:.3g}, {hi:.3g}] is not resolved: its ends differ "
                f"{hi / lo:.3g}-fold (at most {RESOLVED_RATIO:g}-fold is resolved)"]
    return []


def floor_unresolved(e: float, floor: float | None) -> list[str]:
    """Why E contradicts the data's known floor, or []: its estimate lies below the least loss any
    model can reach (within FLOOR_TOL), so the points do not follow this law to its limit."""
    if floor is None or not math.isfinite(floor) or e >= floor * (1.0 - FLOOR_TOL):
        return []
    return [f"E {e:.4g} lies below the known floor {floor:.4g}: no model reaches that loss, so these points "
            "do not follow this law to its limit (undertrained models, or a law that does not describe them)"]


def _verdict(theta: np.ndarray, samples: np.ndarray, ratio: dict[str, Any], logn: np.ndarray,
             logl: np.ndarray, floor: float | None) -> tuple[list[str], list[str]]:
    """(why there is no measurable trend, why the law is not resolved); both empty: fitted."""
    flat, unresolved = [], []
    alpha = float(theta[2])
    lo, hi = _ALPHA_BOUNDS
    if len(samples):
        unresolved += exponent_unresolved("alpha", np.percentile(samples[:, 2], [2.5, 97.5]), _ALPHA_BOUNDS)
    if not unresolved and (alpha <= lo * 1.01 or alpha >= hi * 0.99):
        unresolved.append(f"alpha = {alpha:.3g} sits at a bound of its range [{lo:g}, {hi:g}]")
    unresolved += floor_unresolved(math.exp(float(theta[0])), floor)
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
        unresolved.append(COLLAPSED)
    r_lo, r_hi = ratio["ci95"]
    where = "includes 1" if r_lo <= 1.0 else "lies above 1: the largest budget's loss is higher than the smallest's"
    if r_hi >= 1.0:
        flat.append(f"the 95% interval of the loss ratio between the largest and the smallest budget, "
                    f"[{r_lo:.4g}, {r_hi:.4g}], {where}")
    return flat, unresolved


COLLAPSED = ("the 95% intervals collapse to a point: there is no noise to draw (no residual degree of freedom, "
             "or residuals of 0, and no measured seed noise)")


def e_unresolved(e_draws: np.ndarray, lowest_loss: float) -> list[str]:
    """Why E is not resolved, or []: its 95% interval reaches down to 0 (under 0.1% of the lowest
    observed loss; the fit's floor is e^-30), so the points do not separate the irreducible loss
    from the power law: E and the exponents trade off along a ridge (docs/reports.md quotes a real
    run's such interval). Shared by L(N) and L(N, D)."""
    lo, hi = np.percentile(e_draws, [2.5, 97.5])
    if lo >= NEGLIGIBLE * lowest_loss:
        return []
    return [f"E's 95% interval [{lo:.3g}, {hi:.3g}] reaches 0: the points do not bound the irreducible loss "
            "away from zero, so E is not separated from the power-law terms"]


def law_status(flat: list[str], unresolved: list[str], n_points: int, n_params: int) -> tuple[str, str | None]:
    """The status and reason of a fit (module docstring), shared by L(N) and L(N, D): a law needs
    at least MIN_DOF residual degrees of freedom (points minus free parameters)."""
    dof = n_points - n_params
    few = ([f"{n_points} points for {n_params} free parameters: a curve through them is an interpolation, not a "
            f"fit (at least {n_params + 1} are needed)"] if dof <= 0 else [])
    thin = ([f"{dof} residual degree{'s' if dof > 1 else ''} of freedom (needs {MIN_DOF}: at least "
             f"{n_params + MIN_DOF} points for {n_params} free parameters)"] if 0 < dof < MIN_DOF else [])
    reasons = [*flat, *few, *thin, *unresolved]
    status = ("no_scaling" if flat else "interpolation" if few else "unresolved" if thin or unresolved else "fitted")
    return status, "; ".join(reasons) if reasons else None


def fit_laws(studies: list[tuple[Any, Any]], *, n_boot: int = N_BOOT, seed: int = 0, delta: float = DELTA,
             noise: list[tuple[float, int] | None] | None = None, floor: float | None = None) -> list[dict[str, Any]]:
    """`fit_law` on many studies at once, vectorised across them (the calibration's hundreds of
    synthetic studies): study i is (N, L), its bootstrap seed `seed + i`, its measured seed noise
    `noise[i]`. Each result is the one `fit_law` gives that study alone."""
    with _one_blas_thread():
        items = [(n, loss, None, None, noise[i] if noise else None, seed + i) for i, (n, loss) in enumerate(studies)]
        return _fit_many(items, n_boot, delta, floor)


def _prepare(n: Any, loss: Any, labels: list[str] | None, replicates: tuple[np.ndarray, np.ndarray] | None,
             measured: tuple[float, int] | None, seed: int, n_boot: int, delta: float) -> dict[str, Any]:
    """One study's points in logs (its result's skeleton in ``out``; ``done`` when too few to fit)."""
    n, loss = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    out = _skeleton(n, loss, labels or [str(int(x)) for x in n], n_boot, seed, delta)
    ok = np.isfinite(n) & np.isfinite(loss) & (n > 0) & (loss > 0)
    n_distinct = len(set(n[ok].tolist()))
    if n_distinct < MIN_BUDGETS:
        return {"out": _too_few(out, ok, n_distinct), "done": True}
    within = None
    if replicates is not None:
        rn, rl = (np.asarray(r, dtype=float)[:, ok] for r in replicates)
        within = (np.log(rn), np.log(rl))
    return {"out": out, "done": False, "logn": np.log(n[ok]), "logl": np.log(loss[ok]), "within": within,
            "measured": measured, "seed": seed}


def _fit_many(items: list[tuple[Any, ...]], n_boot: int, delta: float, floor: float | None) -> list[dict[str, Any]]:
    """The fits of several studies (n, loss, labels, replicates, measured noise, seed): the
    full-data fits and then the bootstrap refits of all studies with as many points in one batch."""
    studies = [_prepare(n, loss, labels, reps, measured, seed, n_boot, delta)
               for n, loss, labels, reps, measured, seed in items]
    live = [st for st in studies if not st["done"]]
    for k in sorted({len(st["logn"]) for st in live}):
        group = [st for st in live if len(st["logn"]) == k]
        logn, logl = np.array([st["logn"] for st in group]), np.array([st["logl"] for st in group])
        theta, fun, m = fit_batch(logn, logl, delta)
        # the noise sd from least-squares residuals (the Huber fit's sum of squares runs 10-15% high)
        boxes = [box_of(ln, ll) for ln, ll in zip(logn, logl, strict=True)]
        box = (np.array([b[0] for b in boxes]), np.array([b[1] for b in boxes]))
        ls, _ = _lm_batch(logn, logl, np.ones_like(logl), theta, LS_DELTA, box=box)
        resid = logl - np.logaddexp(ls[:, 0:1], ls[:, 1:2] - ls[:, 2:3] * logn)
        for st, t, f, r in zip(group, theta, fun, resid, strict=True):
            st.update(theta=t, fun=float(f), starts=m, noise=residual_noise(r, N_PARAMS, st["measured"]))
        for st, samples in zip(group, _bootstrap(group, n_boot, delta), strict=True):
            _finish(st, samples, floor)
    return [st["out"] for st in studies]


def _finish(st: dict[str, Any], samples: np.ndarray, floor: float | None) -> None:
    """A study's intervals, loss ratio, status and reason from its fit and bootstrap `samples`."""
    out, theta, logn, logl = st["out"], st["theta"], st["logn"], st["logl"]
    out["noise"] = st["noise"]
    e, a, alpha = _natural(theta)
    for name, est, col in (("E", e, 0), ("A", a, 1), ("alpha", alpha, 2)):
        lo, hi = (np.percentile(samples[:, col], [2.5, 97.5]) if len(samples) else (math.nan, math.nan))
        out[name] = {"estimate": est, "ci95": [float(lo), float(hi)]}
    out["method"].update(starts=st["starts"], bootstrap_resamples=len(samples))
    out["loss_ratio"] = _ratio(logn, logl, st["within"], samples)
    flat, unresolved = _verdict(theta, samples, out["loss_ratio"], logn, logl, floor)
    out["residual_dof"] = int(len(logn) - N_PARAMS)
    out["status"], out["reason"] = law_status(flat, unresolved, len(logn), N_PARAMS)
    out["objective"] = st["fun"]
    if out["status"] == "fitted":
        out["formula"] = f"L(N) = {e:.4g} + {a:.4g} * N^-{alpha:.4g}"
    out["samples"] = samples


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


def seed_noise(pool: Any) -> tuple[float, int] | None:
    """The measured seed noise of a study in log L: the standard deviation pooled over every
    configuration (architecture, choices and training parameters, within a budget) that ran more
    than once, confirmation retrains included, with its degrees of freedom; None where none did."""
    from archhpo.report._columns import ARCH_COLUMNS, TRAINING_COLUMNS
    from archhpo.search._noise import pooled_std

    keys = [c for c in ("budget", *ARCH_COLUMNS, "choice", *TRAINING_COLUMNS) if c in pool.columns]
    ok = pool[pool["val_loss"].notna() & (pool["val_loss"] > 0)]
    if ok.empty:
        return None
    groups = ok.groupby(keys, dropna=False)["val_loss"]
    return pooled_std([math.log(float(v)) for v in values] for _, values in groups)


def known_floor(truth: Any) -> float | None:
    """The least loss the data allow, from a study's known truth (``loss_floor``, else
    ``entropy_rate``: report/_truth.py), or None where it is not known."""
    truth = truth or {}
    for key in ("loss_floor", "entropy_rate"):
        if isinstance(truth.get(key), (int, float)) and math.isfinite(truth[key]):
            return float(truth[key])
    return None


def fit_scaling_law(frame: Any, *, n_boot: int = N_BOOT, seed: int = 0, delta: float = DELTA) -> dict[str, Any]:
    """Fit L(N) = E + A N^-alpha to the best trial of each budget of a `trials_frame` frame
    (N = its exact parameter count).  Budgets without a finished trial are left out; with
    fewer than three points E, A and alpha are None and ``reason`` says why.  The intervals draw
    the frame's measured seed noise (`seed_noise`), or the residuals' where the frame has none or
    they are significantly larger; the loss ratio's interval resamples the trials of each budget
    (`within_budget_replicates`); the frame's known floor (``attrs["truth"]``) bounds E.
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
    out = fit_law(ns, losses, n_boot=n_boot, seed=seed, delta=delta, labels=labels, replicates=replicates,
                  noise=seed_noise(ranked(frame, include_confirmation=True)),
                  floor=known_floor(frame.attrs.get("truth")))
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


__all__ = ["LAW", "STATUSES", "exponent_unresolved", "floor_unresolved", "known_floor", "law_status",
           "noisy_losses", "residual_noise", "seed_noise", "touches", "band", "fit_json", "fit_law", "fit_laws", "fit_scaling_law", "predict", "within_budget_replicates"]
