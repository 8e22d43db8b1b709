"""The statistics of seed noise behind the confirmation's sentences (report/_confirm.py): a
configuration's seed statistics, the paired difference of two finalists over their shared seeds
with its t interval, and the unpaired lead of the chosen finalist graded by the seed std pooled
over every finalist's runs; each with the one sentence the report prints."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from archhpo.search._noise import t_quantile


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
