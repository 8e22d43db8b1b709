"""The statistics of seed noise behind the confirmation's sentences (report/_confirm.py): a
configuration's seed statistics, the paired difference of two finalists over their shared seeds
with its t interval, and the unpaired lead of the chosen finalist graded by the seed std pooled
over every finalist's runs; each with the one sentence the report prints."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for n paired values (df = n - 1)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def seed_stats(values: Mapping[int, float]) -> dict[str, Any]:
    """mean, std (sample, n-1), n and the per-seed values of one configuration."""
    vals = [values[s] for s in sorted(values)]
    return {
        "n": len(vals),
        "mean": statistics.fmean(vals) if vals else None,
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
        "values": {str(s): values[s] for s in sorted(values)},
    }


MIN_PAIRS = 3  # fewer complete pairs give no interval: 2 pairs leave 1 degree of freedom (t = 12.7)


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> dict[str, Any]:
    """b - a over the seeds both have: mean, std, standard error, and the t interval from
    MIN_PAIRS pairs on (None below)."""
    seeds = sorted(set(a) & set(b))
    diffs = [b[s] - a[s] for s in seeds]
    out: dict[str, Any] = {"n_pairs": len(diffs), "seeds": seeds, "differences": diffs,
                           "mean": statistics.fmean(diffs) if diffs else None, "std": None, "se": None,
                           "ci95": None}
    if len(diffs) > 1:
        sd = statistics.stdev(diffs)
        out.update(std=sd, se=sd / math.sqrt(len(diffs)))
    if len(diffs) >= MIN_PAIRS:
        half = t_quantile(len(diffs), level) * out["se"]
        out["ci95"] = [out["mean"] - half, out["mean"] + half]
    return out


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


def pooled_statement(pooled: Mapping[str, Any], first: int, second: int) -> str:
    """One sentence on `pooled_lead`: tied within the pooled noise, or beyond it."""
    ci = pooled["ci95"]
    noise = (f"pooled seed std {fmt(pooled['pooled_std'])} over the finalists' {pooled['n_runs']} runs, "
             f"{pooled['df']} degrees of freedom; 95% interval [{fmt(ci[0])}, {fmt(ci[1])}]")
    if pooled["within_noise"]:
        return (f"Rank {first}'s lead of {fmt(pooled['lead'])} over rank {second} lies within the finalists' "
                f"pooled seed noise ({noise}): the two are tied.")
    return (f"Rank {first}'s lead of {fmt(pooled['lead'])} over rank {second} is beyond the finalists' "
            f"pooled seed noise ({noise}).")


def fmt(x: float) -> str:
    return f"{x:.3f}" if abs(x) >= 5e-4 or x == 0 else f"{x:.1e}"


def lead_statement(lead: Mapping[str, Any], winner: str = "the winner", other: str = "the runner-up") -> str:
    """One plain sentence about a paired lead (runner-up minus winner, lower loss is better)."""
    n, mean, ci = lead["n_pairs"], lead["mean"], lead["ci95"]
    if n == 0 or mean is None:
        return f"No seed has finished for both {winner} and {other}; nothing to compare yet."
    if ci is None:
        pairs = "the one seed both finished" if n == 1 else f"{n} seeds"
        said = (f"{winner.capitalize()} leads {other} by {fmt(mean)}" if mean >= 0  # never "leads by -0.05"
                else f"{other.capitalize()} did better than {winner} by {fmt(-mean)}")
        return (f"{said} on {pairs}; {MIN_PAIRS} or more complete pairs are needed to judge seed noise "
                f"(confirm with --seeds {MIN_PAIRS} or more).")
    interval = f"paired 95% interval [{fmt(ci[0])}, {fmt(ci[1])}] over {n} seeds"
    if ci[0] <= 0 <= ci[1]:
        if mean >= 0:
            return f"{winner.capitalize()}'s lead of {fmt(mean)} over {other} lies within seed noise ({interval})."
        return (f"{other.capitalize()} did better on these seeds by {fmt(-mean)}, within seed noise "
                f"({interval}): the two cannot be told apart.")
    if mean > 0:
        return f"{winner.capitalize()}'s lead of {fmt(mean)} over {other} is larger than seed noise ({interval})."
    return (f"{other.capitalize()} beat {winner} by {fmt(-mean)} beyond seed noise ({interval}): the "
            "phase-1/2 ranking does not hold up.")
