"""`run`'s ETA in FLOPs: the training still to do over the throughput the finished trials measured.

Trial counts make a poor clock: trials differ in size and most stop at a rung under successive
halving, so a mean duration jumps each time a long trial finishes. A trial's cost is known in FLOPs
instead (its shape's flops_per_sample times the samples it trains), and the finished trials' last
claims (Attr.CLAIM_WORK, which counts neither a lost claim's training nor a resumed claim's missing
time) give one worker's throughput. A running trial counts as done at that throughput from where
its claim's checkpoint started (Attr.FLOPS_FROM), up to its own cost. The throughput is measured
per budget, since on a CPU it grows with the model: a slot is priced at its budget's, else the
largest smaller budget's (the ETA errs long), else the rate over every finished trial. A budget
with no finished trial is sized at the samples per epoch the others measured; a trial not started
is priced at the share its rule expects it to train (`expected_share`); a second-wave confirmation
rank that may be skipped makes the ETA a range (`eta_range`). The measurements behind each choice:
docs/design.md §10.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from archhpo.schema import Attr
from archhpo.search._rules import StoppingRule, make_rule, prunable
from archhpo.search._trust import EVERY_RUNG, RungTrust

_FINISHED = ("COMPLETE", "PRUNED", "FAIL")
_LIVE = ("RUNNING", "WAITING")


@dataclass
class SlotWork:
    """One plan slot as the ETA sees it."""

    cost: float | None  # FLOPs to train it to full length once; None: not known (no measurement yet)
    # FLOPs of training it holds: a running claim's starting point (its checkpoint's; 0 when it
    # started over), else what its earlier claims trained (a trial held at a rung, a requeued one)
    spent: float = 0.0
    running_since: dt.datetime | None = None  # when its current claim began (RUNNING)
    done: bool = False
    size: float = 0.0  # its study's budget (nominal parameters): which measured throughput prices it
    # A slot its own study cannot price yet (no trial of it finished): its shape's FLOPs per sample
    # and its epochs, priced at the samples per epoch the run's other studies measured (`Work.price`).
    per_sample: float | None = None
    epochs: float | None = None
    share: float = 1.0  # of `cost` it is expected to train: a new trial the rule may stop (expected_share)
    undecided: bool = False  # a second-wave confirmation rank not decided yet: it may never be trained

    @property
    def expected(self) -> float:
        return float(self.cost or 0.0) * self.share


@dataclass
class Work:
    """The studies' slots and what the finished trials measured."""

    slots: list[SlotWork] = field(default_factory=list)
    flops: float = 0.0  # FLOPs the finished trials trained ...
    seconds: float = 0.0  # ... in this much worker wall time
    by_size: dict[float, list[float]] = field(default_factory=dict)  # the same per budget: [flops, seconds]
    # Samples per epoch of every finished trial of the studies without a data budget: a run's budgets
    # train the same data, so an epoch is as many samples in each (what prices an unpriced slot).
    epoch_samples: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        """FLOPs per second of one worker over every finished trial; None before one recorded both."""
        return self.flops / self.seconds if self.flops > 0 and self.seconds > 0 else None

    def measure(self, size: float, flops: float, seconds: float) -> None:
        """Count a finished trial of a budget of `size` parameters."""
        self.flops += flops
        self.seconds += seconds
        totals = self.by_size.setdefault(size, [0.0, 0.0])
        totals[0] += flops
        totals[1] += seconds

    def price(self) -> None:
        """Price the slots their own studies could not (a budget none of whose trials has finished)
        at the median samples per epoch of the run's finished trials; before any finished, none."""
        if not self.epoch_samples:
            return
        samples = statistics.median(self.epoch_samples)
        for s in self.slots:
            if s.cost is None and s.per_sample and s.epochs:
                s.cost = s.per_sample * samples * s.epochs

    def rate_at(self, size: float) -> float | None:
        """The throughput a slot of a budget of `size` is priced at: that budget's, else the largest
        smaller measured budget's, else the rate over every finished trial."""
        measured = {s: f / sec for s, (f, sec) in self.by_size.items() if f > 0 and sec > 0}
        below = [s for s in measured if s <= size]
        return measured[max(below)] if below else self.rate


