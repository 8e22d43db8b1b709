"""`run`'s progress: a rich bar on a terminal, plain lines every 10-30 s off one, an ETA from the
FLOPs left over the measured throughput, and Ray's copies of worker lines without colour codes."""

from __future__ import annotations

import datetime as dt
import io
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from archhpo.cluster._flops import SlotWork, Work, eta_range, flops_eta, study_work
from archhpo.cluster._progress import RunProgress, plain_ray_logs, progress_line
from archhpo.config import StoredOptions
from archhpo.search._queue import PlanStatus
from archhpo.search._trust import RungTrust
from tests.conftest import TINY_DATA, run_cli

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)
GFLOP = 1e9


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def at(self) -> dt.datetime:
        return T0 + dt.timedelta(seconds=self.t)


def _statuses(final: int = 3, running: int = 2, held: int = 1, failed: int = 1) -> dict[str, PlanStatus]:
    return {
        "demo_75K": PlanStatus(total=6, final=final, running=running, held=held, failed=failed, best_value=2.3227),
        "demo_100K": PlanStatus(total=6, final=1, running=0, best_value=None),
    }


def _work(measured: bool) -> Work:
    slots = [SlotWork(10 * GFLOP, done=True), SlotWork(100 * GFLOP, running_since=T0), SlotWork(10 * GFLOP)]
    return Work(slots, flops=10 * GFLOP if measured else 0.0, seconds=10.0 if measured else 0.0)


def test_the_bar_on_a_terminal_shows_counts_best_and_eta() -> None:
    from rich.console import Console

    clock, measured = FakeClock(), [False]
    console = Console(file=io.StringIO(), force_terminal=True, width=150, record=True, color_system=None)
    shown = RunProgress(io.StringIO(), {}, 2, read_work=lambda: _work(measured[0]), clock=clock, now=clock.at,
                        console=console)
    shown.update(_statuses())
    first = console.export_text()
    assert "--:--" in first, "no finished trial measured the throughput yet"
    clock.t, measured[0] = 20.0, True
    statuses = _statuses(final=4)
    shown.update(statuses)
    shown.close(statuses)
    text = console.export_text()
    last = {line.split()[0]: line for line in text.splitlines() if line.strip()}  # each row's last frame
    print(last["demo_75K"])
    assert "4/6" in last["demo_75K"] and "2 running, 1 held at a rung, 1 failed" in last["demo_75K"]
    assert "best 2.3227" in last["demo_75K"] and "best -" in last["demo_100K"] and "1/6" in last["demo_100K"]
    assert "5/12" in last["all"] and "elapsed 0:00:20" in last["all"]
    # 1 GFLOP/s measured: the running 100-GFLOP slot has 80 left after 20 s, the waiting one 10.
    assert "ETA 0:01:20" in last["all"], last["all"]
    assert "━" in last["demo_75K"], "a drawn bar, not a line of text"


def test_eta_is_unknown_before_a_measurement_and_keeps_its_finish_time_when_a_long_trial_finishes() -> None:
    """One worker: a short trial (10 s), then a long one (100 s), then two short ones, all at 1 GFLOP/s.
    The finish time (now + ETA) stays at 130 s from the first measurement on, the long trial's end included."""
    costs = [10 * GFLOP, 100 * GFLOP, 10 * GFLOP, 10 * GFLOP]
    ends = [10.0, 110.0, 120.0, 130.0]

    def work_at(t: float) -> Work:
        work, start = Work(), 0.0
        for cost, end in zip(costs, ends, strict=True):
            done = end <= t
            running = start <= t < end
            work.slots.append(SlotWork(cost, done=done, running_since=T0 + dt.timedelta(seconds=start) if running else None))
            if done:
                work.flops, work.seconds = work.flops + cost, work.seconds + (end - start)
            start = end
        return work

    assert flops_eta(work_at(5.0), 1, T0 + dt.timedelta(seconds=5)) is None, "nothing measured: --:--"
    finish = []
    for t in (10.0, 40.0, 109.0, 110.0, 115.0, 125.0):
        eta = flops_eta(work_at(t), 1, T0 + dt.timedelta(seconds=t))
        assert eta is not None
        finish.append(t + eta)
    assert finish == pytest.approx([130.0] * len(finish))
    assert flops_eta(work_at(130.0), 1, T0 + dt.timedelta(seconds=130)) == 0.0


