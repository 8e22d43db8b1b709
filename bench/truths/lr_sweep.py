"""T1's learning-rate sweep (issue 32 part 1): at T1's two largest budgets, the top 3 architectures
(by mean loss over their init seeds) trained at 5 learning rates, to judge how the best rate moves
with N and whether the ladder carries it there (part 4: within x/÷1.5 of the swept best).

The rates are RATES: the truth's own rate (3e-3, the lm family's default) and two x2 steps either
side.  The truth already holds 3e-3 for every architecture (seeds 0, 1, 2), so the sweep trains the 4
other rates with seed 0 only, on the truth's data (--data-seed 0): with the same seed the
initialisation and batch order are the ones of the truth's seed-0 run, so each architecture's rates
are a paired comparison and its 3e-3 point is the truth's seed-0 loss.  One pinned study per
(architecture, rate), experiment `t1lr-<rate>`, in its own database (bench/truths/truths.sh sweep).

The best rate of an architecture is the vertex of a parabola fitted to loss against log(rate) over
the three rates around the lowest loss (a rate at the end of the sweep is reported as a bound).

    python bench/truths/lr_sweep.py top --storage sqlite:////work/truths/t1.db --study t1_400K-h2+4+8-t10
    python bench/truths/lr_sweep.py table --truth sqlite:///...t1.db --sweep sqlite:///...t1lr.db \
        --budget 400K --budget 800K --out bench/truths/t1_lr.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RATES = (7.5e-4, 1.5e-3, 3e-3, 6e-3, 1.2e-2)
TRUTH_RATE = 3e-3  # the rate every truth trial used (the lm family's default)
TOP_K = 3
ARCH = ("d_model", "n_layers", "n_heads", "d_ff")
TRUTH_STUDY = "t1_{budget}-h2+4+8-t10"


def _trials(storage: str, study: str) -> list[Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return list(optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False))


def _arch(t: Any) -> tuple[int, ...]:
    return tuple(int(t.user_attrs[k]) for k in ARCH)


def top_architectures(storage: str, study: str, k: int = TOP_K) -> list[tuple[int, ...]]:
    """The k architectures with the lowest mean loss over their COMPLETE trials; refused while any
    planned trial is still open (the top of a half-trained truth is not its top)."""
    trials = _trials(storage, study)
    open_ = [t.number for t in trials if t.state.name in ("WAITING", "RUNNING")]
    if open_:
        raise SystemExit(f"lr_sweep: {study} still has {len(open_)} open trials; finish the truth's budget first.")
    losses: dict[tuple[int, ...], list[float]] = {}
    for t in trials:
        if t.state.name == "COMPLETE" and t.value is not None:
            losses.setdefault(_arch(t), []).append(float(t.value))
    ranked = sorted(losses, key=lambda a: (statistics.fmean(losses[a]), a))
    return ranked[:k]


def best_rate(points: Sequence[tuple[float, float]]) -> tuple[float, str]:
    """The best learning rate of (rate, loss) points: the vertex of the parabola in log(rate) through
    the lowest point and its two neighbours; at an end of the sweep, that end and 'bound'."""
    pts = sorted(points)
    i = min(range(len(pts)), key=lambda j: (pts[j][1], j))
    if i in (0, len(pts) - 1):
        return pts[i][0], "bound"
    (x0, y0), (x1, y1), (x2, y2) = ((math.log(r), v) for r, v in pts[i - 1:i + 2])
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denom
    if a <= 0:  # not convex around the minimum (noise): the lowest point itself
        return pts[i][0], "lowest point"
    return math.exp(-b / (2 * a)), "parabola vertex"


def sweep_rows(truth: str, sweep: str, budget: str) -> list[dict[str, Any]]:
    """One row per (architecture, rate) of a budget: the sweep's seed-0 runs and the truth's seed-0 run."""
    import optuna

    top = top_architectures(truth, TRUTH_STUDY.format(budget=budget))
    rows = []
    for t in _trials(truth, TRUTH_STUDY.format(budget=budget)):
        if t.state.name == "COMPLETE" and _arch(t) in top and int(t.user_attrs["seed"]) == 0:
            rows.append({"budget": budget, **dict(zip(ARCH, _arch(t), strict=True)), "rank": top.index(_arch(t)) + 1,
                         "learning_rate": TRUTH_RATE, "loss": float(t.value), "source": "truth"})
    names = [s.study_name for s in optuna.get_all_study_summaries(sweep) if f"_{budget}-" in s.study_name]
    for name in sorted(names):
        for t in _trials(sweep, name):
            if t.state.name == "COMPLETE" and _arch(t) in top:
                rows.append({"budget": budget, **dict(zip(ARCH, _arch(t), strict=True)), "rank": top.index(_arch(t)) + 1,
                             "learning_rate": float(t.params["learning_rate"]), "loss": float(t.value),
                             "source": "sweep"})
    return sorted(rows, key=lambda r: (r["rank"], r["learning_rate"]))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    top = sub.add_parser("top", help="the top architectures of a finished truth budget, one per line")
    top.add_argument("--storage", required=True)
    top.add_argument("--study", required=True)
    tab = sub.add_parser("table", help="the sweep's table and each architecture's best rate")
    tab.add_argument("--truth", required=True)
    tab.add_argument("--sweep", required=True)
    tab.add_argument("--budget", action="append", required=True)
    tab.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cmd == "top":
        for arch in top_architectures(args.storage, args.study):
            print(" ".join(str(v) for v in arch))
        return 0
    rows = [r for b in args.budget for r in sweep_rows(args.truth, args.sweep, b)]
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["budget"])
        w.writeheader()
        w.writerows(rows)
    for (budget, rank), group in _groups(rows).items():
        rate, how = best_rate([(r["learning_rate"], r["loss"]) for r in group])
        print(f"{budget} rank {rank} {group[0]['d_model']}x{group[0]['n_layers']} h{group[0]['n_heads']}: "
              f"{len(group)} rates, best {rate:.3g} ({how})")
    return 0


def _groups(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["budget"], r["rank"]), []).append(r)
    return out


if __name__ == "__main__":
    sys.exit(main())
