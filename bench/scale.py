"""How archhpo's per-trial cost grows with the study: 0, 10,000 and 100,000 finished trials.

Optuna's own storage slows as a study grows (optuna#3053: 0.5 s to 5 s per trial at 80k trials).
This script grows ONE archhpo study and, at each size, times what a worker and the driver do:

- worker start: ``TrialQueue(url, name)`` (loads the study and its plan);
- per trial (no training): ``claim``, 3 x ``report`` (steps 10, 11, 12: after the pruner's
  warm-up, so the median rule runs every time) and ``finish`` -- median over the trials;
- upkeep: ``maintain()`` (reaping, retries, plan); the driver's progress: ``maintain(blocking=False)``
  and ``status()``;
- relaunch: ``launch()`` of the same settings (what ``archhpo run`` does on resume);
- export: ``export_studies`` (CSV + best JSON of every finished trial).

The finished trials are bulk-inserted (PostgreSQL COPY / SQLite executemany) with the rows a
real finished trial has: the trial, 6 params, its value, 3 intermediate values (at the same
steps, so the pruning query sees every one of them), a fixed_params system attribute and 13
user attributes; the plan grows with them (a study with n finished trials has a plan of at least
n).  Every size also keeps WAITING planned trials to claim.

    python bench/scale.py --json out.json                 # PostgreSQL, sizes 0 10000 100000
    python bench/scale.py --backend sqlite --sizes 0 10000
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import io
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import git_commit, machine_busy_s  # noqa: E402  (bench/ is on sys.path when run as a script)

PG_ADMIN = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
REPORT_STEPS = (10, 11, 12)
WORKER = {"host": platform.node(), "device": "cpu"}


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


# ------------------------------------------------------------------------------ bulk insert
class Bulk:
    """Insert finished trials straight into Optuna's tables (what a long study leaves behind)."""

    def __init__(self, url: str, study_id: int, settings: Any) -> None:
        import sqlalchemy as sa

        self.url, self.study_id, self.settings = url, study_id, settings
        self.engine = sa.create_engine(url)
        self.postgres = url.startswith("postgresql")
        from optuna.distributions import distribution_to_json

        dists = settings.search_space.distributions(len(settings.archs))
        self.dists = dists
        self.dist_json = {k: distribution_to_json(v) for k, v in dists.items()}

    def add(self, slots: list[int], entries: dict[int, Any]) -> float:
        import sqlalchemy as sa

        rng = random.Random(len(slots))
        t0 = time.perf_counter()
        with self.engine.begin() as conn:
            max_id = conn.execute(sa.text("SELECT COALESCE(MAX(trial_id), 0) FROM trials")).scalar()
            max_num = conn.execute(sa.text("SELECT COALESCE(MAX(number), -1) FROM trials WHERE study_id = :s"),
                                   {"s": self.study_id}).scalar()
            now = dt.datetime.now()
            rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in (
                "trials", "trial_params", "trial_values", "trial_intermediate_values",
                "trial_user_attributes", "trial_system_attributes")}
            for i, slot in enumerate(slots):
                tid, num = max_id + 1 + i, max_num + 1 + i
                e = entries[slot]
                params = {"arch_idx": e.arch_idx, **e.params}
                arch = self.settings.archs[e.arch_idx]
                value = 0.5 + 0.2 * rng.random()
                start = now - dt.timedelta(seconds=600 + i)
                rows["trials"].append((tid, num, self.study_id, "COMPLETE", start, start + dt.timedelta(seconds=60)))
                for name, v in params.items():
                    rows["trial_params"].append(
                        (tid, name, self.dists[name].to_internal_repr(v), self.dist_json[name]))
                rows["trial_values"].append((tid, 0, value, "FINITE"))
                for k, step in enumerate(REPORT_STEPS):
                    rows["trial_intermediate_values"].append((tid, step, value + 0.02 * (2 - k), "FINITE"))
                attrs = {"plan_slot": slot, "phase": 1, "attempt": 1, "host": "bulk", "device": "cpu",
                         "duration_s": 60.0, "train_loss": value - 0.05, "best_epoch": 12, "state_note": "complete",
                         **{k: arch[k] for k in ("d_model", "n_layers", "n_heads", "d_ff", "param_count")}}
                rows["trial_user_attributes"] += [(tid, k, json.dumps(v)) for k, v in attrs.items()]
                rows["trial_system_attributes"].append((tid, "fixed_params", json.dumps(params)))
            columns = {
                "trials": "trial_id, number, study_id, state, datetime_start, datetime_complete",
                "trial_params": "trial_id, param_name, param_value, distribution_json",
                "trial_values": "trial_id, objective, value, value_type",
                "trial_intermediate_values": "trial_id, step, intermediate_value, intermediate_value_type",
                "trial_user_attributes": "trial_id, key, value_json",
                "trial_system_attributes": "trial_id, key, value_json",
            }
            raw = conn.connection.dbapi_connection
            for table, cols in columns.items():
                data = rows[table]
                if self.postgres:
                    buf = io.StringIO()
                    import csv

                    csv.writer(buf).writerows(data)
                    buf.seek(0)
                    with raw.cursor() as cur:
                        cur.copy_expert(f"COPY {table} ({cols}) FROM STDIN WITH (FORMAT csv)", buf)
                else:
                    marks = ", ".join("?" * len(data[0]))
                    raw.cursor().executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", data)
            if self.postgres:
                conn.execute(sa.text("SELECT setval(pg_get_serial_sequence('trials', 'trial_id'), "
                                     "(SELECT MAX(trial_id) FROM trials))"))
        if self.postgres:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text("ANALYZE"))  # as autovacuum would have, for a study grown over days
        return time.perf_counter() - t0

    def close(self) -> None:
        self.engine.dispose()