def test_eta_takes_the_longest_slot_left_when_workers_outnumber_the_work() -> None:
    work = Work([SlotWork(100 * GFLOP), SlotWork(10 * GFLOP)], flops=GFLOP, seconds=1.0)
    assert flops_eta(work, 8, T0) == pytest.approx(100.0), "8 workers cannot split one trial"
    assert flops_eta(work, 1, T0) == pytest.approx(110.0)


def test_a_confirmation_rank_waiting_for_its_decision_makes_the_eta_a_range() -> None:
    """A second-wave rank may be skipped: the ETA is the time left without it and with it (1 GFLOP/s,
    one worker: the running 30-GFLOP trial, then maybe the undecided 60-GFLOP one), one figure again
    once no slot is undecided, and unknown while nothing is measured."""
    work = Work([SlotWork(30 * GFLOP), SlotWork(60 * GFLOP, undecided=True)], flops=GFLOP, seconds=1.0)
    assert eta_range(work, 1, T0) == pytest.approx((30.0, 90.0))
    assert eta_range(work, 2, T0) == pytest.approx((30.0, 60.0)), "two workers: the longer slot decides"
    assert "ETA 0:00:30-0:01:30 |" in progress_line(_statuses(), 1, 5.0, eta_range(work, 1, T0)) + " |"
    work.slots[1].undecided = False
    assert eta_range(work, 1, T0) == pytest.approx(90.0)
    assert eta_range(Work([SlotWork(30 * GFLOP), SlotWork(60 * GFLOP, undecided=True)]), 1, T0) is None


def _trial(number: int, state: str, slot: int, params: dict[str, Any], **attrs: Any) -> Any:
    return SimpleNamespace(number=number, state=SimpleNamespace(name=state), params=params, system_attrs={},
                           user_attrs={"plan_slot": slot, **attrs}, datetime_start=T0)


def test_a_study_slots_cost_their_shape_flops_times_the_calibrated_samples() -> None:
    """The finished trial trained 100 samples an epoch; a waiting slot of a shape with 20 FLOPs per
    sample and 2 epochs costs 20 x 100 x 2; a phase-2 slot with no trial yet takes the study's mean epochs."""
    settings = SimpleNamespace(
        archs=[{"flops_per_sample": 10}, {"flops_per_sample": 20}], phase2_params=None, options={},
        plan=[{"slot": 0, "arch_idx": 0, "params": {"epochs": 3}}, {"slot": 1, "arch_idx": 1, "params": {"epochs": 2}},
              {"slot": 2, "arch_idx": 1, "params": None}],
    )
    trials = [
        _trial(0, "COMPLETE", 0, {"arch_idx": 0, "epochs": 3}, flops_full=3000, flops_per_sample=10,
               flops_spent=3000, duration_s=30.0),
        _trial(1, "RUNNING", 1, {"arch_idx": 1, "epochs": 2}),
    ]
    work = Work()
    study_work(settings, trials, work)
    assert [s.done for s in work.slots] == [True, False, False]
    assert work.slots[1].cost == 20 * 100 * 2 and work.slots[1].running_since == T0
    assert work.slots[2].cost == pytest.approx(20 * 100 * 2.5)
    assert work.rate == pytest.approx(100.0)
    # a slot no trial will ever come to (a ladder slot beyond its region) is done, not work left
    skipped = Work()
    study_work(settings, trials, skipped, never={2})
    assert [s.done for s in skipped.slots] == [True, False, True]
    assert sum(s.cost or 0 for s in skipped.slots if not s.done) == 20 * 100 * 2
    # a slot a trial may come to (an undecided confirmation rank) is work left, marked as such
    maybe = Work()
    study_work(settings, trials, maybe, undecided={2})
    assert [s.undecided for s in maybe.slots] == [False, False, True] and not maybe.slots[2].done


