"""The study commands of the command line: launch, worker, run and export, and their helpers."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from archhpo.cli._family import _family_values
from archhpo.cli._options import ARCH_OPTIONS
from archhpo.config import Data, StudyConfig, family_options_of
from archhpo.errors import ArchhpoError, BudgetError, OutputError
from archhpo.models import get_family

EXIT_UNHEALTHY = 3  # `worker`: a sticky CUDA fault; do not reuse this process or its GPU context
EXIT_DISK_FULL = 2  # `worker`: no space for a checkpoint; its trial went back: rerun once space returns
EXIT_ALL_FAILED = 1  # `run`: every trial failed (the report says why); rerunning the same would too


def _pins(args: argparse.Namespace) -> dict[str, list[int]]:
    return {d: getattr(args, d) for d in ARCH_OPTIONS if getattr(args, d, None)}


def _data_ratios(args: argparse.Namespace) -> list[tuple[float | None, float | None]]:
    """(tokens_per_param, samples_per_param) of each study per budget: one per R, or (None, None)."""
    return Data(tokens_per_param=tuple(args.tokens_per_param or ()),
                samples_per_param=tuple(args.samples_per_param or ())).ratios()


def _ratio_suffixes(args: argparse.Namespace) -> list[str]:
    """The study-name suffixes of --tokens-per-param / --samples-per-param ('-t20'), or ['']."""
    from archhpo.schema import DataBudget

    out = []
    for tokens, samples in _data_ratios(args):
        if tokens is not None:
            out.append("-" + DataBudget.label_of("tokens", tokens))
        elif samples is not None:
            out.append("-" + DataBudget.label_of("samples", samples))
        else:
            out.append("")
    return out


def _study_config(args: argparse.Namespace) -> StudyConfig:
    """The study's configuration from the completed options (checked as it is built)."""
    fam = get_family(args.family)
    family = family_options_of(fam.name, fam.flags, _family_values(args, fam, False))
    return StudyConfig.from_options(vars(args), given=sorted(args.given), family_options=family)


def require_experiment(args: argparse.Namespace) -> None:
    if not args.experiment:
        raise ArchhpoError("--experiment is required; give it on the line or as `experiment` in --config.")


def _launch_all(args: argparse.Namespace, check: Callable[[list[Any]], None] | None = None) -> list[str]:
    """Create or reload every study; `check(settings)` may refuse them before anything is written."""
    from archhpo.search._storage import mask_url, open_storage, resolve_storage_url
    from archhpo.search._study import launch

    require_experiment(args)
    url = resolve_storage_url(args.storage, args.env)
    settings = _all_settings(args)  # validate all before writing
    _check_outputs(url)
    if check is not None:
        check(settings)
    storage = open_storage(url, timing=args.env)
    names = []
    for s in settings:
        res = launch(url, s, storage=storage)
        verb = "created" if res.created else "reloaded"
        n1 = sum(e.phase == 1 for e in s.plan)
        n3 = sum(e.phase == 3 for e in s.plan)
        extra = f", {n3} confirmation slots" if n3 else ""
        extra += f", {s.options.paired_seeds} paired seeds" if s.options.paired_seeds else ""
        fit = "architectures fit" if s.budget_value else "configurations"
        print(f"{verb} study {s.study_name} on {mask_url(url)}: {len(s.archs)} {fit}, "
              f"{len(s.plan)} planned trials ({n1} in phase 1{extra}), {res.enqueued} newly queued",
              file=sys.stderr)
        names.append(s.study_name)
    return names


def _check_outputs(url: str | None, out: str | None = None, checkpoint_dir: str | None = None) -> None:
    """Refuse, before a study is created, a folder the command would fail to write later: --out,
    --checkpoint-dir and the SQLite database's folder (an existing database file, too)."""
    from archhpo._io import unwritable
    from archhpo.search._storage import is_sqlite, sqlite_path

    for flag, where in (("--out", out), ("--checkpoint-dir", checkpoint_dir)):
        reason = unwritable(Path(where)) if where else None
        if reason:
            raise OutputError(f"{flag} {where} cannot be written ({reason}); pass a folder you can write to "
                              f"as {flag}.")
    db = sqlite_path(url) if url and is_sqlite(url) else None
    if db is None or not db.parent.is_dir():  # a missing folder: open_storage says so
        return
    reason = unwritable(db.parent) or (f"{db} is read-only" if db.exists() and not os.access(db, os.W_OK) else None)
    if reason:
        raise OutputError(f"The SQLite database {db} cannot be written ({reason}); pass a --storage in a "
                          "folder you can write to.")


