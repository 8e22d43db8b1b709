"""Whether a rung's scores may be trusted to prune: measured, not assumed (docs/design.md §5).

Successive halving prunes at a rung on the bet that the order of the trials' scores there is the
order of their full-length results, and that bet can fail badly (docs/design.md §11).  So a --ladder
study measures it where it is cheap (its smallest budget, every trial trained to the end and scored
at every rung in passing), and a larger budget prunes only at rungs that passed.  With
--trust-each-budget every budget below the largest scores its rungs in passing too, and the next
budget reads the trust measured on it (search/_upkeep.py `_trust`): a small budget at a plateau may
rank by chance at every rung while a larger one's rungs predict.

The measure is the pairwise agreement of rung means with final means over architectures, with a
percentile bootstrap interval; as in PASHA's soft ranking (arXiv 2207.06940), a pair whose finals
are within the finals' seed noise says nothing, a pair whose rung scores are within the rung's own
noise is half right, and that noise widens the cut (`soft_promotions`).  Pure: numbers in, out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from archhpo.search._halving import promotions

__all__ = ["CONFIDENCE", "EVERY_RUNG", "FOR_ABOVE", "N_BOOT", "TRUST_THRESHOLD", "ArchRuns", "RungTrust", "describe_trust",
           "distinguishable_pairs", "pairwise_agreement", "pooled_std", "rung_noise", "rung_trust", "seed_noise",
           "soft_promotions", "spearman", "tie_in"]

# A rung that prunes two trials in three (eta 3) must order distinguishable architectures right at
# least four times in five, and at the low end of its interval, not just on average: a coin (0.5)
# or the first ground truth's reversed rungs (well below 0.5) never pass, and one bad pair in five
# is what a third of survivors kept for the next rung can absorb.
TRUST_THRESHOLD = 0.8
# Bootstrap resamples: the 5th and 95th percentiles of 1000 draws move by about 0.01 between seeds,
# well inside the threshold's margin; the cost is milliseconds for tens of architectures.
N_BOOT = 1000
CONFIDENCE = 0.90  # two-sided: the decision reads the interval's low end, a 95% one-sided bound
# A trust record's key under --trust-each-budget, below the ladder's largest budget: its trials score
# every rung in passing, and the next budget measures its trust on them.
FOR_ABOVE = "scored_for_above"


@dataclass(frozen=True)
class ArchRuns:
    """One architecture's trials at the smallest budget: its scores at each rung below full length
    and its full-length value, per trial (a seed)."""

    key: tuple[Any, ...]
    rung_scores: list[list[float]]  # per trial, per rung below full length
    finals: list[float]  # per trial, the full-length value


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def seed_noise(archs: Sequence[ArchRuns]) -> float:
    """The pooled within-architecture standard deviation of the finals (architectures with at least
    two finite finals; each contributes its squared deviations and n - 1 degrees of freedom); nan
    when no architecture was trained twice."""
    return pooled_std([a.finals for a in archs])


def rung_noise(archs: Sequence[ArchRuns], rung: int) -> float:
    """The same pooled standard deviation of the scores at one rung: the noise of that rung's own
    scores, which is what ties them (a rung score is a short run's loss: it spreads less than the
    finals, so the finals' noise would tie every pair of rung scores)."""
    return pooled_std([[s[rung] for s in a.rung_scores if rung < len(s)] for a in archs])


def pooled_std(groups: Sequence[Sequence[float]]) -> float:
    """The pooled within-group standard deviation over groups with at least two finite values; nan if none."""
    squares, dof = 0.0, 0
    for values in groups:
        finite = [v for v in values if math.isfinite(v)]
        if len(finite) >= 2:
            mean = sum(finite) / len(finite)
            squares += sum((v - mean) ** 2 for v in finite)
            dof += len(finite) - 1
    return math.sqrt(squares / dof) if dof else math.nan


def _tolerance(noise: float) -> float:
    """The gap below which two values are tied: the noise, or exact equality when it is unknown."""
    return noise if math.isfinite(noise) and noise > 0 else 0.0


def pairwise_agreement(rung_means: Sequence[float], final_means: Sequence[float], noise: float,
                       rung_tie: float | None = None) -> float:
    """The share of distinguishable pairs (finals more than `noise` apart) whose rung means are in
    the same order; a pair whose rung means are within `rung_tie` (default: `noise`) counts one half
    (a tie).  Pairs with a non-finite value are left out; nan when no pair is distinguishable."""
    tol = _tolerance(noise)
    rung_tol = tol if rung_tie is None else _tolerance(rung_tie)
    points = [(r, f) for r, f in zip(rung_means, final_means, strict=True) if math.isfinite(r) and math.isfinite(f)]
    agree, pairs = 0.0, 0
    for i, (ri, fi) in enumerate(points):
        for rj, fj in points[i + 1:]:
            if abs(fj - fi) <= tol:
                continue  # the finals cannot tell these two apart: the pair says nothing about the rung
            pairs += 1
            if abs(rj - ri) <= rung_tol:
                agree += 0.5
            elif (rj > ri) == (fj > fi):
                agree += 1.0
    return agree / pairs if pairs else math.nan


def distinguishable_pairs(final_means: Sequence[float], noise: float) -> int:
    """How many pairs of architectures' finals lie more than `noise` apart: what the agreement is
    measured on (a trust resting on 1 pair has a bootstrap interval of [1, 1] and says little)."""
    tol, finite = _tolerance(noise), [f for f in final_means if math.isfinite(f)]
    return sum(abs(b - a) > tol for i, a in enumerate(finite) for b in finite[i + 1:])


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share their mean rank
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation over the finite pairs (for the record; trust reads the agreement)."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 3:
        return math.nan
    rx, ry = _ranks([x for x, _ in pairs]), _ranks([y for _, y in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else math.nan


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th quantile (0..1) of sorted values, interpolated linearly (numpy's default)."""
    at = q * (len(ordered) - 1)
    lo = math.floor(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def _json(value: float) -> float | None:
    return value if math.isfinite(value) else None  # a study attribute is JSON: no NaN


def _rung_means(archs: Sequence[ArchRuns], rung: int) -> list[float]:
    return [_mean([s[rung] for s in a.rung_scores if rung < len(s)]) for a in archs]


def _bootstrap(rung: list[float], final: list[float], noise: tuple[float, float],
               draws: list[list[int]]) -> tuple[float, float]:
    """The percentile interval (CONFIDENCE, two-sided) of the agreement over resampled architectures;
    a draw with no distinguishable pair (all one architecture, say) is left out.  noise: the finals'
    and the rung's."""
    values = sorted(v for v in (pairwise_agreement([rung[i] for i in d], [final[i] for i in d], *noise)
                                for d in draws) if math.isfinite(v))
    if not values:
        return math.nan, math.nan
    tail = (1 - CONFIDENCE) / 2
    return _percentile(values, tail), _percentile(values, 1 - tail)


def rung_trust(archs: Sequence[ArchRuns], threshold: float = TRUST_THRESHOLD, n_boot: int = N_BOOT,
               seed: int = 0) -> dict[str, Any]:
    """Which rungs below full length may prune (a JSON-able record, stored with a ladder budget):
    a rung is trusted when the low end of its agreement's bootstrap interval reaches `threshold`.

    The resamples (architectures drawn with replacement, `random.Random(seed)`) are drawn once and
    shared by every rung, so the record is a deterministic function of its inputs."""
    archs = list(archs)
    noise = seed_noise(archs)
    record: dict[str, Any] = {"measure": "pairwise agreement", "threshold": threshold, "noise": _json(noise),
                              "n_archs": len(archs), "confidence": CONFIDENCE, "n_boot": n_boot,
                              "rungs": [], "trusted": []}
    if len(archs) < 3:
        return {**record, "reason": f"{len(archs)} architectures: agreement needs at least 3"}
    finals = [_mean(a.finals) for a in archs]
    record["pairs"] = distinguishable_pairs(finals, noise)
    rng = random.Random(seed)
    draws = [[rng.randrange(len(archs)) for _ in archs] for _ in range(n_boot)]
    n_rungs = max((len(s) for a in archs for s in a.rung_scores), default=0)
    for rung in range(n_rungs):
        means, tie = _rung_means(archs, rung), rung_noise(archs, rung)
        point = pairwise_agreement(means, finals, noise, tie)
        low, high = _bootstrap(means, finals, (noise, tie), draws) if math.isfinite(point) else (math.nan, math.nan)
        trusted = math.isfinite(low) and low >= threshold
        record["rungs"].append({"rung": rung, "agreement": _json(point), "low": _json(low), "high": _json(high),
                                "spearman": _json(spearman(means, finals)), "noise": _json(tie),
                                "trusted": trusted})
        if trusted:
            record["trusted"].append(rung)
    if not any(r["agreement"] is not None for r in record["rungs"]):
        record["reason"] = "no pair of architectures is distinguishable beyond the seed noise"
    return record


def describe_trust(trust: Mapping[str, Any] | None) -> str:
    """Which fidelity decides a ladder budget and why (the measured agreement): a clause for the report."""
    if not trust:
        return "fidelity: full length (no rung trust was measured)"
    parts = []
    for r in trust.get("rungs", ()):
        if r.get("agreement") is None or r.get("low") is None:
            parts.append(f"rung {r['rung']}: no pair distinguishable beyond noise")
        else:
            parts.append(f"rung {r['rung']} agreement {r['agreement']:.2f} [{r['low']:.2f}, {r['high']:.2f}]")
    measured = "; ".join(parts) or str(trust.get("reason", "no rung below full length"))
    if trust.get("pairs") is not None and trust.get("n_archs"):  # a record from before the count has none
        n = trust["n_archs"]
        measured += (f"; measured on {trust['pairs']} of {n * (n - 1) // 2} pairs of architectures "
                     "distinguishable beyond the seed noise")
    at = f" at {trust['from_budget']}" if trust.get("from_budget") else ""
    if trust.get(FOR_ABOVE):
        at += "; its rungs scored in passing for the next budget's trust"
    if trust.get("trusted"):
        rungs = ", ".join(str(r) for r in trust["trusted"])
        return f"fidelity: prunes at rung {rungs} ({measured}{at}; threshold {trust['threshold']})"
    return (f"fidelity: the region trained to full length (no rung's interval reaches {trust['threshold']}: "
            f"{measured}{at})")


def tie_in(promoted: Sequence[int], scores: Mapping[int, float], noise: float) -> list[int]:
    """`promoted` and every slot whose finite score is within `noise` of the worst promoted score:
    a tie at the cut is not decided by noise (PASHA's soft ranking).  noise nan or 0: `promoted`."""
    tol = _tolerance(noise)
    cut = max((scores[s] for s in promoted if math.isfinite(scores[s])), default=math.nan)
    if not tol or not math.isfinite(cut):
        return list(promoted)
    return sorted({*promoted, *(slot for slot, v in scores.items() if math.isfinite(v) and v <= cut + tol)})


def soft_promotions(scores: Mapping[int, float], eta: int, noise: float) -> list[int]:
    """`promotions` (the best len//eta, at least one, ties by slot, non-finite never), widened by
    the slots within `noise` of the worst promoted score; noise nan or 0: exactly `promotions`."""
    return tie_in(promotions(scores, eta), scores, noise)


@dataclass(frozen=True)
class RungTrust:
    """The rungs a study judges (holds trials at and prunes), and the noise its cuts tie within.

    A study off the ladder judges every rung with hard cuts (`EVERY_RUNG`, today's successive
    halving); a --ladder study judges only the rungs its ladder record trusts (`from_record`)."""

    rungs: frozenset[int] | None = None  # None: every rung
    noise: float = 0.0  # the finals' seed noise: the tie at a rung whose own noise is not recorded
    rung_noise: tuple[tuple[int, float], ...] = ()  # (rung, the seed noise of its scores): the tie at that rung
    measured: bool = False  # read from a ladder record that holds a measured trust (a larger budget's)
    for_above: bool = False  # --trust-each-budget below the largest: a budget above measures on its scores

    def judges(self, rung: int) -> bool:
        return self.rungs is None or rung in self.rungs

    @property
    def judges_any(self) -> bool:
        return self.rungs is None or bool(self.rungs)

    @property
    def scores_in_passing(self) -> bool:
        """Whether a trial scores the rungs it is not held at on its way to full length: off the
        ladder (a replicate's scores are reported) and where the trust is still to be measured (the
        smallest budget's scores are what it is measured on), but not on a budget whose measured trust
        judges no rung: its cooldown branches (about 1/9 of a trial at eta 3) would decide nothing,
        unless a budget above measures its own trust on them (--trust-each-budget)."""
        return self.judges_any or not self.measured or self.for_above

    def noise_at(self, rung: int) -> float:
        """The noise that ties two scores at `rung`: that rung's own, else the finals'."""
        return dict(self.rung_noise).get(rung, self.noise)

    def ties(self, promoted: Sequence[int], scores: Mapping[int, float], rung: int | None = None) -> list[int]:
        """A rule's decision at a judged rung, widened by the ties within that rung's noise."""
        return tie_in(promoted, scores, self.noise if rung is None else self.noise_at(rung))

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> RungTrust:
        """A ladder study's trust from its ladder record's "trust" (`rung_trust`'s); none measured
        (no record yet, the smallest budget, a record from before trust): no rung is judged."""
        trust = (record or {}).get("trust") or {}
        per_rung = tuple((int(r["rung"]), _finite(r.get("noise"))) for r in trust.get("rungs", ())
                         if r.get("noise") is not None)
        return cls(frozenset(int(r) for r in trust.get("trusted", ())), _finite(trust.get("noise")), per_rung,
                   measured=bool(trust), for_above=bool(trust.get(FOR_ABOVE)))


def _finite(value: Any) -> float:
    """A stored noise (JSON null for nan) as a float; 0.0 (exact ties only) when unknown."""
    return float(value) if value is not None and math.isfinite(float(value)) else 0.0


EVERY_RUNG = RungTrust()
