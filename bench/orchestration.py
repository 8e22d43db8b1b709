"""Per-trial orchestration cost of archhpo's trial queue against what a careful user would
hand-roll with Optuna for the same job: a plan of trials fixed at launch, pruned by the median rule.

Trials do no training, so everything timed is bookkeeping.  An archhpo trial is what a worker
does around a training run, through ``search.TrialQueue``:

    claim()                   -- take the next WAITING planned trial (the "ask")
    report(step, loss) x 3    -- intermediate value + the median rule, one per epoch
    finish(COMPLETE, loss)    -- value, attributes and state in one transaction (the "tell")
    maintain()                -- plan upkeep: reap stale trials, retries, phase 2

The hand-rolled baseline (``handrolled``) does the same job with Optuna's public API only:

    launch: optuna.create_study(RandomSampler, MedianPruner) + study.enqueue_trial(params,
            user_attrs) for every phase-1 entry of the same plan archhpo enqueues
    trial:  study.ask() + the six suggest_* calls (which return the enqueued values)
            + 3 x (trial.report + trial.should_prune) + study.tell

Both pruners are the same MedianPruner(n_startup_trials=5, n_warmup_steps=10) and the reports
are at steps 10, 11, 12, so both evaluate the median rule at every report.  The launch is timed
too and reported per planned (enqueued) trial.

Loops (each BACKEND:LOOP runs on its own fresh study, so they all start from the same state):

- ``queue``: claim + 3 reports + finish -- what ``workers.Worker`` does per trial (its upkeep
  runs every ARCHHPO_REAP_S = 30 s and when nothing is waiting, not per trial);
- ``queue+maintain``: the same plus a blocking ``maintain()`` after every trial (an upper bound);
- ``handrolled``: the Optuna baseline above;
- ``optuna-tpe``: the previous reference, ``ask`` + 6 suggests of a TPE sampler on a study with
  nothing queued + 3 reports (no should_prune) + tell (not a like-for-like comparison).

Workers are separate processes (multiprocessing "spawn"), each with its own storage/queue.  A
pool is spawned once; for each stage, k of its processes open the study and do one untimed
warm-up trial, then all start together and each does a fixed number of trials.  Reported per
stage: ms per trial per process (its wall time / its trials; median over processes, and the
range), aggregate trials/s (all trials / wall time from first start to last end), the median
per-trial cost of each call, and how many trials the study held (finished / waiting) when the
stage started.  "worker CPU ms/trial" is the CPU time of the worker processes per trial
(client-side Python/SQLAlchemy/driver, not the database server); "CPU outside workers" is the
machine's busy CPU while the workers ran minus theirs, in cores: the PostgreSQL server plus
whatever else ran.  Ray task overhead (``ray.init`` ~4 s once, task dispatch) is not included.

A scratch PostgreSQL database (dropped afterwards) and a scratch SQLite file hold the studies.

    python bench/orchestration.py                    # the default stages (a few minutes)
    python bench/orchestration.py --stages "postgresql:queue:1,8" --json out.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
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
# Three reports per trial, at and after the full search space's pruner warm-up (10 epochs), so
# that both archhpo and the baseline's MedianPruner evaluate the median rule at every report.
REPORT_STEPS = (10, 11, 12)
EPOCHS = len(REPORT_STEPS)


# ------------------------------------------------------------------------ worker processes
def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


class _Archhpo:
    """One worker's queue; trial() runs one no-training trial and returns per-call seconds."""

    def __init__(self, url: str, study: str, maintain: bool) -> None:
        _quiet_optuna()
        from archhpo.search._queue import TrialQueue

        self.q = TrialQueue(url, study)
        self.maintain = maintain
        self.attrs = {"host": platform.node(), "pid": os.getpid(), "device": "cpu"}
        self.rng = random.Random(os.getpid())

    def trial(self) -> dict[str, float] | None:
        from optuna.trial import TrialState

        ops: dict[str, float] = {}
        t = time.perf_counter()
        claim = self.q.claim(self.attrs)
        ops["claim"] = time.perf_counter() - t
        if claim is None:
            return None
        t = time.perf_counter()
        for step in REPORT_STEPS:
            self.q.report(claim, step, 0.7 - 0.01 * step + 0.05 * self.rng.random())
        ops["report x3"] = time.perf_counter() - t
        t = time.perf_counter()
        self.q.finish(claim, TrialState.COMPLETE, 0.6 + 0.05 * self.rng.random(), {"duration_s": 0.0})
        ops["finish"] = time.perf_counter() - t
        if self.maintain:
            t = time.perf_counter()
            self.q.maintain()
            ops["maintain"] = time.perf_counter() - t
        return ops

    def close(self) -> None:
        self.q.storage.engine.dispose()


