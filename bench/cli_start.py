"""What the command line costs on top of the training it runs (issue 59 part 5), in one run:

(a) `archhpo train --from F` for a few steps against (b) a plain script that builds the same trial
with archhpo's own build_trial and trains it with archhpo's train (so the difference is the
command line: its parser, checks and imports), N alternating repeats, the CPU time of each child
(getrusage) and the ratio a/b per pair; (c) the wall time of a refused budget
(`archhpo launch --experiment x --budget 2Q`), which must write nothing; (d) what the command
line's modules add, in modules and CPU seconds, to a process that imported the plain script's.

    python bench/cli_start.py [--repeats 5] [--steps 15] [--refusals 5] [--best F] [--before DIR]

F (default: a committed 100K lm best JSON) is replayed on generated data cut to `--steps` steps of
its batch (its data budget dropped, one epoch), on one CPU thread.  --before DIR runs (a) and (c)
once more per repeat with PYTHONPATH=DIR: an installed-layout tree (DIR/archhpo) of an older
commit, for the same figures before a change.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BEST = REPO / "bench/truths/realrun/t1real_100K-h2+4+8-t10_best.json"
PLAIN = """
import json, sys
import torch
from archhpo.workers import TrialSpec, build_trial, describe_result, train
torch.set_num_threads(1)
built = build_trial(TrialSpec(**json.load(open(sys.argv[1]))), torch.device("cpu"))
result = train(built.model, built.data, built.family.loss, built.train_config, metrics_fn=built.family.metrics)
print(json.dumps(describe_result(result)))
"""


def tiny_best(best: Path, steps: int, out: Path) -> Path:
    """`best` on generated data of about `steps` batches: its data budget dropped, its tokens cut."""
    data = json.loads(best.read_text())
    data["options"].pop("data_budget", None)
    batch, seq = int(data["best_params"]["batch_size"]), int(data["options"]["seq_len"])
    data["data"]["tokens"] = steps * batch * seq
    path = out / "tiny_best.json"
    path.write_text(json.dumps(data))
    return path


def trial_fields_of(argv: list[str]) -> dict[str, Any]:
    """The TrialSpec fields `archhpo train` builds from `argv` (the same functions it calls)."""
    from archhpo.cli._main import _complete, build_parser
    from archhpo.cli._train_file import trial_fields
    from archhpo.environment import Environment
    from archhpo.models import get_family

    family = get_family(json.loads(Path(argv[argv.index("--from") + 1]).read_text())["family"])
    args = build_parser(family).parse_args(argv)
    _complete(args, family, {}, None, Environment.read())
    return trial_fields(args)


def child(cmd: list[str], cwd: Path, path: str | None = None) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Run `cmd` (with PYTHONPATH=`path`, if given); its CPU seconds (user + system, from getrusage
    of the children) and wall seconds."""
    env = {**os.environ, "PYTHONPATH": path} if path else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done