# ------------------------------------------------------------------------------ measurements
def measure(url: str, name: str, settings: Any, trials: int, repeats: int, out_dir: Path,
            export: bool) -> dict[str, Any]:
    from optuna.trial import TrialState

    from archhpo.report._export import export_studies
    from archhpo.search._queue import TrialQueue
    from archhpo.search._study import launch

    res: dict[str, list[float]] = {k: [] for k in (
        "worker start", "first upkeep (reads the study once)", "claim", "report", "finish",
        "trial (claim+3 reports+finish)", "maintain", "progress: maintain(blocking=False)", "status", "relaunch",
        "export (first, reads every trial)", "export (again, as the driver does)")}
    rng = random.Random(0)
    for _ in range(repeats):
        took, q = _timed(lambda: TrialQueue(url, name))
        res["worker start"].append(took)
        res["first upkeep (reads the study once)"].append(_timed(q.status)[0])
        c = q.claim(WORKER)  # warm-up trial: connections, statement caches
        for step in REPORT_STEPS:
            q.report(c, step, 0.6)
        q.finish(c, TrialState.COMPLETE, 0.6, {"duration_s": 0.0})
        per_trial = []
        for _ in range(trials):
            took_c, c = _timed(lambda q=q: q.claim(WORKER))
            assert c is not None, "the plan ran out of WAITING trials: raise --waiting"
            res["claim"].append(took_c)
            reports = 0.0
            for step in REPORT_STEPS:
                took, _ = _timed(lambda c=c, step=step, q=q: q.report(c, step, 0.5 + 0.2 * rng.random()))
                res["report"].append(took)
                reports += took
            took_f, _ = _timed(lambda c=c, q=q: q.finish(c, TrialState.COMPLETE, 0.55, {"duration_s": 0.0}))
            res["finish"].append(took_f)
            per_trial.append(took_c + reports + took_f)
        res["trial (claim+3 reports+finish)"] += per_trial
        res["maintain"].append(_timed(q.maintain)[0])
        res["progress: maintain(blocking=False)"].append(_timed(lambda q=q: q.maintain(blocking=False))[0])
        res["status"].append(_timed(q.status)[0])
        res["relaunch"].append(_timed(lambda: launch(url, settings))[0])
        q.storage.engine.dispose()
    if export:
        from archhpo.search._storage import open_storage

        storage = open_storage(url, create=False)  # a new storage: nothing cached yet
        res["export (first, reads every trial)"].append(_timed(lambda: export_studies(storage, [name], out_dir))[0])
        for _ in range(max(1, repeats - 1)):
            res["export (again, as the driver does)"].append(
                _timed(lambda: export_studies(storage, [name], out_dir))[0])
        storage.engine.dispose()
    return {k: {"median_ms": _ms(statistics.median(v)), "min_ms": _ms(min(v)), "max_ms": _ms(max(v)), "n": len(v)}
            for k, v in res.items() if v}


