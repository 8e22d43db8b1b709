"""The `archhpo` command line (docs/design.md §2). Every user error ends in one sentence and exit code 2.

Options are defined once, in `archhpo.cli._options` (a study setting's row is derived from its
declaration in archhpo/config.py); the parser is built from them.  A
command is a function taking the parsed namespace, registered with `register_command` (the
parser lists commands in registration order):

    register_command("report", cmd_report, "write the report", configure=add_report_flags)

The command's options are those of `_options.all_options()` naming it in `commands` (e.g. REPORT);
`configure(subparser)` may add more.  Its function receives every option filled in (line, then
experiment file, then default) and `args.given`, the names given on the line or in the file.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from archhpo.cli._family import _family_from_argv, _family_values
from archhpo.cli._options import (
    EXPORT,
    FAMILY_COMMANDS,
    GRID,
    LAUNCH,
    PARAMS,
    RUN,
    STUDY_COMMANDS,
    TRAIN,
    WORKER,
    argv_value,
    config_values,
    default,
    family_options,
    load_config,
    options_for,
)
from archhpo.cli._study_cmds import EXIT_UNHEALTHY as EXIT_UNHEALTHY
from archhpo.cli._study_cmds import _check_outputs, cmd_export, cmd_launch, cmd_run, cmd_worker
from archhpo.cli._study_cmds import _stop_like_ctrl_c as _stop_like_ctrl_c
from archhpo.cli._tokens import add_tokens_args, cmd_tokens
from archhpo.environment import Environment
from archhpo.errors import ArchhpoError
from archhpo.models import Family, family_names, get_family

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `yes | head`'s `yes`


# ----------------------------------------------------------------------------- commands
def cmd_grid(args: argparse.Namespace) -> int:
    from archhpo.budgets import build_grid, format_budget, parse_budget, pinned_grid, require_rows
    from archhpo.schema import ARCH_KEYS

    fam = get_family(args.family)
    info = _family_values(args, fam, with_defaults=True)
    # --n-heads 2,4,8 and the like filter each budget's grid, renumbered and its extremes marked again,
    # exactly as a study pinning them within the budget plans it (budgets/_grid.py pinned_grid)
    pins = {k: v for k in ARCH_KEYS if (v := getattr(args, k, None))}
    rows = []
    for text in args.budget:
        value = parse_budget(text)
        if pins:
            rows += pinned_grid(fam, info, pins, format_budget(value), value, args.tolerance,
                                advice="change the lists or widen --tolerance")
        else:
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


def cmd_report(args: argparse.Namespace) -> int:
    from archhpo.report._page import fit_line, write_report

    if args.csv and "storage" in args.given:
        raise ArchhpoError("Pass either --storage or --csv, not both: the report reads one source.")
    if args.compute is not None and not (math.isfinite(args.compute) and args.compute > 0):
        raise ArchhpoError(f"--compute {args.compute:g} must be a positive number of FLOPs, such as 1e18.")
    storage = args.storage or (None if args.csv else args.env.storage)  # --storage, else $ARCHHPO_STORAGE
    _check_outputs(None, out=args.out)
    if not args.csv and args.experiment is not None and "," not in args.experiment:  # no result: say why first
        from archhpo.report._failures import why_all_failed

        failed = why_all_failed(storage, experiment=args.experiment)
        if failed:
            print(f"archhpo: {failed}", file=sys.stderr)
    report = write_report(args.experiment, storage=storage, csv=args.csv, out=args.out,
                          reference=args.reference, compute=args.compute)
    for path in report.files:
        print(path)
    print(fit_line(report.fit), file=sys.stderr)
    if (report.fit.get("nd_fit") or {}).get("n_points"):
        print(f"compute: {report.fit['nd_fit']['compute_optimal']['sentence']}", file=sys.stderr)
    for line in report.baselines:
        print(f"baseline {line}", file=sys.stderr)
    print(f"report: {report.html}", file=sys.stderr)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from archhpo.cli._dashboard import serve

    serve(args.storage or args.env.storage, args.host, args.port)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from archhpo.cli._train_file import trial_fields

    fields = trial_fields(args)  # the line and the --from file checked: no torch, no Optuna yet
    _optuna_verbosity(args.verbose)
    from archhpo.cli._train import train_command

    print(json.dumps(train_command(args, fields)))
    return 0


def _optuna_verbosity(verbose: bool) -> None:
    """Optuna's log level (INFO with -v, else WARNING); importing Optuna is the heavy part."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)


