"""A real `archhpo run --ladder` through the workers on a truth's ladder (issue 32 part 4), graded by
the truth: its choice per budget against the truth's all-seed means (its trials are new draws, so the
truth's seeds are all held out from it), and its FLOPs against the design's plan for its plan seed.
It reads what the run wrote to --out (the results CSV and the best JSON per budget), committed here.

    python bench/truths/realrun/compare.py                     # T1's 100K and 200K (t1real, the first run)
    python bench/truths/realrun/compare.py --truth bench/truths/t3.csv \\
        --results bench/truths/realrun/t3 --experiment t3real --replay 50  # T3's whole ladder, and its replay's spread

The replay confirms as the run did (`--confirmation run`: its studies' stored options), so a run
launched before the two-wave confirmation is placed among replays of its own plan.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # bench/: _replay_table, search_efficiency
sys.path.insert(0, str(HERE.parents[2]))  # the checkout

import search_efficiency as se  # noqa: E402
from _replay_table import Budget, load_table  # noqa: E402


def spent_flops(results: Path, experiment: str, budget: str) -> tuple[int, float, float]:
    """The run's finished trials of one budget, the FLOPs they spent (the results CSV's flops_spent:
    every epoch and cooldown branch trained, pruned trials included, and work trained again after a
    restart) and, of those, the FLOPs trained twice: a COMPLETE trial that scored no rung spends
    exactly flops_full unless it was stopped without its checkpoint and restarted. The replay models
    the method, not the restarts, so the run is placed among its replays without them. (A trial that
    scored rungs also spends its cooldown branches, so a restart of one is not separated here.)"""
    with open(results / "experiment_results.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["experiment"] == experiment and r["budget"] == budget
                and r["state"] in ("COMPLETE", "PRUNED")]
    spent = sum(float(r["flops_spent"] or 0) for r in rows)
    again = sum(max(0.0, float(r["flops_spent"] or 0) - float(r["flops_full"] or 0)) for r in rows
                if r["state"] == "COMPLETE" and r.get("rung_scores") in ("", "[]"))  # absent in older CSVs: unknown
    return len(rows), spent, again


def grade(b: Budget, results: Path, experiment: str, seed: int, trials: int) -> tuple[str, float, float, float]:
    """One budget's line, the run's FLOPs, those trained twice after a restart, and the design's."""
    n, spent, again = spent_flops(results, experiment, b.name)
    arch = json.loads((results / f"{experiment}_{b.name}_best.json").read_text())["architecture"]
    by = {(a.d_model, a.n_layers, a.n_heads, a.d_ff): a for a in b.archs.values()}
    chosen = by[(arch["d_model"], arch["n_layers"], arch["n_heads"], arch["d_ff"])]
    best = min(b.archs.values(), key=lambda a: a.mean)
    design = sum(b.archs[i].epochs * b.archs[i].flops_per_epoch for i in se.design_plan(b, trials, seed))
    line = (f"{b.name}: {n} trials, chose d{chosen.d_model}-L{chosen.n_layers}-h{chosen.n_heads} "
            f"(truth mean {chosen.mean:.4f}; best d{best.d_model}-L{best.n_layers}-h{best.n_heads} {best.mean:.4f}; "
            f"regret {(chosen.mean - best.mean) / b.seed_std:.2f} std of {b.seed_std:.4f}); "
            f"FLOPs {spent:.3e} against the design's {design:.3e} = {spent / design:.3f}")
    if again:
        line += f" ({(spent - again) / design:.3f} without {again:.3e} trained again after a restart)"
    return line, spent, again, design


def run_confirms_in_waves(results: Path, experiment: str, budgets: list[Budget]) -> list[bool]:
    """Per budget, whether the run confirmed it in two waves (its study's stored options, in its best
    JSON): budgets launched before `--sequential-confirm` existed confirmed every finalist at once,
    and a run extended later (T2's 800K) mixes the two."""
    return [bool(json.loads((results / f"{experiment}_{b.name}_best.json").read_text())["options"]
                 .get("confirm_sequential", False)) for b in budgets]


def confirmation_words(waves: Sequence[bool], budgets: list[Budget]) -> str:
    """How the replay confirms, in words: one way for every budget, or per budget."""
    if len(set(waves)) == 1:
        return "in two waves" if waves[0] else "every finalist at once"
    at_once = ", ".join(b.name for b, w in zip(budgets, waves, strict=True) if not w)
    in_waves = ", ".join(b.name for b, w in zip(budgets, waves, strict=True) if w)
    return f"as each budget stored it: at once at {at_once}, in two waves at {in_waves}"


def _run_ladder(results: Path, experiment: str, budgets: list[Budget], key: str, value: str) -> bool:
    """Whether some ladder budget of the run stored `key`: `value` in its options' "ladder" record."""
    return any(((json.loads((results / f"{experiment}_{b.name}_best.json").read_text())["options"].get("ladder")
                 or {}).get(key) == value) for b in budgets)