class _Handrolled:
    """The careful user's Optuna loop on an enqueued plan: ask + the six suggests (returning the
    enqueued values) + 3 x (report + should_prune) + tell; RandomSampler, MedianPruner."""

    def __init__(self, url: str, study: str, maintain: bool) -> None:
        _quiet_optuna()
        import optuna

        from archhpo.search._study import make_pruner

        # The storage URL, as a user passes it: Optuna wraps it in its caching storage.
        self.study = optuna.load_study(study_name=study, storage=url, sampler=optuna.samplers.RandomSampler(),
                                       pruner=make_pruner("median", quick=False))
        self.distributions = json.loads(self.study.user_attrs["bench_distributions"])
        self.rng = random.Random(os.getpid())

    def _suggest(self, trial: Any) -> dict[str, Any]:
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
            json_to_distribution,
        )

        out = {}
        for name, text in self.distributions.items():
            d = json_to_distribution(text)
            if isinstance(d, IntDistribution):
                out[name] = trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
            elif isinstance(d, FloatDistribution):
                out[name] = trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)
            else:
                assert isinstance(d, CategoricalDistribution)
                out[name] = trial.suggest_categorical(name, d.choices)
        return out

    def trial(self) -> dict[str, float] | None:
        ops: dict[str, float] = {}
        t = time.perf_counter()
        trial = self.study.ask()
        if "plan_slot" not in trial.user_attrs:
            # Nothing was waiting: ask() created a new, unplanned trial; a careful user's loop stops.
            self.study.tell(trial, state=optuna_state("FAIL"))
            return None
        self._suggest(trial)
        ops["ask+6 suggests"] = time.perf_counter() - t
        t = time.perf_counter()
        for step in REPORT_STEPS:
            trial.report(0.7 - 0.01 * step + 0.05 * self.rng.random(), step)
            trial.should_prune()  # the decision is ignored, as in the archhpo loop: same work either way
        ops["report+should_prune x3"] = time.perf_counter() - t
        t = time.perf_counter()
        self.study.tell(trial, 0.6 + 0.05 * self.rng.random())
        ops["tell"] = time.perf_counter() - t
        return ops

    def close(self) -> None:
        pass


def optuna_state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


class _Optuna:
    """Plain Optuna: ask + 6 suggests (TPE) + 3 reports + tell on a default RDBStorage."""

    def __init__(self, url: str, study: str, maintain: bool) -> None:
        _quiet_optuna()
        import optuna

        self.storage = optuna.storages.RDBStorage(url)
        self.study = optuna.load_study(study_name=study, storage=self.storage,
                                       sampler=optuna.samplers.TPESampler())
        self.rng = random.Random(os.getpid())

    def trial(self) -> dict[str, float] | None:
        ops: dict[str, float] = {}
        t = time.perf_counter()
        trial = self.study.ask()
        trial.suggest_int("arch_idx", 0, 400)
        trial.suggest_float("learning_rate", 1e-4, 1e-3, log=True)
        trial.suggest_categorical("epochs", [50, 75, 100])
        trial.suggest_categorical("batch_size", [32, 64, 128, 256])
        trial.suggest_float("weight_decay", 1e-5, 1e-3, log=True)
        trial.suggest_categorical("warmup_steps", [100, 200, 300, 500])
        ops["ask+6 suggests"] = time.perf_counter() - t
        t = time.perf_counter()
        for step in REPORT_STEPS:
            trial.report(0.7 - 0.01 * step + 0.05 * self.rng.random(), step)
        ops["report x3"] = time.perf_counter() - t
        t = time.perf_counter()
        self.study.tell(trial, 0.6 + 0.05 * self.rng.random())
        ops["tell"] = time.perf_counter() - t
        return ops

    def close(self) -> None:
        self.storage.engine.dispose()


_LOOPS = {"archhpo": _Archhpo, "handrolled": _Handrolled, "optuna": _Optuna}


