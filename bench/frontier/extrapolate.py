"""One extrapolation per frontier task, predicted before it is trained, then graded (issue 55
parts 5 and 6; bench/frontier/README.md).

    python bench/frontier/extrapolate.py predict --task syn --storage sqlite:////work/frontier/syn.db
    python bench/frontier/extrapolate.py launch --task syn --storage sqlite:////work/frontier/syn.db \
        --to sqlite:////work/frontier/syn_x.db [--run] -- <the frontier's training flags>
    python bench/frontier/extrapolate.py grade --task syn --storage sqlite:////work/frontier/syn_x.db
    python bench/frontier/extrapolate.py seeds --task syn --storage sqlite:////work/frontier/syn.db \
        --seeds 3 [--run] -- <the frontier's training flags>

`predict` fits the task's frontier (Approach 3's L(N, D) over every trial, Approach 2 beside it),
takes C_big = --factor (at least 4) times its largest budget, plans that C as `archhpo launch
--isoflop C_big --centre N* --sizes 5 --span 16` would (N*/4 to 4N*: N*, its x/÷2 flanks, then x/÷4;
queued in that order, so N* trains first and the outer flanks only where affordable), and
writes the prediction per planned size (the law's loss and one run's 95% interval at its exact N and
D) into extrapolation.json, measured_loss null. `launch` prints (with --run, runs) that launch;
`grade` fills measured_loss from the trained study: inside the interval, the flanks not better
beyond noise, the error in nats and percent. `seeds` launches extra seeds at each resolved vertex.
`predict --also STORAGE` pools an earlier C_big study (`{task}_x` in that database) into the frontier.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
JSON_PATH = HERE / "extrapolation.json"
MIN_FACTOR = 4.0  # C_big at least this many times the largest budget trained (the rule)
FLANK_SIZES, FLANK_SPAN = 5, 16.0  # N*/4, N*/2, N*, 2N*, 4N*: queued N* first, then x/÷2, then x/÷4
PLAN_FLAGS = {"--experiment", "--isoflop", "--centre", "--centre-from", "--sizes", "--span", "--shapes", "--storage"}
NOISE_SDS = 2.0  # a flank is better "beyond noise" when it beats N* by more than this many noise sds


class Refused(Exception):
    """Bad input or a state that cannot be predicted or graded: one sentence, exit 2."""


# the later passes' experiments in the same database (frontier.sh)
RECENTRED = ("{task}_r", "{task}_r2", "{task}_r3", "{task}_r4", "{task}_r5")


def _frame(task: str, storage: str, also: Sequence[str] = ()) -> Any:
    """The frontier's trials: experiment `task`, pooled with its re-centred passes (`task`_r to `task`_r5)
    where the database holds them (each plan's sizes its own, report/_isoflop.py isoflop_points), and
    with each `also` database's C_big study (`task`_x: an extrapolation's profile, read after its grade).
    ``attrs["study_storage"]`` names each study's database."""
    import pandas as pd

    from archhpo.errors import StorageError, StudyError
    from archhpo.report._frame import trials_frame

    frames = [trials_frame(task, storage=storage, curves=False)]
    where = dict.fromkeys(frames[0].attrs.get("studies", {}).values(), storage)
    for name, url in [*((n.format(task=task), storage) for n in RECENTRED), *((f"{task}_x", a) for a in also)]:
        try:
            frames.append(trials_frame(name, storage=url, curves=False))
        except (StudyError, StorageError):  # no such pass in this database
            if url != storage:
                raise Refused(f"{url} holds no study of experiment {task}_x; give --also the C_big study's database.") from None
            continue
        where.update(dict.fromkeys(frames[-1].attrs.get("studies", {}).values(), url))
    frame = pd.concat([f for f in frames if not f.empty] or frames[:1], ignore_index=True)
    # pd.concat keeps no attrs: the data's known truth (its loss floor, which the fits check E against)
    # is the first pass's, and every pass trains the same data
    truths = {json.dumps(f.attrs.get("truth"), sort_keys=True) for f in frames if not f.empty}
    if len(truths) > 1:
        raise Refused(f"The passes of {task!r} record different data truths; each pass must train the frontier's data.")
    frame.attrs = {**frames[0].attrs, "study_storage": where}
    if frame.empty or "compute_budget" not in frame or frame["compute_budget"].isna().all():
        raise Refused(f"{storage} holds no IsoFLOP trials of experiment {task!r}; give the frontier's --task and --storage.")
    return frame


