"""`run`'s ETA before any trial has finished: an IsoFLOP study's slots cost what its plan trains,
a running trial's reported intervals measure the throughput, and the display re-reads the work
until that measurement exists even while no count changes."""

from __future__ import annotations

import datetime as dt
import io
from types import SimpleNamespace
from typing import Any

import pytest

from archhpo.cluster._flops import Work, flops_eta, study_work
from archhpo.cluster._progress import RunProgress, planned_costs, running_progress
from archhpo.config import StoredOptions
from archhpo.schema import isoflop_key
from archhpo.search._queue import PlanStatus

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)
ARCHS = [{"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256, "flops_per_sample": 1000},
         {"d_model": 128, "n_layers": 2, "n_heads": 2, "d_ff": 512, "flops_per_sample": 3000}]


def _isoflop_settings(samples: tuple[int, int] = (900, 300)) -> Any:
    options = StoredOptions.from_dict({"isoflop": {"compute_budget": 9e5, "samples": {
        isoflop_key(a): n for a, n in zip(ARCHS, samples, strict=True)}}})
    return SimpleNamespace(archs=ARCHS, phase2_params=None, options=options, budget_value=1e5,
                           plan=[{"slot": i, "arch_idx": i, "params": {"epochs": 3}} for i in range(2)])


def _trial(number: int, state: str, steps: dict[int, float] | None = None, **attrs: Any) -> Any:
    return SimpleNamespace(number=number, state=SimpleNamespace(name=state), params={"arch_idx": number, "epochs": 3},
                           system_attrs={}, user_attrs={"plan_slot": number, **attrs}, datetime_start=T0,
                           intermediate_values=steps or {})


def test_an_isoflop_studys_slots_cost_its_planned_samples_before_any_trial_finished() -> None:
    """Each size trains its own samples (900 x 1000 and 300 x 3000 FLOPs: C each); the per-epoch
    calibration knows nothing yet, the plan does."""
    settings = _isoflop_settings()
    work = Work()
    study_work(settings, [], work)
    assert [s.cost for s in work.slots] == [None, None], "the calibration alone cannot price them"
    planned_costs(settings, work.slots)
    assert [s.cost for s in work.slots] == [900_000.0, 900_000.0]


def test_a_study_without_an_isoflop_plan_keeps_its_calibrated_costs() -> None:
    settings = SimpleNamespace(archs=ARCHS, phase2_params=None, options={}, budget_value=1e5,
                               plan=[{"slot": 0, "arch_idx": 0, "params": {"epochs": 3}}])
    work = Work()
    study_work(settings, [], work)
    planned_costs(settings, work.slots)
    assert [s.cost for s in work.slots] == [None]


def test_a_running_trials_reported_intervals_measure_the_throughput() -> None:
    """1 of 3 intervals reported 30 s after the claim: a third of 900,000 FLOPs in 30 s (10,000/s);
    a trial that has reported nothing measures nothing, and neither does a finished one here."""
    settings = _isoflop_settings()
    trials = [_trial(0, "RUNNING", {1: 3.1}), _trial(1, "RUNNING")]
    work = Work()
    study_work(settings, trials, work)
    planned_costs(settings, work.slots)
    now = T0 + dt.timedelta(seconds=30)
    assert running_progress(settings, trials, work.slots, now) == [(1e5, pytest.approx(300_000.0), 30.0)]
    for size, flops, seconds in running_progress(settings, trials, work.slots, now):
        work.measure(size, flops, seconds)
    # 900,000 - 300,000 (trial 0, at 10,000/s) and 900,000 - 300,000 (trial 1) over 2 workers
    assert flops_eta(work, 2, now) == pytest.approx(60.0)


class _Queue:
    """A study as RunProgress reads it: its settings and its trials, which the test moves on."""

    def __init__(self, settings: Any, trials: list[Any]) -> None:
        self.settings, self.trials = settings, trials
        self.study = SimpleNamespace(get_trials=lambda deepcopy=False: self.trials)


def test_the_eta_appears_once_a_running_trial_reports_although_no_count_changed() -> None:
    """Two trials run for minutes; the counts stay at 0 of 2 done, 2 running. The first display has
    no measurement (--:--); once a trial reports its first interval the next poll shows an ETA."""
    clock = {"t": 0.0}
    queue = _Queue(_isoflop_settings(), [_trial(0, "RUNNING"), _trial(1, "RUNNING")])
    now = lambda: T0 + dt.timedelta(seconds=clock["t"])  # noqa: E731
    shown = RunProgress(io.StringIO(), {"iso_C9e5": queue}, 2, clock=lambda: clock["t"], now=now)
    statuses = {"iso_C9e5": PlanStatus(total=2, running=2)}
    assert shown.eta(statuses) is None
    clock["t"] = 30.0
    queue.trials = [_trial(0, "RUNNING", {1: 3.1}), _trial(1, "RUNNING")]
    assert shown.eta(statuses) == pytest.approx(60.0)
