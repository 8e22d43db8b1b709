"""Successive halving with real training: a promoted trial goes on from the state it was held in
(nothing trained twice, the same full-length loss as a study that never halves), WSD rung scores are
cooldown branches, replicates score rungs in passing, idle workers take other budgets' work, and a
study whose worker is SIGKILLed makes the same decisions as one that is not (SQLite, PostgreSQL)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState

from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import Worker
from tests.conftest import run_cli, wait_for

LM = {"family": "lm", "data": "synthetic:tokens=3000", "quick": True, "seed": 0, "n_trials": 6,
      "schedule": "wsd", "cooldown": 0.2, "eta": 2, "min_fraction": "1/2",
      "fixed_params": {"epochs": 4, "batch_size": 16, "learning_rate": 3e-3}}
FAST_REAP = {"ARCHHPO_HEARTBEAT_S": "1", "ARCHHPO_GRACE_S": "4", "ARCHHPO_REAP_S": "1"}


def _run(url: str, tmp_path: Path, pruner: str, **kw: Any) -> tuple[Any, list[optuna.trial.FrozenTrial]]:
    s = prepare_settings(f"e{pruner}", "100K", **{**LM, "pruner": pruner, **kw})
    launch(url, s)
    torch.set_num_threads(1)
    Worker([TrialQueue(url, s.study_name)], device="cpu", threads=1, checkpoint_dir=tmp_path / "ck").run()
    study = optuna.load_study(study_name=s.study_name, storage=url)
    return s, study.get_trials(deepcopy=False)


def _by_slot(trials: list[optuna.trial.FrozenTrial], state: TrialState) -> dict[int, float]:
    return {t.user_attrs["plan_slot"]: t.value for t in trials if t.state == state}


def test_a_promoted_trial_ends_exactly_where_a_study_without_halving_does(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    _, plain = _run(url, tmp_path, "none")
    s, halved = _run(url, tmp_path, "halving")
    phase1 = {e.slot for e in s.plan if e.phase == 1}
    complete = {slot: v for slot, v in _by_slot(halved, TrialState.COMPLETE).items() if slot in phase1}
    assert complete, "some phase-1 trial went to full length"
    plain_values = _by_slot(plain, TrialState.COMPLETE)
    assert complete == {slot: plain_values[slot] for slot in complete}, "held, resumed: bit for bit the same"
    for t in halved:
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        assert t.user_attrs["rung_epochs"] == [2, 4]
        if t.state == TrialState.PRUNED:  # scored by a cooldown branched at epoch 2, not the constant-rate loss
            assert t.value == t.user_attrs["rung_scores"][0] != t.intermediate_values[2]
            assert t.user_attrs["branch_epochs"][0] > 0 and sorted(t.intermediate_values) == [1, 2]
        else:
            assert sorted(t.intermediate_values) == [1, 2, 3, 4], "one curve, trained once"
    spent = sum(t.user_attrs["flops_spent"] for t in halved)
    assert spent < sum(t.user_attrs["flops_full"] for t in halved), "halving saved compute"
    # every trial's rung scores reach the CSV and the frame, from the database and from the CSV alike
    from archhpo.report._export import RESULTS_CSV, csv_text, result_rows
    from archhpo.report._frame import trials_frame

    (tmp_path / RESULTS_CSV).write_text(csv_text(result_rows(optuna.load_study(study_name=s.study_name,
                                                                               storage=url), s)))
    stored = {t.number: t.user_attrs["rung_scores"] for t in halved}
    assert {len(v) for v in stored.values()} == {1, 2}, "pruned trials hold one score, promoted ones two"
    for frame in (trials_frame("ehalving", storage=url), trials_frame("ehalving", csv=tmp_path / RESULTS_CSV)):
        assert dict(zip(frame["trial"], frame["rung_scores"], strict=True)) == stored
    assert not list((tmp_path / "ck").rglob("*.pt")), "held states are removed once the plan is done"


def test_replicates_of_a_halving_study_score_every_rung_in_passing(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    _, trials = _run(url, tmp_path, "halving", paired_seeds=2, n_trials=3)
    assert {t.state for t in trials} == {TrialState.COMPLETE}, "a replicate is never stopped early"
    for t in trials:
        assert t.user_attrs["rung"] == 1 and len(t.user_attrs["rung_scores"]) == 2
        assert t.user_attrs["rung_scores"][-1] == t.value
        assert t.user_attrs["flops_spent"] > t.user_attrs["flops_full"], "its branches counted as compute"


def test_while_a_rung_waits_an_idle_worker_trains_another_budget(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    a = prepare_settings("x", "100K", **{**LM, "pruner": "halving"})
    b = prepare_settings("x", "75K", **{**LM, "pruner": "none", "n_trials": 3})
    launch(url, a)
    launch(url, b)
    qa, qb = TrialQueue(url, a.study_name), TrialQueue(url, b.study_name)
    elsewhere = qa.claim({"host": "slow"})  # another worker holds one of A's rung-0 trials
    assert elsewhere is not None
    worker = Worker([qa, qb], device="cpu", threads=1, checkpoint_dir=tmp_path / "ck")
    thread = threading.Thread(target=worker.run, daemon=True)  # it returns once every plan is done
    thread.start()
    assert wait_for(lambda: qb.maintain().done, timeout=300), "B was trained while A's rung waited"
    a_trials = optuna.load_study(study_name=a.study_name, storage=url).get_trials(deepcopy=False)
    assert not any(x.state == TrialState.COMPLETE for x in a_trials), "A's rung 0 is still undecided"
    assert any(x.user_attrs.get("rung_hold") for x in a_trials)
    qa.requeue(elsewhere, "the slow worker gave up")
    thread.join(300)
    assert not thread.is_alive() and qa.maintain().done


def _popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **FAST_REAP}
    return subprocess.Popen([sys.executable, "-m", "archhpo", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_FLAGS = ["--family", "lm", "--data", "synthetic:tokens=3000", "--quick", "--trials", "6", "--pruner", "halving",
          "--eta", "2", "--min-fraction", "1/2", "--schedule", "wsd", "--epochs", "4", "--batch-size", "16",
          "--learning-rate", "3e-3"]


def _outcome(url: str, name: str) -> tuple[Any, dict[int, tuple[str, float]]]:
    study = optuna.load_study(study_name=name, storage=url)
    final = {t.user_attrs["plan_slot"]: (t.state.name, t.value) for t in study.get_trials(deepcopy=False)
             if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
    return study.user_attrs["archhpo_halving"], final


def _states(url: str, name: str) -> list[tuple[Any, ...]]:
    """Each trial's number, state, slot, attempt, rung, hold and note: what a hung study waits for."""
    study = optuna.load_study(study_name=name, storage=url)
    keys = ("plan_slot", "attempt", "rung", "rung_hold", "state_note")
    return [(t.number, t.state.name, *(t.user_attrs.get(k) for k in keys)) for t in study.get_trials(deepcopy=False)]