def _all_settings(args: argparse.Namespace) -> list[Any]:
    """Each budget's settings, per data ratio; with --ladder, smallest first, each planned from the
    smaller ones at the same ratio.  A µP study without --mup-base-width takes the smallest d_model
    of its smallest budget's grid, and without --mup-base-depth its smallest n_layers (CompleteP's
    base depth), one base for every study of the experiment (docs/mup.md)."""
    config = _study_config(args)
    out = _settings_of(config, args)
    if config.parametrization == "mup" and out and None in (config.mup_base_width, config.mup_base_depth):
        smallest = min(out, key=lambda s: s.budget_value)
        width = config.mup_base_width or min(int(a["d_model"]) for a in smallest.archs)
        depth = config.mup_base_depth or min(int(a["n_layers"]) for a in smallest.archs)
        out = _settings_of(dataclasses.replace(config, mup_base_width=width, mup_base_depth=depth), args)
    return out


def _settings_of(config: StudyConfig, args: argparse.Namespace) -> list[Any]:
    from archhpo.budgets import parse_budget
    from archhpo.search._study import prepare_settings

    if config.isoflop.computes:  # one study per compute budget C (archhpo/cli/_isoflop.py)
        from archhpo.cli._isoflop import isoflop_all
        from archhpo.search._storage import resolve_storage_url

        return isoflop_all(config, resolve_storage_url(args.storage, args.env))
    _check_distinct(config.budgets, parse_budget)
    out: list[Any] = []
    for part in config.per_ratio():
        if not config.ladder:
            out += [prepare_settings(part, b) for b in (config.budgets or (None,))]
            continue
        chain: list[Any] = []
        for budget in sorted(config.budgets, key=parse_budget):
            chain.append(prepare_settings(part, budget, ladder_below=[s.study_name for s in chain]))
        out += chain
    return out


def _check_distinct(budgets: tuple[str, ...], parse: Any) -> None:
    """Refuse a budget given twice (75K and 75000 are one budget): it would plan one study twice
    under one name."""
    seen: dict[int, str] = {}
    for text in budgets:
        value = parse(text)
        if value in seen:
            raise BudgetError(f"--budget {text} is given twice (as {seen[value]!r} and {text!r}); give each "
                              "budget once.")
        seen[value] = text


def _name_builders(args: argparse.Namespace) -> list[str]:
    """The flags given that build study names from --experiment (--budget, pins, data ratios)."""
    keys = ["budget", *ARCH_OPTIONS, "tokens_per_param", "samples_per_param"]
    return ["--" + k.replace("_", "-") for k in keys if getattr(args, k, None)]


def _check_addressing(args: argparse.Namespace) -> None:
    """worker/export: refuse a line that names no study, before any database is opened.  --study
    alone suffices (each study stores its experiment); --budget, pins and data ratios only name a
    study together with --experiment."""
    from archhpo.config import check_experiment

    if args.experiment is not None:
        check_experiment(args.experiment)
        return
    flags = _name_builders(args)
    if flags:
        verb = "names" if len(flags) == 1 else "name"
        raise ArchhpoError(f"{' and '.join(flags)} {verb} a study only together with --experiment; add "
                           "--experiment NAME, or give the study's full name with --study NAME as `launch` "
                           "printed it.")
    if not args.study:
        what = "train" if args.command == "worker" else "export"
        raise ArchhpoError(f"`archhpo {args.command}` needs the studies to {what}: give --study NAME as `launch` "
                           "printed it, or --experiment NAME (with --budget or pins, or alone for all its studies).")


def _experiment_of(storage: Any, name: str) -> str | None:
    """The experiment `launch` stored in the study (None: not an archhpo study); a study that does
    not exist is load_study's clear error."""
    from archhpo.search._study import load_study, settings_attr

    return load_study(storage, name).user_attrs.get(settings_attr("experiment"))


def _addressed_studies(args: argparse.Namespace, storage: Any) -> dict[str, str | None]:
    """worker/export: each addressed study's name and its experiment.  --study names, else
    {experiment}_{label} for each --budget (with the pins), or the pinned study's label; with none
    of these, every study of the experiment.  `_check_addressing` has vetted the line."""
    from archhpo.search._storage import resilient
    from archhpo.search._study import experiment_studies, study_label, study_name

    names = list(args.study or [])
    pins = _pins(args)
    if args.experiment and (args.budget or pins):
        names += [study_name(args.experiment, study_label(b, pins) + suffix)
                  for suffix in _ratio_suffixes(args) for b in (args.budget or [None])]
    if names:
        # Loading each study also says clearly when one does not exist; a dropped connection is retried.
        return {n: resilient(functools.partial(_experiment_of, storage, n), "loading the study",
                             args.env.db_patience_s) for n in names}
    found = resilient(lambda: experiment_studies(storage, args.experiment), "listing the studies",
                      args.env.db_patience_s)
    if not found:
        raise ArchhpoError(f"No archhpo study of experiment {args.experiment!r} in this storage; "
                           "check --experiment and --storage.")
    return dict.fromkeys(found, args.experiment)


