"""Time from SIGKILL of a worker mid-trial to its trial being reaped (FAIL) and retried.

Launches a small quick study on SQLite, starts `archhpo worker`, SIGKILLs it once a trial has
checkpointed an epoch, starts a second worker with the same settings, and reports how long
after the kill the retry was enqueued and claimed.  Heartbeat/grace/reaper come from the
environment (ARCHHPO_HEARTBEAT_S, ARCHHPO_GRACE_S, ARCHHPO_REAP_S) as in production.

    python bench/crash_recovery.py            # defaults: 15 s beat, 90 s grace, 30 s reaper
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from archhpo.environment import Environment

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="archhpo-crash-"))
    url = f"sqlite:///{tmp / 's.db'}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--experiment", "crash", "--budget", "200K", "--storage", url]
    cli = [sys.executable, "-m", "archhpo"]
    subprocess.run([*cli, "launch", *common, "--trials", "3", "--quick", "--pruner", "none",
                    "--data", "synthetic:steps=20000"], check=True, env=env, cwd=tmp)
    worker = [*cli, "worker", *common, "--threads", "1", "--checkpoint-dir", str(tmp / "ck")]
    victim = subprocess.Popen(worker, env=env, cwd=tmp, stderr=subprocess.DEVNULL)
    while not any((tmp / "ck").rglob("*.pt")):
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed = time.monotonic()
    rescuer = subprocess.Popen(worker, env=env, cwd=tmp, stderr=subprocess.DEVNULL)
    enqueued = claimed = None
    study = optuna.load_study(study_name="crash_200K", storage=url)
    while rescuer.poll() is None:
        retries = [t for t in study.get_trials(deepcopy=False) if "retry_of" in t.user_attrs]
        if retries and enqueued is None:
            enqueued = time.monotonic() - killed
        if retries and claimed is None and retries[0].state != optuna.trial.TrialState.WAITING:
            claimed = time.monotonic() - killed
        time.sleep(0.2)
    retry = next(t for t in study.get_trials() if "retry_of" in t.user_attrs)
    timing = Environment.read()  # what the two worker processes read (their defaults from the same place)
    print(f"heartbeat {timing.heartbeat_s} s, grace {timing.grace_s} s, reaper {timing.reap_s:g} s")
    print(f"SIGKILL -> trial failed and retry enqueued: {enqueued:.1f} s")
    print(f"SIGKILL -> retry running on the second worker: {claimed:.1f} s")
    print(f"retry resumed from epoch {retry.user_attrs.get('resumed_from_epoch')}, state {retry.state.name}")


if __name__ == "__main__":
    main()