def _running(name: str, url: str) -> list[int]:
    trials = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    return [t.number for t in trials if t.state == TrialState.RUNNING]


def _kill_while_a_trial_runs(work: list[str], name: str, url: str, cwd: Path) -> None:
    """SIGKILL a worker once a rung holds a trial and another trial is running. A quick trial can finish
    between the check and the signal, so the kill is repeated (the study simply goes on) until the dead
    worker is seen to leave a RUNNING trial behind: the orphan the rescuer must retry. The first kill
    waits for a held rung, so the study is killed in the middle of halving."""
    for attempt in range(5):
        victim = _popen(*work, cwd=cwd)

        def held_and_running(first: bool = attempt == 0) -> bool:
            trials = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
            return ((not first or any(t.user_attrs.get("rung_hold") for t in trials))
                    and any(t.state == TrialState.RUNNING for t in trials))

        assert wait_for(held_and_running, timeout=180)
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        if _running(name, url):
            return
    pytest.fail("five SIGKILLs in a row never caught a trial running")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_sigkilled_worker_changes_no_decision(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    urls = ([f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"] if backend == "sqlite"
            else [request.getfixturevalue("pg_url")] * 2)
    outcomes = []
    for i, (url, kill) in enumerate(zip(urls, (False, True), strict=True)):
        common = ["--experiment", f"k{i}", "--budget", "100K", "--storage", url]
        assert run_cli("launch", *common, *_FLAGS).returncode == 0
        work = ["worker", *common, "--threads", "1", "--checkpoint-dir", str(tmp_path / f"ck{i}")]
        if kill:
            _kill_while_a_trial_runs(work, f"k{i}_100K", url, tmp_path)
        rescuer = _popen(*work, cwd=tmp_path)
        _, err = rescuer.communicate(timeout=300)
        assert rescuer.returncode == 0, err[-2000:]
        outcomes.append(_outcome(url, f"k{i}_100K"))
    killed = optuna.load_study(study_name="k1_100K", storage=urls[1]).get_trials(deepcopy=False)
    assert any("retry_of" in t.user_attrs for t in killed), "the killed worker's trial was retried"
    (decided, final), (decided_killed, final_killed) = outcomes
    assert decided_killed == decided and final_killed == final
    assert any(state == "PRUNED" for state, _ in final.values())


@pytest.mark.ray
def test_a_sigkilled_driver_changes_no_decision(tmp_path: Path) -> None:
    """`run` SIGKILLed while a rung waits (its Ray workers die with it), then run again: every slot
    finishes exactly once, with the same rung decisions and final losses as a plain worker that was
    never interrupted (1 thread each, as `run --workers 2 --threads 1`). (It replaces the plain-median
    driver test: the same kill and restart, with the halving state on top.)"""
    plain = f"sqlite:///{tmp_path / 'plain.db'}"
    common = ["--experiment", "p", "--budget", "100K", "--storage", plain]
    assert run_cli("launch", *common, *_FLAGS).returncode == 0
    worker = run_cli("worker", *common, "--threads", "1", "--checkpoint-dir", str(tmp_path / "ckp"), cwd=tmp_path)
    assert worker.returncode == 0, worker.stderr[-2000:]
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    args = ["run", "--experiment", "d", "--budget", "100K", "--storage", url, "--workers", "2", "--threads", "1",
            "--out", str(tmp_path / "o"), "--checkpoint-dir", str(tmp_path / "ck"), *_FLAGS]
    driver = _popen(*args, cwd=tmp_path)

    def held() -> bool:
        try:
            trials = optuna.load_study(study_name="d_100K", storage=url).get_trials(deepcopy=False)
        except Exception:  # the study is not created yet
            return False
        return any(t.user_attrs.get("rung_hold") for t in trials)

    assert wait_for(held, timeout=240)
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=30)
    try:
        res = run_cli(*args, cwd=tmp_path, env=FAST_REAP, timeout=600)
    except subprocess.TimeoutExpired as hung:  # say what the study was waiting for
        raise AssertionError(f"the restarted run hung; trials: {_states(url, 'd_100K')}; its stderr ends: "
                             f"{(hung.stderr or b'')[-1500:]!r}") from hung
    assert res.returncode == 0, res.stderr[-2000:]
    decided, final = _outcome(url, "d_100K")
    assert (decided, final) == _outcome(plain, "p_100K")
    trials = optuna.load_study(study_name="d_100K", storage=url).get_trials(deepcopy=False)
    finished = [t.user_attrs["plan_slot"] for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert sorted(finished) == sorted(final) == list(range(6)), "every slot finished exactly once"
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    with open(tmp_path / "o" / "experiment_results.csv") as fh:
        assert sorted(int(r["plan_slot"]) for r in csv.DictReader(fh)) == list(range(6)), "one CSV row a slot"