def _check_line(args: argparse.Namespace) -> None:
    """The checks of a study command's line that need no database, run before anything heavy is
    imported (the command runs them again in its place; they are cheap): launch's --experiment,
    the study's configuration and each --budget (run's too, its own checks first in cmd_run);
    worker's and export's addressing of their studies."""
    from archhpo.budgets import parse_budget
    from archhpo.cli._study_cmds import _check_addressing, _check_distinct, _study_config, require_experiment

    if args.command == LAUNCH:
        require_experiment(args)
    if args.command in (LAUNCH, RUN) and args.experiment:  # run without one: cmd_run's checks first
        config = _study_config(args)
        if not config.isoflop.computes:
            _check_distinct(config.budgets, parse_budget)
    elif args.command in (WORKER, EXPORT):
        _check_addressing(args)


# ----------------------------------------------------------------------------- commands and parser
@dataclass(frozen=True)
class Command:
    name: str
    func: Callable[[argparse.Namespace], int]
    help: str
    configure: Callable[[argparse.ArgumentParser], None] | None = None


COMMANDS: dict[str, Command] = {}


def register_command(
    name: str,
    func: Callable[[argparse.Namespace], int],
    help: str,
    configure: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Add (or replace) a subcommand: its options are those of _options.all_options() naming it, plus
    whatever `configure(subparser)` adds; `func(args)` returns the exit code."""
    COMMANDS[name] = Command(name, func, help, configure)


register_command("grid", cmd_grid, "list the architectures that fit a budget")
register_command("params", cmd_params, "exact parameter count of one configuration")
register_command("launch", cmd_launch, "create (or reload) the study and its trial plan")
register_command("worker", cmd_worker, "train planned trials until the plan is done")
register_command("run", cmd_run, "launch + Ray workers + results, with live progress")
register_command("export", cmd_export, "write the CSV and best JSON from the database")
register_command("dashboard", cmd_dashboard, "optuna-dashboard on the storage (127.0.0.1 by default)")
register_command("train", cmd_train, "train one configuration and print its metrics as JSON")
register_command("report", cmd_report, "write the report: answer per budget, scaling fit, figures, tables")
register_command("tokens", cmd_tokens, "write a UTF-8 text file as a token file of its bytes (--data tokens:OUT)",
                 configure=add_tokens_args)


def _command_options(command: str, family: Family | None) -> list[Any]:
    extra = family_options(family) if command in FAMILY_COMMANDS else []
    return [*options_for(command), *extra]


def build_parser(family: Family | None) -> argparse.ArgumentParser:
    """The parser, with `family`'s flags on the commands that take family flags."""
    p = argparse.ArgumentParser(prog="archhpo", description="Budgeted transformer architecture search.",
                                allow_abbrev=False)
    p.add_argument("-v", "--verbose", action="store_true", help="log worker and trial details")
    sub = p.add_subparsers(dest="command", required=True)
    families = ", ".join(family_names())
    for cmd in COMMANDS.values():
        description = cmd.help[0].upper() + cmd.help[1:] + "."
        if cmd.name in FAMILY_COMMANDS:
            shown = family.name if family else "none (unknown --family)"
            description += (f" Family flags shown: {shown}; `archhpo {cmd.name} --family NAME --help` lists "
                            f"another family's ({families}).")
        if cmd.name in STUDY_COMMANDS:
            description += " Every option can also come from an experiment file (--config); flags on the line win."
        # conflict_handler="resolve": a command's `configure` may redefine one of its options.
        sp = sub.add_parser(cmd.name, help=cmd.help, description=description, allow_abbrev=False,
                            conflict_handler="resolve")
        for o in options_for(cmd.name):
            o.add_to(sp, cmd.name, family)
        if cmd.name in FAMILY_COMMANDS and family is not None:
            group = sp.add_argument_group(f"{family.name} options (--family {family.name})")
            for o in family_options(family):
                o.add_to(group, cmd.name)
        if cmd.configure is not None:
            cmd.configure(sp)
        sp.set_defaults(func=cmd.func)
    return p


def _complete(args: argparse.Namespace, family: Family | None, config: dict[str, Any], config_path: str | None,
              env: Environment | None = None) -> None:
    """Fill every option of the command: the line, else the experiment file, else the default (an
    ARCHHPO_* variable of `env`, the process's Environment, before the built-in one);
    args.given = the names given on the line or in the file; args.env = `env`, for the commands."""
    command = args.command
    file_values: dict[str, Any] = {}
    if config and config_path:
        keys = {o.name: o for o in [*_command_options(LAUNCH, family), *_command_options(RUN, family)]}
        file_values = config_values(config, config_path, command, keys.values())
    given = set()
    env = env or Environment.read()
    for o in _command_options(command, family):
        if hasattr(args, o.key):
            given.add(o.name)
        elif o.key in file_values:
            setattr(args, o.key, file_values[o.key])
            given.add(o.name)
        else:
            setattr(args, o.key, None if o.key.startswith("fam_") else o.default_for(command, env))
    args.given = given
    args.env = env


def _hide_passwords_from_ps() -> None:
    """Mask a password given in --storage in this process's command line (ps, /proc, and Ray's
    record of the driver's entrypoint) before anything heavy is imported: it was visible while
    Python started and this module loaded; PGPASSWORD, ~/.pgpass or ARCHHPO_STORAGE never are."""
    if not any("://" in a for a in sys.argv):
        return  # no URL, no password
    from archhpo._urls import mask_url  # imports nothing heavy

    masked = [mask_url(a) for a in sys.argv]
    if masked == sys.argv:
        return
    sys.argv[:] = masked
    if _mask_argv_memory(mask_url):
        return
    from archhpo.cluster._ray_private import setproctitle

    set_title = setproctitle()  # ships with Ray; rewrites the argv memory ps reads
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            words = [w.decode(errors="replace") for w in fh.read().split(b"\0") if w]
    except OSError:
        return
    if set_title is not None:
        set_title(" ".join(mask_url(w) for w in words))


def _mask_argv_memory(mask: Callable[[str], str]) -> bool:
    """Overwrite, in place, the argv memory that ps and /proc/PID/cmdline read (its bounds are
    arg_start and arg_end of /proc/self/stat), each word masked, cut to its length and padded with
    NULs.  False where there is no such file (not Linux) or the memory cannot be read."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5), from field 3 on
        old = ctypes.string_at(start, end - start)
    except (OSError, IndexError, ValueError):
        return False
    words = [(w, mask(w.decode(errors="surrogateescape")).encode(errors="surrogateescape")[:len(w)])
             for w in old.split(b"\0")]
    new = b"\0".join(m.ljust(len(w), b"\0") for w, m in words)
    if new != old:
        ctypes.memmove(start, new, len(old))
    return True


def _attach_negative_values(argv: list[str]) -> list[str]:
    """`--budget -2M` as `--budget=-2M`: argparse takes a value starting with '-' (other than a
    plain number) for an option and says "expected one argument"; joined, the option's own check
    says what is wrong with the value."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"^-[\d.]", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _other_family_flag(argv: Sequence[str], command: str | None, family: Family | None) -> None:
    """A flag that only another family has (`--encoder sum` with patchtst): say which family has it,
    instead of argparse's bare "unrecognized arguments"."""
    if command not in FAMILY_COMMANDS or family is None:
        return
    own = {o.flag_name for o in _command_options(command, family)}
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or flag in own:
            continue
        owners = [n for n in family_names() if n != family.name
                  and any("--" + f.name.replace("_", "-") == flag for f in get_family(n).flags)]
        if owners:
            raise ArchhpoError(f"{flag} is a flag of the {' and '.join(owners)} family, not of {family.name}; "
                               f"add --family {owners[0]} or drop {flag}.")


def _stdout_to_devnull() -> None:
    """The reader of stdout went away (`archhpo grid | head`): exit quietly, as command-line tools
    do, instead of a BrokenPipeError traceback; what is still buffered would fail again when the
    interpreter flushes it at exit, so stdout goes to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a replaced sys.stdout (tests) has no file descriptor
        pass
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    argv = _attach_negative_values(list(sys.argv[1:] if argv is None else argv))  # a copy (PGPASSWORD)
    _hide_passwords_from_ps()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        command = next((a for a in argv if not a.startswith("-")), None)
        config_path = argv_value(argv, "--config") if command in STUDY_COMMANDS else None
        config = load_config(config_path) if config_path else {}
        name = _family_from_argv(argv, config) if command in (*FAMILY_COMMANDS, TRAIN) else default("family")
        if command in FAMILY_COMMANDS and name not in family_names():
            get_family(name)  # raises the clear unknown-family error (before --help, too)
        family = get_family(name) if name in family_names() else None
        _other_family_flag(argv, command, family)
        parser = build_parser(family)
        args = parser.parse_args(argv)
        _complete(args, family, config, config_path, Environment.read())  # the one read of ARCHHPO_*
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        _check_line(args)  # a typo is refused before Optuna, torch or Ray is imported
        if args.command not in (GRID, PARAMS, TRAIN):  # grid, params: closed form; train: cmd_train
            _optuna_verbosity(args.verbose)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone (`| head`) shows here, not as a traceback at exit
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    except ArchhpoError as exc:
        print(f"archhpo: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("archhpo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