def run_trusts_each_budget(results: Path, experiment: str, budgets: list[Budget]) -> bool:
    """Whether the run measured the rung trust at every budget below its largest (--trust-each-budget,
    stored in each ladder budget's options)."""
    return _run_ladder(results, experiment, budgets, "trust", "each")


def run_confirms_at_rung(results: Path, experiment: str, budgets: list[Budget]) -> bool:
    """Whether the run confirmed at a trusted rung where a budget trusted one (--confirm-at-rung)."""
    return _run_ladder(results, experiment, budgets, "confirm", "rung")


def replay_spread(budgets: list[Budget], repeats: int, seed: int, sequential: bool | Sequence[bool] = se.SEQUENTIAL,
                  trials: int = 50, each_budget: bool = False, at_rung: bool = False) -> dict[str, Any]:
    """The `archhpo` strategy replayed on the same budgets with the run's --trials, one study per
    repeat, confirming in two waves or all at once (`sequential`, or per budget): the spread of its FLOPs ratio
    over repeats (min, 5th and 95th percentiles, max) and per budget the share of repeats within
    1 std, to place the real run in."""
    ratios, within = [], []
    for k in range(repeats):  # each its own plan seed and noise (search_efficiency.replay, one repeat)
        one = se.replay(budgets, 1, seed + k, trials, sequential=sequential, each_budget=each_budget,
                        at_rung=at_rung, carry_finalists=False)["archhpo"]  # every real run predates the option
        ratios.append(one["flops_ratio"])
        within.append(one["within_1std_per_budget"])
    ratios.sort()
    pick = lambda q: ratios[min(len(ratios) - 1, round(q * (len(ratios) - 1)))]  # noqa: E731
    return {"flops_ratio": [ratios[0], pick(0.05), pick(0.95), ratios[-1]],
            "within_1std": [sum(w[i] for w in within) / repeats for i in range(len(budgets))]}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--truth", type=Path, default=HERE.parent / "t1_partial_100K-400K.csv")
    ap.add_argument("--results", type=Path, default=HERE, help="the run's --out (results CSV, best JSONs)")
    ap.add_argument("--experiment", default="t1real")
    ap.add_argument("--seed", type=int, default=7, help="the run's --seed (its plan seed)")
    ap.add_argument("--trials", type=int, default=50, help="the run's --trials")
    ap.add_argument("--replay", type=int, default=0, metavar="N",
                    help="also replay the archhpo strategy N times on the same budgets (plan seeds from --replay-seed)")
    ap.add_argument("--replay-seed", type=int, default=se.EVALUATION_SEED)
    ap.add_argument("--confirmation", choices=("run", "waves", "at-once"), default="run",
                    help="the replay's confirmation: as the run's studies stored it (default), in two waves "
                         "(today's --ladder default) or every finalist at once")
    args = ap.parse_args(argv)
    budgets = [b for b in load_table(args.truth)
               if (args.results / f"{args.experiment}_{b.name}_best.json").exists()]
    if not budgets:
        raise SystemExit(f"compare: no best JSON of {args.experiment} in {args.results} matches a budget of "
                         f"{args.truth}; give the run's --out and --experiment.")
    total_real = total_again = total_design = 0.0
    for b in budgets:
        line, spent, again, design = grade(b, args.results, args.experiment, args.seed, args.trials)
        print(line)
        total_real += spent
        total_again += again
        total_design += design
    print(f"total FLOPs ratio {total_real / total_design:.3f}" + (
        f" ({(total_real - total_again) / total_design:.3f} without the work trained again after restarts, "
        "which the replay does not model)" if total_again else ""))
    if args.replay:
        waves = (run_confirms_in_waves(args.results, args.experiment, budgets) if args.confirmation == "run"
                 else [args.confirmation == "waves"] * len(budgets))
        each = run_trusts_each_budget(args.results, args.experiment, budgets)
        at_rung = run_confirms_at_rung(args.results, args.experiment, budgets)
        spread = replay_spread(budgets, args.replay, args.replay_seed, waves, args.trials, each, at_rung)
        lo, p5, p95, hi = spread["flops_ratio"]
        mode = (confirmation_words(waves, budgets) + (", trust at each budget" if each else "")
                + (", at the trusted rung" if at_rung else ""))
        print(f"replay ({args.replay} repeats, seeds {args.replay_seed}+k, confirming {mode}): FLOPs ratio min {lo:.3f}, 5-95% "
              f"{p5:.3f}-{p95:.3f}, max {hi:.3f}; within 1 std per budget: " + " / ".join(f"{w:.0%}" for w in spread["within_1std"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