def plan_entries(template: list[Any], slots: range) -> dict[int, Any]:
    """PlanEntry objects for `slots`, phase 1, cycling through the template's."""
    return {s: dataclasses.replace(template[s % len(template)], slot=s, phase=1, seed=None) for s in slots}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    ap.add_argument("--sizes", type=int, nargs="+", default=[0, 10_000, 100_000],
                    help="finished trials in the study at each measurement (increasing)")
    ap.add_argument("--trials", type=int, default=10, help="timed trials per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--waiting", type=int, default=160, help="WAITING planned trials enqueued by launch")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from archhpo.search._optuna_private import study_id_of
    from archhpo.search._storage import open_storage
    from archhpo.search._study import launch, load_study, prepare_settings

    needed = (len(args.sizes)) * args.repeats * (args.trials + 1)
    if args.waiting < needed:
        ap.error(f"--waiting must be at least {needed} (sizes x repeats x (trials + 1))")
    pg_db = f"archhpo_scale_{os.getpid()}"
    tmp = tempfile.TemporaryDirectory(prefix="archhpo-scale-")
    url = (PG_ADMIN.rsplit("/", 1)[0] + "/" + pg_db) if args.backend == "postgresql" \
        else f"sqlite:///{Path(tmp.name) / 'scale.db'}"
    import sqlalchemy as sa

    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    if args.backend == "postgresql":
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{pg_db}"'))
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    busy0 = machine_busy_s()
    try:
        base = prepare_settings("scale", "20M", n_trials=400, tolerance=0.9)
        template = [e for e in base.plan if e.phase == 1]
        waiting = plan_entries(template, range(args.waiting))
        settings = dataclasses.replace(base, plan=list(waiting.values()), n_trials=args.waiting)
        took_launch, _ = _timed(lambda: launch(url, settings))
        print(f"# launched {settings.study_name}: {args.waiting} WAITING trials in {took_launch:.1f} s "
              f"({took_launch / args.waiting * 1e3:.1f} ms per planned trial)", file=sys.stderr, flush=True)
        storage = open_storage(url, create=False)
        study = load_study(storage, settings.study_name)
        bulk = Bulk(url, study_id_of(study), settings)
        have = 0
        for size in args.sizes:
            new = range(args.waiting + have, args.waiting + size)
            entries = {**waiting, **plan_entries(template, range(args.waiting, args.waiting + size))}
            settings = dataclasses.replace(settings, plan=[entries[s] for s in sorted(entries)], n_trials=len(entries))
            insert_s = bulk.add(list(new), entries) if len(new) else 0.0
            for key in ("archhpo_plan", "archhpo_n_trials"):
                study.set_user_attr(key, settings.to_attrs()[key])
            have = size
            print(f"# {size} finished trials (+{len(new)} inserted in {insert_s:.0f} s); measuring",
                  file=sys.stderr, flush=True)
            load = os.getloadavg()[0]
            b0, t0 = machine_busy_s(), time.perf_counter()
            m = measure(url, settings.study_name, settings, args.trials, args.repeats, Path(tmp.name) / "out",
                        export=not args.no_export)
            wall = time.perf_counter() - t0
            rows.append({"finished": size, "plan": len(settings.plan), "loadavg_1min": load,
                         "machine_busy_cores": (machine_busy_s() - b0) / wall, "ops": m})
            print(f"#   trial {m['trial (claim+3 reports+finish)']['median_ms']:.1f} ms, maintain "
                  f"{m['maintain']['median_ms']:.1f} ms, status {m['status']['median_ms']:.1f} ms"
                  + (f", export {m['export (first, reads every trial)']['median_ms']:.0f} ms"
                     if "export (first, reads every trial)" in m else ""),
                  file=sys.stderr, flush=True)
        bulk.close()
        storage.engine.dispose()
    finally:
        if args.backend == "postgresql":
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)'))
        admin.dispose()
        tmp.cleanup()
    elapsed = time.perf_counter() - t_all
    machine = {"cpus": os.cpu_count(), "optuna": optuna.__version__, "sqlalchemy": sa.__version__,
               "python": platform.python_version(), "commit": git_commit(),
               "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
               "busy_cores_whole_run": (machine_busy_s() - busy0) / elapsed}
    print(f"archhpo per-trial cost by study size, {args.backend}; commit {machine['commit']}, "
          f"{machine['date_utc']}, {machine['cpus']} CPUs; {args.trials} trials x {args.repeats} repeats per size")
    print()
    ops = list(rows[0]["ops"])
    base_row = rows[0]["ops"]
    print("| operation | " + " | ".join(f"{r['finished']:,} finished (plan {r['plan']:,})" for r in rows)
          + " | largest / empty |")
    print("|---|" + "---:|" * (len(rows) + 1))
    for op in ops:
        cells = []
        for r in rows:
            o = r["ops"].get(op)
            cells.append(f"{o['median_ms']:.1f} ({o['min_ms']:.1f}-{o['max_ms']:.1f})" if o else "-")
        last = rows[-1]["ops"].get(op)
        ratio = f"{last['median_ms'] / base_row[op]['median_ms']:.2f}x" if last and base_row[op]["median_ms"] else "-"
        print(f"| {op} | " + " | ".join(cells) + f" | {ratio} |")
    print()
    print("Machine load during each size (1-min load average at its start; busy cores while measuring): "
          + "; ".join(f"{r['finished']:,}: {r['loadavg_1min']:.1f}, {r['machine_busy_cores']:.2f}" for r in rows))
    print(f"Total time {elapsed:.0f} s.")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine, "args": vars(args), "rows": rows, "elapsed_s": elapsed}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
