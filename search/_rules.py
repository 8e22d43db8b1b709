"""The stopping rules: may a trial go on, and how far (docs/design.md §5).

A study has one rule, chosen by its stored pruner name and options (`make_rule`).  A rule is one
class with two hooks, as an Optuna pruner is one class with `prune`:

- `stops(step, best, completed)`, at report time: may this trial go on after reporting at `step`
  (the median rule); `completed()` reads the COMPLETE trials' values at that step, only if asked;
- `decide(rung, scores)`, at upkeep time: which trials held at a complete rung go on (successive
  halving); `rungs(epochs)` says where a trial of `epochs` epochs is held and scored.
A rule may implement either meaningfully and leave the other as `_Rule`'s no-op; it may also say
`expected_share(epochs, trust)`, what share of a full training a new trial is expected to train
(`run`'s ETA prices queued trials with it; `_Rule`'s 1 errs long).  The queue asks
the rule only through these hooks (search/_queue.py at claims and reports, search/_rungs.py at
upkeep), and which trials any rule may stop at all is one predicate, `prunable`.  Adding a rule
(its class and one `register_rule`): docs/development.md, "Adding a stopping rule".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import optuna

from archhpo.config import StoredOptions, StudyConfig
from archhpo.errors import StudyError
from archhpo.schema import PRUNERS, Attr, TrainingPlan
from archhpo.search._halving import Halving, parse_fraction, promotions
from archhpo.search._trust import EVERY_RUNG, RungTrust

if TYPE_CHECKING:
    from archhpo.search._settings import StudySettings

__all__ = ["RULES", "MedianRule", "NoStopping", "StoppingRule", "SuccessiveHalving", "claim_plan", "make_rule",
           "on_ladder", "prunable", "register_rule", "unregister_rule"]

Completed = Callable[[], Sequence[float]]  # the finite values of the COMPLETE trials at a step, sorted


class StoppingRule(Protocol):
    """What the queue and the upkeep ask a study's rule (see the module's docstring)."""

    name: ClassVar[str]

    @property
    def n_rungs(self) -> int:
        """The rungs every trial is held and scored at, the last its full length; 0: none."""
        ...

    def rungs(self, epochs: int) -> list[int]: ...
    def stops(self, step: int, best: float, completed: Completed) -> bool: ...
    def decide(self, rung: int, scores: Mapping[int, float]) -> list[int]: ...
    def study_options(self) -> dict[str, Any]: ...
    def expected_share(self, epochs: int, trust: RungTrust = ...) -> float: ...


class _Seeded(Protocol):
    @property
    def phase(self) -> int: ...
    @property
    def seed(self) -> int | None: ...


def prunable(entry: _Seeded) -> bool:
    """Whether a stopping rule (median, halving, any other) may stop this trial on its own.

    Confirmation (phase 3) and paired-seed trials never are: each is one seed of a replicate set,
    and stopping the seeds that trail at an early epoch would leave means and variances of the
    survivors only.  Every rule's hooks are asked only about trials this predicate admits.
    `entry`: a PlanEntry or a queue Claim (anything with a phase and a seed)."""
    return entry.phase != 3 and entry.seed is None


class _Rule:
    """The no-op hooks a rule inherits: never stop at a report, hold nowhere, promote everyone."""

    name: ClassVar[str] = ""

    @classmethod
    def from_options(cls, options: StoredOptions) -> StoppingRule:
        """The rule of a study from its stored options."""
        return cls()

    @classmethod
    def from_config(cls, config: StudyConfig) -> StoppingRule:
        """The rule a new study launches with (its options then come from `study_options`)."""
        return cls()

    @property
    def n_rungs(self) -> int:
        return 0

    def rungs(self, epochs: int) -> list[int]:
        return []

    def stops(self, step: int, best: float, completed: Completed) -> bool:
        return False

    def decide(self, rung: int, scores: Mapping[int, float]) -> list[int]:
        return sorted(scores)

    def study_options(self) -> dict[str, Any]:
        """What the study stores in its options for this rule ({} keeps a study's identity)."""
        return {}

    def expected_share(self, epochs: int, trust: RungTrust = EVERY_RUNG) -> float:
        """The share of a full-length training that a new trial the rule may judge is expected to
        train, what `run`'s ETA prices it at (`trust`: the rungs its study judges); 1 where the rule
        cannot say (the ETA then errs long)."""
        return 1.0


class NoStopping(_Rule):
    """--pruner none: every trial trains to its full length."""

    name: ClassVar[str] = "none"


@dataclass(frozen=True)
class MedianRule(_Rule):
    """Optuna's median rule (MedianPruner's), defined once: stop a trial at epoch `step` when
    its best loss so far is worse than the median of the COMPLETE trials' losses at that epoch,
    once `n_startup_trials` of them have a value there and from epoch `n_warmup_steps` on.

    The queue applies it in one query (search/_queue.py: asking MedianPruner itself reloads
    every trial of the study on each report); `optuna_pruner` is the same rule for a plain
    Optuna loop (the baseline in bench/).  Which trials it may judge at all: `prunable`."""

    name: ClassVar[str] = "median"
    n_startup_trials: int = 5  # finished trials before the median means anything
    n_warmup_steps: int = 10  # never before the model had a fair start

    @classmethod
    def for_study(cls, quick: bool) -> MedianRule:
        return cls(n_warmup_steps=1) if quick else cls()

    @classmethod
    def from_options(cls, options: StoredOptions) -> StoppingRule:
        return cls.for_study(bool(options.quick))

    @classmethod
    def from_config(cls, config: StudyConfig) -> StoppingRule:
        return cls.for_study(bool(config.quick))

    def stops(self, step: int, best: float, completed: Completed | Sequence[float]) -> bool:
        """`completed`: the finite values of the COMPLETE trials at `step`, sorted (or what reads them)."""
        values = completed() if callable(completed) else completed
        if step < self.n_warmup_steps or len(values) < self.n_startup_trials:
            return False
        return best > _sorted_median(values)

    def optuna_pruner(self) -> optuna.pruners.MedianPruner:
        return optuna.pruners.MedianPruner(n_startup_trials=self.n_startup_trials,
                                           n_warmup_steps=self.n_warmup_steps)


def _sorted_median(values: Sequence[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


@dataclass(frozen=True)
class SuccessiveHalving(_Rule):
    """Successive halving over the plan (search/_halving.py's arithmetic): every trial is held at
    each rung until the rung is complete; the best 1/eta of its trials go on (`promotions`).
    On a --ladder (`on_ladder`) only at the rungs its study trusts (search/_trust.py)."""

    name: ClassVar[str] = "halving"
    halving: Halving = Halving()

    @classmethod
    def from_options(cls, options: StoredOptions) -> StoppingRule:
        halving = Halving.from_options(options)
        return NoStopping() if halving is None else cls(halving)

    @classmethod
    def from_config(cls, config: StudyConfig) -> StoppingRule:
        halving = Halving(config.pruning.eta, parse_fraction(config.pruning.min_fraction), config.ladder)
        halving.check_schedule(config.schedule.name, config.schedule.cooldown)
        return cls(halving)

    @property
    def n_rungs(self) -> int:
        return self.halving.n_rungs

    def rungs(self, epochs: int) -> list[int]:
        return self.halving.epochs(epochs)

    def decide(self, rung: int, scores: Mapping[int, float]) -> list[int]:
        return promotions(scores, self.halving.eta)

    def study_options(self) -> dict[str, Any]:
        return {"halving": self.halving.as_option()}

    def expected_share(self, epochs: int, trust: RungTrust = EVERY_RUNG) -> float:
        """Every trial trains to the first rung and 1/eta of those at each rung go on: rungs at 1 and
        3 of 3 epochs, eta 3, expect (1 + 2/3) / 3.  On a ladder only the rungs its `trust` judges
        halve, the others are passed through (rung 1 of 1, 3, 9 alone: (3 + 6/3) / 9); before its
        trust is measured (no ladder record yet, or the smallest budget) 1: it may train to the end."""
        rungs = self.rungs(epochs)
        if not rungs or epochs <= 0 or (self.halving.ladder and not trust.measured):
            return 1.0
        judged = trust if self.halving.ladder else EVERY_RUNG
        trained, reached, going = 0.0, 0, 1.0
        for k, rung in enumerate(rungs[:-1]):
            trained += (rung - reached) * going
            reached, going = rung, going / self.halving.eta if judged.judges(k) else going
        return min(1.0, (trained + (epochs - reached) * going) / epochs)


# ----------------------------------------------------------------------------- the registry
RULES: dict[str, type[_Rule]] = {}


def register_rule(rule: type[_Rule]) -> type[_Rule]:
    """Make `rule` a study's choice under its name (also --pruner's and the config's)."""
    RULES[rule.name] = rule
    if rule.name not in PRUNERS:
        PRUNERS.append(rule.name)
    return rule


def unregister_rule(name: str) -> None:
    RULES.pop(name, None)
    if name in PRUNERS:
        PRUNERS.remove(name)


for _builtin in (MedianRule, SuccessiveHalving, NoStopping):
    register_rule(_builtin)


def make_rule(source: StudySettings | StudyConfig) -> StoppingRule:
    """The rule of a study (its stored pruner name and options) or of a config about to launch one."""
    name = source.pruning.rule if isinstance(source, StudyConfig) else source.pruner
    rule = RULES.get(name)
    if rule is None:
        raise StudyError(f"Unknown pruner {name!r}; this archhpo knows: {', '.join(RULES)}.")
    return rule.from_config(source) if isinstance(source, StudyConfig) else rule.from_options(source.options)


def on_ladder(rule: StoppingRule) -> bool:
    """Whether `rule` judges only the rungs its study's ladder record trusts (successive halving
    launched with --ladder); any other judges every rung it has (`EVERY_RUNG`)."""
    return isinstance(rule, SuccessiveHalving) and rule.halving.ladder


def claim_plan(rule: StoppingRule, params: Mapping[str, Any], judged: bool,
               attrs: Mapping[str, Any], trust: RungTrust = EVERY_RUNG) -> tuple[TrainingPlan, int]:
    """A claim's training plan and the rung it trains to, from its training parameters and the
    trial's stored attributes; a rule that holds nowhere plans nothing (train to full length).

    A trial the rule may judge (`prunable`) trains to the rung after the last one it was scored at
    (the first for a new trial) and stops there, or at the last rung to its full length; any other
    (a replicate) trains to full length, scoring every rung below it in passing.  `trust`: the
    rungs the study judges (search/_trust.py; off the ladder every one).  A judged trial with no
    trusted rung ahead trains to full length, scoring the rest in passing; one with a trusted rung
    ahead still stops at each rung on the way, held only at a trusted one (TrialQueue.park): a
    parked claim records only the score it stops at.  A ladder budget whose measured trust judges no
    rung scores nothing (`RungTrust.scores_in_passing`): it trains like a rule that holds nowhere.
    A confirmation run at a trusted rung (Attr.CONFIRM_RUNG, --confirm-at-rung) scores every rung up
    to it in passing and ends there (`TrainingPlan.ends`)."""
    rungs = rule.rungs(int(params["epochs"])) if rule.n_rungs else []
    if not rungs:
        return TrainingPlan(), 0
    passed = attrs.get(Attr.RUNG)
    rung = 0 if passed is None or not judged else int(passed) + 1
    plan = TrainingPlan(scored=tuple(rungs), scores=tuple(float(v) for v in attrs.get(Attr.RUNG_SCORES) or []),
                        branch_epochs=tuple(float(v) for v in attrs.get(Attr.BRANCH_EPOCHS) or []))
    if rung >= len(rungs) - 1 and judged:
        return plan, rung
    confirm = attrs.get(Attr.CONFIRM_RUNG)
    if confirm is not None and not judged:  # --confirm-at-rung: scored in passing up to its rung, ended there
        upto = tuple(rungs[: int(confirm) + 1])
        return replace(plan, validate_at=tuple(sorted(set(upto))), score_at=upto, stop_after=upto[-1], ends=True,
                       scores_from_checkpoint=True), int(confirm)
    if not trust.scores_in_passing:  # a ladder budget that trusts no rung: full length, nothing scored
        return TrainingPlan(), 0
    if not judged or not any(trust.judges(r) for r in range(rung, len(rungs) - 1)):
        rest = tuple(rungs[rung:-1])  # scored in passing; a resumed claim's are in its checkpoint
        plan = replace(plan, validate_at=tuple(sorted(set(rest))), score_at=rest, scores_from_checkpoint=True)
        return plan, rung if not judged else len(rungs) - 1
    at = rungs[rung]
    return replace(plan, validate_at=(at,), score_at=(at,), stop_after=at), rung
