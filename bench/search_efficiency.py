"""Search strategies replayed on a ground-truth table: how much compute each spends, and how far its
chosen architecture is from the best one (issue 17 part 4).

The table (bench/search_truth.csv, made by bench/search_truth.py from archhpo studies) holds every
grid architecture of every budget trained to full length with several seeds, its per-epoch curve
and the scores successive halving would use at its rungs.  A strategy is replayed per budget on a
plan drawn with archhpo's own plan functions; each planned trial's outcome is one of its
architecture's seeds, drawn at random.  No training, no torch: seconds.

Assumptions, stated where they matter: the table has one set of training parameters (a paired
study), so "random training parameters" cannot be replayed and every strategy searches the
architecture only; a trial's compute is epochs x flops_per_epoch (cooldown branches included,
evaluation not counted); all budgets share the data, so only L(N) at fixed data is identifiable.

Strategies (per budget, the plan of --trials trials of archhpo's design: phase 1 = 40% of the trials
in architectures, twice each, phase 2 = the rest once, farthest-point order from the extremes):
  design           every planned trial to full length;
  median           the same with archhpo's median rule on the per-epoch curves (quick warm-up);
  topk_one_epoch   every planned trial one epoch, the best --topk (by that loss) to full length;
  halving          synchronous successive halving, eta 3, first rung 1/9, archhpo's `promotions`;
  halving_ladder   halving where a larger budget plans only architectures whose aspect ratio
                   d_model/n_layers lies within the range of the next smaller budget's best
                   full-length architectures (up to 3; widened by --ladder-widen each way), plus
                   the grid's extremes, with archhpo's ladder trial counts (--trials halved per
                   step up the ladder, at least the extremes + 2);
  ladder           (beyond the issue's list) the same ladder, its trials trained to full length.
Measures: flops_ratio (FLOPs over design's, all budgets and repeats), regret per budget (the chosen
architecture's true mean loss minus the best one's, in units of the budget's pooled seed std),
share_within_1std (repeats whose regret is at most 1 std at every budget).

    python bench/search_efficiency.py --truth bench/search_truth.csv --repeats 20 --seed 0 --json out.json
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for `python bench/...`

STRATEGIES = ("design", "median", "topk_one_epoch", "halving", "halving_ladder", "ladder")
TARGET = {"share_within_1std": 0.9, "flops_ratio": 0.25}
ETA, MIN_RUNG = 3, 0  # the table's rungs are those of --eta 3 --min-fraction 1/9 (rung 0 = 1/9)


@dataclass
class Arch:
    idx: int
    d_model: int
    n_layers: int
    epochs: int
    flops_per_epoch: float
    runs: list[dict[str, Any]] = field(default_factory=list)  # per seed: loss, curve, rung_loss, ...

    @property
    def mean(self) -> float:
        return statistics.fmean(r["loss"] for r in self.runs)

    @property
    def aspect(self) -> float:
        return self.d_model / self.n_layers


@dataclass
class Budget:
    name: str
    params: int
    archs: dict[int, Arch]

    @property
    def best_mean(self) -> float:
        return min(a.mean for a in self.archs.values())

    @property
    def seed_std(self) -> float:
        """Pooled within-architecture standard deviation over seeds."""
        var = [statistics.variance([r["loss"] for r in a.runs]) for a in self.archs.values() if len(a.runs) > 1]
        return math.sqrt(statistics.fmean(var)) if var else math.nan


class TableError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(f"search_efficiency: {message}")


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(";")] if text else []


def load_table(path: Path) -> list[Budget]:
    """The table's budgets, smallest first; a malformed table is refused with one sentence."""
    try:
        with open(path) as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise TableError(f"cannot read {path} ({exc.strerror}); make it with bench/search_truth.py.") from None
    need = {"budget", "budget_params", "arch_idx", "d_model", "n_layers", "seed", "epochs", "flops_per_epoch",
            "loss", "curve", "rung_epochs", "rung_loss", "branch_epochs"}
    if not rows or not need <= set(rows[0]):
        raise TableError(f"{path} is not a ground-truth table (it needs the columns {', '.join(sorted(need))}).")
    budgets: dict[str, Budget] = {}
    try:
        for r in rows:
            b = budgets.setdefault(r["budget"], Budget(r["budget"], int(r["budget_params"]), {}))
            a = b.archs.setdefault(int(r["arch_idx"]), Arch(int(r["arch_idx"]), int(r["d_model"]), int(r["n_layers"]),
                                                             int(r["epochs"]), float(r["flops_per_epoch"])))
            a.runs.append({"seed": int(r["seed"]), "loss": float(r["loss"]), "curve": _floats(r["curve"]),
                           "rung_epochs": [int(e) for e in r["rung_epochs"].split(";")],
                           "rung_loss": _floats(r["rung_loss"]), "branch_epochs": _floats(r["branch_epochs"])})
    except (ValueError, KeyError) as exc:
        raise TableError(f"{path} has a malformed row ({exc}); regenerate it with bench/search_truth.py.") from None
    return sorted(budgets.values(), key=lambda b: b.params)