def _child(conn: Any) -> None:
    """Pool process: ('prepare', loop, url, study, maintain) -> ready; ('go', n) -> results."""
    runner = None
    while True:
        msg = conn.recv()
        if msg is None:
            break
        try:
            if msg[0] == "prepare":
                _, loop, url, study, maintain = msg
                t = time.perf_counter()
                runner = _LOOPS[loop](url, study, maintain)
                runner.trial()  # warm-up: connections, compiled statements, caches
                conn.send(("ready", time.perf_counter() - t))
            elif msg[0] == "go":
                assert runner is not None
                per_trial: list[dict[str, float]] = []
                start_wall, start, cpu = time.time(), time.perf_counter(), time.process_time()
                for _ in range(msg[1]):
                    ops = runner.trial()
                    if ops is None:
                        break
                    per_trial.append(ops)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu
                runner.close()
                runner = None
                conn.send(("done", {"start": start_wall, "end": start_wall + elapsed, "elapsed": elapsed,
                                    "cpu": cpu, "trials": per_trial}))
        except Exception as exc:  # report, keep the pool alive
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Pool:
    def __init__(self, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for _ in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_child, args=(child,), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def stage(self, k: int, loop: str, url: str, study: str, trials_each: int, maintain: bool) -> dict[str, Any]:
        conns = self.conns[:k]
        for c in conns:
            c.send(("prepare", loop, url, study, maintain))
        ready = [_expect(c, "ready") for c in conns]
        busy0, t0 = machine_busy_s(), time.perf_counter()
        for c in conns:
            c.send(("go", trials_each))
        results = [_expect(c, "done") for c in conns]
        busy, wall = machine_busy_s() - busy0, time.perf_counter() - t0
        # Cores' worth of CPU used outside the worker processes while they ran: the database
        # server (PostgreSQL) plus anything else on the machine.
        outside = max(0.0, (busy - sum(r["cpu"] for r in results)) / wall)
        return {"startup_s": ready, "results": results, "outside_cpu_cores": outside}

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


def _expect(conn: Any, kind: str) -> Any:
    got, payload = conn.recv()
    if got != kind:
        raise RuntimeError(f"worker process: {payload}")
    return payload


# ------------------------------------------------------------------------------ the studies
def trial_counts(url: str, study: str) -> dict[str, int]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT t.state, COUNT(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                "WHERE s.study_name = :n GROUP BY t.state"), {"n": study}).all()
    finally:
        engine.dispose()
    return {str(state).split(".")[-1]: int(n) for state, n in rows}


# Loops a stage can run: (worker class, maintain() after every trial, study pruner).
LOOPS: dict[str, tuple[str, bool, str]] = {
    "queue": ("archhpo", False, "median"),  # what workers.Worker does per trial
    "queue+maintain": ("archhpo", True, "median"),  # claim, 3 reports, finish, maintain
    "queue-nopruner": ("archhpo", False, "none"),  # the same as queue with --pruner none
    "handrolled": ("handrolled", False, "median"),  # enqueue_trial plan + ask/suggest/report/should_prune/tell
    "optuna-tpe": ("optuna", False, ""),  # the old reference: TPE ask/tell on an empty study
}


def launch_archhpo(url: str, experiment: str, budget: str, n_trials: int, tolerance: float,
                   pruner: str) -> tuple[str, dict[str, Any]]:
    from archhpo.search._study import launch, prepare_settings

    settings = prepare_settings(experiment, budget, n_trials=n_trials, tolerance=tolerance, pruner=pruner)
    t = time.perf_counter()
    result = launch(url, settings)
    info = {
        "plan": len(settings.plan), "phase1": sum(e.phase == 1 for e in settings.plan),
        "archs": len(settings.archs), "enqueued": result.enqueued, "launch_s": time.perf_counter() - t,
    }
    return settings.study_name, info


def launch_handrolled(url: str, experiment: str, budget: str, n_trials: int, tolerance: float
                      ) -> tuple[str, dict[str, Any]]:
    """The baseline's launch: the same plan, enqueued with Optuna's public enqueue_trial."""
    import optuna
    from optuna.distributions import distribution_to_json

    from archhpo.search._study import make_pruner, prepare_settings

    settings = prepare_settings(experiment, budget, n_trials=n_trials, tolerance=tolerance)
    dists = settings.search_space.distributions(len(settings.archs))
    phase1 = [e for e in settings.plan if e.phase == 1]
    name = f"{experiment}_handrolled"
    t = time.perf_counter()
    study = optuna.create_study(study_name=name, storage=url, direction="minimize",
                                sampler=optuna.samplers.RandomSampler(), pruner=make_pruner("median", False))
    for e in phase1:
        study.enqueue_trial({"arch_idx": e.arch_idx, **(e.params or {})},
                            user_attrs={"plan_slot": e.slot, "phase": 1, "attempt": 1})
    launch_s = time.perf_counter() - t
    study.set_user_attr("bench_distributions", json.dumps({k: distribution_to_json(v) for k, v in dists.items()}))
    info = {"plan": len(settings.plan), "phase1": len(phase1), "archs": len(settings.archs),
            "enqueued": len(phase1), "launch_s": launch_s}
    return name, info