def test_a_running_trial_is_as_far_as_its_claim_started_not_as_its_earlier_claims_trained() -> None:
    """A trial requeued after 3000 FLOPs of training is claimed again: resumed from a checkpoint
    holding 1000 (the rest was lost with the stop) or started over (0, on a machine without it). The
    ETA counts from there; before the worker has said (flops_from None), from what was spent."""
    settings = SimpleNamespace(archs=[{"flops_per_sample": 10}], phase2_params=None, options={},
                               plan=[{"slot": 0, "arch_idx": 0, "params": {"epochs": 4}}])
    held: dict[int | None, float] = {}
    for start in (1000, 0, None):
        running = _trial(0, "RUNNING", 0, {"arch_idx": 0, "epochs": 4}, flops_full=4000, flops_spent=3000,
                         flops_from=start)
        work = Work()
        study_work(settings, [running], work)
        held[start] = work.slots[0].spent
    assert held == {1000: 1000.0, 0: 0.0, None: 3000.0}
    waiting = _trial(0, "WAITING", 0, {"arch_idx": 0, "epochs": 4}, flops_full=4000, flops_spent=3000, flops_from=0)
    work = Work()
    study_work(settings, [waiting], work)
    assert work.slots[0].spent == 3000.0, "a held trial holds what it trained (its checkpoint at the rung)"


def test_the_throughput_is_the_last_claims_work_in_its_time() -> None:
    """A trial that lost 1000 FLOPs of training to a kill (flops_spent 3000 over its last claim's
    20 s) measures its last claim, 2000 FLOPs in 20 s; a trial recorded before claim_work existed,
    what it spent over its duration."""
    settings = SimpleNamespace(archs=[{"flops_per_sample": 10}], phase2_params=None, options={},
                               plan=[{"slot": 0, "arch_idx": 0, "params": {"epochs": 2}}])
    done = {"flops_full": 2000, "flops_per_sample": 10, "flops_spent": 3000, "duration_s": 20.0}
    rates = []
    for claim in ([2000, 20.0], None):
        work = Work()
        attrs = {**done, **({"claim_work": claim} if claim else {})}
        study_work(settings, [_trial(0, "COMPLETE", 0, {"arch_idx": 0, "epochs": 2}, **attrs)], work)
        rates.append(work.rate)
    assert rates == [pytest.approx(100.0), pytest.approx(150.0)]


def test_a_budget_with_no_finished_trial_is_sized_by_the_other_budgets_epochs() -> None:
    """A run's budgets train the same data: the larger budget, none of whose trials has finished,
    is priced at the smaller one's measured 100 samples an epoch (20 FLOPs/sample x 100 x 2 epochs),
    so the run has an ETA as soon as any trial finished, not once every budget has one."""
    small = SimpleNamespace(archs=[{"flops_per_sample": 10}], phase2_params=None, options={}, budget_value=100e3,
                            plan=[{"slot": 0, "arch_idx": 0, "params": {"epochs": 3}}])
    large = SimpleNamespace(archs=[{"flops_per_sample": 20}], phase2_params=None, options={}, budget_value=300e3,
                            plan=[{"slot": 0, "arch_idx": 0, "params": {"epochs": 2}}])
    done = _trial(0, "COMPLETE", 0, {"arch_idx": 0, "epochs": 3}, flops_full=3000, flops_per_sample=10,
                  flops_spent=3000, duration_s=30.0)
    alone = Work()
    study_work(large, [], alone)
    assert flops_eta(alone, 1, T0) is None and alone.slots[0].cost is None, "nothing measured anywhere"
    work = Work()
    study_work(small, [done], work)
    study_work(large, [], work)
    assert work.slots[1].cost is None, "its own study cannot price it"
    assert flops_eta(work, 1, T0) == pytest.approx(20 * 100 * 2 / 100.0)
    assert work.slots[1].cost == 20 * 100 * 2