def _trained(frame: Any) -> Any:
    """The finished IsoFLOP trials: a budget planned but not trained (the frontier's 1e14) is no
    budget of the frontier, and C_big's factor counts from the largest one trained."""
    state = frame["state"] if "state" in frame else "COMPLETE"
    done = frame[(state == "COMPLETE") & frame["compute_budget"].notna()]
    if done.empty:
        raise Refused("The frontier has no finished IsoFLOP trial yet; train it before predicting.")
    return done


def _largest_study(frame: Any) -> str:
    done = _trained(frame)
    return str(done.loc[done["compute_budget"].astype(float).idxmax(), "study"])


def plan_big(storage: str, study: str, compute: float, centre: float) -> list[Any]:
    """The trials `archhpo launch --isoflop compute --centre centre --sizes 5 --span 16` plans, with
    the frontier study's data facts, pins and validation intervals (budgets/_isoflop.py)."""
    from archhpo.budgets._isoflop import plan_isoflop
    from archhpo.models import get_family
    from archhpo.search._settings import read_settings
    from archhpo.search._storage import open_storage

    settings = read_settings(open_storage(storage, create=False), study)
    epochs = int((settings.plan[0].params or {}).get("epochs") or 1)
    plan = plan_isoflop(get_family(settings.family), settings.info, compute, sizes=FLANK_SIZES, span=FLANK_SPAN,
                        centre=centre, intervals=epochs, pins=settings.pins or None)
    return list(plan.trials)


def law_at(nd: dict[str, Any], n: float, d: float) -> dict[str, Any]:
    """The fitted L(N, D) at (n, d): estimate, the law's 95% interval and one run's (with the noise)."""
    from archhpo.report._answer import run_interval

    s = nd["samples"]
    loss = s[:, 0] + s[:, 1] * n ** -s[:, 3] + s[:, 2] * d ** -s[:, 4]
    rest = loss[1:][np.isfinite(loss[1:])]
    return {"estimate": float(loss[0]), "ci95": run_interval(loss, nd.get("noise")),
            "law_ci95": [float(x) for x in np.percentile(rest, [2.5, 97.5])]}


def in_regime(frame: Any, min_steps: int) -> Any:
    """The trials that train at least `min_steps` optimizer steps (train_samples over the batch);
    0 keeps all. Approach 3 only: each budget's profile (Approach 2) keeps every size."""
    if min_steps <= 0:
        return frame
    steps = frame["train_samples"].astype(float) / frame["batch_size"].astype(float)
    kept = frame[steps >= min_steps].copy()
    kept.attrs = dict(frame.attrs)
    return kept