# ------------------------------------------------------------------------------ plans and trials
@dataclass
class Trial:
    slot: int
    arch: Arch
    run: dict[str, Any]  # the seed this trial's outcome is drawn from


def plan(budget: Budget, archs: Sequence[int], n_trials: int, rng: random.Random) -> list[Trial]:
    """archhpo's plan over `archs` (phase 1 twice, phase 2 once), each trial a random seed's outcome."""
    from archhpo.budgets import GridRow
    from archhpo.search._plan import plan_order, plan_sizes

    rows = [_row(budget.archs[i], k, i in _extremes(budget)) for k, i in enumerate(archs)]
    order = [archs[k] for k in plan_order([GridRow(**r) for r in rows], rng.randrange(2**31))]
    n_ext = sum(1 for i in archs if i in _extremes(budget))
    n1, reps, n2 = plan_sizes(len(archs), max(n_trials, n_ext), n_ext)
    chosen = order[:n1] * reps + order[n1:n1 + n2]
    return [Trial(s, budget.archs[i], rng.choice(budget.archs[i].runs)) for s, i in enumerate(chosen)]


def _extremes(budget: Budget) -> set[int]:
    """The grid's extremes: the smallest and largest d_model and n_layers (first index of each)."""
    archs = sorted(budget.archs.values(), key=lambda a: a.idx)
    out = set()
    for key in (lambda a: (a.d_model, a.idx), lambda a: (-a.d_model, a.idx),
                lambda a: (a.n_layers, a.idx), lambda a: (-a.n_layers, a.idx)):
        out.add(min(archs, key=key).idx)
    return out


def _row(a: Arch, k: int, extreme: bool) -> dict[str, Any]:
    return {"budget": "replay", "arch_idx": k, "d_model": a.d_model, "n_layers": a.n_layers, "n_heads": 1,
            "d_ff": 4 * a.d_model, "param_count": 0, "estimate": None, "extreme": "x" if extreme else "",
            "choices": {}}


# ------------------------------------------------------------------------------ strategies
@dataclass
class Outcome:
    flops: float
    winner: Arch
    ranked: list[Arch]  # the strategy's full-length trials, best first (what a ladder carries up)


def full(trials: list[Trial]) -> Outcome:
    done = sorted(trials, key=lambda t: (t.run["loss"], t.slot))
    return Outcome(sum(t.arch.epochs * t.arch.flops_per_epoch for t in trials), done[0].arch, [t.arch for t in done])


