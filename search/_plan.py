"""The trial plan of docs/design.md §5, with paired seeds and the confirmation phase.

Phase 1: about 40% of the trials' worth of architectures, 2 trials each with random training
parameters; phase 2: further architectures, 1 trial each, with the best phase-1 parameters.
Architectures come in farthest-point order over the (log d_model, log n_layers) plane, extremes
first, so any prefix spreads over the plane.  Categorical choices (``--encoder sum,linear``) each
have their own rows and are taken round-robin, so each gets an equal share.  Paired studies
(``--paired-seeds S``): each configuration up to ``--trials`` trains once per seed 0..S-1 with one
set of training parameters, and there is no phase 2.

Confirmation (``--confirm K --seeds S``): K x S phase-3 entries ({"rank": k, "seed": s}) that plan
upkeep fills once phases 1 and 2 are final with the k-th best architecture and its best trial's
parameters.  ``--baselines`` adds one entry per rule of search/_baselines.py per seed ({"rank":
K + j, "baseline": rule}); ``--lr-probe`` one per factor of schema.LR_PROBE_FACTORS ({"rank": K + B
+ j, "lr_probe": factor}, seed 0): the rank-0 configuration at its rate times the factor.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from archhpo.budgets import GridRow
from archhpo.errors import BudgetError
from archhpo.search._space import SearchSpace

PHASE1_SHARE = 0.4  # of the trials, in architectures (each run twice): 50 trials → 20 archs


def is_extra(baseline: str | None, lr_probe: float | None) -> bool:
    """A phase-3 slot (a PlanEntry, or its stored assignment) that confirms no rank of its own: a
    baseline's shape or a learning-rate probe."""
    return bool(baseline) or lr_probe is not None


@dataclass(frozen=True)
class PlanEntry:
    slot: int
    phase: int  # 1, 2 or 3 (confirmation)
    arch_idx: int | None  # None for phase 3 until phases 1 and 2 are final
    params: dict[str, Any] | None  # training parameters; None for phases 2/3 until upkeep fills them
    seed: int | None = None  # paired seed or confirmation seed; None for ordinary trials
    rank: int | None = None  # phase 3: 0 = the best architecture of phases 1-2
    baseline: str | None = None  # phase 3 with --baselines: the rule whose shape this slot trains
    lr_probe: float | None = None  # phase 3 with --lr-probe: the factor of rank 0's learning rate it trains at
    attrs: dict[str, Any] | None = None  # user attributes its trial starts with (an IsoFLOP trial's C, N and D)

    @property
    def extra(self) -> bool:
        return is_extra(self.baseline, self.lr_probe)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlanEntry:
        """An entry of a stored plan (StudySettings.plan), as `as_dict` wrote it."""
        return cls(**d)

    def as_dict(self) -> dict[str, Any]:
        """The stored form (a study's plan is a list of these, so old studies load)."""
        d = asdict(self)
        for key in ("rank", "baseline", "lr_probe", "attrs"):  # absent when unset: older plans keep their identity
            if d[key] is None:
                del d[key]
        return d


def spread_order(rows: list[GridRow], seed: int = 0) -> list[int]:
    """arch_idx values: extremes first, then greedy farthest-point over (log d, log L).

    Expects rows[i].arch_idx == i (one choice's rows as build_grid returns them)."""
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


def _choice_key(row: GridRow) -> str:
    return json.dumps(row.choices, sort_keys=True)


def plan_order(rows: list[GridRow], seed: int = 0) -> list[int]:
    """Global arch_idx order: each choice's spread order, taken round-robin, extremes first.
    Without choices this is spread_order(rows, seed)."""
    groups: dict[str, list[GridRow]] = {}
    for r in rows:
        groups.setdefault(_choice_key(r), []).append(r)
    extremes, rest = [], []
    for members in groups.values():
        local = [GridRow(**{**r.as_dict(), "arch_idx": i}) for i, r in enumerate(members)]
        order = [members[i].arch_idx for i in spread_order(local, seed)]
        n_ext = sum(1 for r in members if r.extreme)
        extremes.append(order[:n_ext])
        rest.append(order[n_ext:])

    def round_robin(lists: list[list[int]]) -> list[int]:
        out: list[int] = []
        for i in range(max((len(x) for x in lists), default=0)):
            out += [x[i] for x in lists if i < len(x)]
        return out

    return round_robin(extremes) + round_robin(rest)


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