def _report_experiment(args: argparse.Namespace, studies: dict[str, str | None]) -> str:
    """export --report: the one experiment whose report is written, read from the studies (and
    --experiment); refused, before anything is written, when they name none or several."""
    unknown = [n for n, e in studies.items() if e is None]
    if unknown:
        raise ArchhpoError(f"Study {unknown[0]!r} was not created by `archhpo launch`, so it names no experiment "
                           "to report; leave it out of `export --report`.")
    found = sorted({e for e in studies.values() if e} | ({args.experiment} if args.experiment else set()))
    if len(found) > 1:
        listed = ", ".join(repr(e) for e in found[:-1]) + f" and {found[-1]!r}"
        given = "--experiment and the studies" if args.experiment and args.study else "the studies"
        raise ArchhpoError(f"--report writes one experiment's report, but {given} belong to experiments {listed}; "
                           "run `archhpo export --report` once per experiment.")
    return found[0]


def cmd_launch(args: argparse.Namespace) -> int:
    _launch_all(args)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from archhpo.search._queue import TrialQueue
    from archhpo.search._storage import open_storage, resolve_storage_url
    from archhpo.workers import Worker

    _check_addressing(args)  # before the database is opened
    url = resolve_storage_url(args.storage, args.env)
    _check_outputs(url, checkpoint_dir=args.checkpoint_dir)
    names = list(_addressed_studies(args, open_storage(url, create=False, timing=args.env)))
    queues = [TrialQueue(url, n, timing=args.env) for n in names]  # $ARCHHPO_HEARTBEAT_S, _GRACE_S, _REAP_S
    # SIGTERM/SIGINT give the running trial back to the queue (same attempt) and exit 128+signal.
    summary = Worker(queues, device=args.device, threads=args.threads, checkpoint_dir=args.checkpoint_dir,
                     checkpoint_every=args.checkpoint_every, handle_signals=True,
                     on_idle=lambda note: print(f"worker idle: {note}", file=sys.stderr, flush=True)).run()
    state = ("unhealthy" if summary.unhealthy else "disk full" if summary.disk_full
             else "stopped" if summary.signal else "done")
    print(json.dumps({"worker": state, **summary.__dict__}), file=sys.stderr)
    if summary.unhealthy:  # its trial is back in the queue; a supervisor starts a fresh process
        return EXIT_UNHEALTHY
    if summary.disk_full:  # the sentence was logged; the same command resumes once space returns
        return EXIT_DISK_FULL
    return 128 + summary.signal if summary.signal else 0


def cmd_run(args: argparse.Namespace) -> int:
    from archhpo.cluster._options import RunOptions, check_run_options  # light: torch and Ray come later
    from archhpo.search._storage import resolve_storage_url

    gpus = args.gpus_per_trial  # checked before anything is written
    if gpus is not None and gpus != "auto":
        try:
            gpus = float(gpus)
        except ValueError:
            raise ArchhpoError(f"--gpus-per-trial {gpus!r} must be a number such as 0.25, or auto.") from None
        if not 0 <= gpus <= 8:
            raise ArchhpoError(f"--gpus-per-trial {gpus} must lie between 0 and the GPUs of one node.")
    url = resolve_storage_url(args.storage, args.env)
    opts = RunOptions(workers=args.workers, ray_address=args.ray_address, device=args.device,
                      gpus_per_trial=gpus, checkpoint_dir=Path(args.checkpoint_dir),
                      checkpoint_every=args.checkpoint_every, threads=args.threads,
                      stop_wait_s=args.env.stop_wait_s, timing=args.env)
    check_run_options(url, opts)  # refused means nothing written: before _launch_all opens the database
    # The checkpoints of a run on a Ray cluster are written on its nodes: the driver cannot check them.
    _check_outputs(url, out=args.out, checkpoint_dir=None if args.ray_address else args.checkpoint_dir)
    with _stop_like_ctrl_c():
        return _launch_and_run(args, url, opts)