def flops_eta(work: Work, workers: int, now: dt.datetime, undecided: bool = True) -> float | None:
    """Seconds left: the FLOPs still to train over the measured throughput of `workers` workers
    (no more of them than slots left), and never less than the longest slot left takes one worker.
    None until a finished trial measured the throughput, or while a slot's cost is unknown.
    `undecided` False: as if every undecided slot were skipped."""
    left = [s for s in work.slots if not s.done and (undecided or not s.undecided)]
    if not left:
        return 0.0
    work.price()
    if work.rate is None or any(s.cost is None for s in left):
        return None
    remaining = []  # seconds of one worker per slot, each at its own budget's throughput
    for s in left:
        rate = work.rate_at(s.size) or work.rate
        todo = max(0.0, s.expected - s.spent)
        if s.running_since is not None:  # what it trained since its claim, at the measured rate
            todo -= min(todo, max(0.0, (now - s.running_since).total_seconds()) * rate)
        remaining.append(todo / rate)
    parallel = max(1, min(workers, len(left)))
    return max(sum(remaining) / parallel, max(remaining))


def eta_range(work: Work, workers: int, now: dt.datetime) -> float | tuple[float, float] | None:
    """`flops_eta`, or (without, with) the undecided slots where they change it."""
    high = flops_eta(work, workers, now)
    low = flops_eta(work, workers, now, undecided=False) if any(s.undecided for s in work.slots) else high
    return high if high is None or low is None or low == high else (low, high)


# ----------------------------------------------------------------------------- reading a study
def _state(t: Any) -> str:
    return str(getattr(t.state, "name", t.state))


def _params(t: Any) -> dict[str, Any]:
    """A trial's planned parameters: its own once claimed, else those its WAITING trial was given."""
    return dict(t.params or t.system_attrs.get("fixed_params", {}))


def _field(entry: Any, name: str) -> Any:
    """A plan entry's field, stored form (dict) or PlanEntry alike."""
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


def _data_budget(settings: Any) -> bool:
    """Whether every trial of the study trains the same data (--tokens-per-param), whatever its epochs."""
    options = settings.options
    found = options.get("data_budget") if isinstance(options, dict) else getattr(options, "data_budget", None)
    return bool(found)


def _budget_samples(settings: Any) -> float | None:
    """Samples a trial trains under a data budget, from the budget itself (tokens over the window,
    or samples): what a study that has finished no trial yet, such as a ladder budget just planned,
    is estimated with.  None without a data budget or a known window."""
    options = settings.options
    stored = options if isinstance(options, dict) else options.as_dict()  # StoredOptions: seq_len is a family key
    budget, seq_len = stored.get("data_budget"), stored.get("seq_len")
    if not budget or not budget.get("target"):
        return None
    if budget.get("unit") == "samples":
        return float(budget["target"])
    return float(budget["target"]) / float(seq_len) if seq_len else None


class _Calibration:
    """Samples a trial trains, from the finished trials: per epoch, or per trial (a data budget,
    which also gives an estimate before any trial finished: `prior`)."""

    def __init__(self, trials: Iterable[Any], per_trial: bool, prior: float | None = None) -> None:
        self.per_trial = per_trial
        self.measured: list[float] = []
        for t in trials:
            full, per_sample = t.user_attrs.get(Attr.FLOPS_FULL), t.user_attrs.get(Attr.FLOPS_PER_SAMPLE)
            epochs = 1 if per_trial else _params(t).get("epochs")
            if full and per_sample and epochs:
                self.measured.append(float(full) / float(per_sample) / float(epochs))
        self.samples = statistics.median(self.measured) if self.measured else (prior if per_trial else None)

    def cost(self, flops_per_sample: float | None, epochs: float | None) -> float | None:
        if self.samples is None or not flops_per_sample or (not self.per_trial and not epochs):
            return None
        return flops_per_sample * self.samples * (1.0 if self.per_trial else float(epochs or 0))


def _slot_shape(settings: Any, entry: Any, trials: list[Any], mean_epochs: float | None,
                mean_fps: float | None) -> tuple[float | None, float | None]:
    """(flops per sample, epochs) of a slot: its newest trial's, else the plan's, else the study's means
    (a confirmation slot whose architecture upkeep has not chosen yet)."""
    params = _params(trials[-1]) if trials else dict(_field(entry, "params") or {})
    arch_idx = params.get("arch_idx", _field(entry, "arch_idx"))
    fps = mean_fps
    if arch_idx is not None and int(arch_idx) < len(settings.archs):
        fps = settings.archs[int(arch_idx)].get("flops_per_sample") or mean_fps
    epochs = params.get("epochs") or (settings.phase2_params or {}).get("epochs") or mean_epochs
    return fps, epochs