def median(trials: list[Trial]) -> Outcome:
    """archhpo's median rule (quick warm-up: from epoch 1, after 5 completed trials) on the curves,
    trials taken in plan order as one worker would."""
    from archhpo.search._study import MedianRule

    rule, done, flops = MedianRule.for_study(True), [], 0.0
    for t in trials:
        best, stopped = math.inf, False
        for epoch, val in enumerate(t.run["curve"], start=1):
            flops += t.arch.flops_per_epoch
            best = min(best, val)
            at = sorted(d.run["curve"][epoch - 1] for d in done if len(d.run["curve"]) >= epoch)
            if epoch < t.arch.epochs and rule.stops(epoch, best, at):
                stopped = True
                break
        if not stopped:
            done.append(t)
    done.sort(key=lambda t: (t.run["loss"], t.slot))
    return Outcome(flops, done[0].arch, [t.arch for t in done])


def topk_one_epoch(trials: list[Trial], k: int) -> Outcome:
    first = sorted(trials, key=lambda t: (t.run["curve"][0], t.slot))[:k]
    flops = sum(t.arch.flops_per_epoch for t in trials) + sum((t.arch.epochs - 1) * t.arch.flops_per_epoch
                                                              for t in first)
    out = full(first)
    return Outcome(flops, out.winner, out.ranked)


def halving(trials: list[Trial]) -> Outcome:
    """Synchronous successive halving on the rung scores, archhpo's promotions (eta 3)."""
    from archhpo.search._halving import promotions

    alive, flops = list(trials), 0.0
    n_rungs = len(trials[0].run["rung_loss"])
    reached = {t.slot: 0 for t in trials}  # epochs trained so far
    for rung in range(n_rungs):
        for t in alive:
            epoch = t.run["rung_epochs"][rung]
            flops += (epoch - reached[t.slot] + (t.run["branch_epochs"][rung] if rung < n_rungs - 1 else 0)) \
                * t.arch.flops_per_epoch
            reached[t.slot] = epoch
        if rung == n_rungs - 1:
            break
        keep = set(promotions({t.slot: t.run["rung_loss"][rung] for t in alive}, ETA))
        alive = [t for t in alive if t.slot in keep]
    done = sorted(alive, key=lambda t: (t.run["loss"], t.slot))
    return Outcome(flops, done[0].arch, [t.arch for t in done])


def ladder_region(budget: Budget, carried: list[Arch], widen: float) -> list[int]:
    """The architectures of `budget` whose aspect ratio lies within the carried ones' range (widened
    by `widen` each way), plus the grid's extremes; all of them when nothing was carried."""
    if not carried:
        return sorted(budget.archs)
    lo, hi = min(a.aspect for a in carried) / widen, max(a.aspect for a in carried) * widen
    return sorted(i for i, a in budget.archs.items() if lo <= a.aspect <= hi or i in _extremes(budget))


# ------------------------------------------------------------------------------ the replay
def replay(budgets: list[Budget], repeats: int, seed: int, n_trials: int = 50, topk: int = 5,
           widen: float = 1.5) -> dict[str, Any]:
    """Every strategy on every budget, `repeats` times with different plan seeds."""
    from archhpo.search._ladder import ladder_trials

    regrets: dict[str, list[list[float]]] = {s: [] for s in STRATEGIES}
    same: dict[str, list[list[bool]]] = {s: [] for s in STRATEGIES}  # the design's winner, per budget
    flops: dict[str, float] = dict.fromkeys(STRATEGIES, 0.0)
    for rep in range(repeats):
        carried: list[Arch] = []
        carried_full: list[Arch] = []
        per: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        agree: dict[str, list[bool]] = {s: [] for s in STRATEGIES}
        for step, budget in enumerate(budgets):
            rng = random.Random(f"{seed}:{rep}:{budget.name}")
            n_ladder = ladder_trials(n_trials, step, len(_extremes(budget)))
            trials = plan(budget, sorted(budget.archs), n_trials, random.Random(rng.random()))
            narrowed = plan(budget, ladder_region(budget, carried, widen), n_ladder, random.Random(rng.random()))
            full_narrowed = plan(budget, ladder_region(budget, carried_full, widen), n_ladder,
                                 random.Random(rng.random()))
            outcomes = {"design": full(trials), "median": median(trials), "topk_one_epoch": topk_one_epoch(trials, topk),
                        "halving": halving(trials), "halving_ladder": halving(narrowed), "ladder": full(full_narrowed)}
            for name, out in outcomes.items():
                flops[name] += out.flops
                per[name].append((out.winner.mean - budget.best_mean) / budget.seed_std)
                agree[name].append(out.winner.idx == outcomes["design"].winner.idx)
            carried = outcomes["halving_ladder"].ranked[:3]  # up the ladder: this budget's best (<= 3)
            carried_full = outcomes["ladder"].ranked[:3]
        for name in STRATEGIES:
            regrets[name].append(per[name])
            same[name].append(agree[name])
    return _measures(budgets, regrets, same, flops)


