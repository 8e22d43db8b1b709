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
    python bench/truths/lr_sweep.py judge --table bench/truths/t1_lr.csv --budget 400K \
        --ladder sqlite:///...run.db --study RUN_400K-h2+4+8-t10      # or --carried RATE --width D_MODEL
    python bench/truths/lr_sweep.py judge ... --ladder sqlite:///...run.db --study RUN_800K-h2+4+8-t10 --today

`judge` grades the rate a `--ladder` run carried to a budget (part 4: within x/÷ TARGET_FACTOR of
the swept best): the run's stored ladder record gives the carried rate and the width it is read at
(`lr_width`; a record stored before the width rule has none and carries one rate to every width),
and each swept architecture is judged at the carried rate moved to its own d_model by the ladder's
own rule (archhpo.search._lrfit.at_width) against its sweep's best rate.  A best rate at an end of
the sweep is a bound: the carried rate is judged against it only when it lies beyond it.  With
`--today` the rate judged is the one this checkout's rule carries from the run's own smaller
budgets (`todays_rate`), for a run planned before the rule changed.
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
TARGET_FACTOR = 1.5  # issue 32 part 4: the carried rate within x/÷1.5 of the swept best
LADDER_KEY = "archhpo_ladder"  # where a --ladder budget stores what it carried (archhpo.search._study)


def storage_url(text: str) -> str:
    """An argparse type: a storage URL to read.  A bare path is refused (SQLAlchemy would raise a
    traceback), and so is a SQLite file that does not exist (Optuna would create an empty one)."""
    if "://" not in text:
        raise argparse.ArgumentTypeError(f"'{text}' is not a storage URL; give sqlite:///PATH (three slashes, "
                                         "then the path) or postgresql://USER@HOST/DB")
    if text.startswith("sqlite:///") and not Path(text[len("sqlite:///"):]).is_file():
        raise argparse.ArgumentTypeError(f"'{text}' names no SQLite file; check the path after sqlite:///")
    return text


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


def judge_rows(rows: Sequence[dict[str, Any]], budget: str, carried: float, width: int | None) -> list[dict[str, Any]]:
    """Per swept architecture of `budget`: the carried rate at its d_model (moved from `width` by the
    ladder's width rule; None: one rate for every width), the sweep's best rate, and the factor
    between them (max of the two ratios; None when the best is a bound the carried rate lies inside
    of, which says nothing about the distance)."""
    from archhpo.search._lrfit import at_width

    out = []
    for (b, rank), group in _groups([r for r in rows if r["budget"] == budget]).items():
        d_model = int(group[0]["d_model"])
        rate = carried if width is None else at_width(carried, width, d_model)
        best, how = best_rate([(float(r["learning_rate"]), float(r["loss"])) for r in group])
        factor: float | None = max(rate / best, best / rate)
        lowest, highest = min(float(r["learning_rate"]) for r in group), max(float(r["learning_rate"]) for r in group)
        if how == "bound" and ((best == lowest and rate < best) or (best == highest and rate > best)):
            factor = None  # beyond the swept end where the loss still fell: the distance is unknown
        out.append({"budget": b, "rank": rank, "arch": f"{d_model}x{group[0]['n_layers']} h{group[0]['n_heads']} "
                    f"ff{group[0]['d_ff']}", "carried": rate, "best": best, "how": how, "factor": factor,
                    "within": factor is not None and factor <= TARGET_FACTOR})
    return out


def ladder_rate(storage: str, study: str) -> tuple[float, int | None]:
    """The carried learning rate of a --ladder budget's stored record, and the width it is read at."""
    import optuna

    record = optuna.load_study(study_name=study, storage=storage).user_attrs.get(LADDER_KEY)
    if not record or not record.get("carried"):
        raise SystemExit(f"lr_sweep: {study} has no carried learning rate (not a --ladder budget above the "
                         "smallest, or not planned yet); name a planned ladder budget's study.")
    width = record.get("lr_width")
    return float(record["carried"]["learning_rate"]), None if width is None else int(width)