def test_under_successive_halving_a_new_trial_is_priced_at_the_share_it_is_expected_to_train() -> None:
    """eta 3, rungs at 1 and 3 of 3 epochs: a phase-1 slot no worker has started (no trial, or a
    queued one that trained nothing) costs 5/9 of a full training; a started one, one held at a rung
    and a confirmation slot (which no rule stops) cost all of it."""
    options = StoredOptions.from_dict({"halving": {"eta": 3, "min_fraction": "1/3"}})
    plan = [{"slot": 0, "arch_idx": 0, "phase": 1, "params": {"epochs": 3}},
            {"slot": 1, "arch_idx": 0, "phase": 1, "params": {"epochs": 3}},
            {"slot": 2, "arch_idx": 0, "phase": 3, "params": {"epochs": 3}}]
    settings = SimpleNamespace(archs=[{"flops_per_sample": 10}], phase2_params=None, options=options,
                               pruner="halving", plan=plan)
    done = _trial(0, "COMPLETE", 0, {"arch_idx": 0, "epochs": 3}, flops_full=3000, flops_per_sample=10,
                  flops_spent=3000, duration_s=30.0)
    work = Work()
    study_work(settings, [done, _trial(1, "RUNNING", 1, {"arch_idx": 0, "epochs": 3})], work)
    assert [s.share for s in work.slots] == [1.0, 1.0, 1.0], "started, started, never stopped"
    fresh = Work()
    study_work(settings, [done], fresh)
    assert [s.share for s in fresh.slots] == [1.0, pytest.approx(5 / 9), 1.0]
    assert flops_eta(fresh, 1, T0) == pytest.approx((3000 * 5 / 9 + 3000) / 100.0)
    queued = Work()
    study_work(settings, [done, _trial(1, "WAITING", 1, {"arch_idx": 0, "epochs": 3})], queued)
    assert queued.slots[1].share == pytest.approx(5 / 9), "enqueued at launch, never claimed"
    held = Work()
    study_work(settings, [done, _trial(1, "WAITING", 1, {"arch_idx": 0, "epochs": 3}, flops_spent=1000)], held)
    assert held.slots[1].share == 1.0, "held at a rung: it trained, and goes on only if promoted"
    # --confirm-at-rung: a confirmation run marked at rung 0 ends there (1 of 3 epochs), queued or running
    for state in ("WAITING", "RUNNING"):
        at_rung = Work()
        study_work(settings, [done, _trial(2, state, 2, {"arch_idx": 0, "epochs": 3}, confirm_rung=0)], at_rung)
        assert at_rung.slots[2].share == pytest.approx(1 / 3)


def test_a_ladder_budgets_new_trial_is_priced_at_the_rungs_its_trust_judges() -> None:
    """--ladder's halving: a phase-1 slot no worker has started costs 5/9 of a full training where
    the budget's measured trust judges rung 0 (rungs at 1 and 3 of 3 epochs, eta 3), all of it where
    it judges none or none is measured yet (the smallest budget trains to the end); it cost all of
    it under every trust before, so a ladder's ETA overshot by its pruned trials."""
    options = StoredOptions.from_dict({"halving": {"eta": 3, "min_fraction": "1/3", "trust": "ladder"}})
    plan = [{"slot": 0, "arch_idx": 0, "phase": 1, "params": {"epochs": 3}},
            {"slot": 1, "arch_idx": 0, "phase": 1, "params": {"epochs": 3}}]
    settings = SimpleNamespace(archs=[{"flops_per_sample": 10}], phase2_params=None, options=options,
                               pruner="halving", plan=plan)
    done = _trial(0, "COMPLETE", 0, {"arch_idx": 0, "epochs": 3}, flops_full=3000, flops_per_sample=10,
                  flops_spent=3000, duration_s=30.0)
    shares = {}
    for name, record in (("rung 0", {"trust": {"trusted": [0], "noise": 0.01}}),
                         ("none trusted", {"trust": {"trusted": [], "noise": 0.01}}), ("unmeasured", None)):
        work = Work()
        study_work(settings, [done], work, trust=RungTrust.from_record(record))
        shares[name] = work.slots[1].share
    assert shares == {"rung 0": pytest.approx(5 / 9), "none trusted": 1.0, "unmeasured": 1.0}


