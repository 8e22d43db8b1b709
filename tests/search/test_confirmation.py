"""A sequential confirmation (search/_confirmation.py) on every backend: the first wave alone is
enqueued, a later rank is decided once the first wave is final (confirmed within the pooled seed
noise, its slot final without a trial beyond it), once however many upkeeps race, and a decision
stored before a kill is enqueued by the next upkeep; a study without the option confirms at once."""

from __future__ import annotations

import html
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState
from scipy import stats

from archhpo.report import confirmation_summary
from archhpo.report._confirm import decision_statement, frame_confirmation
from archhpo.report._database import frame_from_storage
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._confirmation import decide, listed, mark_waves, trained, waiting
from archhpo.search._upkeep import PHASE3_KEY
from tests.conftest import TINY_DATA, race_upkeeps

WORKER = {"host": "test", "device": "cpu"}


# ------------------------------------------------------------------------------- the rule
def _expected(runs: dict[int, list[float]], leader: int, cand: list[float]) -> tuple[float, float, float]:
    """lead, pooled std and half-width, computed here from their definitions."""
    groups = [v for v in [*runs.values(), cand] if len(v) > 1]
    df = sum(len(v) - 1 for v in groups)
    sd = math.sqrt(sum(sum((x - statistics.fmean(v)) ** 2 for x in v) for v in groups) / df)
    se = sd * math.sqrt(1 / len(runs[leader]) + 1 / len(cand))
    return statistics.fmean(cand) - statistics.fmean(runs[leader]), sd, float(stats.t.ppf(0.975, df)) * se


def test_a_later_rank_behind_the_leader_beyond_the_pooled_noise_is_skipped() -> None:
    runs = {0: [1.00, 1.02], 1: [1.01, 1.03]}
    d = decide(runs, 2, [1.20])
    lead, sd, half = _expected(runs, 0, [1.20])
    assert (d["leader"], d["df"], d["confirm"]) == (0, 2, False)
    assert d["lead"] == pytest.approx(lead, abs=1e-12) and d["pooled_std"] == pytest.approx(sd, abs=1e-12)
    assert d["ci95"] == pytest.approx([lead - half, lead + half], abs=1e-12) and lead - half > 0


@pytest.mark.parametrize("candidate", [[1.05], [0.80], [1.02, 1.04]])
def test_a_later_rank_within_the_noise_or_ahead_is_confirmed(candidate: list[float]) -> None:
    runs = {0: [1.00, 1.02], 1: [1.01, 1.03]}
    d = decide(runs, 2, candidate)
    lead, _, half = _expected(runs, 0, candidate)
    assert d["confirm"] and d["lead"] == pytest.approx(lead, abs=1e-12) and lead - half <= 0


def test_the_leader_is_the_lowest_mean_and_no_noise_confirms() -> None:
    assert decide({0: [1.00, 1.10], 1: [1.01, 1.03]}, 2, [1.30])["leader"] == 1
    blind = decide({0: [1.00], 1: [1.01]}, 2, [9.0])
    assert blind["confirm"] and blind["lead"] is None, "one run each: no degree of freedom, nothing says it is behind"
    assert decide({}, 2, [1.0])["confirm"] and decide({0: [1.0, 1.1]}, 2, [])["confirm"]


def test_the_waves_of_a_stored_assignment() -> None:
    ranks = mark_waves([{"rank": k} for k in range(4)] + [{"rank": 4, "baseline": "kaplan"}])
    assert waiting(ranks) == [2, 3] and trained(ranks) == {0, 1, 4} and listed(ranks) == {0, 1, 2, 3, 4}
    ranks[2]["decision"], ranks[3]["decision"] = {"confirm": True}, {"confirm": False}
    assert waiting(ranks) == [] and trained(ranks) == {0, 1, 2, 4} and listed(ranks) == {0, 1, 2, 4}
    assert trained([{"rank": 0}, {"rank": 2}]) == {0, 2}, "an assignment without waves: every rank"


# ------------------------------------------------------------------------------- the queue
def _launch(url: str, sequential: bool = True) -> TrialQueue:
    s = prepare_settings("exp", "500K", family="patchtst", n_trials=12, data=TINY_DATA, quick=True, seed=0,
                         confirm=3, confirm_seeds=1, sequential_confirm=sequential)
    launch(url, s)
    return TrialQueue(url, s.study_name)


