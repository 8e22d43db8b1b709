"""The ground-truth table of bench/search_efficiency.py and the noise of one replayed study.

Two schemas are read (bench/search_truth.py writes both):
- the first truth's (bench/search_truth.csv): a seed changed the data and the initialisation, and
  there is no `data_seed` column (or it is empty);
- the truths of bench/truths/: the same columns plus train_tokens, tokens_per_param, data_seed and
  duration_s; `data_seed` is set, so every seed of an architecture saw the same data and differs
  only in initialisation and batch order.

The noise of a real study (`Draw`): one study trains every trial on the same data, each trial with
its own initialisation.  A replayed repeat therefore fixes the data and gives each trial one of its
architecture's runs on that data, and judges the chosen architecture by a true mean that leaves
that run out (leave-one-seed-out), so the noise that drove a choice does not also grade it:
- seeds that changed the data: the repeat holds out seed k (k = repeat mod the number of seeds, so
  every data draw is replayed equally often); every trial of every architecture and budget is its
  architecture's seed-k run (the table has one run on that data, so an architecture's two phase-1
  trials are the same run), and the truth of an architecture is the mean of its other seeds;
- seeds on fixed data: per architecture, a held-out seed h drawn at random; the architecture's first
  trial is seed h, a second trial (phase 1 runs each architecture twice, with a new initialisation)
  the next seed of a random order of the others (it is then one of the truth's seeds: three seeds
  cannot leave two out and still average two), and the truth is the mean of the seeds other than h.
An architecture with one seed is its own truth (nothing can be left out).
That is `--noise table`: a later run of an architecture (a second phase-1 trial, a confirmation)
is one of the seeds its truth averages, so a choice is partly graded on the runs that made it.
Two modes grade every choice on noise it never saw (`make_draw`):
- `fresh` (search_efficiency's default): the truth is each architecture's mean over all its seeds,
  and every trial is a new run: final loss = mean + sd*z, sd the budget's pooled seed std, z ~ N(0,1)
  from the trial's own generator (seed, repeat, budget, architecture, occurrence: every strategy gets
  the same k-th run of an architecture, so comparisons are paired); its curve and rung scores are
  the architecture's per-epoch mean curve and mean rung scores shifted by sd*(rho*z + sqrt(1-rho^2)*z2),
  z2 a second normal: rho (`--rho`, default 1.0) is the correlation of the curve's shift with the
  final loss's (1: the whole curve shifted with its end).  Where the table's runs end their curve
  or full-length rung at the final loss, the fresh run's do too.  rung_epochs and branch_epochs are
  the table's (the same for every seed, checked).  No value a trial sees equals a truth;
- `split`: per architecture a held-out seed h drawn per repeat; its trials cycle through the other
  seeds in a random order and its truth is seed h's loss alone (an architecture with one seed: that
  run is both, said by `noise_data`).
"""

from __future__ import annotations

import csv
import math
import random
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

NEED = ("budget", "budget_params", "arch_idx", "d_model", "n_layers", "n_heads", "d_ff", "param_count", "seed",
        "epochs", "flops_per_epoch", "loss", "curve", "rung_epochs", "rung_loss", "branch_epochs")


class TableError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(f"search_efficiency: {message}")


@dataclass
class Arch:
    idx: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    param_count: int
    epochs: int
    flops_per_epoch: float
    runs: list[dict[str, Any]] = field(default_factory=list)  # per seed, seed order: loss, curve, rung_loss, ...

    @property
    def mean(self) -> float:
        return statistics.fmean(r["loss"] for r in self.runs)

    def seeds(self) -> list[int]:
        return [r["seed"] for r in self.runs]

    def run(self, seed: int) -> dict[str, Any]:
        return next(r for r in self.runs if r["seed"] == seed)


