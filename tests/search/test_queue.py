"""Study launch and the trial queue on every backend: no duplicated plan, exactly-once claims,
phase 2 created once under a race, requeue on interrupt, lost trials reaped and retried once."""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from archhpo.errors import StudyError
from archhpo.search import TrialQueue, launch, open_storage, prepare_settings
from tests.conftest import TINY_DATA, race_upkeeps

WORKER = {"host": "test", "device": "cpu"}


def _settings(**kw):  # type: ignore[no-untyped-def]
    args = {"family": "patchtst", "n_trials": 12, "data": TINY_DATA, "quick": True, "seed": 0}
    return prepare_settings("exp", "500K", **{**args, **kw})


def _launch(url: str, **kw) -> TrialQueue:  # type: ignore[no-untyped-def]
    s = _settings(**kw)
    launch(url, s)
    return TrialQueue(url, s.study_name)


def _trials(q: TrialQueue) -> list[optuna.trial.FrozenTrial]:
    return q.storage.get_all_trials(q.study_id)


def test_launch_stores_everything_a_remote_worker_needs(storage_url: str) -> None:
    q = _launch(storage_url)
    attrs = optuna.load_study(study_name="exp_500K", storage=storage_url).user_attrs
    for key in ("family", "budget", "tolerance", "data", "options", "archs", "plan", "info", "space"):
        assert f"archhpo_{key}" in attrs
    assert attrs["archhpo_options"]["horizon"] == 1 and attrs["archhpo_options"]["threshold"] == 0.01
    phase1 = [e for e in q.settings.plan if e.phase == 1]
    trials = _trials(q)
    assert len(trials) == len(phase1) and all(t.state == TrialState.WAITING for t in trials)


def test_launching_twice_never_duplicates_the_plan(storage_url: str) -> None:
    q = _launch(storage_url)
    n = len(_trials(q))
    res = launch(storage_url, _settings())
    assert not res.created and res.enqueued == 0 and len(_trials(q)) == n


def test_relaunch_with_other_settings_is_refused(storage_url: str) -> None:
    _launch(storage_url)
    with pytest.raises(StudyError, match="different settings.*n_trials"):
        launch(storage_url, _settings(n_trials=20))


def test_claims_set_params_and_architecture_attrs(storage_url: str) -> None:
    q = _launch(storage_url)
    claim = q.claim(WORKER)
    t = q.storage.get_trial(claim.trial_id)
    assert t.state == TrialState.RUNNING
    assert set(claim.params) == {"arch_idx", "learning_rate", "epochs", "batch_size", "weight_decay", "warmup_steps"}
    arch = q.settings.archs[claim.params["arch_idx"]]
    # Optuna's params: the design's, and the architecture's dimensions for the dashboard's plots
    assert t.params == {**claim.params, **{k: arch[k] for k in ("d_model", "n_layers", "n_heads", "d_ff")}}
    for key in ("d_model", "n_layers", "n_heads", "d_ff", "param_count"):
        assert t.user_attrs[key] == arch[key]
    assert t.user_attrs["host"] == "test" and t.user_attrs["plan_slot"] == claim.slot


def _claim_all(url: str, name: str, out: list[int], lock: threading.Lock) -> None:
    q = TrialQueue(url, name)
    while (c := q.claim(WORKER)) is not None:
        with lock:
            out.append(c.number)
        q.finish(c, TrialState.COMPLETE, 0.5, {"duration_s": 0.0})


def test_concurrent_workers_claim_each_trial_exactly_once(storage_url: str) -> None:
    q = _launch(storage_url, n_trials=30)
    n = len(_trials(q))
    got: list[int] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=_claim_all, args=(storage_url, q.name, got, lock)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(n)), "every waiting trial ran once, none twice"
    assert all(t.state == TrialState.COMPLETE for t in _trials(q))


def _finish_phase1(q: TrialQueue) -> None:
    value = 1.0
    while (c := q.claim(WORKER)) is not None:
        value -= 0.01
        q.finish(c, TrialState.COMPLETE, value, {"duration_s": 0.1, "train_loss": value})