def _launch_and_run(args: argparse.Namespace, url: str, opts: Any) -> int:
    from archhpo.cluster._capacity import check_local_capacity
    from archhpo.cluster._run import finished_plans, run_workers
    from archhpo.report._export import export_studies
    from archhpo.search._storage import open_storage

    names = _launch_all(args, check=lambda settings: check_local_capacity(settings, opts))
    out_dir = Path(args.out)
    storage = open_storage(url, create=False, timing=args.env)
    statuses = finished_plans(url, names, args.env)
    export = functools.partial(_export_or_stop, export_studies, storage, names, out_dir)
    if statuses:  # nothing to train: say so without starting Ray (that alone takes ~30 s)
        _print_statuses(statuses)
        print(f"the plan of {', '.join(names)} is finished; nothing to run (a new --experiment starts a new "
              "study)", file=sys.stderr)
        # The results are still (re)written: a driver killed before its last export left them stale.
        export()
    else:  # the cluster calls back as trials finish; the command line writes the results
        opts.progress = export
        statuses = run_workers(url, names, opts)
        _print_statuses(statuses)
    print(f"results in {Path(args.out).resolve()}", file=sys.stderr)
    all_failed = _report_after_run(args, url, names)
    return EXIT_ALL_FAILED if all_failed else 0


def _export_or_stop(export: Callable[..., Any], storage: Any, names: list[str], out_dir: Path) -> None:
    """Write the results; a write that fails (a full disk, a folder made read-only or replaced)
    becomes one sentence naming the path, and the pool stops and gives its trials back."""
    try:
        export(storage, names, out_dir)
    except OSError as exc:
        where = exc.filename or out_dir
        raise OutputError(f"Cannot write the results to {where} ({exc.strerror or exc}); the run stopped and "
                          "gave its trials back: make room or pass another --out, then run the same command "
                          "to resume.") from None


@contextlib.contextmanager
def _stop_like_ctrl_c() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, `kill`) and SIGINT stop `run` as Ctrl-C does: the workers give
    their trials back.  SIGINT is re-armed because a shell starts background jobs with it ignored."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _print_statuses(statuses: dict[str, Any]) -> None:
    for name, st in statuses.items():
        best = f"{st.best_value:.4f}" if st.best_value is not None else "none"
        at_rung = f", {st.at_rung} confirmed at a rung" if st.at_rung else ""  # --confirm-at-rung's runs
        print(f"{name}: {st.complete} complete, {st.pruned} pruned{at_rung}, {st.failed} failed; best val_loss {best}",
              file=sys.stderr)


def _report_after_run(args: argparse.Namespace, url: str, names: list[str]) -> bool:
    """`run` ends with the report of the whole experiment; a report that cannot be written is a
    warning (the trials are done and exported), never a failed run.  True when every trial of
    `names` failed: the report then leads with why."""
    from archhpo.report._failures import why_all_failed
    from archhpo.report._isoflop import isoflop_lines
    from archhpo.report._page import fit_line, write_report

    try:
        failed = why_all_failed(url, names)
    except Exception:  # noqa: BLE001 - a database gone now: the report below says so, as a warning
        failed = None
    if failed:
        print(f"archhpo: {failed}", file=sys.stderr)
    try:
        report = write_report(args.experiment, storage=url, out=args.out)
    except Exception as exc:  # noqa: BLE001
        print(f"archhpo: warning: report not written ({type(exc).__name__}: {exc}); "
              f"`archhpo report --experiment {args.experiment}` retries it", file=sys.stderr)
        return failed is not None
    print(fit_line(report.fit), file=sys.stderr)
    for line in isoflop_lines(report.fit.get("isoflop_fit") or {}):  # an IsoFLOP study's Approach 2
        print(line, file=sys.stderr)
    if report.compute:
        print(report.compute, file=sys.stderr)
    for line in report.baselines:
        print(f"baseline {line}", file=sys.stderr)
    print(f"report: {report.html.resolve()}", file=sys.stderr)
    return failed is not None


def cmd_export(args: argparse.Namespace) -> int:
    from archhpo.report._export import export_studies
    from archhpo.search._storage import open_storage, resolve_storage_url

    _check_addressing(args)  # before the database is opened
    url = resolve_storage_url(args.storage, args.env)
    _check_outputs(url, out=args.out)
    storage = open_storage(url, create=False, timing=args.env)
    studies = _addressed_studies(args, storage)
    # The report's experiment is settled before the CSV is written: a refused --report writes nothing.
    experiment = _report_experiment(args, studies) if args.report else None
    for path in export_studies(storage, list(studies), Path(args.out)):
        print(path)
    if experiment is not None:
        from archhpo.report._page import write_report

        for path in write_report(experiment, storage=storage, out=args.out).files:
            print(path)
    return 0