def make_plan(
    rows: list[GridRow],
    n_trials: int,
    space: SearchSpace,
    seed: int = 0,
    *,
    paired_seeds: int = 0,
    study_params: dict[str, Any] | None = None,
    confirm: int = 0,
    confirm_seeds: int = 0,
    baselines: Sequence[str] = (),
    lr_probe: Sequence[float] = (),
) -> list[PlanEntry]:
    """The study's plan.  ``study_params`` are the training parameters of a paired study; ``lr_probe``
    the factors of --lr-probe's entries (none on the ladder's largest budget)."""
    order = plan_order(rows, seed)
    n_extremes = sum(1 for r in rows if r.extreme)
    entries: list[PlanEntry] = []
    if paired_seeds > 0:
        if study_params is None:
            raise ValueError("a paired plan needs the study's training parameters")
        n1, _, _ = plan_sizes(len(rows), n_trials, n_extremes)  # validates --trials
        configs = order[: min(len(rows), n_trials)]
        for s in range(paired_seeds):  # seed-major: an early stop still has whole seeds
            for arch_idx in configs:
                entries.append(PlanEntry(len(entries), 1, arch_idx, dict(study_params), seed=s))
        return entries
    n1, reps, n2 = plan_sizes(len(rows), n_trials, n_extremes)
    rng = random.Random(seed)
    for _ in range(reps):  # interleaved so an early stop still covers every phase-1 arch once
        for arch_idx in order[:n1]:
            entries.append(PlanEntry(len(entries), 1, arch_idx, space.sample(rng)))
    for arch_idx in order[n1 : n1 + n2]:
        entries.append(PlanEntry(len(entries), 2, arch_idx, None))
    return _with_confirmation(entries, confirm, confirm_seeds, n1 + n2, baselines, lr_probe)


def _with_confirmation(entries: list[PlanEntry], confirm: int, confirm_seeds: int, n_archs: int,
                       baselines: Sequence[str] = (), lr_probe: Sequence[float] = ()) -> list[PlanEntry]:
    """`entries` and the confirmation's K x S phase-3 entries, then each seed's baseline entries,
    seed-major (an early stop still has pairs), then one entry per learning-rate probe factor."""
    ranks = min(confirm, n_archs)  # never more ranks than the plan has architectures
    n_seeds = confirm_seeds if confirm > 0 else 0
    for s in range(n_seeds):
        for k in range(ranks):
            entries.append(PlanEntry(len(entries), 3, None, None, seed=s, rank=k))
        for j, rule in enumerate(baselines):
            entries.append(PlanEntry(len(entries), 3, None, None, seed=s, rank=ranks + j, baseline=rule))
    for j, factor in enumerate(lr_probe if n_seeds else ()):  # seed 0: paired with rank 0's first confirmation run
        entries.append(PlanEntry(len(entries), 3, None, None, seed=0, rank=ranks + len(baselines) + j,
                                 lr_probe=float(factor)))
    return entries


def ladder_plan(n_slots: int, confirm: int = 0, confirm_seeds: int = 0, baselines: Sequence[str] = (),
                lr_probe: Sequence[float] = ()) -> list[PlanEntry]:
    """A ladder budget's plan (search/_ladder.py): `n_slots` phase-1 entries whose architecture and
    training parameters are filled by plan upkeep once the smaller budgets are final; no phase 2."""
    entries = [PlanEntry(slot, 1, None, None) for slot in range(n_slots)]
    return _with_confirmation(entries, confirm, confirm_seeds, n_slots, baselines, lr_probe)