@dataclass
class Budget:
    name: str
    params: int
    archs: dict[int, Arch]
    fixed_data: bool  # every seed saw the same data (a truth of bench/truths/)
    eta: int = 3

    @property
    def seed_std(self) -> float:
        """Pooled within-architecture standard deviation over seeds (the unit of regret)."""
        var = [statistics.variance([r["loss"] for r in a.runs]) for a in self.archs.values() if len(a.runs) > 1]
        return math.sqrt(statistics.fmean(var)) if var else math.nan

    @cached_property
    def mean_runs(self) -> dict[int, dict[str, Any]]:
        """Per architecture its mean run over seeds (`mean_run`), what fresh noise draws around."""
        return {i: mean_run(a) for i, a in self.archs.items()}

    @property
    def grid_once_flops(self) -> float:
        """Every grid architecture trained once to full length (flops_vs_grid_once's unit)."""
        return sum(a.epochs * a.flops_per_epoch for a in self.archs.values())


def mean_run(arch: Arch) -> dict[str, Any]:
    """The architecture's mean over its seeds: final loss, per-epoch curve and rung scores; its rung
    and branch epochs (refused with one sentence where its seeds disagree on them), and whether every
    seed's curve and full-length rung end at its final loss."""
    shapes = {(tuple(r["rung_epochs"]), tuple(r["branch_epochs"]), len(r["curve"]), len(r["rung_loss"]))
              for r in arch.runs}
    if len(shapes) > 1:
        raise TableError(f"architecture {arch.idx} has seeds with different rungs, branches or curve lengths; "
                         "fresh noise needs them equal (regenerate the table with bench/search_truth.py).")
    first = arch.runs[0]
    return {"loss": arch.mean,
            "curve": [statistics.fmean(v) for v in zip(*(r["curve"] for r in arch.runs), strict=True)],
            "rung_loss": [statistics.fmean(v) for v in zip(*(r["rung_loss"] for r in arch.runs), strict=True)],
            "rung_epochs": list(first["rung_epochs"]), "branch_epochs": list(first["branch_epochs"]),
            "curve_ends_at_loss": all(r["curve"] and r["curve"][-1] == r["loss"] for r in arch.runs),
            "rung_ends_at_loss": all(r["rung_loss"] and r["rung_loss"][-1] == r["loss"] for r in arch.runs)}


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(";")] if text else []


def _read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path) as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise TableError(f"cannot read {path} ({exc.strerror}); make it with bench/search_truth.py.") from None
    if not rows or not set(NEED) <= set(rows[0]):
        raise TableError(f"{path} is not a ground-truth table (it needs the columns {', '.join(sorted(NEED))}).")
    return rows


def load_table(path: Path) -> list[Budget]:
    """The table's budgets, smallest first; a malformed table is refused with one sentence."""
    rows = _read_rows(path)
    budgets: dict[str, Budget] = {}
    try:
        for r in rows:
            b = budgets.setdefault(r["budget"], Budget(r["budget"], int(r["budget_params"]), {},
                                                       bool(r.get("data_seed", "").strip())))
            a = b.archs.setdefault(int(r["arch_idx"]), Arch(
                int(r["arch_idx"]), int(r["d_model"]), int(r["n_layers"]), int(r["n_heads"]), int(r["d_ff"]),
                int(r["param_count"]), int(r["epochs"]), float(r["flops_per_epoch"])))
            a.runs.append({"seed": int(r["seed"]), "loss": float(r["loss"]), "curve": _floats(r["curve"]),
                           "rung_epochs": [int(e) for e in r["rung_epochs"].split(";")],
                           "rung_loss": _floats(r["rung_loss"]), "branch_epochs": _floats(r["branch_epochs"])})
    except (ValueError, KeyError) as exc:
        raise TableError(f"{path} has a malformed row ({exc}); regenerate it with bench/search_truth.py.") from None
    for b in budgets.values():
        for a in b.archs.values():
            a.runs.sort(key=lambda r: r["seed"])
        b.eta = table_eta(b)
    return sorted(budgets.values(), key=lambda b: b.params)


def table_eta(budget: Budget) -> int:
    """Successive halving's eta, read from the rungs the table records: rung k is at min_fraction x
    eta^k of a trial's epochs (search/_halving.py), so eta is the ratio of two consecutive rungs
    below full length.  With a single rung below full length eta is not determined by the rungs;
    archhpo's default is taken when it fits them (min_fraction x eta >= 1), else the smallest that does."""
    from archhpo.schema import DEFAULT_ETA

    a = min(budget.archs.values(), key=lambda a: a.idx)
    epochs, rungs = a.epochs, a.runs[0]["rung_epochs"]
    below = [e / epochs for e in rungs[:-1]]
    if len(below) >= 2:
        return max(2, round(below[1] / below[0]))
    if len(below) == 1:
        return max(DEFAULT_ETA, math.ceil(1 / below[0] - 1e-9))
    return DEFAULT_ETA


