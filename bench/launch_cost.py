"""Launch cost per planned trial, archhpo's `launch()` against the hand-rolled baseline's
`create_study` + one `enqueue_trial` per phase-1 entry of the same plan (see orchestration.py),
alternating A/B on one scratch PostgreSQL database so both see the same load.

    python bench/launch_cost.py [--rounds 4] [--plan-trials 100]
"""

from __future__ import annotations

import argparse
import os
import statistics

import orchestration as o  # bench/ is on sys.path when run as a script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--plan-trials", type=int, default=100)
    ap.add_argument("--budget", default="20M")
    ap.add_argument("--tolerance", type=float, default=0.9)
    args = ap.parse_args(argv)
    o._quiet_optuna()
    db = f"archhpo_launch_{os.getpid()}"
    o._admin(f'CREATE DATABASE "{db}"')
    url = o.PG_ADMIN.rsplit("/", 1)[0] + "/" + db
    res: dict[str, list[float]] = {"archhpo launch()": [], "hand-rolled enqueue_trial": []}
    try:
        for i in range(args.rounds):
            _, a = o.launch_archhpo(url, f"a{i}", args.budget, args.plan_trials, args.tolerance, "median")
            _, h = o.launch_handrolled(url, f"h{i}", args.budget, args.plan_trials, args.tolerance)
            res["archhpo launch()"].append(a["launch_s"] / a["enqueued"] * 1e3)
            res["hand-rolled enqueue_trial"].append(h["launch_s"] / h["enqueued"] * 1e3)
            enqueued = a["enqueued"]
    finally:
        o._admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    m = o.machine(None)
    print(f"Launch cost per planned trial ({enqueued} enqueued per launch, {args.rounds} rounds A/B), "
          f"archhpo {m['commit']}, {m['date_utc']}, load average {m.get('loadavg', '?')}")
    print()
    print("| launch | ms per planned trial, median (min-max) |")
    print("|---|---:|")
    for k, v in res.items():
        print(f"| {k} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