def _run(q: TrialQueue, value: Callable[[Any], float], until_phase3: bool = False) -> list[int]:
    """Claim and finish every claimable trial with value(claim); the phases run, in order.
    until_phase3: stop at the first confirmation claim, handed back unfinished."""
    phases = []
    while (c := q.claim(WORKER)) is not None:
        phases.append(c.phase)
        if until_phase3 and c.phase == 3:
            q.requeue(c)
            break
        v = value(c)
        q.finish(c, TrialState.COMPLETE, v, {"duration_s": 0.1, "train_loss": v})
    return phases


def _valuer(q: TrialQueue, conf: dict[int, float]) -> Callable[[Any], float]:
    """Every run of an architecture alike in phases 1-2 (its rank is fixed by its index); a
    confirmation of rank r its architecture's value + conf[r]."""
    def value(c: Any) -> float:
        v = 1.0 + 0.001 * int(c.params["arch_idx"])
        return v + conf[q.storage.get_trial(c.trial_id).user_attrs["rank"]] if c.phase == 3 else v
    return value


def _first_wave(url: str, conf: dict[int, float], sequential: bool = True) -> TrialQueue:
    """A study run until nothing is left to claim (its first wave's end, when sequential)."""
    q = _launch(url, sequential)
    value = _valuer(q, conf)
    while _run(q, value):
        q.maintain()
    return q


def _phase3(q: TrialQueue) -> list[Any]:
    return sorted((t for t in q.storage.get_all_trials(q.study_id) if t.user_attrs["phase"] == 3),
                  key=lambda t: t.number)


def test_a_rank_behind_beyond_the_noise_is_never_trained_and_the_report_says_why(storage_url: str) -> None:
    q = _first_wave(storage_url, {0: 2e-4, 1: -2e-4})
    ranks = q.upkeep.study_attr(PHASE3_KEY)
    assert [int(r["rank"]) for r in ranks] == [0, 1, 2] and [r.get("wave") for r in ranks] == [None, None, 2]
    assert [t.user_attrs["rank"] for t in _phase3(q)] == [0, 1], "the first wave alone was trained"
    decision = ranks[2]["decision"]
    assert decision["confirm"] is False and decision["leader"] == 0 and decision["ci95"][0] > 0
    status = q.maintain()
    assert status.done and status.skipped == 1 and not status.details.get("phase3")
    summary = confirmation_summary(q.storage.get_all_trials(q.study_id), q.settings.archs, ranks)
    assert summary["n_architectures"] == 2 and summary["decisions"][0]["rank"] == 2
    assert "Rank 2 was not retrained: its search runs' mean" in summary["statement"]
    assert "beyond the first wave's pooled seed std" in summary["statement"]
    frame = frame_from_storage(storage_url, "exp", curves=False)  # the report's path: the study's stored ranks
    assert summary["statement"] in frame_confirmation(frame)[q.settings.budget]["statement"]


def test_a_rank_within_the_noise_is_decided_and_enqueued_once_however_many_upkeeps_race(storage_url: str) -> None:
    q = _launch(storage_url)
    value = _valuer(q, {0: 0.5, 1: -0.5, 2: 0.0})
    while 3 not in _run(q, value, until_phase3=True):
        q.maintain()
    status = q.maintain()
    assert "wait for ranks 0-1's confirmation" in status.details["phase3"] and not status.done
    rank2 = {e.slot for e in q.settings.plan if e.phase == 3 and e.rank == 2}
    assert rank2 and q.upkeep.undecided() == rank2, "the ETA prices rank 2 as a range until it is decided"
    _run(q, value)  # the first wave ends; six upkeeps race to decide rank 2
    race_upkeeps(storage_url, q.name)
    assert sorted(t.user_attrs["rank"] for t in _phase3(q)) == [0, 1, 2], "rank 2 enqueued exactly once"
    decision = q.upkeep.study_attr(PHASE3_KEY)[2]["decision"]
    assert decision["confirm"] and decision["leader"] == 1
    assert q.upkeep.undecided() == set(), "decided: one figure again"
    _run(q, value)
    assert q.maintain().done and q.maintain().skipped == 0


