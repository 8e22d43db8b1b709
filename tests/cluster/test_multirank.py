"""Trials across 2 ranks through real processes: `archhpo worker` launched by torchrun (gloo on CPU).

Rank 0 holds the claim and writes once for the group; a 1-rank worker and a 2-rank group share a
study and run every trial exactly once; a rank killed with SIGKILL breaks its group, torchrun
restarts it, and the trial, reaped and retried once, resumes from its last checkpoint and ends at
the uninterrupted 2-rank run's value; a SIGTERM to one rank stops both and gives the trial back,
which resumes to that value too; a pruned trial stops on both ranks at its rung; a group fenced out
stops on both ranks and never touches the retry.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from archhpo.errors import ArchhpoError
from archhpo.schema import Attr
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._space import SearchSpace
from archhpo.workers import Worker
from tests.conftest import wait_for
from tests.workers._ranks import free_port

# The killed rank's claim is reaped after GRACE_S; the mixed study's grace outlasts any late beat of
# three training processes on two loaded cores, so none of its trials is reaped.
FAST_REAP = {"ARCHHPO_HEARTBEAT_S": "1", "ARCHHPO_GRACE_S": "8", "ARCHHPO_REAP_S": "1",
             "ARCHHPO_GROUP_TIMEOUT_S": "30"}
NO_REAP = {**FAST_REAP, "ARCHHPO_GRACE_S": "120"}
# The killed rank's test: a grace that outlasts a beat delayed on a loaded CI machine (with 8 s it once
# waited out its 240 s there, cause unrecorded; _await now prints the trials and the group's output).
KILL_REAP = {**FAST_REAP, "ARCHHPO_GRACE_S": "20"}


def _study(url: str, name: str, trials: int, epochs: int, same_seed: bool = False, ranks: int = 1,
           pruner: str = "none") -> str:
    """A tiny lm study; with `same_seed` every trial is the first one again (arch, params and seed)."""
    s = prepare_settings(name, "100K", family="lm", n_trials=max(2, trials), data="synthetic:tokens=4000", seed=3,
                         quick=True, pruner=pruner, family_options={"seq_len": 16}, ranks_per_trial=ranks)
    space = SearchSpace(learning_rate=(1e-4, 1e-2), epochs=(epochs,), batch_size=(16,),
                        weight_decay=(1e-5, 1e-3), warmup_steps=(2,))
    fixed = {"epochs": epochs, "batch_size": 16, "warmup_steps": 2}
    plan = [dataclasses.replace(e, params={**(e.params or {}), **fixed}) for e in s.plan[:trials]]
    if same_seed:
        plan = [dataclasses.replace(plan[0], slot=e.slot, seed=7) for e in plan]
    launch(url, dataclasses.replace(s, plan=plan, space=space.as_dict()))
    return s.study_name


def _group(url: str, cwd: Path, restarts: int = 0, timing: dict[str, str] = FAST_REAP) -> subprocess.Popen[str]:
    """`torchrun --nproc-per-node 2 -m archhpo worker ...`: one worker of two ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts",
           str(restarts), "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "archhpo",
           "worker", "--experiment", "mr", "--budget", "100K", "--storage", url, "--device", "cpu",
           "--threads", "1", "--checkpoint-dir", str(cwd / "ck")]
    env = {**os.environ, **timing, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def _finish(proc: subprocess.Popen[str], log: Path, timeout: float = 300) -> str:
    """The group's output (kept whole in `log`) once torchrun exits 0."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        log.write_text(out)
        raise AssertionError(f"the group did not finish within {timeout} s (output: {log})") from None
    log.write_text(out)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode} (output: {log}):\n{out[-3000:]}"
    return out


def _await(group: subprocess.Popen[str], predicate: Any, what: str, url: str, name: str,
           timeout: float = 240) -> None:
    """Wait for `predicate` while the group runs; if it never holds, or the group exits first, fail
    with what the group printed and the trials' states (a bare timeout says nothing about why)."""
    if wait_for(lambda: predicate() or group.poll() is not None, timeout=timeout, every=0.2) and group.poll() is None:
        return
    group.kill()
    out, _ = group.communicate()
    states = [(t.number, t.state.name, t.user_attrs.get("plan_slot")) for t in _trials(url, name)]
    raise AssertionError(f"{what}: not within {timeout} s (group exit {group.returncode}); trials {states}; the group printed:\n{out[-4000:]}")


def _rank_pid(agent: int, rank: int) -> int | None:
    """The pid of torchrun's child process of `rank` (from its environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == agent and f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
            return int(entry.name)
    return None


def test_a_study_mixing_one_and_two_rank_trials_runs_every_trial_exactly_once(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = sqlite_url
    name = _study(url, "mr", trials=4, epochs=2)
    group = _group(url, tmp_path, timing=NO_REAP)
    try:
        def group_claimed() -> bool:
            return any(t.state == TrialState.RUNNING for t in _trials(url, name))

        assert wait_for(group_claimed, timeout=180, every=0.5), "the 2-rank group claimed a trial"
        for key, value in NO_REAP.items():
            monkeypatch.setenv(key, value)
        summary = Worker([TrialQueue(url, name)], device="cpu", threads=1).run()  # one rank, beside the group
        out = _finish(group, tmp_path / "group.log")
    finally:
        group.kill()
    trials = _trials(url, name)
    slots = Counter(t.user_attrs["plan_slot"] for t in trials if t.state == TrialState.COMPLETE)
    assert sorted(slots.values()) == [1, 1, 1, 1] and len(trials) == 4, [(t.number, t.state) for t in trials]
    ranks = Counter(int(t.user_attrs.get(Attr.RANKS, 1)) for t in trials)
    assert ranks[2] >= 1 and ranks[1] == summary.complete >= 1, (ranks, summary, out[-2000:])
    assert all(t.user_attrs[Attr.SHARD] == "ddp" for t in trials if t.user_attrs.get(Attr.RANKS) == 2)


def test_a_killed_rank_restarts_the_group_and_the_retry_ends_at_the_uninterrupted_value(
        sqlite_url: str, tmp_path: Path) -> None:
    """Two copies of one trial: the first trains uninterrupted on 2 ranks; rank 1 is killed (SIGKILL)
    once the second has checkpointed an epoch. torchrun restarts both ranks; the dead attempt is
    reaped and retried once from its checkpoint, and ends at the first copy's value bit for bit."""
    url = sqlite_url
    name = _study(url, "mr", trials=2, epochs=3, same_seed=True)
    group = _group(url, tmp_path, restarts=1, timing=KILL_REAP)
    try:
        def second_checkpointed() -> bool:
            done = [t for t in _trials(url, name) if t.state == TrialState.COMPLETE]
            files = list((tmp_path / "ck" / name).glob("slot*.attempt1.pt"))
            return len(done) == 1 and len(files) == 1

        _await(group, second_checkpointed, "the second copy checkpointed an epoch", url, name)
        victim = _rank_pid(group.pid, 1)
        assert victim is not None, "rank 1's process"
        os.kill(victim, signal.SIGKILL)
        out = _finish(group, tmp_path / "group.log")
    finally:
        group.kill()
    trials = sorted(_trials(url, name), key=lambda t: t.number)
    first, dead, retry = _by_role(trials)
    assert dead.state == TrialState.FAIL and "fail_reason" not in dead.user_attrs, out[-2000:]
    assert retry.user_attrs["retry_of"] == dead.number and retry.user_attrs["resumed_from_epoch"] >= 1
    assert retry.value == first.value, (retry.value, first.value)
    assert int(retry.user_attrs[Attr.RANKS]) == int(first.user_attrs[Attr.RANKS]) == 2
    assert "the trial's group broke" in out, out[-3000:]


def test_a_sigterm_to_one_rank_gives_the_trial_back_once_and_it_resumes_to_the_uninterrupted_value(
        sqlite_url: str, tmp_path: Path) -> None:
    """Two copies of one trial: the first trains uninterrupted on 2 ranks; rank 1 gets SIGTERM once
    the second has checkpointed an epoch. Both ranks stop in the same step (else a collective breaks
    the group), rank 0 gives the trial back (WAITING, same number, not failed), and a second group
    resumes it to the first copy's value bit for bit."""
    url = sqlite_url
    name = _study(url, "mr", trials=2, epochs=4, same_seed=True)
    group = _group(url, tmp_path, timing=NO_REAP)
    try:
        def second_checkpointed() -> bool:
            done = [t for t in _trials(url, name) if t.state == TrialState.COMPLETE]
            return len(done) == 1 and len(list((tmp_path / "ck" / name).glob("slot*.attempt1.pt"))) == 1

        _await(group, second_checkpointed, "the second copy checkpointed an epoch", url, name)
        victim = _rank_pid(group.pid, 1)
        assert victim is not None, "rank 1's process"
        os.kill(victim, signal.SIGTERM)
        out, _ = group.communicate(timeout=120)
        (tmp_path / "stopped.log").write_text(out)
    finally:
        group.kill()
    # Rank 1 exits 143 as a worker stopped by SIGTERM does (so torchrun reports the group failed);
    # rank 0 gave the trial back and ended its loop.
    assert '"signal": 15' in out and '"requeued": 1' in out and "exitcode  : 143" in out, out[-3000:]
    first, second = sorted(_trials(url, name), key=lambda t: t.number)
    assert first.state == TrialState.COMPLETE and second.state == TrialState.WAITING, out[-3000:]
    assert second.user_attrs["state_note"].startswith("requeued"), second.user_attrs
    assert "the trial's group broke" not in out, out[-3000:]
    again = _group(url, tmp_path, timing=NO_REAP)
    try:
        out = _finish(again, tmp_path / "resumed.log")
    finally:
        again.kill()
    trials = sorted(_trials(url, name), key=lambda t: t.number)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2, out[-3000:]
    resumed = trials[1]
    assert "retry_of" not in resumed.user_attrs and resumed.user_attrs["resumed_from_epoch"] >= 1
    assert resumed.value == first.value, (resumed.value, first.value)


def test_a_pruned_two_rank_trial_stops_on_both_ranks_and_is_recorded_pruned_once(
        sqlite_url: str, tmp_path: Path) -> None:
    """Five finished trials at loss 0 make the median rule prune both planned trials at their first
    scored epoch: rank 0 is told so at epoch 1 and broadcasts it; rank 1 stops there too (had it trained
    on, its next collective would wait for a rank 0 gone and break the group: exit non-zero)."""
    url = sqlite_url
    name = _study(url, "mr", trials=2, epochs=3, pruner="median")
    study = optuna.load_study(study_name=name, storage=url)
    for _ in range(5):
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.0,
                                                  intermediate_values={1: 0.0, 2: 0.0, 3: 0.0}))
    out = _finish(_group(url, tmp_path, timing=NO_REAP), tmp_path / "group.log")
    ours = [t for t in _trials(url, name) if "plan_slot" in t.user_attrs]
    assert [t.state for t in ours] == [TrialState.PRUNED] * 2, ([(t.number, t.state) for t in ours], out[-2000:])
    assert sorted(t.user_attrs["plan_slot"] for t in ours) == [0, 1], "each planned trial once"
    for pruned in ours:
        assert pruned.user_attrs["pruned_at_epoch"] == 1 and sorted(pruned.intermediate_values) == [1]
        assert int(pruned.user_attrs[Attr.RANKS]) == 2
    assert "the trial's group broke" not in out, out[-2000:]


