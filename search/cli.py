"""The `archhpo` command line (SPEC §2). Every user error ends in one sentence and exit code 2."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from archhpo.errors import ArchhpoError
from archhpo.models import Family, family_names, get_family

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


# ----------------------------------------------------------------------------- family flags
def _family_from_argv(argv: Sequence[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--family" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--family="):
            return arg.split("=", 1)[1]
    return "patchtst"


def _add_family_flags(p: argparse.ArgumentParser, family: Family | None) -> None:
    if family is None:
        return
    group = p.add_argument_group(f"{family.name} options")
    for flag in family.flags:
        group.add_argument(
            "--" + flag.name.replace("_", "-"), dest=f"fam_{flag.name}", type=flag.type, default=None,
            help=f"{flag.help} (default {flag.default})",
        )


def _family_values(args: argparse.Namespace, family: Family, with_defaults: bool) -> dict[str, Any]:
    values = {}
    for flag in family.flags:
        v = getattr(args, f"fam_{flag.name}", None)
        if v is not None:
            values[flag.name] = v
        elif with_defaults:
            values[flag.name] = flag.default
    return values


# ----------------------------------------------------------------------------- commands
def cmd_grid(args: argparse.Namespace) -> int:
    from archhpo.budgets import build_grid, format_budget, parse_budget, require_rows

    fam = get_family(args.family)
    info = _family_values(args, fam, with_defaults=True)
    rows = []
    for text in args.budget:
        value = parse_budget(text)
        rows += require_rows(build_grid(fam, value, info, args.tolerance), value, args.tolerance, fam.name)
    dicts = [r.as_dict() for r in rows]
    if args.format == "json":
        print(json.dumps(dicts, indent=1))
    elif args.format == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(dicts[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(dicts)
        print(buf.getvalue(), end="")
    else:
        head = f"{'budget':>6} {'idx':>4} {'d_model':>7} {'layers':>6} {'heads':>5} {'d_ff':>5} "
        head += f"{'params':>14} {'estimate':>14} {'vs budget':>9} {'flops/sample':>12}  extreme"
        print(head)
        for r in rows:
            est = f"{r.estimate:>14,}" if r.estimate is not None else f"{'-':>14}"
            dev = r.param_count / parse_budget(r.budget) - 1
            flops = f"{r.flops_per_sample:>12.3e}" if r.flops_per_sample is not None else f"{'-':>12}"
            print(f"{r.budget:>6} {r.arch_idx:>4} {r.d_model:>7} {r.n_layers:>6} {r.n_heads:>5} {r.d_ff:>5} "
                  f"{r.param_count:>14,} {est} {dev:>+9.1%} {flops}  {r.extreme}")
        for b in args.budget:
            n = sum(1 for r in rows if r.budget == format_budget(parse_budget(b)))
            print(f"# {format_budget(parse_budget(b))}: {n} architectures within ±{args.tolerance:.0%}")
    return 0


def _arch_from_args(args: argparse.Namespace) -> dict[str, int]:
    return {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads, "d_ff": args.d_ff}


def cmd_params(args: argparse.Namespace) -> int:
    fam = get_family(args.family)
    cfg = fam.config_for(_arch_from_args(args), _family_values(args, fam, with_defaults=True))
    count = fam.param_count(cfg)
    est = fam.estimate(cfg) if fam.estimate else None
    flops = fam.flops_per_sample(cfg) if fam.flops_per_sample else None
    if args.format == "json":
        from dataclasses import asdict

        print(json.dumps({"family": fam.name, "param_count": count, "estimate": est,
                          "flops_per_sample": flops, "config": asdict(cfg)}))
    else:
        extra = f" (design formula estimate {est:,})" if est is not None else ""
        print(f"{count:,} parameters{extra}")
        if flops is not None:
            print(f"{flops:,} training FLOPs per sample (forward + backward, {flops:.3e})")
    return 0


def _settings_from_args(args: argparse.Namespace, budget: str) -> Any:
    from archhpo.search._study import prepare_settings

    fam = get_family(args.family)
    return prepare_settings(
        args.experiment, budget, family=args.family, n_trials=args.trials, data=args.data,
        horizon=args.horizon, threshold=args.threshold, seed=args.seed, quick=args.quick,
        tolerance=args.tolerance, pruner=args.pruner, family_options=_family_values(args, fam, False),
    )


def _launch_all(args: argparse.Namespace) -> list[str]:
    from archhpo.search._storage import mask_url, open_storage, resolve_storage_url
    from archhpo.search._study import launch

    url = resolve_storage_url(args.storage)
    settings = [_settings_from_args(args, b) for b in args.budget]  # validate all before writing
    storage = open_storage(url)
    names = []
    for s in settings:
        res = launch(url, s, storage=storage)
        verb = "created" if res.created else "reloaded"
        n1 = sum(e["phase"] == 1 for e in s.plan)
        print(f"{verb} study {s.study_name} on {mask_url(url)}: {len(s.archs)} architectures fit, "
              f"{len(s.plan)} planned trials ({n1} in phase 1), {res.enqueued} newly queued",
              file=sys.stderr)
        names.append(s.study_name)
    return names


def cmd_launch(args: argparse.Namespace) -> int:
    _launch_all(args)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from archhpo.budgets import budget_label
    from archhpo.search._queue import TrialQueue
    from archhpo.search._storage import resolve_storage_url
    from archhpo.search._study import check_experiment, study_name
    from archhpo.workers import Worker

    url = resolve_storage_url(args.storage)
    names = [study_name(check_experiment(args.experiment), budget_label(b)) for b in args.budget]
    queues = [TrialQueue(url, n) for n in names]
    # SIGTERM/SIGINT give the running trial back to the queue (same attempt) and exit 128+signal.
    summary = Worker(queues, device=args.device, threads=args.threads, checkpoint_dir=args.checkpoint_dir,
                     handle_signals=True).run()
    print(json.dumps({"worker": "stopped" if summary.signal else "done", **summary.__dict__}), file=sys.stderr)
    return 128 + summary.signal if summary.signal else 0


def cmd_run(args: argparse.Namespace) -> int:
    from archhpo.search._run import RunOptions, check_run_options, run_workers
    from archhpo.search._storage import resolve_storage_url

    gpus = args.gpus_per_trial  # checked before anything is written
    if gpus is not None and gpus != "auto":
        try:
            gpus = float(gpus)
        except ValueError:
            raise ArchhpoError(f"--gpus-per-trial {gpus!r} must be a number such as 0.25, or auto.") from None
        if not 0 <= gpus <= 8:
            raise ArchhpoError(f"--gpus-per-trial {gpus} must lie between 0 and the GPUs of one node.")
    url = resolve_storage_url(args.storage)
    opts = RunOptions(workers=args.workers, ray_address=args.ray_address, device=args.device,
                      gpus_per_trial=gpus, out_dir=Path(args.out), checkpoint_dir=Path(args.checkpoint_dir))
    check_run_options(url, opts)  # refused means nothing written: before _launch_all opens the database
    names = _launch_all(args)
    statuses = run_workers(url, names, opts)
    for name, st in statuses.items():
        best = f"{st.best_value:.4f}" if st.best_value is not None else "none"
        print(f"{name}: {st.complete} complete, {st.pruned} pruned, {st.failed} failed; best val_loss {best}",
              file=sys.stderr)
    print(f"results in {Path(args.out).resolve()}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from archhpo.budgets import budget_label
    from archhpo.search._export import export_studies
    from archhpo.search._storage import open_storage, resolve_storage_url
    from archhpo.search._study import check_experiment, experiment_studies, load_study, study_name

    check_experiment(args.experiment)  # every refusal before the database is opened (or created)
    storage = open_storage(resolve_storage_url(args.storage), create=False)
    if args.budget:
        names = [study_name(args.experiment, budget_label(b)) for b in args.budget]
        for n in names:
            load_study(storage, n)  # a clear error for a study that does not exist
    else:
        names = experiment_studies(storage, args.experiment)
        if not names:
            raise ArchhpoError(f"No archhpo study of experiment {args.experiment!r} in this storage; "
                               "check --experiment and --storage.")
    for path in export_studies(storage, names, Path(args.out)):
        print(path)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from archhpo.search._dashboard import serve

    serve(args.storage, args.host, args.port)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from archhpo.search._train_cmd import train_command

    print(json.dumps(train_command(args)))
    return 0


# ----------------------------------------------------------------------------- parser
def build_parser(family: Family | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="archhpo", description="Budgeted transformer architecture search.")
    p.add_argument("-v", "--verbose", action="store_true", help="log worker and trial details")
    sub = p.add_subparsers(dest="command", required=True)
    families = ", ".join(family_names())

    def common_budget(sp: argparse.ArgumentParser, required: bool = True) -> None:
        sp.add_argument("--budget", action="append", required=required, default=None,
                        help="parameter budget such as 2M, 20M, 1.5B, 500K; repeat for several")

    def storage(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--storage", default=None,
                        help="database URL (default $ARCHHPO_STORAGE, else sqlite:///archhpo.db)")

    def checkpoint_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--checkpoint-dir", default=os.environ.get("ARCHHPO_CHECKPOINT_DIR", "checkpoints"),
                        help="per-epoch checkpoints, so a retried trial resumes (shared storage on a cluster)")

    def study_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--experiment", required=True)
        common_budget(sp)
        sp.add_argument("--family", default="patchtst", help=f"model family: {families}")
        sp.add_argument("--trials", type=int, default=50, help="planned trials per budget")
        sp.add_argument("--data", default="synthetic", help="synthetic[:k=v,...] or a CSV/Parquet path")
        sp.add_argument("--horizon", type=int, default=1)
        sp.add_argument("--threshold", type=float, default=0.01)
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--tolerance", type=float, default=0.25)
        sp.add_argument("--pruner", default="median", choices=["median", "none"])
        sp.add_argument("--quick", action="store_true", help="small data and few epochs (minutes on a CPU)")
        storage(sp)
        _add_family_flags(sp, family)

    sp = sub.add_parser("grid", help="list the architectures that fit a budget")
    common_budget(sp)
    sp.add_argument("--family", default="patchtst", help=f"model family: {families}")
    sp.add_argument("--tolerance", type=float, default=0.25)
    sp.add_argument("--format", choices=["table", "json", "csv"], default="table")
    _add_family_flags(sp, family)
    sp.set_defaults(func=cmd_grid)

    def arch_flags(sp: argparse.ArgumentParser, required: bool) -> None:
        sp.add_argument("--family", default="patchtst", help=f"model family: {families}")
        for name in ("d-model", "n-layers", "n-heads", "d-ff"):
            sp.add_argument(f"--{name}", type=int, required=required)
        _add_family_flags(sp, family)

    sp = sub.add_parser("params", help="exact parameter count of one configuration")
    arch_flags(sp, True)
    sp.add_argument("--format", choices=["text", "json"], default="text")
    sp.set_defaults(func=cmd_params)

    sp = sub.add_parser("launch", help="create (or reload) the study and its trial plan")
    study_args(sp)
    sp.set_defaults(func=cmd_launch)

    sp = sub.add_parser("worker", help="train planned trials until the plan is done")
    sp.add_argument("--experiment", required=True)
    common_budget(sp)
    storage(sp)
    sp.add_argument("--device", default="auto", help="auto, cpu or cuda")
    sp.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    checkpoint_flag(sp)
    sp.set_defaults(func=cmd_worker)

    sp = sub.add_parser("run", help="launch + Ray workers + results, with live progress")
    study_args(sp)
    sp.add_argument("--workers", type=int, default=2)
    sp.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: local Ray)")
    sp.add_argument("--device", default="auto")
    sp.add_argument("--gpus-per-trial", default=None,
                    help="GPU share per trial (0.25 packs four on a GPU); default auto: sized from the "
                         "memory estimate of the largest planned trial when the cluster has GPUs")
    sp.add_argument("--out", default="results")
    checkpoint_flag(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("export", help="write the CSV and best JSON from the database")
    sp.add_argument("--experiment", required=True)
    common_budget(sp, required=False)
    storage(sp)
    sp.add_argument("--out", default="results")
    sp.set_defaults(func=cmd_export)

    sp = sub.add_parser("dashboard", help="optuna-dashboard on the storage (127.0.0.1 by default)")
    storage(sp)
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8080)
    sp.set_defaults(func=cmd_dashboard)

    sp = sub.add_parser("train", help="train one configuration and print its metrics as JSON")
    arch_flags(sp, False)
    sp.add_argument("--from", dest="from_json", default=None, help="a *_best.json to reproduce")
    sp.add_argument("--data", default=None)
    sp.add_argument("--horizon", type=int, default=None)
    sp.add_argument("--threshold", type=float, default=None)
    sp.add_argument("--seed", type=int, default=None)
    sp.add_argument("--quick", action="store_true")
    for name, typ in (("learning-rate", float), ("epochs", int), ("batch-size", int),
                      ("weight-decay", float), ("warmup-steps", int)):
        sp.add_argument(f"--{name}", type=typ, default=None)
    sp.add_argument("--device", default="auto")
    sp.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (a CPU replay is exact with the worker's thread count)")
    sp.add_argument("--save", default=None, help="write the trained weights and config here (.pt)")
    sp.set_defaults(func=cmd_train)
    return p


def _hide_passwords_from_ps() -> None:
    """Mask a password given in --storage in this process's command line (ps, /proc, and Ray's
    record of the driver's entrypoint).  It was visible while Python started; PGPASSWORD or
    ~/.pgpass never are."""
    from archhpo.search._storage import mask_url

    masked = [mask_url(a) for a in sys.argv]
    if masked == sys.argv:
        return
    sys.argv[:] = masked
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            words = [w.decode(errors="replace") for w in fh.read().split(b"\0") if w]
    except OSError:
        return
    from archhpo.search._ray_private import setproctitle

    set_title = setproctitle()  # ships with Ray; rewrites the argv memory ps reads
    if set_title is None:
        return
    set_title(" ".join(mask_url(w) for w in words))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)  # a copy: the password still reaches PGPASSWORD
    _hide_passwords_from_ps()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        name = _family_from_argv(argv)
        family = get_family(name) if name in family_names() else None
        parser = build_parser(family)
        args = parser.parse_args(argv)
        if getattr(args, "family", None) is not None and args.family not in family_names():
            get_family(args.family)  # raises the clear unknown-family error
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        import optuna

        optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose else optuna.logging.WARNING)
        return int(args.func(args) or 0)
    except ArchhpoError as exc:
        print(f"archhpo: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("archhpo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