def create_optuna(url: str) -> str:
    import optuna

    optuna.create_study(study_name="plain_optuna_tpe", storage=url, direction="minimize")
    return "plain_optuna_tpe"


def summarise(backend: str, loop: str, procs: int, before: dict[str, int], out: dict[str, Any]) -> dict[str, Any]:
    res = out["results"]
    n = sum(len(r["trials"]) for r in res)
    per_proc_ms = [r["elapsed"] / len(r["trials"]) * 1e3 for r in res if r["trials"]]
    cpu_ms = sum(r["cpu"] for r in res) / n * 1e3 if n else float("nan")
    wall = max(r["end"] for r in res) - min(r["start"] for r in res)
    trials = [t for r in res for t in r["trials"]]
    ops = {k: statistics.median(t[k] for t in trials) * 1e3 for k in trials[0]} if trials else {}
    total_med = statistics.median(sum(t.values()) for t in trials) * 1e3 if trials else float("nan")
    no_maint = statistics.median(sum(v for k, v in t.items() if k != "maintain") for t in trials) * 1e3 \
        if trials else float("nan")
    finished = sum(before.get(s, 0) for s in ("COMPLETE", "PRUNED", "FAIL"))
    return {
        "backend": backend, "loop": loop, "procs": procs, "trials": n,
        "outside_cpu_cores": out["outside_cpu_cores"],
        "finished_before": finished, "waiting_before": before.get("WAITING", 0),
        "ms_per_trial_median": statistics.median(per_proc_ms), "ms_per_trial_min": min(per_proc_ms),
        "ms_per_trial_max": max(per_proc_ms), "trials_per_s": n / wall, "wall_s": wall,
        "client_cpu_ms_per_trial": cpu_ms,
        "ops_median_ms": ops, "trial_median_ms": total_med, "trial_median_ms_without_maintain": no_maint,
        "startup_s_median": statistics.median(out["startup_s"]),
        "per_process_ms": [[{k: round(v * 1e3, 2) for k, v in t.items()} for t in r["trials"]] for r in res],
    }


def machine(pg_url: str | None) -> dict[str, Any]:
    import optuna
    import sqlalchemy as sa

    info: dict[str, Any] = {"python": platform.python_version(), "optuna": optuna.__version__,
                            "sqlalchemy": sa.__version__, "cpus": os.cpu_count(),
                            "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                            "commit": git_commit()}
    try:
        with open("/proc/loadavg") as fh:
            info["loadavg"] = " ".join(fh.read().split()[:3])
    except OSError:
        pass
    if pg_url:
        engine = sa.create_engine(pg_url)
        with engine.connect() as conn:
            info["postgresql"] = conn.execute(sa.text("SHOW server_version")).scalar()
        engine.dispose()
    import sqlite3

    info["sqlite"] = sqlite3.sqlite_version
    return info


def _admin(sql: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(sql))
    engine.dispose()


def _parse_stage(text: str) -> tuple[str, str, list[int]]:
    """'postgresql:queue+maintain:1,8,16' -> (backend, loop, [1, 8, 16])."""
    try:
        backend, loop, procs = text.split(":")
        ks = [int(k) for k in procs.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"stage {text!r} is not BACKEND:LOOP:N[,N...]") from None
    if backend not in ("postgresql", "sqlite") or loop not in LOOPS or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"stage {text!r}: backend postgresql|sqlite, loop one of {list(LOOPS)}")
    return backend, loop, ks


