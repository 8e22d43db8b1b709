"""The learning rate a µP ladder carries against today's fitted exponent, replayed on T1's ladder.

T1's real learning-rate run (bench/truths/realrun/t1lr/t1lrreal.db: `archhpo run --ladder` with the
rate searched at 100K) and T1's sweep at its largest budget (bench/truths/t1_lr.csv: the 800K top 3
architectures at 5 rates) are read, nothing is trained.  Two rates reach 800K:
- carried unchanged (`--parametrization mup`'s rule, search/_ladder.py `carry_up` with
  parametrization "mup"): the rate the run's smallest budget located, at every width;
- today's rule (`lr_sweep.todays_rate`): the line of the fitted or prior exponent through the
  smaller budgets, at one width and moved to each architecture's d_model.
Each is graded on the sweep: its factor from each architecture's swept best (`lr_sweep.judge_rows`)
and its regret, the loss at the rate (piecewise linear in log rate between the swept points, an end
held beyond it) minus the best swept loss.  FLOPs: both rules plan the same trials; a fitted exponent
needs every budget above the smallest to locate its rate, which is --lr-probe's extra runs of the
best architecture at each schema.LR_PROBE_FACTORS, priced from T1's table (bench/truths/t1.csv).

T1 was trained under the standard parametrization, so the "unchanged" rate graded here is an SP
rate carried unchanged: what carrying costs *without* µP.  A µP ladder's own regret needs truths
trained under µP; this replay cannot give it.

    python bench/mup_carry_replay.py --json /tmp/mup_carry.json
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "bench/truths/realrun/t1lr/t1lrreal.db"
SWEEP = REPO / "bench/truths/t1_lr.csv"
TABLE = REPO / "bench/truths/t1.csv"
STUDY = "t1lrreal_{budget}-h2+4+8-t10"
LARGEST = "800K"


def _lr_sweep() -> Any:
    spec = importlib.util.spec_from_file_location("lr_sweep", REPO / "bench/truths/lr_sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lr_sweep"] = module
    spec.loader.exec_module(module)
    return module


def mup_rate(storage: str, study: str) -> tuple[float, str]:
    """The rate `carry_up` carries to `study` under µP from the run's smaller budgets, and why."""
    from archhpo.budgets import GridRow
    from archhpo.search._ladder import carry_up
    from archhpo.search._ladder_record import _finished
    from archhpo.search._lrfit import LrFit
    from archhpo.search._upkeep import PlanUpkeep

    upkeep = PlanUpkeep(storage, study)
    below = [PlanUpkeep(storage, n, storage=upkeep.storage) for n in upkeep.settings.options.ladder_below]
    finished = [(u.settings.budget_value, _finished(u)) for u in below]
    s = upkeep.settings
    out = carry_up(finished[-1][1], below[-1].settings.budget_value, s.budget_value,
                   [GridRow(**a) for a in s.archs], s.search_space, [0], int(s.options.seed), below=finished,
                   parametrization="mup")
    return float(out["carried"]["learning_rate"]), LrFit.from_dict(out["lr_fit"]).describe()


def loss_at(points: Sequence[tuple[float, float]], rate: float) -> float:
    """The loss at `rate`, piecewise linear in log rate between the swept (rate, loss) points; the
    end point's loss beyond an end."""
    pts = sorted(points)
    if rate <= pts[0][0]:
        return pts[0][1]
    if rate >= pts[-1][0]:
        return pts[-1][1]
    for (r0, y0), (r1, y1) in zip(pts, pts[1:], strict=False):
        if r0 <= rate <= r1:
            w = (math.log(rate) - math.log(r0)) / (math.log(r1) - math.log(r0))
            return y0 + w * (y1 - y0)
    raise AssertionError("unreachable: the rate lies inside the sweep")


