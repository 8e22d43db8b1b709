"""End to end on a GPU (issue 9, part 5): a quick two-budget study run by plain workers on SQLite.

The procedure, exactly as a user would run it on a GPU host that has PyTorch but no Ray and no
PostgreSQL:

1. ``archhpo launch`` a quick study with budgets 2M and 20M on an SQLite file;
2. start ``--workers`` plain ``archhpo worker --device cuda`` processes at once (round-robin over
   the visible GPUs through CUDA_VISIBLE_DEVICES, so several share a GPU when there are more
   workers than GPUs) and wait for them;
3. ``archhpo export`` the CSV and the best JSON of each budget;
4. check that every finished trial ran on cuda and recorded gpu_name, peak_memory_gib, mfu and
   samples_per_s, and that no trial failed;
5. replay each best JSON with ``archhpo train --from X_best.json --device cuda`` on the same GPU and
   check its validation loss against the study's within a bf16 tolerance (--rtol, --atol).

    python bench/gpu_e2e.py                      # 4 workers, 8 trials per budget
    python bench/gpu_e2e.py --workers 8 --trials 12 --keep DIR

Prints one JSON summary line and exits 0 when every check passes, 1 when one fails, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BUDGETS = ("2M", "20M")
NO_GPU = ("bench/gpu_e2e.py: no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is False); "
          "this end-to-end check needs one.")


def archhpo(*args: str, env: dict[str, str] | None = None, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "archhpo", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def trial_rows(db: Path) -> list[dict[str, Any]]:
    """Every trial of the file with its state and user attributes (plain sqlite3: Optuna's tables)."""
    con = sqlite3.connect(db)
    try:
        out = []
        for tid, number, state, name in con.execute(
            "SELECT t.trial_id, t.number, t.state, s.study_name FROM trials t JOIN studies s USING (study_id)"
        ):
            attrs = {k: json.loads(v) for k, v in con.execute(
                "SELECT key, value_json FROM trial_user_attributes WHERE trial_id = ?", (tid,))}
            out.append({"study": name, "number": number, "state": state, "attrs": attrs})
        return out
    finally:
        con.close()


def visible_gpus(count: int, inherited: str | None) -> list[str]:
    """The GPUs the workers may use, as CUDA_VISIBLE_DEVICES entries: the inherited list (a SLURM
    allocation of GPUs 2,3 stays on 2,3), else 0..count-1."""
    if inherited is not None and inherited.strip():
        return [g.strip() for g in inherited.split(",") if g.strip()]
    return [str(i) for i in range(count)]


def missing_peak(names: list[str]) -> str | None:
    """One sentence for a GPU without a dense bf16 peak (its trials could record no MFU), else None."""
    from archhpo.workers._device import PEAK_ENV, dense_bf16_peak_flops

    for name in dict.fromkeys(names):
        if dense_bf16_peak_flops(name) is None:
            return (f"{name} is not in archhpo's table of GPU peaks (workers/_device.py), so its trials "
                    f"cannot record MFU; set {PEAK_ENV} to its dense bf16 peak in FLOP/s and run again.")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="plain worker processes (default 4)")
    ap.add_argument("--trials", type=int, default=8, help="planned trials per budget (default 8)")
    ap.add_argument("--data", default="synthetic:steps=6000")
    ap.add_argument("--rtol", type=float, default=0.03, help="replay tolerance, relative (bf16; default 3%%)")
    ap.add_argument("--atol", type=float, default=0.01, help="replay tolerance, absolute (default 0.01)")
    ap.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temp folder)")
    ap.add_argument("--budgets", nargs="+", default=list(BUDGETS), help=argparse.SUPPRESS)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check this script's procedure on CPU (tiny budgets; proves nothing about GPUs)")
    args = ap.parse_args(argv)
    device = "cpu" if args.cpu_smoke else "cuda"
    if not args.cpu_smoke and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    if not args.cpu_smoke and (why := missing_peak([torch.cuda.get_device_name(i)
                                                     for i in range(torch.cuda.device_count())])):
        print(why, file=sys.stderr)
        return 2
    work = Path(args.keep or tempfile.mkdtemp(prefix="archhpo-gpu-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "e2e.db"
    url = f"sqlite:///{db}"
    budgets = [x for b in args.budgets for x in ("--budget", b)]
    failures: list[str] = []
    t0 = time.perf_counter()

    res = archhpo("launch", "--experiment", "gpue2e", *budgets, "--trials", str(args.trials), "--quick",
                  "--data", args.data, "--storage", url)
    if res.returncode:
        print(res.stderr, file=sys.stderr)
        return 1
    gpus = visible_gpus(torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")) if device == "cuda" else []
    procs = []
    for i in range(args.workers):
        env = ({**os.environ, "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus
               else {**os.environ, "OMP_NUM_THREADS": "1"})
        log = open(work / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "archhpo", "worker", "--experiment", "gpue2e", *budgets, "--storage", url,
             "--device", device, "--checkpoint-dir", str(work / "ckpt")], stdout=log, stderr=subprocess.STDOUT,
            env=env), log))
    for i, (p, log) in enumerate(procs):
        if p.wait():
            failures.append(f"worker {i} exited with {p.returncode} (see {work / f'worker{i}.log'})")
        log.close()
    train_s = time.perf_counter() - t0

    res = archhpo("export", "--experiment", "gpue2e", "--storage", url, "--out", str(work / "out"))
    if res.returncode:
        failures.append(f"export failed: {res.stderr.strip()[-300:]}")

    rows = trial_rows(db)
    finished = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED", "FAIL")]
    for r in finished:
        a = r["attrs"]
        if r["state"] == "FAIL":
            failures.append(f"{r['study']} trial {r['number']} failed: {a.get('fail_reason')}")
        if not str(a.get("device", "")).startswith(device):
            failures.append(f"{r['study']} trial {r['number']} ran on {a.get('device')!r}, not {device}")
        wanted = ("gpu_name", "peak_memory_gib", "samples_per_s", "mfu") if device == "cuda" else ("samples_per_s",)
        missing = [k for k in wanted if a.get(k) is None]
        if r["state"] == "COMPLETE" and missing:
            failures.append(f"{r['study']} trial {r['number']} lacks {', '.join(missing)}")
    if len([r for r in finished if r["state"] == "COMPLETE"]) < len(args.budgets):
        failures.append("fewer complete trials than budgets")

    replays = []
    for budget in args.budgets:
        best = work / "out" / f"gpue2e_{budget}_best.json"
        if not best.exists():
            failures.append(f"no {best.name}")
            continue
        want = float(json.loads(best.read_text())["best_value"])
        res = archhpo("train", "--from", str(best), "--device", device)
        if res.returncode:
            failures.append(f"train --from {best.name} failed: {res.stderr.strip()[-300:]}")
            continue
        got = float(json.loads(res.stdout.strip().splitlines()[-1])["val_loss"])
        ok = abs(got - want) <= max(args.atol, args.rtol * abs(want))
        replays.append({"budget": budget, "study_val_loss": want, "replay_val_loss": got, "within_tolerance": ok})
        if not ok:
            failures.append(f"{budget}: replay {got:.5f} vs study {want:.5f} beyond rtol {args.rtol} / atol {args.atol}")

    mfus = sorted(m for r in finished if (m := r["attrs"].get("mfu")) is not None)
    summary = {
        "gpu": torch.cuda.get_device_name(0) if gpus else None, "gpus": gpus, "torch": torch.__version__, "workers": args.workers,
        "trials": len(rows), "finished": len(finished), "complete": sum(r["state"] == "COMPLETE" for r in rows),
        "devices": sorted({str(r["attrs"].get("device")) for r in finished}),
        "peak_memory_gib_max": max((r["attrs"].get("peak_memory_gib") or 0 for r in finished), default=None),
        "mfu_median": mfus[len(mfus) // 2] if mfus else None,
        "study_s": round(train_s, 1), "replays": replays, "failures": failures, "work": str(work),
    }
    print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