# ------------------------------------------------------------------------------ the grid, as archhpo marks it
def grid_rows(budget: Budget) -> tuple[list[Any], list[int]]:
    """The budget's architectures as archhpo's GridRows (arch_idx = position, extremes marked by the
    real code: the row closest to the budget among those at each smallest/largest d_model and
    n_layers) and the table's arch_idx of each position."""
    from archhpo.budgets import GridRow
    from archhpo.budgets._grid import _mark_extremes

    idx = sorted(budget.archs)
    rows = [GridRow(budget=budget.name, arch_idx=k, d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads,
                    d_ff=a.d_ff, param_count=a.param_count, estimate=None, extreme="")
            for k, a in enumerate(budget.archs[i] for i in idx)]
    return _mark_extremes(rows, budget.params), idx


def extremes(budget: Budget) -> set[int]:
    """The table's arch_idx of the grid's extremes."""
    rows, idx = grid_rows(budget)
    return {idx[r.arch_idx] for r in rows if r.extreme}


# ------------------------------------------------------------------------------ the noise of one repeat
@dataclass
class Draw:
    """One repeat's noise at one budget: each architecture's runs in the order its trials take them
    (the first is the held-out seed) and its true mean without the held-out seed."""

    order: dict[int, list[int]]
    truth: dict[int, float]
    held: dict[int, int] = field(default_factory=dict)  # --noise split: each architecture's truth seed

    def run(self, arch: Arch, occurrence: int) -> dict[str, Any]:
        """The run of the `occurrence`-th trial (0 = first) of `arch` in the plan."""
        seeds = self.order[arch.idx]
        return arch.run(seeds[occurrence % len(seeds)])

    @property
    def best(self) -> float:
        return min(self.truth.values())


def draw(budget: Budget, repeat: int, rng: random.Random, held_out: bool = True) -> Draw:
    """The noise of `repeat` at `budget` (module docstring); `held_out` False makes every truth the
    mean of all seeds, the held-out one included (the comparison the leave-one-out answers)."""
    order: dict[int, list[int]] = {}
    truth: dict[int, float] = {}
    all_seeds = sorted({s for a in budget.archs.values() for s in a.seeds()})
    for i in sorted(budget.archs):
        a = budget.archs[i]
        seeds = a.seeds()
        if budget.fixed_data:
            seeds = rng.sample(seeds, len(seeds))  # h first, then a random order of the others
        else:  # one data draw for the whole repeat: seed k, or (a partial table) the next one it has
            k = all_seeds[repeat % len(all_seeds)]
            seeds = [min(seeds, key=lambda s: ((s - k) % (max(all_seeds) + 1), s))]
        order[i] = seeds
        rest = [r["loss"] for r in a.runs if r["seed"] != seeds[0] or not held_out] or [r["loss"] for r in a.runs]
        truth[i] = statistics.fmean(rest)
    return Draw(order, truth)


def split_draw(budget: Budget, rng: random.Random) -> Draw:
    """`--noise split` at one budget of one repeat: per architecture a held-out seed h (random), the
    trials cycling through the other seeds in a random order, the truth seed h's loss alone (one seed:
    that run is its trials' and its truth)."""
    order: dict[int, list[int]] = {}
    truth: dict[int, float] = {}
    held: dict[int, int] = {}
    for i in sorted(budget.archs):
        a = budget.archs[i]
        seeds = a.seeds()
        if len(seeds) > 1:
            held[i] = rng.choice(seeds)
            rest = [s for s in seeds if s != held[i]]
            order[i] = rng.sample(rest, len(rest))
        else:
            order[i] = seeds
        truth[i] = a.run(held.get(i, seeds[0]))["loss"]
    return Draw(order, truth, held)