def _measures(budgets: list[Budget], regrets: dict[str, list[list[float]]], same: dict[str, list[list[bool]]],
              flops: dict[str, float]) -> dict[str, Any]:
    out = {}
    for name in STRATEGIES:
        reps, n = regrets[name], range(len(budgets))
        out[name] = {
            "flops_ratio": flops[name] / flops["design"],
            "share_within_1std": sum(all(r <= 1 for r in rep) for rep in reps) / len(reps),
            "regret_std": [statistics.fmean(rep[i] for rep in reps) for i in n],
            # per budget: the share of repeats whose winner is within 1 std of the best, and the share
            # whose winner is the architecture the design (the full plan) chose in the same repeat
            "within_1std_per_budget": [sum(rep[i] <= 1 for rep in reps) / len(reps) for i in n],
            "same_winner_as_design": [sum(rep[i] for rep in same[name]) / len(reps) for i in n],
        }
    return out


def markdown(result: dict[str, Any], budgets: list[Budget]) -> str:
    names = ", ".join(b.name for b in budgets)
    lines = [f"| strategy | FLOPs / design | regret <= 1 std at every budget | mean regret (std) per budget: {names} "
             f"| within 1 std, per budget | the design's winner, per budget |", "|---|---:|---:|---|---|---|"]
    for name, m in result.items():
        share = lambda v: " / ".join(f"{x:.0%}" for x in v)  # noqa: E731
        lines.append(f"| {name} | {m['flops_ratio']:.3f} | {m['share_within_1std']:.0%} | "
                     + " / ".join(f"{r:.2f}" for r in m["regret_std"])
                     + f" | {share(m['within_1std_per_budget'])} | {share(m['same_winner_as_design'])} |")
    return "\n".join(lines)


def verdict(result: dict[str, Any]) -> str:
    hl, tk = result["halving_ladder"], result["topk_one_epoch"]
    met = hl["share_within_1std"] >= TARGET["share_within_1std"] and hl["flops_ratio"] <= TARGET["flops_ratio"]
    beats = hl["share_within_1std"] > tk["share_within_1std"] and hl["flops_ratio"] < tk["flops_ratio"]
    return (f"target (halving_ladder: regret <= 1 std in >= 90% of repeats at <= 25% of design's FLOPs): "
            f"{'met' if met else 'NOT met'}; beats topk_one_epoch on both measures: {'yes' if beats else 'no'}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--truth", type=Path, default=Path(__file__).with_name("search_truth.csv"))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=50, help="planned trials per budget (the design's 50)")
    ap.add_argument("--topk", type=int, default=5, help="topk_one_epoch: trials kept after one epoch")
    ap.add_argument("--ladder-widen", type=float, default=1.5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise TableError("--repeats must be at least 1.")
    budgets = load_table(args.truth)
    result = replay(budgets, args.repeats, args.seed, args.trials, args.topk, args.ladder_widen)
    print(markdown(result, budgets))
    print(verdict(result))
    if args.json:
        doc = {"strategies": result, "budgets": [b.name for b in budgets], "repeats": args.repeats,
               "seed": args.seed, "truth_sha256": hashlib.sha256(args.truth.read_bytes()).hexdigest(),
               "verdict": verdict(result)}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