def graded(rows: Sequence[dict[str, Any]], budget: str, rate: float, width: int | None) -> list[dict[str, Any]]:
    """Per swept architecture: lr_sweep's verdict and the regret at the rate it trains at."""
    sweep = _lr_sweep()
    out = []
    for v in sweep.judge_rows(rows, budget, rate, width):
        points = [(float(r["learning_rate"]), float(r["loss"])) for r in rows
                  if r["budget"] == budget and str(r["rank"]) == str(v["rank"])]
        v["regret"] = loss_at(points, v["carried"]) - min(y for _, y in points)
        out.append(v)
    return out


def probe_flops(table: Path, budgets: Sequence[str]) -> float:
    """What --lr-probe adds to make every budget above the smallest locate its rate: the best mean
    architecture of each budget retrained at each LR_PROBE_FACTORS, at its full-length FLOPs."""
    from archhpo.schema import LR_PROBE_FACTORS

    with open(table, newline="") as fh:
        rows = list(csv.DictReader(fh))
    total = 0.0
    for budget in budgets:
        mine = [r for r in rows if r["budget"].split("-")[0] == budget]
        means: dict[str, list[float]] = {}
        for r in mine:
            means.setdefault(r["arch_idx"], []).append(float(r["loss"]))
        best = min(means, key=lambda k: sum(means[k]) / len(means[k]))
        row = next(r for r in mine if r["arch_idx"] == best)
        total += len(LR_PROBE_FACTORS) * float(row["flops_per_epoch"]) * int(row["epochs"])
    return total


def run_flops(storage: str, budgets: Sequence[str]) -> float:
    """The FLOPs the real ladder run's trials spent, every budget."""
    import optuna

    from archhpo.schema import Attr

    return float(sum(t.user_attrs.get(Attr.FLOPS_SPENT, 0) for b in budgets
                     for t in optuna.load_study(study_name=STUDY.format(budget=b), storage=storage).trials))


def replay(run: Path, sweep_csv: Path, table: Path) -> dict[str, Any]:
    """Both rules' rates at LARGEST, graded on the sweep, and the FLOPs; the run's database is read
    from a copy, so the committed file is never opened for writing."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / run.name
        shutil.copyfile(run, copy)
        return _replay(f"sqlite:///{copy}", sweep_csv, table)


def _replay(storage: str, sweep_csv: Path, table: Path) -> dict[str, Any]:
    study = STUDY.format(budget=LARGEST)
    with open(sweep_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    carried, why = mup_rate(storage, study)
    today, width, exponent = _lr_sweep().todays_rate(storage, study)
    budgets = ["100K", "200K", "400K", LARGEST]
    spent = run_flops(storage, budgets)
    return {
        "budget": LARGEST,
        "unchanged": {"rate": carried, "rule": why, "graded": graded(rows, LARGEST, carried, None),
                      "flops": spent},
        "today": {"rate": today, "width": width, "rule": exponent, "graded": graded(rows, LARGEST, today, width),
                  "flops": spent, "flops_with_probe": spent + probe_flops(table, budgets[1:])},
        "measures": "an SP rate carried unchanged (T1 trained under SP), not a µP ladder's regret",
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--run", type=Path, default=RUN, help="the T1 learning-rate run's database")
    p.add_argument("--sweep", type=Path, default=SWEEP)
    p.add_argument("--table", type=Path, default=TABLE)
    args = p.parse_args(argv)
    for path in (args.run, args.sweep, args.table):
        if not path.is_file():
            p.error(f"{path} does not exist: pass the T1 file it names (see bench/truths/README.md).")
    if not args.json.parent.is_dir():
        p.error(f"{args.json.parent} is not a folder: create it or write elsewhere.")
    result = replay(args.run, args.sweep, args.table)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    for key in ("unchanged", "today"):
        part = result[key]
        print(f"{key}: {part['rate']:.3g} ({part['rule']})")
        for v in part["graded"]:
            factor = "unknown" if v["factor"] is None else f"x{v['factor']:.2f}"
            print(f"  rank {v['rank']} {v['arch']}: at {v['carried']:.3g}, best {v['best']:.3g}: {factor}, "
                  f"regret {v['regret']:+.4f}")
    print(f"FLOPs: {result['today']['flops']:.3g} either rule; {result['today']['flops_with_probe']:.3g} with "
          "--lr-probe at every budget above the smallest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
