"""`archhpo report` on a 20,000-trial experiment: wall time and HTML size (issue 8 part 5).

Builds a synthetic experiment of `--trials` trials spread over `--budgets` budgets whose best
losses follow a known law, as an experiment_results.csv (every column archhpo writes, per-epoch
validation curves included; `--source csv`) or as real archhpo studies in a SQLite database
(launched with the real grid and plan, then the trials bulk-inserted into Optuna's tables with
their params, value, worker attributes and per-epoch intermediate values; `--source db`), then
times `archhpo report` on it as a separate process (import time included) and checks the page
size.  Target: under 20 s on 2 cores, HTML under 5 MB.

    python bench/report_scale.py [--source csv|db] [--trials 20000] [--budgets 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_commit, machine_busy_s  # noqa: E402

COLUMNS = (
    "experiment", "trial", "budget", "horizon", "d_model", "n_layers", "n_heads", "d_ff", "param_count",
    "learning_rate", "epochs", "batch_size", "weight_decay", "warmup_steps", "val_loss", "train_loss",
    "duration_s", "timestamp", "state", "phase", "plan_slot", "seed", "family", "choices", "best_epoch",
    "flops_per_sample", "train_flops", "samples_per_s", "val_curve",
)
BUDGETS = ("500K", "2M", "8M", "32M", "128M", "512M", "2B")


def synthetic_rows(experiment: str, n_trials: int, n_budgets: int, seed: int = 0,
                   law: tuple[float, float, float] = (0.30, 40.0, 0.30)) -> list[dict]:
    """Rows like archhpo's CSV; a budget's losses lie above E + A N^-alpha at its count."""
    from archhpo.budgets import parse_budget

    rng = np.random.default_rng(seed)
    e, a, alpha = law
    rows = []
    per = n_trials // n_budgets
    stamp = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for b in BUDGETS[:n_budgets]:
        value = parse_budget(b)
        for i in range(per):
            d_model = int(rng.choice([64, 128, 256, 512, 1024]))
            n_layers = int(rng.choice([2, 3, 4, 6, 8, 12, 16, 24, 32, 48]))
            count = int(value * rng.uniform(0.8, 1.2))
            floor = e + a * count**-alpha
            shape = 0.02 * abs(math.log(n_layers / d_model * 16))  # a preferred depth-to-width ratio
            loss = floor * (1 + shape + rng.exponential(0.03))
            state = "PRUNED" if rng.random() < 0.15 else "COMPLETE"
            epochs = int(rng.choice([50, 75, 100]))
            n_ep = epochs if state == "COMPLETE" else int(rng.integers(10, epochs))
            curve = loss * (1 + 2.0 * np.exp(-np.arange(1, n_ep + 1) / (epochs / 6)))
            best_epoch = int(np.argmin(curve)) + 1
            fps = 6 * count * 60
            rows.append({
                "experiment": experiment, "trial": i, "budget": b, "horizon": 1, "d_model": d_model,
                "n_layers": n_layers, "n_heads": 8, "d_ff": 4 * d_model, "param_count": count,
                "learning_rate": float(10 ** rng.uniform(-4, -3)), "epochs": epochs,
                "batch_size": int(rng.choice([32, 64, 128, 256])), "weight_decay": float(10 ** rng.uniform(-5, -3)),
                "warmup_steps": int(rng.choice([100, 200, 300, 500])), "val_loss": float(curve.min()),
                "train_loss": float(loss * 0.9), "duration_s": float(rng.uniform(10, 600)),
                "timestamp": (stamp + dt.timedelta(seconds=i)).isoformat(), "state": state,
                "phase": 1 if i < 0.4 * per else 2, "plan_slot": i, "seed": "", "family": "patchtst",
                "choices": "{}", "best_epoch": best_epoch, "flops_per_sample": fps,
                "train_flops": fps * 4000 * n_ep, "samples_per_s": float(rng.uniform(1e3, 1e4)),
                "val_curve": json.dumps([[k + 1, round(float(v), 6)] for k, v in enumerate(curve)]),
            })
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def build_db(url: str, experiment: str, n_trials: int, n_budgets: int, seed: int = 0) -> None:
    """Launch one real study per budget, then bulk-insert its finished trials (one transaction
    per table and budget) the way workers would have written them."""
    import sqlalchemy as sa
    from optuna.distributions import distribution_to_json

    from archhpo.search import launch, open_storage, prepare_settings
    from archhpo.search._optuna_private import models as m

    rng = np.random.default_rng(seed)
    storage = open_storage(url)
    per = n_trials // n_budgets
    now = dt.datetime(2026, 1, 1)
    for b in BUDGETS[:n_budgets]:
        settings = prepare_settings(experiment, b, family="patchtst", data="synthetic:steps=700", n_trials=50)
        launch(url, settings, storage=storage)
        study_id = storage.get_study_id_from_name(settings.study_name)
        dists = settings.search_space.distributions(len(settings.archs))
        dist_json = {k: distribution_to_json(v) for k, v in dists.items()}
        space = settings.search_space
        with storage.engine.begin() as conn:
            first_id = (conn.execute(sa.select(sa.func.max(m.TrialModel.trial_id))).scalar() or 0) + 1
            first_no = conn.execute(sa.select(sa.func.count()).select_from(m.TrialModel)
                                    .where(m.TrialModel.study_id == study_id)).scalar()
            trials, params, values, attrs, inter = [], [], [], [], []
            for i in range(per):
                tid = first_id + i
                idx = int(rng.integers(len(settings.archs)))
                arch = settings.archs[idx]
                count = arch["param_count"]
                e, a, alpha = (0.30, 40.0, 0.30)
                loss = (e + a * count**-alpha) * (1 + 0.02 * abs(math.log(arch["n_layers"] / arch["d_model"] * 16))
                                                  + rng.exponential(0.03))
                pruned = rng.random() < 0.15
                chosen = {"arch_idx": idx, "learning_rate": float(10 ** rng.uniform(-4, -3)),
                          "epochs": int(rng.choice(space.epochs)), "batch_size": int(rng.choice(space.batch_size)),
                          "weight_decay": float(10 ** rng.uniform(-5, -3)),
                          "warmup_steps": int(rng.choice(space.warmup_steps))}
                n_ep = chosen["epochs"] if not pruned else int(rng.integers(10, chosen["epochs"]))
                curve = loss * (1 + 2.0 * np.exp(-np.arange(1, n_ep + 1) / (chosen["epochs"] / 6)))
                trials.append({"trial_id": tid, "number": first_no + i, "study_id": study_id,
                               "state": "PRUNED" if pruned else "COMPLETE", "datetime_start": now,
                               "datetime_complete": now})
                params += [{"trial_id": tid, "param_name": k, "param_value": dists[k].to_internal_repr(v),
                            "distribution_json": dist_json[k]} for k, v in chosen.items()]
                if not pruned:
                    values.append({"trial_id": tid, "objective": 0, "value": float(curve.min()), "value_type": "FINITE"})
                ua = {**{k: arch[k] for k in ("d_model", "n_layers", "n_heads", "d_ff", "param_count")},
                      "host": "bench", "device": "cpu", "plan_slot": 1000 + i, "phase": 1, "attempt": 1,
                      "train_loss": float(loss * 0.9), "best_epoch": int(np.argmin(curve)) + 1,
                      "duration_s": float(rng.uniform(10, 600)), "flops_per_sample": 6 * count * 60,
                      "train_flops": 6 * count * 60 * 4000 * n_ep, "samples_per_s": float(rng.uniform(1e3, 1e4))}
                attrs += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in ua.items()]
                inter += [{"trial_id": tid, "step": k + 1, "intermediate_value": float(v),
                           "intermediate_value_type": "FINITE"} for k, v in enumerate(curve)]
            conn.execute(sa.insert(m.TrialModel.__table__), trials)
            conn.execute(sa.insert(m.TrialParamModel.__table__), params)
            conn.execute(sa.insert(m.TrialValueModel.__table__), values)
            conn.execute(sa.insert(m.TrialUserAttributeModel.__table__), attrs)
            conn.execute(sa.insert(m.TrialIntermediateValueModel.__table__), inter)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=20000)
    p.add_argument("--budgets", type=int, default=5)
    p.add_argument("--out", default="/tmp/archhpo-report-scale")
    p.add_argument("--source", choices=("csv", "db"), default="csv")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "experiment_results.csv"
    db_path = out / "scale.db"
    t0 = time.perf_counter()
    if args.source == "csv":
        write_csv(synthetic_rows("scale", args.trials, args.budgets), csv_path)
        source = ["--csv", str(csv_path)]
    else:
        db_path.unlink(missing_ok=True)
        build_db(f"sqlite:///{db_path}", "scale", args.trials, args.budgets)
        source = ["--storage", f"sqlite:///{db_path}"]
    build_s = time.perf_counter() - t0
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, t0 = machine_busy_s(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "archhpo", "report", "--experiment", "scale", *source,
                           "--out", str(out)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    busy = machine_busy_s() - busy0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if proc.returncode != 0:
        sys.exit(f"report failed ({proc.returncode}): {proc.stderr[-2000:]}")
    html_mb = (out / "scale_report.html").stat().st_size / 2**20
    result = {
        "source": args.source, "trials": args.trials, "budgets": args.budgets,
        "input_mb": round((csv_path if args.source == "csv" else db_path).stat().st_size / 2**20, 1),
        "build_s": round(build_s, 1), "report_wall_s": round(wall, 2), "report_cpu_s": round(cpu, 2),
        "html_mb": round(html_mb, 2),
        "machine_busy_cpu_s_during_report": round(busy, 1), "cpus": os.cpu_count(),
        "load_avg_1min_after": round(os.getloadavg()[0], 1),
        "commit": git_commit(), "date": dt.date.today().isoformat(),
        "target_met": wall < 20 and html_mb < 5,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