def test_phase2_is_created_once_when_workers_race(storage_url: str) -> None:
    q = _launch(storage_url, n_trials=12)
    _finish_phase1(q)
    race_upkeeps(storage_url, q.name)
    slots = [t.user_attrs["plan_slot"] for t in _trials(q)]
    assert sorted(slots) == list(range(len(q.settings.plan))), "each planned slot exists exactly once"
    best = min((t for t in _trials(q) if t.user_attrs["phase"] == 1), key=lambda t: t.value)
    for t in _trials(q):
        if t.user_attrs["phase"] == 2:
            assert t.system_attrs["fixed_params"]["learning_rate"] == best.params["learning_rate"]
            assert t.system_attrs["fixed_params"]["epochs"] == best.params["epochs"]


def test_plan_completes_with_exactly_the_planned_trials(storage_url: str) -> None:
    q = _launch(storage_url, n_trials=12)
    _finish_phase1(q)
    q.maintain()
    _finish_phase1(q)  # now phase 2
    status = q.maintain()
    assert status.done and status.complete == len(q.settings.plan) == 12
    assert len(_trials(q)) == 12 and len({t.number for t in _trials(q)}) == 12


def test_requeue_returns_an_interrupted_trial_with_its_params(storage_url: str) -> None:
    q = _launch(storage_url)
    c = q.claim(WORKER)
    assert q.requeue(c, "test")
    t = q.storage.get_trial(c.trial_id)
    assert t.state == TrialState.WAITING
    again = q.claim(WORKER)
    assert again.number == c.number and again.params == c.params


def _age_heartbeat(url: str, trial_id: int) -> None:
    storage = open_storage(url)
    with storage.engine.begin() as conn:
        conn.execute(sa.text("UPDATE trial_heartbeats SET heartbeat = :t WHERE trial_id = :i"),
                     {"t": "2000-01-01 00:00:00", "i": trial_id})


def test_a_lost_worker_trial_is_reaped_and_retried_once(storage_url: str) -> None:
    q = _launch(storage_url)
    c = q.claim(WORKER)
    _age_heartbeat(storage_url, c.trial_id)  # as if its worker was SIGKILLed long ago
    q.maintain()
    lost = q.storage.get_trial(c.trial_id)
    assert lost.state == TrialState.FAIL
    retries = [t for t in _trials(q) if t.user_attrs.get("retry_of") == c.number]
    assert len(retries) == 1 and retries[0].state == TrialState.WAITING
    assert retries[0].system_attrs["fixed_params"] == c.params and retries[0].user_attrs["attempt"] == 2
    assert not q.finish(c, TrialState.COMPLETE, 0.1, {}), "a reaped trial cannot be completed late"
    # The retry is lost too: no third attempt, the slot is final as failed.
    while (r := q.claim(WORKER)) is not None and r.number != retries[0].number:
        q.finish(r, TrialState.COMPLETE, 0.3, {})
    _age_heartbeat(storage_url, r.trial_id)
    q.maintain()
    assert not [t for t in _trials(q) if t.user_attrs.get("retry_of") == r.number]


def test_deliberate_failures_are_final_not_retried(storage_url: str) -> None:
    q = _launch(storage_url)
    c = q.claim(WORKER)
    q.finish(c, TrialState.FAIL, None, {"fail_reason": "training loss became non-finite"})
    q.maintain()
    assert not [t for t in _trials(q) if t.user_attrs.get("retry_of") == c.number]
    assert q.status().failed == 1


def test_sqlite_lock_file_sits_beside_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    q = _launch(url)
    q.maintain()
    assert (tmp_path / "x.db.lock").exists()