def predict(task: str, storage: str, factor: float = MIN_FACTOR, compute: float | None = None,
            n_boot: int = 1000, min_steps: int = 0, also: Sequence[str] = ()) -> dict[str, Any]:
    """The prediction entry of `task` (module docstring); Refused where it cannot be made. With
    `min_steps`, L(N, D) is fitted on the trials that train at least that many steps; `also`
    pools earlier C_big studies' databases into the frontier (`_frame`)."""
    from archhpo.report._answer import compute_answer, nd_fit, nd_points
    from archhpo.report._isoflop import isoflop_fit

    frame = _frame(task, storage, also)
    top = float(_trained(frame)["compute_budget"].astype(float).max())
    c = float(compute) if compute is not None else factor * top
    if not c >= MIN_FACTOR * top * (1 - 1e-9):
        raise Refused(f"C_big {c:.3g} is under {MIN_FACTOR:g}x the largest budget {top:.3g}; give --factor 4 or more.")
    fitted = in_regime(frame, min_steps)
    nd = nd_fit(fitted, n_boot)
    answer = compute_answer(frame, nd, c)
    if answer.get("status") != "fitted":
        raise Refused(f"{task}: no prediction, L(N, D) is not fitted ({nd.get('status')}: {nd.get('reason')}).")
    n_star, study = float(answer["N"]["estimate"]), _largest_study(frame)
    planned = [{"size": t.size, "n": t.param_count, "train_tokens": t.train_tokens, "train_flops": t.train_flops,
                "shape": {k: getattr(t.row, k) for k in ("d_model", "n_layers", "n_heads", "d_ff")},
                "loss": law_at(nd, t.param_count, t.train_tokens)}
               for t in plan_big(frame.attrs.get("study_storage", {}).get(study, storage), study, c, n_star)]
    middle = planned[len(planned) // 2]
    iso = isoflop_fit(frame, nd, n_boot)
    return {"task": task, "compute": c, "factor": c / top, "largest_budget": top,
            "fit": {"min_steps": min_steps, "n_points": len(nd_points(fitted))},
            "predicted": {"n_star": {"estimate": n_star, "ci95": answer["N"]["ci95"]},
                          "d_star": answer["D"]["estimate"], "tokens_per_param": answer["tokens_per_param"]["estimate"],
                          "a": answer["a"], "approach_2_a": iso.get("a"), "n": middle["n"], "shape": middle["shape"],
                          "train_tokens": middle["train_tokens"], "loss": middle["loss"]},
            "planned": planned, "measured_loss": None, "prediction_commit": _commit(),
            "predicted_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "launch": launch_args(task, c, n_star)}


def _commit() -> str | None:
    """The checkout's commit the prediction is made at (``+dirty`` with uncommitted changes)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def launch_args(task: str, compute: float, n_star: float) -> list[str]:
    """`archhpo launch`'s IsoFLOP flags of the extrapolation (without storage and training flags)."""
    return ["--experiment", f"{task}_x", "--isoflop", f"{compute:.6g}", "--centre", f"{n_star:.6g}",
            "--sizes", str(FLANK_SIZES), "--span", f"{FLANK_SPAN:g}"]


def write_entry(entry: dict[str, Any], path: Path = JSON_PATH) -> None:
    """Add or replace `entry`'s task in the JSON list at `path` (tasks in name order)."""
    entries = {e["task"]: e for e in (json.loads(path.read_text()) if path.is_file() else [])}
    entries[entry["task"]] = entry
    path.write_text(json.dumps([entries[t] for t in sorted(entries)], indent=2) + "\n")


def read_entry(task: str, path: Path = JSON_PATH) -> dict[str, Any]:
    entries = {e["task"]: e for e in (json.loads(path.read_text()) if path.is_file() else [])}
    if task not in entries:
        raise Refused(f"{path} holds no prediction for {task!r}; run `predict --task {task}` (and commit it) first.")
    return entries[task]


def measured(task: str, storage: str) -> dict[int, dict[str, Any]]:
    """Per trained parameter count of the `{task}_x` study: its mean loss, seeds and first start."""
    from archhpo.report._frame import trials_frame

    frame = trials_frame(f"{task}_x", storage=storage, curves=False)
    done = frame[(frame["state"] == "COMPLETE") & frame["val_loss"].notna()] if not frame.empty else frame
    out = {}
    for n, group in done.groupby("param_count"):
        out[int(n)] = {"loss": float(group["val_loss"].mean()), "runs": len(group),
                       "loss_sd": float(group["val_loss"].std()) if len(group) > 1 else None}
    return out


def grade(entry: dict[str, Any], runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """`entry` with measured_loss and ``grade``: the measured loss at N* against its predicted
    interval, the error in nats and percent, and whether a flank beats N* beyond noise (the
    predicted run interval's half-width over 1.96 as the noise sd, NOISE_SDS of them)."""
    pred = entry["predicted"]
    if int(pred["n"]) not in runs:
        raise Refused(f"The {entry['task']}_x study has no finished trial of N* ({pred['n']:,} parameters) yet; "
                      "train it (`archhpo worker`) before grading.")
    got = runs[int(pred["n"])]["loss"]
    est, (lo, hi) = pred["loss"]["estimate"], pred["loss"]["ci95"]
    noise = (hi - lo) / (2 * 1.96) * NOISE_SDS
    flanks = [{"n": p["n"], "measured_loss": runs[int(p["n"])]["loss"], "predicted": p["loss"]["estimate"],
               "better_beyond_noise": runs[int(p["n"])]["loss"] < got - noise}
              for p in entry["planned"] if int(p["n"]) != int(pred["n"]) and int(p["n"]) in runs]
    return {**entry, "measured_loss": got, "grade": {
        "inside_interval": bool(lo <= got <= hi), "error_nats": got - est, "error_percent": 100 * (got - est) / est,
        "flanks": flanks, "flanks_not_better": not any(f["better_beyond_noise"] for f in flanks),
        "noise_margin": noise, "runs_at_n_star": runs[int(pred["n"])]["runs"]}}


def vertex_seeds(task: str, storage: str, seeds: int) -> list[list[str]]:
    """Per resolved vertex (Approach 2), the launch of `seeds` more seeds of the trained size nearest
    it at its C: its shape pinned, --budget its exact N, --tokens-per-param its D/N (the same data)."""
    from archhpo.report._isoflop import isoflop_fit, isoflop_points

    frame = _frame(task, storage)
    iso, pts = isoflop_fit(frame, None, 200), isoflop_points(frame)
    out = []
    for v in (v for v in iso["vertices"] if not v["edge"]):
        at = pts[pts["compute_budget"] == v["compute_budget"]]
        row = at.iloc[int(np.argmin(np.abs(np.log(at["param_count"].astype(float)) - math.log(v["n_opt"]["estimate"]))))]
        n = int(row["param_count"])
        shape = [x for k in ("d_model", "n_layers", "n_heads", "d_ff") for x in (f"--{k.replace('_', '-')}", str(int(row[k])))]
        out.append(["--experiment", task, "--budget", str(n), "--tolerance", "0.001", "--paired-seeds", str(seeds),
                    *shape, "--tokens-per-param", f"{float(row['train_tokens']) / n:.10g}"])
    if not out:
        raise Refused(f"{task}: no compute budget's vertex is resolved yet (every one at an edge); nothing to seed.")
    return out


def _archhpo(args: Sequence[str], run: bool) -> None:
    """Print `archhpo launch ARGS` (a shell line); with `run`, run it and stop at its failure."""
    print(shlex.join(["archhpo", "launch", *args]), flush=True)
    if run:
        from archhpo.cli import main as archhpo

        code = archhpo(["launch", *args])
        if code:
            raise Refused(f"archhpo launch exited {code}; see its message above.")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("predict", "launch", "grade", "seeds"))
    p.add_argument("--task", required=True)
    p.add_argument("--storage", required=True, help="the frontier's database (grade: the trained study's)")
    p.add_argument("--to", help="launch: the database of the extrapolation's study (default --storage)")
    p.add_argument("--factor", type=float, default=MIN_FACTOR, help="C_big over the largest budget (at least 4)")
    p.add_argument("--compute", type=float, help="C_big itself, instead of --factor")
    p.add_argument("--seeds", type=int, default=3, help="seeds: seeds per vertex size")
    p.add_argument("--json", type=Path, default=JSON_PATH)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--also", action="append", default=[], metavar="STORAGE",
                   help="predict: pool this database's {task}_x study (an earlier C_big profile) into the frontier")
    p.add_argument("--min-steps", type=int, default=0,
                   help="predict: fit L(N, D) on the trials of at least this many optimizer steps (0: all)")
    p.add_argument("--run", action="store_true", help="launch, seeds: run the launch, not only print it")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        if args.command == "predict":
            entry = predict(args.task, args.storage, args.factor, args.compute, args.n_boot, args.min_steps, args.also)
            write_entry(entry, args.json)
            print(json.dumps(entry["predicted"], indent=2))
        elif args.command == "launch":
            entry = read_entry(args.task, args.json)
            if clash := sorted({f.split("=")[0] for f in rest} & PLAN_FLAGS):
                raise Refused(f"{', '.join(clash)} after -- would change the predicted plan (the launch sets the "
                              "experiment, C_big, the centre, the sizes and the span, and --to the storage); "
                              "give only the frontier's training flags and its --data.")
            _archhpo([*entry["launch"], *rest, "--storage", args.to or args.storage], args.run)
        elif args.command == "grade":
            entry = grade(read_entry(args.task, args.json), measured(args.task, args.storage))
            write_entry(entry, args.json)
            print(json.dumps(entry["grade"], indent=2))
        else:
            for launch in vertex_seeds(args.task, args.storage, args.seeds):
                _archhpo([*launch, *rest, "--storage", args.storage], args.run)
    except Refused as exc:
        print(f"extrapolate.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