def test_a_decision_stored_before_a_kill_is_enqueued_by_the_next_upkeep(storage_url: str) -> None:
    from archhpo.search._confirmation import decide_waiting

    q = _launch(storage_url)
    value = _valuer(q, {0: 0.5, 1: -0.5, 2: 0.0})
    while 3 not in _run(q, value, until_phase3=True):
        q.maintain()
    _run(q, value)  # the first wave is final; no upkeep has decided yet
    ranks = q.upkeep.study_attr(PHASE3_KEY)
    done = q.storage.get_all_trials(q.study_id, states=(TrialState.COMPLETE,))
    q.upkeep.study.set_user_attr(PHASE3_KEY, decide_waiting(ranks, done))  # stored, then killed: nothing enqueued
    assert [t.user_attrs["rank"] for t in _phase3(q)] == [0, 1]
    q.maintain()
    assert [t.user_attrs["rank"] for t in _phase3(q)] == [0, 1, 2]
    stored = q.upkeep.study_attr(PHASE3_KEY)
    assert stored == decide_waiting(ranks, done), "the stored decision is kept, not made again"


def test_without_the_option_every_finalist_is_confirmed_at_once(storage_url: str) -> None:
    q = _launch(storage_url, sequential=False)
    value = _valuer(q, {0: 2e-4, 1: -2e-4, 2: 0.0})
    while 3 not in _run(q, value, until_phase3=True):
        q.maintain()
    ranks = q.upkeep.study_attr(PHASE3_KEY)
    assert all("wave" not in r for r in ranks) and "confirm_sequential" not in q.settings.options.as_dict()
    assert sorted(t.user_attrs["rank"] for t in _phase3(q)) == [0, 1, 2], "all three enqueued together"


def test_two_waves_end_to_end_with_a_real_worker(tmp_path: Path) -> None:
    """launch --confirm 3 --seeds 1 --sequential-confirm → one real worker trains the plan to its end
    (waiting for no one: it decides the third rank itself) → the stored decision is `decide` on the
    trained runs, the third is trained exactly when it says so, and the export and report say it."""
    import torch

    from archhpo.cli import main
    from archhpo.search._confirmation import decide_waiting
    from archhpo.workers import Worker

    torch.set_num_threads(1)
    url, out = f"sqlite:///{tmp_path / 's.db'}", tmp_path / "res"
    assert main(["launch", "--experiment", "s", "--budget", "200K", "--trials", "4", "--quick", "--epochs", "2",
                 "--data", TINY_DATA, "--pruner", "none", "--confirm", "3", "--seeds", "1", "--sequential-confirm",
                 "--storage", url]) == 0
    q = TrialQueue(url, "s_200K")
    assert q.settings.options.confirm_sequential
    summary = Worker([q], device="cpu", threads=1).run()
    ranks = q.upkeep.study_attr(PHASE3_KEY)
    decision = ranks[2]["decision"]
    assert summary.failed == 0 and summary.complete == 4 + 2 + int(decision["confirm"])
    assert q.maintain().done
    done = q.storage.get_all_trials(q.study_id, states=(TrialState.COMPLETE,))
    undecided = [{k: v for k, v in r.items() if k != "decision"} for r in ranks]
    assert decide_waiting(undecided, [t for t in done if t.user_attrs.get("rank") != 2]) == ranks
    assert sorted(t.user_attrs["rank"] for t in _phase3(q)) == [0, 1, 2][:2 + int(decision["confirm"])]
    assert main(["export", "--experiment", "s", "--storage", url, "--out", str(out)]) == 0
    best = json.loads((out / "s_200K_best.json").read_text())["confirmation"]
    assert best["decisions"] == json.loads(json.dumps([ranks[2]]))
    assert decision_statement(ranks[2]) in best["statement"]
    assert main(["report", "--experiment", "s", "--storage", url, "--out", str(out)]) == 0
    assert html.escape(decision_statement(ranks[2])) in (out / "s_report.html").read_text()


def test_a_study_launched_before_the_two_waves_resumes_with_the_same_command(storage_url: str) -> None:
    """A --ladder study stored without `confirm_sequential` (launched before it existed) relaunches
    under today's default and keeps confirming at once; a study stored with it is not relaunched
    without it."""
    from archhpo.errors import StudyError

    old = _launch(storage_url, sequential=False)
    _launch(storage_url, sequential=True)  # today's default on the old command: no refusal
    assert "confirm_sequential" not in TrialQueue(storage_url, old.name).settings.options.as_dict()
    s = prepare_settings("new", "500K", family="patchtst", n_trials=12, data=TINY_DATA, quick=True, seed=0,
                         confirm=3, confirm_seeds=1, sequential_confirm=True)
    launch(storage_url, s)
    off = prepare_settings("new", "500K", family="patchtst", n_trials=12, data=TINY_DATA, quick=True, seed=0,
                           confirm=3, confirm_seeds=1)
    with pytest.raises(StudyError, match=r"options.confirm_sequential: stored True, now None"):
        launch(storage_url, off)