def _last_json(done: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def train_pairs(best: Path, repeats: int, work: Path, old: str | None) -> dict[str, Any]:
    """(a) and (b) (and (a) at `old`) alternating, the order rotated each repeat; CPU and wall per run."""
    argv = ["train", "--from", str(best), "--epochs", "1", "--threads", "1", "--device", "cpu"]
    fields = work / "fields.json"
    fields.write_text(json.dumps(trial_fields_of(argv)))
    plain = work / "plain_train.py"
    plain.write_text(PLAIN)
    commands = {"cli": [sys.executable, "-m", "archhpo", *argv], "plain": [sys.executable, str(plain), str(fields)]}
    if old:
        commands["before"] = commands["cli"]
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    results: dict[str, dict[str, Any]] = {}
    names = list(commands)
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            cpu, wall, done = child(commands[name], work, old if name == "before" else None)
            results[name] = _last_json(done, name)
            runs[name].append((cpu, wall))
    steps = math.ceil(results["cli"]["train_flops"] / results["cli"]["flops_per_sample"]
                      / results["cli"]["params"]["batch_size"])
    return {"runs": runs, "steps": steps, "same_val_loss": results["cli"]["val_loss"] == results["plain"]["val_loss"],
            "val_loss": (results["cli"]["val_loss"], results["plain"]["val_loss"])}


def refusals(repeats: int, work: Path, old: str | None = None) -> list[tuple[float, float]]:
    """(c) `launch --budget 2Q` (at `old`, if given): refused (exit 2), nothing written; CPU and
    wall per run."""
    where = work / ("refusal_before" if old else "refusal")
    where.mkdir()
    out = []
    for _ in range(repeats):
        cpu, wall, done = child([sys.executable, "-m", "archhpo", "launch", "--experiment", "x", "--budget", "2Q"],
                                where, old)
        if done.returncode != 2 or "2Q" not in done.stderr or any(where.iterdir()):
            raise SystemExit(f"the bad budget was not refused cleanly: {done.returncode} {done.stderr}")
        out.append((cpu, wall))
    return out


EXTRA = """
import sys, time
import torch, archhpo.workers
before = set(sys.modules)
start = time.process_time()
import archhpo.cli._main, archhpo.cli._train_file, archhpo.cli._train
print(len(set(sys.modules) - before), time.process_time() - start)
"""


def extra_imports(repeats: int, work: Path, old: str | None = None) -> list[tuple[float, float]]:
    """(d) modules and CPU seconds the train command's modules add to the plain script's imports."""
    out = []
    for _ in range(repeats):
        done = child([sys.executable, "-c", EXTRA], work, old)[2]
        modules, cpu = done.stdout.split()
        out.append((float(modules), float(cpu)))
    return out


def _spread(values: list[float], fmt: str = ".2f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def report(pairs: dict[str, Any], refused: dict[str, list[tuple[float, float]]], extra: dict[str, Any],
           args: argparse.Namespace) -> None:
    cli, plain = pairs["runs"]["cli"], pairs["runs"]["plain"]
    ratios = [c[0] / p[0] for c, p in zip(cli, plain, strict=True)]
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"archhpo {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}; uptime: {load}")
    print(f"{args.repeats} alternating pairs of {pairs['steps']} training steps ({Path(args.best).name}, "
          f"1 thread); same val_loss: {pairs['same_val_loss']} {pairs['val_loss']}")
    print()
    print("| run | CPU s, median (min-max) | wall s, median (min-max) |")
    print("|---|---:|---:|")
    print(f"| (a) `archhpo train --from` | {_spread([c for c, _ in cli])} | {_spread([w for _, w in cli])} |")
    print(f"| (b) plain script, build_trial + train | {_spread([c for c, _ in plain])} | "
          f"{_spread([w for _, w in plain])} |")
    print(f"| (a)/(b) CPU ratio per pair | {_spread(ratios, '.3f')} | |")
    if "before" in pairs["runs"]:
        old = pairs["runs"]["before"]
        print(f"| (a) before, at --before | {_spread([c for c, _ in old])} | {_spread([w for _, w in old])} |")
        print(f"| (a) before/(b) CPU ratio | {_spread([o[0] / p[0] for o, p in zip(old, plain, strict=True)], '.3f')} | |")
    for name, runs in refused.items():
        print(f"| (c) `launch --budget 2Q` refused{name} | {_spread([c for c, _ in runs])} | "
              f"{_spread([w for _, w in runs])} |")
    for name, runs in extra.items():
        print(f"| (d) the train command's imports beyond (b)'s{name}: {int(runs[0][0])} modules | "
              f"{_spread([c for _, c in runs], '.3f')} | |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--refusals", type=int, default=5)
    ap.add_argument("--best", default=str(BEST))
    ap.add_argument("--before", default=None, help="PYTHONPATH of an older commit's installed-layout tree")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        best = tiny_best(Path(args.best), args.steps, work)
        pairs = train_pairs(best, args.repeats, work, args.before)
        refused = {"": refusals(args.refusals, work)}
        if args.before:
            refused[", before"] = refusals(args.refusals, work, args.before)
        extra = {"": extra_imports(args.refusals, work)}
        if args.before:
            extra[", before"] = extra_imports(args.refusals, work, args.before)
    report(pairs, refused, extra, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