def todays_rate(storage: str, study: str) -> tuple[float, int, str]:
    """The learning rate this checkout's ladder rule would carry to a --ladder budget from the same
    run's smaller budgets (their finished trials as stored; nothing is written), the width it is read
    at and the rule's exponent in words: a run's stored rate is the rule of the day it was planned."""
    from archhpo.search._ladder_record import ladder_record
    from archhpo.search._lrfit import LrFit
    from archhpo.search._upkeep import PlanUpkeep

    upkeep = PlanUpkeep(storage, study)
    if not upkeep.settings.options.ladder_below:
        raise SystemExit(f"lr_sweep: {study} is not a --ladder budget above the smallest; name one.")
    out = ladder_record(upkeep, [PlanUpkeep(storage, n, storage=upkeep.storage)
                                 for n in upkeep.settings.options.ladder_below])
    if not out.get("carried"):
        raise SystemExit(f"lr_sweep: {study}'s smaller budgets have no finished trial to carry a rate from.")
    return float(out["carried"]["learning_rate"]), int(out["lr_width"]), LrFit.from_dict(out["lr_fit"]).describe()


def _judge(args: argparse.Namespace) -> int:
    if (args.carried is None) == (args.ladder is None):
        raise SystemExit("lr_sweep judge: give either --ladder STORAGE --study NAME or --carried RATE.")
    if args.ladder is not None and not args.study:
        raise SystemExit("lr_sweep judge: --ladder needs --study, the ladder budget's study name.")
    if args.today and args.ladder is None:
        raise SystemExit("lr_sweep judge: --today recomputes a --ladder run's rate; give --ladder and --study.")
    if args.today:
        carried, width, exponent = todays_rate(args.ladder, args.study)
        print(f"today's rule, from {args.study}'s smaller budgets: {exponent}")
    else:
        carried, width = ladder_rate(args.ladder, args.study) if args.ladder else (args.carried, args.width)
    with open(args.table, newline="") as fh:
        verdicts = judge_rows(list(csv.DictReader(fh)), args.budget, carried, width)
    if not verdicts:
        raise SystemExit(f"lr_sweep judge: {args.table} has no rows of budget {args.budget}; check --budget.")
    at = f"at d_model {width}, moved per width" if width is not None else "one rate for every width"
    print(f"{args.budget}: carried {carried:.3g} ({at}); target within x/÷{TARGET_FACTOR:g} of each sweep's best")
    for v in verdicts:
        factor = "unknown (beyond a bound)" if v["factor"] is None else f"x{v['factor']:.2f}"
        print(f"  rank {v['rank']} {v['arch']}: carried {v['carried']:.3g}, best {v['best']:.3g} ({v['how']}): "
              f"{factor}, {'within' if v['within'] else 'outside'}")
    return 0 if all(v["within"] for v in verdicts) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    top = sub.add_parser("top", help="the top architectures of a finished truth budget, one per line")
    top.add_argument("--storage", type=storage_url, required=True)
    top.add_argument("--study", required=True)
    tab = sub.add_parser("table", help="the sweep's table and each architecture's best rate")
    tab.add_argument("--truth", type=storage_url, required=True, help="the truth's storage URL")
    tab.add_argument("--sweep", type=storage_url, required=True, help="the sweep's storage URL")
    tab.add_argument("--budget", action="append", required=True)
    tab.add_argument("--out", type=Path, required=True)
    jud = sub.add_parser("judge", help="grade a ladder's carried rate against a budget's sweep (exit 1: outside)")
    jud.add_argument("--table", type=Path, required=True, help="a sweep table written by `table`")
    jud.add_argument("--budget", required=True)
    jud.add_argument("--ladder", type=storage_url, help="the --ladder run's storage URL (with --study)")
    jud.add_argument("--study", help="the ladder budget's study in --ladder")
    jud.add_argument("--carried", type=float, help="a carried rate, instead of a run's record")
    jud.add_argument("--width", type=int, help="the d_model --carried is read at (default: one rate for every width)")
    jud.add_argument("--today", action="store_true", help="with --ladder: judge the rate this checkout's rule "
                     "carries from the run's smaller budgets, not the one the run stored")
    args = p.parse_args(argv)
    if args.cmd == "judge":
        return _judge(args)
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
