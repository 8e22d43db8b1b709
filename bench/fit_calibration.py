"""Coverage of the L(N) fit's 95% intervals on synthetic studies drawn from a known law (issue 54 part 6).

Each study has k budgets log-spaced over 1M-300M on L = 1.7 + 380 N^-0.32, each point the law
times exp(noise), noise Gaussian with sd `--noise` in log L (0.5%: about the seed noise of the
real runs' best trials).  Every study also measures its seed noise the way a study with
`--paired-seeds 3` does: 3 seeds per budget, so a pooled sd with 2k degrees of freedom, which the
fit draws unless its residuals are significantly larger (`--no-seed-noise`: residuals only).  Coverage counts
every study, `fitted` or not (a fit that is no law still has intervals).  Prints one row per k:
coverage of alpha, E and A, and the share of studies `fitted`.

    python bench/fit_calibration.py [--studies 200] [--boot 1000] [--budgets 4,6,8] [--noise 0.005]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

LAW = (1.7, 380.0, 0.32)
SEEDS = 3  # seeds per budget behind the measured noise


def study(k: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, tuple[float, int]]:
    """One synthetic study: k parameter counts, their losses, and the measured seed noise (sd of
    log L pooled over SEEDS seeds per budget, its degrees of freedom)."""
    e, a, alpha = LAW
    n = np.logspace(6, np.log10(3e8), k)
    loss = (e + a * n**-alpha) * np.exp(rng.normal(0.0, noise, k))
    dof = k * (SEEDS - 1)
    measured = noise * float(np.sqrt(rng.chisquare(dof) / dof))
    return n, loss, (measured, dof)


def coverage(k: int, studies: int, n_boot: int, noise: float = 0.005, seed: int = 0,
             seeds: bool = True) -> dict[str, Any]:
    """The share of `studies` synthetic studies whose 95% intervals of E, A and alpha hold the
    truth, and the share `fitted`; without `seeds` the studies measured no seed noise."""
    from archhpo.report._fit import fit_laws

    rng = np.random.default_rng(seed + 1000 * k)
    drawn = [study(k, noise, rng) for _ in range(studies)]
    fits = fit_laws([(n, loss) for n, loss, _ in drawn], n_boot=n_boot, noise=[m if seeds else None for _, _, m in drawn])
    hits = {name: sum(bool(f[name]["ci95"][0] <= truth <= f[name]["ci95"][1]) for f in fits)
            for name, truth in zip(("E", "A", "alpha"), LAW, strict=True)}
    fitted = sum(f["status"] == "fitted" for f in fits)
    return {"budgets": k, "studies": studies, **{name: v / studies for name, v in hits.items()},
            "fitted": fitted / studies}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--studies", type=int, default=200)
    p.add_argument("--boot", type=int, default=1000, help="bootstrap refits per fit (the product's default: 1000)")
    p.add_argument("--budgets", default="4,6,8")
    p.add_argument("--noise", type=float, default=0.005, help="sd of the noise in log L")
    p.add_argument("--no-seed-noise", action="store_true", help="studies without measured seed noise (residuals only)")
    args = p.parse_args(argv)
    print(f"L = {LAW[0]} + {LAW[1]:g} N^-{LAW[2]}, 1M-300M, noise sd {args.noise:g} in log L, "
          f"{args.studies} studies, {args.boot} bootstrap refits each")
    print("| budgets | alpha covered | E covered | A covered | fitted | seconds |")
    print("|---|---|---|---|---|---|")
    for k in (int(x) for x in args.budgets.split(",")):
        t0 = time.perf_counter()
        row = coverage(k, args.studies, args.boot, args.noise, seeds=not args.no_seed_noise)
        print(f"| {k} | {row['alpha']:.3f} | {row['E']:.3f} | {row['A']:.3f} | {row['fitted']:.3f} | "
              f"{time.perf_counter() - t0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