def test_median_rule_prunes_only_trials_worse_than_completed_ones(storage_url: str) -> None:
    q = _launch(storage_url, n_trials=12)  # quick: warm-up of 1 epoch, 5 startup trials
    for i in range(5):
        c = q.claim(WORKER)
        assert not q.report(c, 1, 0.5 + 0.1 * i), "no pruning before 5 trials have completed"
        q.finish(c, TrialState.COMPLETE, 0.5 + 0.1 * i, {})
    worse, better = q.claim(WORKER), q.claim(WORKER)
    assert q.report(worse, 1, 0.75), "worse than the median (0.7) at the same epoch"
    assert not q.report(better, 1, 0.65)
    assert not q.report(better, 2, 0.9), "the best loss so far counts, and no trial has epoch 2 yet"


def test_pruner_none_never_prunes(storage_url: str) -> None:
    q = _launch(storage_url, n_trials=12, pruner="none")
    for _ in range(5):
        c = q.claim(WORKER)
        q.report(c, 1, 0.1)
        q.finish(c, TrialState.COMPLETE, 0.1, {})
    assert not q.report(q.claim(WORKER), 1, 1e9)


def test_status_waits_for_the_cache_lock_that_upkeep_holds(storage_url: str) -> None:
    """The worker's heartbeat thread runs maintain() beside the main thread: both read and
    change the queue's trial cache, so status() takes the same lock as the upkeep."""
    q = _launch(storage_url)
    expected = q.status().total
    got: list[int] = []
    with q.upkeep._cache_lock:  # as an upkeep on another thread would hold it
        reader = threading.Thread(target=lambda: got.append(q.status().total))
        reader.start()
        reader.join(timeout=1.0)
        assert reader.is_alive() and got == []  # waiting for the lock, not reading a changing cache
    reader.join(timeout=60)
    assert got == [expected]


def test_the_eta_counts_down_with_the_running_trials(storage_url: str) -> None:
    """`run`'s ETA: trials not yet final at the mean duration, less what the running ones have done
    (each up to the mean), over the workers. It used to stand still between two finishes (for an
    hour in a study of hour-long trials)."""
    import datetime as dt

    from archhpo.cluster._run import eta_s
    from archhpo.search import PlanStatus

    q = _launch(storage_url)
    before = dt.datetime.now()
    c = q.claim(WORKER)
    (started,) = q.status().running_since
    assert before - dt.timedelta(seconds=1) <= started <= dt.datetime.now(), "the claim's start time"
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    st = PlanStatus(total=10, final=4, mean_duration_s=100.0,
                    running_since=[now - dt.timedelta(seconds=30), now - dt.timedelta(seconds=500)])
    assert eta_s({"a": st}, workers=2, now=now) == (6 * 100 - 30 - 100) / 2, "a late trial counts as one mean"
    assert eta_s({"a": st}, workers=2, now=now + dt.timedelta(seconds=40)) == (600 - 70 - 100) / 2
    assert eta_s({"a": PlanStatus(total=3, final=0)}, workers=2) is None, "nothing finished: no estimate"
    assert eta_s({"a": PlanStatus(total=3, final=3)}, workers=2) == 0.0
    assert q.requeue(c, "test") and q.status().running_since == []


def test_a_connection_dropped_while_a_worker_opens_its_queue_costs_a_retry(storage_url: str) -> None:
    """A connection lost between loading the study and reading its settings (the CI flake of
    test_outages: pg_terminate_backend landing there) is retried, not fatal to the worker."""
    s = _settings()
    launch(storage_url, s)
    storage = open_storage(storage_url, create=False)
    calls = []
    real = storage.get_study_user_attrs

    def flaky(study_id: int):  # type: ignore[no-untyped-def]
        calls.append(study_id)
        if len(calls) == 1:  # Optuna wraps every SQLAlchemy error of its storage like this
            try:
                raise sa.exc.OperationalError("SELECT", {}, Exception("server closed the connection"))
            except sa.exc.OperationalError as exc:
                raise optuna.exceptions.StorageInternalError("lost") from exc
        return real(study_id)

    storage.get_study_user_attrs = flaky  # type: ignore[method-assign]
    q = TrialQueue(storage_url, s.study_name, storage=storage)
    assert len(calls) == 2 and q.settings.study_name == s.study_name