def test_a_study_with_a_data_budget_is_costed_before_any_of_its_trials_finished() -> None:
    """A ladder budget just planned has no finished trial to calibrate on; under --tokens-per-param
    every trial trains the budget's tokens over the window, so its slots cost flops/sample x that."""
    options = {"seq_len": 128, "data_budget": {"unit": "tokens", "per_param": 10.0, "target": 2_000_000}}
    settings = SimpleNamespace(archs=[{"flops_per_sample": 10}, {"flops_per_sample": 20}], phase2_params=None,
                               options=options, plan=[{"slot": 0, "arch_idx": 1, "params": {"epochs": 9}}])
    work = Work()
    study_work(settings, [], work)
    assert [s.cost for s in work.slots] == [20 * 2_000_000 / 128]
    samples = SimpleNamespace(**{**vars(settings), "options": {"data_budget": {"unit": "samples", "target": 500}}})
    work = Work()
    study_work(samples, [], work)
    assert [s.cost for s in work.slots] == [20 * 500]
    unknown = SimpleNamespace(**{**vars(settings), "options": {"data_budget": {"unit": "tokens", "target": 10}}})
    work = Work()
    study_work(unknown, [], work)
    assert [s.cost for s in work.slots] == [None], "tokens without a window: not known"


def test_off_a_terminal_one_plain_line_every_10_to_30_s() -> None:
    clock, out = FakeClock(), io.StringIO()
    shown = RunProgress(out, {}, 2, read_work=lambda: _work(True), clock=clock, now=clock.at)
    assert shown.bar is None and shown.file is out
    for t, final in ((0, 3), (5, 4), (11, 4), (20, 4), (40, 4), (41.5, 4), (45, 5)):
        clock.t = t
        shown.update(_statuses(final=final))
    shown.close(_statuses(final=6, running=0))
    lines = out.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == ["[0:00:00", "[0:00:11", "[0:00:41", "[0:00:45"], lines
    assert "trials 12/12 done" not in out.getvalue()
    assert lines[-1].startswith("[0:00:45] trials 7/12 done, 0 running, 1 failed, 1 held at a rung")
    assert all("\x1b" not in line and "\r" not in line for line in lines)


def test_a_budget_with_nothing_to_train_says_what_it_waits_for() -> None:
    """A ladder budget before its smaller one, or a confirmation's second wave before its first,
    has no trial running or queued: the line says why instead of looking stuck; a budget with work
    running does not repeat its plan's notes."""
    from archhpo.cluster._progress import progress_line

    statuses = {
        "lad_200K": PlanStatus(total=6, final=4, running=1, details={"phase3": "waiting for phases 1 and 2"}),
        "lad_500K": PlanStatus(total=5, details={"phase3": "waiting for phases 1 and 2",
                                                 "phase1": "waiting for lad_200K (the ladder plans this budget "
                                                           "from the smaller ones)"}),
        "lad_1M": PlanStatus(total=5, final=5, details={"phase3": "rank(s) 2 wait for ranks 0-1's confirmation"}),
    }
    line = progress_line(statuses, 1, 0.0, None)
    # the earliest phase's wait only: its confirmation waiting for phase 1 follows from it
    assert line.endswith("| waiting: lad_500K: waiting for lad_200K (the ladder plans this budget from the smaller ones)")
    statuses["lad_200K"].running = 0
    assert "lad_200K: waiting for phases 1 and 2  lad_500K: " in progress_line(statuses, 1, 0.0, None)
    statuses = {"lad_200K": PlanStatus(total=6, final=4, running=1), "lad_500K": PlanStatus(total=5)}
    assert "waiting:" not in progress_line(statuses, 1, 0.0, None), "no reason recorded: nothing added"


