"""Preemption costs nothing: SIGTERM or SIGINT to a real `archhpo worker`
process, and ray.cancel of a Ray worker task, give the running trial back to the queue within a
few seconds (WAITING, same attempt, no FAIL, its checkpoint kept for the next claim), and the
worker exits cleanly (exit code 128 + the signal: 143 for SIGTERM, 130 for SIGINT)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from archhpo.search import TrialQueue, launch, prepare_settings
from tests.conftest import run_cli, wait_for

SLOW_DATA = "synthetic:steps=2000"  # epochs of a second or two on one thread
EPOCHS = 4  # a signal sent once epoch 1 is checkpointed lands mid-trial


def _popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "ARCHHPO_HEARTBEAT_S": "1", "ARCHHPO_REAP_S": "1"}
    return subprocess.Popen([sys.executable, "-m", "archhpo", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def _launch(url: str, experiment: str, n: int = 3) -> list[str]:
    """n planned trials of EPOCHS epochs at batch size 32."""
    s = prepare_settings(experiment, "200K", n_trials=3, data=SLOW_DATA, quick=True, pruner="none")
    plan = [dataclasses.replace(e, params={**(e.params or {}), "epochs": EPOCHS, "batch_size": 32}) for e in s.plan[:n]]
    launch(url, dataclasses.replace(s, plan=plan))
    return ["--experiment", experiment, "--budget", "200K", "--storage", url]


def _assert_given_back(url: str, name: str, number: int) -> None:
    trials = _trials(url, name)
    assert not [t for t in trials if t.state in (TrialState.FAIL, TrialState.RUNNING)], "no FAIL, none left RUNNING"
    t = next(t for t in trials if t.number == number)
    assert t.state == TrialState.WAITING and t.user_attrs["attempt"] == 1, "given back without spending an attempt"
    assert "retry_of" not in t.user_attrs and len({x.user_attrs["plan_slot"] for x in trials}) == len(trials)


def _stop_mid_trial(url: str, tmp_path: Path, sig: signal.Signals, experiment: str) -> None:
    common = _launch(url, experiment)
    ck = tmp_path / "ck"
    worker = _popen("worker", *common, "--threads", "1", "--checkpoint-dir", str(ck), cwd=tmp_path)
    try:
        # One epoch done (its checkpoint written) and the trial still training.
        assert wait_for(lambda: any(ck.rglob("*.attempt1.pt")), timeout=240), "no checkpoint was written"
        running = [t for t in _trials(url, f"{experiment}_200K") if t.state == TrialState.RUNNING]
        assert len(running) == 1
        sent = time.monotonic()
        worker.send_signal(sig)
        assert wait_for(lambda: next(t for t in _trials(url, f"{experiment}_200K")
                                     if t.number == running[0].number).state == TrialState.WAITING,
                        timeout=30, every=0.1)
        given_back_s = time.monotonic() - sent
        _, err = worker.communicate(timeout=30)
        exited_s = time.monotonic() - sent
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert given_back_s < 5, f"the trial went back to the queue {given_back_s:.1f}s after {sig.name}"
    assert exited_s < 10, f"the worker exited {exited_s:.1f}s after {sig.name}"
    _assert_given_back(url, f"{experiment}_200K", running[0].number)
    note = next(t for t in _trials(url, f"{experiment}_200K") if t.number == running[0].number).user_attrs
    assert note["state_note"] == f"requeued: {sig.name}"
    # The checkpoint stays for the next claim of the same attempt (the attempt is not over).
    slot = running[0].user_attrs["plan_slot"]
    assert (ck / f"{experiment}_200K" / f"slot{slot:05d}.attempt1.pt").exists()
    q = TrialQueue(url, f"{experiment}_200K")
    claim = q.claim({"host": "test"})
    assert claim is not None and claim.number == running[0].number and claim.attempt == 1


def test_sigterm_gives_the_trial_back_and_exits_143(storage_url: str, tmp_path: Path) -> None:
    _stop_mid_trial(storage_url, tmp_path, signal.SIGTERM, "term")


def test_sigint_gives_the_trial_back_and_exits_130(sqlite_url: str, tmp_path: Path) -> None:
    _stop_mid_trial(sqlite_url, tmp_path, signal.SIGINT, "int")


def test_a_given_back_trial_resumes_from_its_own_checkpoint(sqlite_url: str, tmp_path: Path) -> None:
    """After SIGTERM the next worker takes the same trial (same attempt) and resumes it."""
    url = sqlite_url
    ck = tmp_path / "ck"
    common = [*_launch(url, "resume", n=1), "--threads", "1", "--checkpoint-dir", str(ck)]
    worker = _popen("worker", *common, cwd=tmp_path)
    assert wait_for(lambda: any(ck.rglob("*.attempt1.pt")), timeout=240)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == 143, err[-2000:]
    res = run_cli(*["worker", *common], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    (trial,) = _trials(url, "resume_200K")
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["attempt"] == 1
    assert trial.user_attrs["resumed_from_epoch"] >= 1
    assert sorted(trial.intermediate_values) == [1, 2, 3, 4]
    assert not list(ck.rglob("*.pt")), "the checkpoint is deleted once the finish is committed"


@pytest.mark.ray
def test_ray_cancel_gives_the_trial_back(sqlite_url: str, tmp_path: Path) -> None:
    import ray

    from archhpo.cluster._ray_private import loopback_only
    from archhpo.cluster._run import worker_task

    url = sqlite_url
    _launch(url, "cancel")
    with loopback_only():
        ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="WARNING",
                 _node_ip_address="127.0.0.1")
    try:
        ref = ray.remote(worker_task).options(num_cpus=1, max_retries=0).remote(
            url, ["cancel_200K"], "cpu", 1, "run-test", str(tmp_path / "ck"))
        assert wait_for(lambda: any((tmp_path / "ck").rglob("*.attempt1.pt")), timeout=240)
        running = [t for t in _trials(url, "cancel_200K") if t.state == TrialState.RUNNING]
        assert len(running) == 1
        sent = time.monotonic()
        ray.cancel(ref)
        assert wait_for(lambda: next(t for t in _trials(url, "cancel_200K")
                                     if t.number == running[0].number).state == TrialState.WAITING,
                        timeout=30, every=0.1)
        given_back_s = time.monotonic() - sent
        try:
            summary = ray.get(ref, timeout=60)
        except ray.exceptions.TaskCancelledError:
            summary = None
        assert summary is None or summary["requeued"] == 1
    finally:
        ray.shutdown()
    assert given_back_s < 5
    _assert_given_back(url, "cancel_200K", running[0].number)


def test_the_trainer_stops_between_two_steps_when_asked() -> None:
    from archhpo.errors import TrialStopped
    from archhpo.models import get_family
    from archhpo.workers import TrainConfig, train

    fam = get_family("patchtst")
    spec = fam.parse_data("synthetic:steps=700", {"quick": True})
    data = fam.load_data(spec, {"quick": True})
    model = fam.build(fam.config_for({"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}, fam.data_info(spec, {})))
    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 3

    with pytest.raises(TrialStopped):
        train(model, data, fam.loss, TrainConfig(epochs=2, batch_size=32, warmup_steps=0), should_stop=should_stop)
    assert len(asked) == 4, "asked before every step; stopped before the 4th"


def test_run_stops_on_sigterm_as_on_ctrl_c_and_restores_the_handlers() -> None:
    """`archhpo run` under a scheduler (or nohup'd, where the shell left SIGINT ignored) is stopped
    with SIGTERM: the driver must see it as Ctrl-C, which gives every running trial back."""
    from archhpo.cli._main import _stop_like_ctrl_c

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with pytest.raises(KeyboardInterrupt), _stop_like_ctrl_c():
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler interrupts this
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "the caller's handlers are put back"
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


def test_a_second_ctrl_c_while_the_driver_waits_still_requeues_its_trials(
    storage_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run`'s Ctrl-C cancels the worker tasks and waits for their stop-time saves; a second Ctrl-C
    (or a scheduler's repeated SIGTERM) during that wait ends the wait, not the requeue: the run's
    own RUNNING trials go back to the queue, another run's stay claimed."""
    import io

    import ray

    from archhpo.cluster._run import RunOptions, _Pool
    from archhpo.search import open_storage

    _launch(storage_url, "stop")
    pool = _Pool(storage_url, ["stop_200K"], RunOptions(stop_wait_s=90.0),
                 io.StringIO(), open_storage(storage_url, create=False))
    queue = pool.queues["stop_200K"]
    ours = queue.claim({"host": "test", "run_id": pool.run_id})
    theirs = queue.claim({"host": "test", "run_id": "another-run"})
    assert ours is not None and theirs is not None
    waits: list[float] = []

    def interrupted_wait(refs: list[object], num_returns: int, timeout: float) -> None:
        waits.append(timeout)
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "cancel", lambda ref: None)
    monkeypatch.setattr(ray, "wait", interrupted_wait)
    pool.refs = [object()]
    pool.stop()
    states = {t.number: t.state for t in _trials(storage_url, "stop_200K")}
    assert waits == [90.0], "the driver waits stop_wait_s for the saves"
    assert states[ours.number] == TrialState.WAITING, "requeued despite the second Ctrl-C"
    assert states[theirs.number] == TrialState.RUNNING, "another run's trial is not ours to requeue"
    assert ("the workers saved and gave back 0 trial(s) and the driver requeued 1 more"
            in pool.out.getvalue())  # type: ignore[attr-defined]


def test_the_stop_message_counts_the_trials_the_workers_gave_back(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers that returned in time report what they gave back (WorkerSummary.requeued); a task
    that died reports nothing, and the driver's own requeue is counted apart."""
    import io

    import ray

    from archhpo.cluster._run import RunOptions, _Pool
    from archhpo.search import open_storage

    _launch(sqlite_url, "given")
    pool = _Pool(sqlite_url, ["given_200K"], RunOptions(stop_wait_s=5.0), io.StringIO(),
                 open_storage(sqlite_url, create=False))
    returned = {"a": {"requeued": 2}, "b": {"requeued": 1}, "dead": RuntimeError("the task died")}

    def get(ref: str, timeout: float) -> object:
        if isinstance(returned[ref], Exception):
            raise returned[ref]  # type: ignore[misc]
        return returned[ref]

    monkeypatch.setattr(ray, "cancel", lambda ref: None)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout: (list(refs), []))
    monkeypatch.setattr(ray, "get", get)
    pool.refs = ["a", "b", "dead"]
    pool.stop()
    assert ("Stopped: the workers saved and gave back 3 trial(s) and the driver requeued 0 more. Run the same "
            "command to resume.") in pool.out.getvalue()  # type: ignore[attr-defined]
