"""Seed noise, as the plan's upkeep and the report both read it: the seed std pooled over groups of
runs that differ by seed alone, and the lead of one configuration's mean over another's graded by
it.  The upkeep decides a sequential confirmation's later ranks with it (search/_confirmation.py);
the report prints its sentences (report/_noise.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for n paired values (df = n - 1)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def pooled_std(groups: Iterable[Sequence[float]]) -> tuple[float, int] | None:
    """The seed std pooled over groups of runs that differ by seed alone (each group one
    configuration): sqrt(sum of squares about each group's mean / sum(n_i - 1)), and its degrees of
    freedom; None when no group has two runs.  The one estimate of seed noise the report uses: a
    budget's noise (report/_summary.py `budget_noise`) and a confirmation's lead (`pooled_lead`)."""
    repeated = [list(g) for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in repeated)
    if not df:
        return None
    ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in repeated)
    return math.sqrt(ss / df), df


def pooled_lead(runs: Mapping[int, Sequence[float]], first: int, second: int,
                level: float = 0.95) -> dict[str, Any] | None:
    """The lead of `second`'s mean over `first`'s (lower loss is better), graded by the seed noise
    pooled over every finalist's runs: each finalist's runs differ by seed alone, so their spread
    around its own mean estimates one seed std with sum(n_i - 1) degrees of freedom, and the lead's
    standard error is that std x sqrt(1/n_first + 1/n_second).  Unpaired: it needs no seed shared by
    the two, so a confirmation of 1 seed a finalist (--ladder's 3 x 1) is graded too, where the
    paired comparison needs MIN_PAIRS shared seeds.  None without a degree of freedom."""
    pooled = pooled_std(runs.values())
    if pooled is None or not runs.get(first) or not runs.get(second):
        return None
    sd, df = pooled
    se = sd * math.sqrt(1 / len(runs[first]) + 1 / len(runs[second]))
    lead = statistics.fmean(runs[second]) - statistics.fmean(runs[first])
    half = t_quantile(df + 1, level) * se  # t_quantile takes n and uses n - 1 degrees of freedom
    return {"lead": lead, "pooled_std": sd, "df": df, "n_runs": sum(len(v) for v in runs.values()), "se": se,
            "ci95": [lead - half, lead + half], "within_noise": lead - half <= 0 <= lead + half}