DEFAULT_STAGES = [
    "postgresql:queue:1,8,16", "postgresql:handrolled:1,8,16", "postgresql:queue+maintain:1,8,16",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=_parse_stage, nargs="+", default=[_parse_stage(s) for s in DEFAULT_STAGES],
                    help="BACKEND:LOOP:N[,N...] with LOOP one of: " + ", ".join(LOOPS)
                    + "; each BACKEND:LOOP gets its own fresh study (default: " + " ".join(DEFAULT_STAGES) + ")")
    ap.add_argument("--trials", type=int, default=40,
                    help="timed trials per multi-worker stage, split evenly (at least 4 per worker)")
    ap.add_argument("--single-trials", type=int, default=20, help="timed trials of a 1-worker stage")
    ap.add_argument("--budget", default="20M")
    ap.add_argument("--plan-trials", type=int, default=400, help="n_trials of the archhpo studies")
    ap.add_argument("--tolerance", type=float, default=0.9, help="budget tolerance (0.9 gives a 400-trial plan)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    args = ap.parse_args(argv)
    _quiet_optuna()

    load_before = machine(None).get("loadavg", "?")
    backends = list(dict.fromkeys(b for b, _, _ in args.stages))
    pg_db = f"archhpo_bench_{os.getpid()}"
    pg_url = PG_ADMIN.rsplit("/", 1)[0] + "/" + pg_db
    tmp = tempfile.TemporaryDirectory(prefix="archhpo-bench-")
    urls = {"postgresql": pg_url, "sqlite": f"sqlite:///{Path(tmp.name) / 'bench.db'}"}
    need = max(max(ks) for _, _, ks in args.stages)
    rows: list[dict[str, Any]] = []
    studies: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    pool = None
    if "postgresql" in backends:
        _admin(f'CREATE DATABASE "{pg_db}"')
    try:
        print(f"# spawning {need} worker processes", file=sys.stderr, flush=True)
        pool = Pool(need)
        for i, (backend, loop, ks) in enumerate(args.stages):
            url = urls[backend]
            kind, maintain, pruner = LOOPS[loop]
            if kind in ("archhpo", "handrolled"):
                if kind == "archhpo":
                    name, info = launch_archhpo(url, f"bench{i}", args.budget, args.plan_trials, args.tolerance,
                                                pruner)
                else:
                    name, info = launch_handrolled(url, f"bench{i}", args.budget, args.plan_trials, args.tolerance)
                info["launch_ms_per_trial"] = info["launch_s"] / max(1, info["enqueued"]) * 1e3
                print(f"# {backend}: launched {name}: plan {info['plan']} trials, {info['enqueued']} enqueued "
                      f"in {info['launch_s']:.1f} s ({info['launch_ms_per_trial']:.1f} ms per planned trial)",
                      file=sys.stderr, flush=True)
            else:
                name, info = create_optuna(url), {}
            for k in ks:
                total = args.single_trials if k == 1 else max(args.trials, 4 * k)
                before = trial_counts(url, name)
                out = pool.stage(k, kind, url, name, total // k, maintain=maintain)
                row = summarise(backend, loop, k, before, out)
                rows.append(row)
                print(f"# {backend} {loop} x{k}: {row['ms_per_trial_median']:.0f} ms/trial/worker, "
                      f"{row['trials_per_s']:.2f} trials/s, finished before {row['finished_before']}",
                      file=sys.stderr, flush=True)
            studies.append({"backend": backend, "loop": loop, "study": name, **info,
                            "final_counts": trial_counts(url, name)})
    finally:
        if pool is not None:
            pool.close()
        if "postgresql" in backends:
            _admin(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')
        tmp.cleanup()
    elapsed = time.perf_counter() - t_all

    m = machine(PG_ADMIN if "postgresql" in backends else None)
    print(f"Orchestration overhead per trial (no training; {EPOCHS} reports per trial), "
          f"{m['cpus']} CPUs, load average before the run {load_before}; archhpo {m['commit']}, {m['date_utc']}")
    print()
    for s in studies:
        if "plan" in s:
            print(f"- {s['backend']} `{s['loop']}`: study `{s['study']}`, {s['archs']} architectures, plan of "
                  f"{s['plan']} trials ({s['phase1']} in phase 1, enqueued by launch in {s['launch_s']:.2f} s = "
                  f"{s['launch_ms_per_trial']:.1f} ms per planned trial); final states {s['final_counts']}")
        else:
            print(f"- {s['backend']} `{s['loop']}`: study `{s['study']}`; final states {s['final_counts']}")
    print()
    print("| backend | loop | workers | trials timed | study before (finished / waiting) "
          "| ms/trial per worker, median (min-max) | trials/s, all workers | worker CPU ms/trial "
          "| per-call median ms | CPU outside workers (cores) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        ops = ", ".join(f"{k} {v:.0f}" for k, v in r["ops_median_ms"].items())
        print(f"| {r['backend']} | {r['loop']} | {r['procs']} | {r['trials']} "
              f"| {r['finished_before']} / {r['waiting_before']} "
              f"| {r['ms_per_trial_median']:.0f} ({r['ms_per_trial_min']:.0f}-{r['ms_per_trial_max']:.0f}) "
              f"| {r['trials_per_s']:.2f} | {r['client_cpu_ms_per_trial']:.0f} | {ops} "
              f"| {r['outside_cpu_cores']:.2f} |")
    print()
    print(f"Total benchmark time {elapsed:.0f} s (including spawning {need} processes and launching the studies).")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": m, "args": {**vars(args), "stages": [list(s) for s in args.stages]},
                       "studies": studies, "rows": rows, "elapsed_s": elapsed}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