def test_the_bar_shows_what_an_idle_budget_waits_for() -> None:
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=200, record=True, color_system=None)
    shown = RunProgress(io.StringIO(), {}, 1, read_work=lambda: _work(True), clock=FakeClock(), console=console)
    statuses = {"lad_200K": PlanStatus(total=6, final=4, running=1, details={"phase3": "waiting for phases 1 and 2"}),
                "lad_500K": PlanStatus(total=5, details={"phase1": "waiting for lad_200K"})}
    shown.close(statuses)
    last = {line.split()[0]: line for line in console.export_text().splitlines() if line.strip()}
    assert "best -  (waiting for lad_200K)" in last["lad_500K"]
    assert "waiting" not in last["lad_200K"], "a budget with a trial running shows its counts only"


def test_ray_prints_worker_lines_without_colour_codes_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private.worker import print_worker_logs

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = SimpleNamespace(isatty=lambda: True, write=lambda text: len(text))
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(sys, "stderr", tty)
    plain_ray_logs(tty, tty)
    assert "RAY_COLOR_PREFIX" not in os.environ and sys.stdout is tty, "a terminal keeps Ray's colours"
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    plain_ray_logs(tty, piped)
    assert os.environ["RAY_COLOR_PREFIX"] == "0"
    print_worker_logs({"pid": 4242, "ip": "127.0.0.1", "localhost": "127.0.0.1", "lines": ["trial 3 done"],
                       "task_name": "worker_task"}, sys.stdout)
    print("a line\x1b[32m [repeated 2x across cluster]\x1b[0m")  # Ray colours this note regardless
    assert piped.getvalue() == "(worker_task pid=4242) trial 3 done\na line [repeated 2x across cluster]\n"
    assert sys.stderr is tty


@pytest.mark.ray
def test_run_off_a_terminal_prints_plain_lines(sqlite_url: str, tmp_path: Path) -> None:
    """`archhpo run` into a pipe, as a scheduler's log sees it: progress lines and Ray's copies of
    the workers' lines, none with an escape code."""
    hook = tmp_path / "hook"
    hook.mkdir()  # every Ray worker process says one line, which Ray copies to the driver with its prefix
    (hook / "sitecustomize.py").write_text(  # every second: Ray copies its output once it has set it up
        "import sys, threading, time\n"
        "def say():\n    for _ in range(120):\n        time.sleep(1)\n        print('a worker line', flush=True)\n"
        "if any('default_worker' in a for a in sys.argv):\n    threading.Thread(target=say, daemon=True).start()\n")
    path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    res = run_cli("run", "--experiment", "plain", "--d-model", "32", "--n-layers", "1", "--trials", "2",
                  "--epochs", "1", "--quick",
                  "--data", TINY_DATA, "--workers", "1", "--storage", sqlite_url, "--out", str(tmp_path / "r"),
                  cwd=tmp_path, env={"RAY_COLOR_PREFIX": "", "PYTHONPATH": path})
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    assert "pid=" in text and "a worker line" in text, "Ray copied the worker's line"
    assert "trials 2/2 done" in res.stderr and "\x1b" not in text


def test_each_budget_is_priced_at_its_own_or_the_largest_smaller_budgets_throughput() -> None:
    """On a CPU a larger model trains more FLOPs a second (T1's truths: 5 GFLOP/s at 100K, 41 at
    400K): a ladder's last budget priced at the rate over every finished trial, mostly small ones,
    would take several times too long."""
    work = Work()
    work.measure(100_000, 10 * GFLOP, 2.0)  # 5 GFLOP/s, twice as much wall time as ...
    work.measure(400_000, 40 * GFLOP, 1.0)  # ... 40 GFLOP/s
    assert work.rate == pytest.approx(50 / 3 * GFLOP) and work.rate_at(400_000) == pytest.approx(40 * GFLOP)
    assert work.rate_at(800_000) == pytest.approx(40 * GFLOP), "the largest smaller budget's"
    assert work.rate_at(50_000) == work.rate, "below every measured budget: the rate over all"
    work.slots = [SlotWork(400 * GFLOP, size=800_000), SlotWork(50 * GFLOP, size=100_000)]
    assert flops_eta(work, 1, T0) == pytest.approx(400 / 40 + 50 / 5)
    assert flops_eta(work, 2, T0) == pytest.approx(10.0), "the longest slot: one worker cannot split it"