def study_work(settings: Any, trials: list[Any], work: Work, never: Set[int] = frozenset(),
               undecided: Set[int] = frozenset(), trust: RungTrust = EVERY_RUNG) -> None:
    """Add one study's slots and measurements to `work` (`trials`: Optuna's FrozenTrials; `never`:
    the slots no trial will ever come to, done without cost; `undecided`: those a trial may come to,
    PlanUpkeep.undecided; `trust`: the rungs a --ladder budget judges, search/_rungs.py StudyTrust)."""
    finished = [t for t in trials if _state(t) in _FINISHED]
    size = float(getattr(settings, "budget_value", 0) or 0)
    for t in finished:
        spent, seconds = _measured(t)
        if spent and seconds:
            work.measure(size, float(spent), float(seconds))
    calibration = _Calibration(finished, _data_budget(settings), _budget_samples(settings))
    rule = make_rule(settings) if getattr(settings, "pruner", None) else None  # a test's bare settings: none
    if not calibration.per_trial:
        work.epoch_samples += calibration.measured
    by_slot: dict[int, list[Any]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if Attr.PLAN_SLOT in t.user_attrs:
            by_slot.setdefault(int(t.user_attrs[Attr.PLAN_SLOT]), []).append(t)
    epochs = [float(e) for t in trials if (e := _params(t).get("epochs"))]
    per_sample = [float(a["flops_per_sample"]) for a in settings.archs if a.get("flops_per_sample")]
    mean_epochs = statistics.fmean(epochs) if epochs else None
    mean_fps = statistics.fmean(per_sample) if per_sample else None
    for entry in settings.plan:
        ts = by_slot.get(int(_field(entry, "slot")), [])
        live = [t for t in ts if _state(t) in _LIVE]
        if (ts and not live) or (not ts and int(_field(entry, "slot")) in never):
            work.slots.append(SlotWork(None, done=True))
            continue
        fps, slot_epochs = _slot_shape(settings, entry, ts, mean_epochs, mean_fps)
        known = live[-1].user_attrs.get(Attr.FLOPS_FULL) if live else None
        running = next((t for t in live if _state(t) == "RUNNING"), None)
        # not started: no trial yet, or only a queued one that has trained nothing (not held at a rung)
        fresh = running is None and not any(t.user_attrs.get(Attr.FLOPS_SPENT) for t in ts)
        share = _new_share(rule, entry, slot_epochs, trust) if fresh else 1.0
        confirm = live[-1].user_attrs.get(Attr.CONFIRM_RUNG) if live else None
        if confirm is not None and rule is not None and slot_epochs:  # --confirm-at-rung: it ends at its rung
            share = _rung_share(rule, int(slot_epochs), int(confirm))
        work.slots.append(SlotWork(
            float(known) if known else calibration.cost(fps, slot_epochs), spent=_held(live, running),
            running_since=running.datetime_start if running is not None else None, size=size,
            per_sample=None if calibration.per_trial else fps, epochs=slot_epochs, share=share,
            undecided=not ts and int(_field(entry, "slot")) in undecided,
        ))


def _measured(t: Any) -> tuple[Any, Any]:
    """(FLOPs, seconds) a finished trial measured: its last claim's (Attr.CLAIM_WORK), else, for a
    trial recorded before it existed, what all its claims trained over the trial's duration."""
    claim = t.user_attrs.get(Attr.CLAIM_WORK)
    if claim:
        return claim[0], claim[1]
    return t.user_attrs.get(Attr.FLOPS_SPENT), t.user_attrs.get(Attr.DURATION_S)


def _new_share(rule: StoppingRule | None, entry: Any, epochs: float | None, trust: RungTrust) -> float:
    """What share of a full-length training a slot no trial has come to yet is expected to train:
    its study's rule's `expected_share` for a trial the rule may stop (`prunable`: successive
    halving stops most of them at the first rung; on a ladder at the rungs `trust` judges), else 1."""
    if rule is None or not epochs:
        return 1.0
    seeded = SimpleNamespace(phase=int(_field(entry, "phase") or 1), seed=_field(entry, "seed"))
    return rule.expected_share(int(epochs), trust) if prunable(seeded) else 1.0


def _rung_share(rule: StoppingRule, epochs: int, rung: int) -> float:
    """The share of a full-length training a confirmation run that ends at `rung` trains."""
    rungs = rule.rungs(epochs)
    return min(1.0, rungs[rung] / epochs) if rung < len(rungs) and epochs > 0 else 1.0


def _held(live: list[Any], running: Any) -> float:
    """The training a live slot holds: where its running claim started (Attr.FLOPS_FROM, which the
    worker writes once it has looked for a checkpoint), else what its claims trained (FLOPS_SPENT:
    a held or requeued trial, or a claim that has not said yet)."""
    start = running.user_attrs.get(Attr.FLOPS_FROM) if running is not None else None
    if start is not None:
        return float(start)
    return float(live[-1].user_attrs.get(Attr.FLOPS_SPENT) or 0) if live else 0.0
