"""The two-phase trial plan of SPEC §5.

Phase 1: about 40% of the trials' worth of architectures, 2 trials each with random training
parameters; phase 2: further architectures, 1 trial each, trained with the best phase-1
parameters (filled in when phase 1 is final).  Architectures are taken in farthest-point
order over the (log d_model, log n_layers) plane, starting with the extremes, so any prefix
of the order spreads over the plane.  A small grid shrinks the plan; nothing is repeated.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from archhpo.budgets import GridRow
from archhpo.errors import BudgetError
from archhpo.search._space import SearchSpace

PHASE1_SHARE = 0.4  # of the trials, in architectures (each run twice): 50 trials → 20 archs


@dataclass(frozen=True)
class PlanEntry:
    slot: int
    phase: int
    arch_idx: int
    params: dict[str, Any] | None  # training parameters; None for phase 2 until phase 1 is final

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def spread_order(rows: list[GridRow], seed: int = 0) -> list[int]:
    """arch_idx values: extremes first, then greedy farthest-point over (log d, log L)."""
    if not rows:
        return []
    xs = [math.log2(r.d_model) for r in rows]
    ys = [math.log2(r.n_layers) for r in rows]

    def norm(v: list[float]) -> list[float]:
        lo, hi = min(v), max(v)
        return [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in v]

    pts = list(zip(norm(xs), norm(ys), strict=True))
    # A seeded jitter breaks ties between archs at the same (d, L) point reproducibly.
    jitter = random.Random(seed)
    tiebreak = [jitter.random() * 1e-9 for _ in rows]
    chosen = [r.arch_idx for r in rows if r.extreme]
    dist = [math.inf] * len(rows)
    for c in chosen:
        for i in range(len(rows)):
            dist[i] = min(dist[i], math.dist(pts[i], pts[c]))
    remaining = set(range(len(rows))) - set(chosen)
    while remaining:
        best = max(remaining, key=lambda i: (dist[i] + tiebreak[i], -i))
        chosen.append(best)
        remaining.discard(best)
        for i in remaining:
            dist[i] = min(dist[i], math.dist(pts[i], pts[best]))
    return chosen


def plan_sizes(n_archs: int, n_trials: int, n_extremes: int) -> tuple[int, int, int]:
    """(phase-1 architectures, trials per phase-1 architecture, phase-2 architectures)."""
    if n_trials < 1:
        raise BudgetError(f"--trials must be at least 1, got {n_trials}.")
    if n_trials < n_extremes:
        raise BudgetError(
            f"--trials {n_trials} is fewer than the {n_extremes} extreme architectures the plan must "
            f"include; use --trials {n_extremes} or more."
        )
    n1 = min(n_archs, max(n_extremes, round(PHASE1_SHARE * n_trials), 1))
    reps = 2 if 2 * n1 <= n_trials else 1
    n2 = max(0, min(n_archs - n1, n_trials - reps * n1))
    return n1, reps, n2


def make_plan(rows: list[GridRow], n_trials: int, space: SearchSpace, seed: int = 0) -> list[PlanEntry]:
    order = spread_order(rows, seed)
    n1, reps, n2 = plan_sizes(len(rows), n_trials, sum(1 for r in rows if r.extreme))
    rng = random.Random(seed)
    entries: list[PlanEntry] = []
    for _ in range(reps):  # interleaved so an early stop still covers every phase-1 arch once
        for arch_idx in order[:n1]:
            entries.append(PlanEntry(len(entries), 1, arch_idx, space.sample(rng)))
    for arch_idx in order[n1 : n1 + n2]:
        entries.append(PlanEntry(len(entries), 2, arch_idx, None))
    return entries