@dataclass
class FreshDraw:
    """`--noise fresh` at one budget of one repeat (module docstring): the truth is every seed's mean,
    and the k-th trial of an architecture is a new run drawn by its own generator, keyed by `key`
    (seed, repeat, budget), the architecture and k, so every strategy sees the same k-th run."""

    budget: Budget
    key: str
    rho: float
    truth: dict[int, float]
    runs: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # every run handed out

    def run(self, arch: Arch, occurrence: int) -> dict[str, Any]:
        """The run of the `occurrence`-th trial (0 = first) of `arch`: drawn once, then the same."""
        at = (arch.idx, occurrence)
        if at not in self.runs:
            rng = random.Random(f"{self.key}:{arch.idx}:{occurrence}")
            self.runs[at] = fresh_run(self.budget.mean_runs[arch.idx], self.budget.seed_std, self.rho, rng)
        return self.runs[at]

    @property
    def best(self) -> float:
        return min(self.truth.values())


def fresh_run(mean: dict[str, Any], sd: float, rho: float, rng: random.Random) -> dict[str, Any]:
    """One new run around an architecture's mean run: final loss mean + sd*z, the curve and rung
    scores shifted by sd*(rho*z + sqrt(1 - rho^2)*z2) (their last value the final loss where the
    table's runs end there)."""
    z, z2 = rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)
    loss = mean["loss"] + sd * z
    shift = sd * (rho * z + math.sqrt(max(0.0, 1 - rho * rho)) * z2)
    curve = [v + shift for v in mean["curve"]]
    rungs = [v + shift for v in mean["rung_loss"]]
    if mean["curve_ends_at_loss"]:
        curve[-1] = loss
    if mean["rung_ends_at_loss"]:
        rungs[-1] = loss
    return {"seed": None, "loss": loss, "curve": curve, "rung_epochs": mean["rung_epochs"], "rung_loss": rungs,
            "branch_epochs": mean["branch_epochs"]}


Noise: TypeAlias = Draw | FreshDraw  # one repeat's noise at one budget, any mode
NOISE_MODES = ("fresh", "split", "table")


def make_draw(budget: Budget, repeat: int, seed: int, mode: str = "table", held_out: bool = True,
              rho: float = 1.0) -> Noise:
    """The noise of `repeat` at `budget` in `mode` (module docstring); `held_out` applies to "table"
    only.  Fresh noise on a budget without a seed std (one seed per architecture) is refused."""
    if mode == "fresh":
        if not budget.seed_std > 0:
            raise TableError(f"{budget.name} has no seed std (one seed per architecture, or all equal); "
                             "fresh noise needs one: use --noise table.")
        return FreshDraw(budget, f"fresh:{seed}:{repeat}:{budget.name}", rho,
                         {i: a.mean for i, a in budget.archs.items()})
    rng = noise_rng(seed, repeat, budget)
    if mode == "split":
        return split_draw(budget, rng)
    if mode == "table":
        return draw(budget, repeat, rng, held_out)
    raise TableError(f"unknown noise mode {mode!r}; choose one of {', '.join(NOISE_MODES)}.")


def regret(noise: Noise, winner: Arch, std: float) -> float:
    """The winner's held-out true mean above the best one's, in seed standard deviations."""
    gap = noise.truth[winner.idx] - noise.best
    return gap / std if std > 0 else (0.0 if gap == 0 else math.inf)


def noise_rng(seed: int, repeat: int, budget: Budget) -> random.Random:
    """The generator of one repeat's noise at one budget (its own, so a budget's draw does not
    depend on what the strategies did below it)."""
    return random.Random(f"{seed}:{repeat}:{budget.name}")