def test_a_two_rank_group_fenced_out_stops_on_both_ranks_and_never_touches_the_retry(
        sqlite_url: str, tmp_path: Path) -> None:
    """Both ranks are paused (SIGSTOP) past the grace period, within the group's timeout: the test
    reaps the claim and a 1-rank worker takes the retry. Resumed, rank 0 finds its claim fenced and
    the group stops on both ranks (no broken collective), writing nothing more to the dead attempt
    or the retry; the retry is the one finished trial."""
    from tests.search.test_fencing import REAPER, _holds_a_lock

    url = sqlite_url
    # Only the test reaps (REAPER's 4 s grace); the group's timeout outlasts the pause by far.
    beat = {**NO_REAP, "ARCHHPO_GRACE_S": "600", "ARCHHPO_GROUP_TIMEOUT_S": "180"}
    name = _study(url, "mr", trials=1, epochs=12)
    ck = tmp_path / "ck"
    group = _group(url, tmp_path, timing=beat)
    rescuer = None
    ranks: list[int] = []
    try:
        _await(group, lambda: bool(list((ck / name).glob("slot*.attempt1.pt"))), "the group checkpointed an epoch",
               url, name)
        ranks = [pid for pid in (_rank_pid(group.pid, r) for r in (0, 1)) if pid is not None]
        assert len(ranks) == 2, "both ranks' processes"
        for _ in range(100):  # paused outside any transaction and the plan lock, as test_fencing does
            for pid in ranks:
                os.kill(pid, signal.SIGSTOP)
            if not _holds_a_lock(url):
                break
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
        (old,) = _trials(url, name)
        reaper = TrialQueue(url, name, timing=REAPER)
        try:
            def reaped() -> bool:
                reaper.upkeep.maintain()
                return any(t.user_attrs.get("retry_of") == old.number for t in _trials(url, name))

            assert wait_for(reaped, timeout=20, every=0.5), "the paused group's trial was reaped and retried"
        finally:
            reaper.storage.engine.dispose()
        before = next(t for t in _trials(url, name) if t.number == old.number)
        rescuer = subprocess.Popen(
            [sys.executable, "-m", "archhpo", "worker", "--experiment", "mr", "--budget", "100K", "--storage", url,
             "--device", "cpu", "--threads", "1", "--checkpoint-dir", str(ck)],
            cwd=tmp_path, env={**os.environ, **beat, "RAY_USAGE_STATS_ENABLED": "0"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert wait_for(lambda: any(t.user_attrs.get("retry_of") == old.number and t.state == TrialState.RUNNING
                                    for t in _trials(url, name)), timeout=120, every=0.2), "the rescuer runs the retry"
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
        rescued, _ = rescuer.communicate(timeout=300)
        out = _finish(group, tmp_path / "group.log")
    finally:
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for p in (group, rescuer):
            if p is not None and p.poll() is None:
                p.kill()
    assert rescuer.returncode == 0, rescued[-2000:]
    assert "reaped while this" in out and "the trial's group broke" not in out, out[-3000:]
    trials = _trials(url, name)
    after = next(t for t in trials if t.number == old.number)
    assert after.state == TrialState.FAIL and after.user_attrs == before.user_attrs, "nothing written after the fence"
    assert after.intermediate_values == before.intermediate_values, "no report after the fence"
    (retry,) = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(trials) == 2 and retry.user_attrs["retry_of"] == old.number
    assert retry.user_attrs["pid"] == rescuer.pid and Attr.RANKS not in retry.user_attrs, retry.user_attrs


def _by_role(trials: list[Any]) -> tuple[Any, Any, Any]:
    """The uninterrupted copy, the killed attempt and its retry."""
    assert len(trials) == 3, [(t.number, t.state) for t in trials]
    retry = next(t for t in trials if t.user_attrs.get("retry_of") is not None)
    dead = next(t for t in trials if t.number == retry.user_attrs["retry_of"])
    first = next(t for t in trials if t not in (dead, retry))
    return first, dead, retry


def test_gangs_fill_the_clusters_gpus_k_at_a_time_and_cpu_runs_take_workers_over_k() -> None:
    from archhpo.cluster._placement import gang_count

    assert gang_count(2, "auto", 8, None) == 4
    assert gang_count(4, "auto", 8, 1) == 1, "--workers caps the gangs"
    assert gang_count(2, "cpu", 8, 4) == 2, "--device cpu: the workers' ranks, one CPU each"
    assert gang_count(2, "auto", 0, 6) == 3, "a CPU cluster: the workers' ranks"
    assert gang_count(2, "auto", 0, None) == 1, "the default 2 workers make one gang of 2"
    with pytest.raises(ArchhpoError, match="needs 4 GPUs, but the Ray cluster has 2"):
        gang_count(4, "auto", 2, None)


@pytest.mark.ray
def test_run_trains_a_two_rank_study_through_ray_train_gangs_every_trial_once(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run`'s pool for a study at 2 ranks per trial: Ray Train TorchTrainers of 2 gloo workers,
    gang-placed, as many as --workers // 2; rank 0 (world rank 0) claims and writes each trial once."""
    pytest.importorskip("ray")
    from archhpo.cluster._options import RunOptions
    from archhpo.cluster._run import run_workers

    url = sqlite_url
    name = _study(url, "mr", trials=2, epochs=1, ranks=2)
    for key, value in {**NO_REAP, "RAY_USAGE_STATS_ENABLED": "0",
                       "PYTHONPATH": str(Path(__file__).resolve().parents[2])}.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    statuses = run_workers(url, [name], RunOptions(workers=2, device="cpu", threads=1,
                                                   checkpoint_dir=tmp_path / "ck"), out=out)
    assert statuses[name].done and "1 trial(s) at a time, each across 2 ranks (cpu)" in out.getvalue()
    trials = _trials(url, name)
    assert sorted(t.state for t in trials) == [TrialState.COMPLETE] * 2
    assert {(t.user_attrs[Attr.RANKS], t.user_attrs["ray_train_rank"]) for t in trials} == {(2, 0)}
