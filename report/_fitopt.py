"""The optimiser behind the L(N) fit (report/_fit.py): the Huber objective of log L in the
parametrisation (log E, log A, alpha), its starting grid and bounds, and vectorised
Levenberg-Marquardt (IRLS) steps that minimise it for many problems at once (every start of many
studies' full-data fits, every bootstrap refit), each within its own bounds; and one BLAS thread
while they run."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
from collections.abc import Iterator

import numpy as np

ALPHA_BOUNDS = (1e-4, 4.0)
LOG_FLOOR = -30.0  # the bottom of every prefactor's log range (E, A, B): e^-30 stands for 0


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
    return [(LOG_FLOOR, top), (LOG_FLOOR, top + ALPHA_BOUNDS[1] * float(logn.max()) + 5.0), ALPHA_BOUNDS]


def _per_problem(theta: np.ndarray, logn: np.ndarray, logl: np.ndarray, weights: np.ndarray,
                 delta: float) -> np.ndarray:
    """The objective of B problems at once: theta (B, 3), weights (B, k) = each point's count;
    logn and logl are (k,) points shared by every problem or (B, k), one row per problem."""
    t = theta[:, 1:2] - theta[:, 2:3] * logn
    r = np.logaddexp(theta[:, 0:1], t) - logl
    absr = np.abs(r)
    return (weights * np.where(absr <= delta, 0.5 * r * r / delta, absr - 0.5 * delta)).sum(1)


def _lm_batch(logn: np.ndarray, logl: np.ndarray, weights: np.ndarray, theta0: np.ndarray, delta: float,
              iters: int = 300, box: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the same Huber objective for B problems at once (the bootstrap refits) by
    Levenberg-Marquardt steps on its iteratively reweighted least-squares form, vectorised in
    numpy: a step is kept only where it lowers that problem's objective, so every problem
    descends monotonically from its start.  logn/logl: (k,) shared points or (B, k) per problem;
    `box`: each problem's (lo, hi) bounds, (B, 3) each (default: `_bounds` of all the points)."""
    shape = (len(theta0), weights.shape[1])
    logn, logl = np.broadcast_to(logn, shape), np.broadcast_to(logl, shape)
    if box is None:
        box = (np.array([b[0] for b in _bounds(logn, logl)])[None, :].repeat(shape[0], 0),
               np.array([b[1] for b in _bounds(logn, logl)])[None, :].repeat(shape[0], 0))
    lo, hi = box
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
        new = np.clip(th + step, lo[active], hi[active])
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


def box_of(logn: np.ndarray, logl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (lo, hi) bounds of one study's parameters, as (3,) arrays (`_bounds`)."""
    bounds = _bounds(logn, logl)
    return np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])


def fit_batch(logn: np.ndarray, logl: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray, int]:
    """The full-data fits of S studies at once, logn/logl (S, k): vectorised Levenberg-Marquardt
    from every point of each study's starting grid (`_starts`), within its own bounds; each study
    keeps its best end point (the lowest objective).  Returns theta (S, 3), objective (S,) and the
    number of starts per study."""
    starts = [_starts(ln, ll, coarse=False) for ln, ll in zip(logn, logl, strict=True)]
    m = len(starts[0])
    boxes = [box_of(ln, ll) for ln, ll in zip(logn, logl, strict=True)]
    lo = np.repeat(np.array([b[0] for b in boxes]), m, 0)
    hi = np.repeat(np.array([b[1] for b in boxes]), m, 0)
    theta0 = np.array([x for st in starts for x in st])
    rows_n, rows_l = np.repeat(logn, m, 0), np.repeat(logl, m, 0)
    theta, f = _lm_batch(rows_n, rows_l, np.ones_like(rows_l), theta0, delta, box=(lo, hi))
    f = np.where(np.all(np.isfinite(theta), 1), f, np.inf).reshape(len(logn), m)
    best = np.argmin(f, 1)
    return theta.reshape(len(logn), m, 3)[np.arange(len(logn)), best], f[np.arange(len(logn)), best], m


__all__ = ["ALPHA_BOUNDS", "LOG_FLOOR", "box_of", "fit_batch"]