def noise_ceiling(budgets: list[Budget], repeats: int, seed: int, held_out: bool = True,
                  runs: tuple[int, ...] = (1, 2), mode: str = "table", rho: float = 1.0) -> dict[str, float]:
    """What the table's noise lets a search reach: per k in `runs`, the share of repeats (the same
    draws as the replay's) in which training every grid architecture k times, on the runs its trials
    would get, and choosing the lowest mean is within 1 seed std of the best at every budget.  k = 1
    is the whole grid once, about the design's cost; k = 2 twice that, its second run already one of
    the seeds the truth averages.  On a 3-seed table every further run of an architecture is a seed
    its truth averages, so a strategy above the k = 2 share (archhpo confirms its finalists) is
    partly graded on the noise it chose with: a share target above it cannot be shown met honestly
    on this table; more seeds per architecture in the truth would.  That reading is `mode` "table"'s;
    under "fresh" and "split" (`make_draw`) the runs are those modes' and never a truth's."""
    out = {}
    for k in runs:
        hits = 0
        for rep in range(repeats):
            ok = True
            for b in budgets:
                noise = make_draw(b, rep, seed, mode, held_out, rho)
                means = {i: statistics.fmean(noise.run(a, o)["loss"] for o in range(k)) for i, a in b.archs.items()}
                pick = min(means, key=lambda i: (means[i], i))
                ok &= regret(noise, b.archs[pick], b.seed_std) <= 1
            hits += ok
        out[f"every_arch_x{k}"] = hits / repeats
    return out


def oracle(budgets: list[Budget], repeats: int, seed: int, mode: str = "table", held_out: bool = True,
           rho: float = 1.0) -> dict[str, Any]:
    """The table-best oracle graded as the replay grades a strategy: at every budget the architecture
    of the lowest mean over all the table's seeds (ties: the lower arch_idx), judged on each repeat's
    draw (the same as the replay's).  Under "fresh" the truth is that mean, so it is the best by
    construction (regret 0, 100% within 1 std); under "split" and "table" a truth leaves seeds out
    and the oracle can miss."""
    picks = [min(b.archs.values(), key=lambda a: (a.mean, a.idx)) for b in budgets]
    per = [[regret(make_draw(b, rep, seed, mode, held_out, rho), a, b.seed_std) for b, a in zip(budgets, picks,
                                                                                               strict=True)]
           for rep in range(repeats)]
    per_budget = [statistics.fmean(rep[i] for rep in per) for i in range(len(budgets))]
    return {"arch_idx": [a.idx for a in picks], "share_within_1std": sum(all(r <= 1 for r in rep) for rep in per) / repeats,
            "regret_std": statistics.fmean(per_budget), "regret_std_top": per_budget[-1],
            "regret_std_per_budget": per_budget,
            "regret_nats": statistics.fmean(r * b.seed_std for r, b in zip(per_budget, budgets, strict=True))}


TRUTH_SEEDS = (3, 5, 10, None)  # truth sizes truth_ceiling is reported for (None: an exact truth)


def truth_ceiling(budgets: list[Budget], truth_seeds: int | None, runs: int, repeats: int = 20000,
                  seed: int = 0) -> float:
    """What a truth of `truth_seeds` seeds per architecture can show, in a parametric model: the
    share of repeats in which choosing the lowest mean of `runs` fresh runs of every grid architecture
    is within 1 seed std of the best at every budget, judged as the replay judges (the chosen
    architecture's truth minus the lowest truth), each truth the mean of `truth_seeds` - 1 other
    runs (leave-one-seed-out) or, None, the exact mean.  The model: an architecture's runs are
    normal around the table's mean of it, with the budget's pooled seed std, independent of each
    other (a real study's: the replay's draws reuse the table's seeds, so there a second run is one
    of the seeds its truth averages).  The table's means stand in for the true ones, so near-ties
    look slightly more separated than they are, and the shares err high.  It answers how many seeds a
    truth needs before a share target can be shown met at all: with ties within noise, no search,
    however much it spends, is graded within 1 std more often than this.  It is parametric and the
    same under every noise mode (its truths are independent of the runs chosen on, like "fresh")."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ok = np.ones(repeats, dtype=bool)
    for b in budgets:
        sd, mus = b.seed_std, np.array([a.mean for a in b.archs.values()])
        chosen = (mus + sd * rng.standard_normal((repeats, len(mus), runs)).mean(axis=2)).argmin(axis=1)
        if truth_seeds is None:
            truth = np.broadcast_to(mus, (repeats, len(mus)))
        else:
            truth = mus + sd * rng.standard_normal((repeats, len(mus), max(truth_seeds - 1, 1))).mean(axis=2)
        ok &= truth[np.arange(repeats), chosen] - truth.min(axis=1) <= sd
    return float(ok.mean())
