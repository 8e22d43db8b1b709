"""The names archhpo's layers share, defined once: architecture keys, training parameters, the
attributes a trial records and the data budget (the options a study stores are derived from the
settings' declarations in archhpo/config.py: `StoredOptions`).

Every module that lists these names reads them from here (the search space, the options, the
trial builder, the queue, the export, the DataFrame, the report and the train command);
tests/test_schema.py fails if a second literal list of the architecture keys appears in the
package.  This module imports nothing but the standard library and archhpo.errors, so every layer may use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from archhpo.errors import ArchhpoError, ConfigError

# ----------------------------------------------------------------------------- architecture
ARCH_KEYS = ("d_model", "n_layers", "n_heads", "d_ff")
"""The four dimensions the grid enumerates and a trial's architecture is given by."""

PARAM_COUNT = "param_count"
ARCH_RECORD = (*ARCH_KEYS, PARAM_COUNT)
"""What a trial records of its architecture: the dimensions and the exact parameter count."""

ARCH_HELP = {
    "d_model": "model width",
    "n_layers": "transformer layers",
    "n_heads": "attention heads",
    "d_ff": "feed-forward width",
}


# ----------------------------------------------------------------------------- training parameters
@dataclass(frozen=True)
class TrainingParam:
    """One training parameter the plan samples (docs/design.md §5).

    ``kind`` "log" is a log-uniform float range (lo, hi), "choice" a set of integers;
    ``full`` is the range of a full study, ``quick`` that of a ``--quick`` study.
    """

    name: str
    type: type
    kind: Literal["log", "choice"]
    full: tuple[float, ...] | tuple[int, ...]
    quick: tuple[float, ...] | tuple[int, ...]


TRAINING = (
    TrainingParam("learning_rate", float, "log", (1e-4, 1e-3), (1e-4, 1e-3)),
    TrainingParam("epochs", int, "choice", (50, 75, 100), (2, 3, 4)),
    TrainingParam("batch_size", int, "choice", (32, 64, 128, 256), (32, 64, 128, 256)),
    TrainingParam("weight_decay", float, "log", (1e-5, 1e-3), (1e-5, 1e-3)),
    TrainingParam("warmup_steps", int, "choice", (100, 200, 300, 500), (10, 20, 30, 50)),
)
TRAINING_PARAMS = tuple(p.name for p in TRAINING)
"""The training parameters' names, in the order the plan, the CSV and the report show them."""

ARCH_INDEX = "arch_idx"
PLAN_PARAMS = (ARCH_INDEX, *TRAINING_PARAMS)
"""The Optuna parameters of a planned trial: the grid row's index and the training parameters."""


def training_param(name: str) -> TrainingParam:
    return next(p for p in TRAINING if p.name == name)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_training_params(fixed: Mapping[str, Any], ranges: Mapping[str, Any], *, paired: bool) -> None:
    """The training parameters a study fixes (one value each, of the parameter's type) and those it
    searches within a stated range (a log-scaled parameter's LO:HI with 0 < LO < HI, not also fixed,
    not in a paired study, which trains one set of training parameters); ConfigError otherwise."""
    params = {p.name: p for p in TRAINING}
    for name, value in fixed.items():
        if name not in params:
            raise ConfigError(f"{_flag(name)} is not a training parameter; fix one of: "
                              f"{', '.join(_flag(k) for k in TRAINING_PARAMS)}.")
        kind = params[name].type
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise ConfigError(f"{_flag(name)} must be {kind.__name__}, got {value!r}.")
    for name, bounds in ranges.items():
        flag = _flag(name)
        if name not in params or params[name].kind != "log":
            raise ConfigError(f"{flag} takes one value, not a range: only "
                              f"{', '.join(_flag(p.name) for p in TRAINING if p.kind == 'log')} take LO:HI.")
        if name in fixed:
            raise ConfigError(f"{flag} is both fixed and given a range; give one value or LO:HI, not both.")
        if paired:
            raise ConfigError(f"A paired study (--paired-seeds) trains one set of training parameters, so {flag} "
                              "takes one value, not LO:HI; give one value or drop --paired-seeds.")
        lo, hi = (float(b) for b in bounds) if len(bounds) == 2 else (math.nan, math.nan)
        if not 0 < lo < hi < math.inf:
            shown = ":".join(f"{b:g}" for b in bounds)
            raise ConfigError(f"{flag} {shown}: a range needs 0 < LO < HI (a log-uniform range), e.g. {flag} 1e-3:3e-2.")


# ----------------------------------------------------------------------------- data per parameter
DATA_UNITS = ("tokens", "samples")
DEFAULT_INTERVALS = 9
"""Validation intervals of a data-budget study when --epochs does not set them: 9 puts halving's
default rungs (1/9, 1/3, 1) on whole intervals."""


@dataclass(frozen=True)
class DataBudget:
    """A study's training data stated per parameter (``--tokens-per-param R``): every trial of a
    budget trains on D = R x the budget's nominal N data units, whatever its shape, and its
    ``epochs`` count validation intervals of D/epochs each (not passes over the data set).

    Stored in the study's options under ``OPTION``; a study without it trains whole epochs."""

    OPTION = "data_budget"
    unit: str  # "tokens" (lm, char_cls) or "samples" (every other family)
    per_param: float  # R
    budget_params: int  # the budget's nominal N (2M -> 2,000,000), not a shape's exact count

    def __post_init__(self) -> None:
        if self.unit not in DATA_UNITS:
            raise ArchhpoError(f"Unknown data unit {self.unit!r}; use one of {', '.join(DATA_UNITS)}.")
        if not (math.isfinite(self.per_param) and self.per_param > 0):
            raise ArchhpoError(f"--{self.unit}-per-param must be a positive number, got {self.per_param}.")
        if self.budget_params < 1:
            raise ArchhpoError(f"--{self.unit}-per-param needs a parameter budget (--budget 2M), not pins alone.")

    @property
    def target(self) -> int:
        """D: the data units every trial of the study trains on (rounded up)."""
        return math.ceil(self.per_param * self.budget_params - 1e-9)

    @property
    def label(self) -> str:
        return self.label_of(self.unit, self.per_param)

    @staticmethod
    def label_of(unit: str, per_param: float) -> str:
        """The study-name suffix: 't20' (tokens) or 's20' (samples), so several R give several studies."""
        return f"{unit[0]}{float(per_param):g}"

    def as_option(self) -> dict[str, Any]:
        return {"unit": self.unit, "per_param": float(self.per_param), "budget_params": int(self.budget_params),
                "target": self.target}

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> DataBudget | None:
        raw = options.get(cls.OPTION)
        if not raw:
            return None
        return cls(str(raw["unit"]), float(raw["per_param"]), int(raw["budget_params"]))

    def samples_per_interval(self, units_per_sample: int, intervals: int) -> int:
        """Training samples in each of `intervals` validation intervals: D over the units one sample
        holds, split evenly (rounded up, so a trial trains at least D)."""
        samples = math.ceil(self.target / max(1, int(units_per_sample)))
        return max(1, math.ceil(samples / max(1, int(intervals))))


# ----------------------------------------------------------------------------- trial attributes
# The objective's name: Optuna's metric name of every study (the dashboard's axis), the CSV's
# column and the report's word for a trial's value.
OBJECTIVE = "val_loss"


class Attr:
    """The user attributes a trial records (Optuna ``trial.user_attrs`` keys)."""

    PHASE = "phase"  # 1 exploration, 2 exploitation, 3 confirmation
    PLAN_SLOT = "plan_slot"  # the planned trial's position in the plan
    SEED = "seed"  # the training seed (paired studies and confirmations)
    RANK = "rank"  # a confirmation trial: the rank of the architecture it retrains
    BASELINE = "baseline"  # a confirmation trial of --baselines: the rule whose shape it trains
    LR_PROBE = "lr_probe"  # a phase-3 trial of --lr-probe: the factor its learning rate is the best's times
    ATTEMPT = "attempt"  # 1, then 2 for the retry of a trial whose worker vanished
    RETRY_OF = "retry_of"  # the number of the trial a retry repeats
    DURATION_S = "duration_s"  # wall time over all the claims that trained it (from their checkpoints)
    TRAIN_LOSS = "train_loss"
    BASELINE_VAL_LOSS = "baseline_val_loss"
    FAIL_REASON = "fail_reason"  # set by a worker: a deliberate FAIL (NaN, OOM, refused) is final
    OOM_SHARED = "oom_shared"  # an out-of-memory error while sharing a GPU (retried on a whole one)
    WHOLE_GPU = "whole_gpu"  # only a worker with a GPU of its own claims this trial
    CLAIM_TOKEN = "claim_token"  # who holds a RUNNING trial: heartbeat/report/finish are fenced on it
    # Successive halving (search/_halving.py): the last rung a trial was scored at (the last rung =
    # full length), its score at each rung, the epochs of its rungs and of each score's cooldown
    # branch, and whether it waits (WAITING, unclaimable) for its rung's decision.
    RUNG = "rung"
    RUNG_SCORES = "rung_scores"
    RUNG_EPOCHS = "rung_epochs"
    BRANCH_EPOCHS = "branch_epochs"
    RUNG_HOLD = "rung_hold"
    # --confirm-at-rung: a confirmation run that ends at this rung (the lowest its budget trusts),
    # PRUNED with its score there as its value; the finalists are chosen on their scores there.
    CONFIRM_RUNG = "confirm_rung"
    # FLOPs: spent by the trial over all its claims, cooldown branches included; and what training
    # it to full length once costs (the best JSON's flops_full_plan adds these over the plan).
    FLOPS_SPENT = "flops_spent"
    FLOPS_FULL = "flops_full"
    FLOPS_PER_SAMPLE = "flops_per_sample"
    MEMORY_ESTIMATE_GIB = "memory_estimate_gib"  # the fit check's estimate of the trial's peak
    # The running claim's starting point: FLOPs of the training its checkpoint held (0: it started
    # over, e.g. on a machine without the earlier claim's checkpoint); None until the worker says.
    # FLOPS_SPENT counts lost work too, so the ETA reads a running trial's progress from this.
    FLOPS_FROM = "flops_from"
    # [FLOPs, wall seconds] of the claim that finished or parked the trial: the ETA's throughput.
    # FLOPS_SPENT counts every claim's training (lost work too) and DURATION_S the claims its
    # checkpoint carries, so their ratio is off for a trial that lost work or resumed a dead one's.
    CLAIM_WORK = "claim_work"
    RESUMED_FROM_EPOCH = "resumed_from_epoch"  # a retry or a promoted trial went on from this epoch
    RESUMED_FROM_STEP = "resumed_from_step"  # ... and this many steps into the next (a stopped trial)
    PRUNED_AT_EPOCH = "pruned_at_epoch"
    # Data: tokens (token families) or samples trained since the start, whichever claims trained
    # them; the study's data per parameter; and the passes over the training set that took.
    TRAIN_TOKENS = "train_tokens"
    TRAIN_SAMPLES = "train_samples"
    TOKENS_PER_PARAM = "tokens_per_param"
    SAMPLES_PER_PARAM = "samples_per_param"
    DATA_PASSES = "data_passes"
    # Speed: the model FLOPs utilisation of the timed training steps (MFU is kept as its older name)
    # and of the claim's wall clock; where memory cut the batch, the micro-batch and the gradient
    # accumulation steps that keep the study's batch (workers/_batch.py).
    MFU = "mfu"
    STEP_MFU = "step_mfu"
    TRIAL_MFU = "trial_mfu"
    MICRO_BATCH = "micro_batch"
    ACCUMULATION_STEPS = "accumulation_steps"
    # The worker that ran the trial (recorded with every claim): host, device, process, CPU threads
    # (a CPU replay is exact with the same count) and its GPU share (Ray's num_gpus; see gpu_share).
    HOST = "host"
    DEVICE = "device"
    PID = "pid"
    THREADS = "threads"
    GPU_SHARE = "gpu_share"
    # A trial across K ranks (workers/_distributed.py): the group's size and its sharding (ddp, fsdp).
    RANKS = "ranks"
    SHARD = "shard"


def gpu_share(worker_attrs: dict[str, Any]) -> float:
    """A worker's share of its GPU: Ray's num_gpus when it is a fraction in (0, 1), else 1 (a GPU of
    its own, or a CPU worker, recorded as 0 or not at all). The OOM policy and the queue's whole-GPU
    retries both read it from here."""
    try:
        share = float(worker_attrs.get(Attr.GPU_SHARE, 1.0))
    except (TypeError, ValueError):
        return 1.0
    return share if 0 < share < 1 else 1.0


__all__ = [
    "OBJECTIVE",
    "DATA_UNITS",
    "DEFAULT_ETA",
    "DEFAULT_INTERVALS",
    "DEFAULT_MIN_FRACTION",
    "LADDER_CARRY_FINALISTS",
    "LADDER_CONFIRM_AT_RUNG",
    "LADDER_CONFIRM_SEEDS",
    "LADDER_SEQUENTIAL",
    "LADDER_FINALISTS",
    "LR_PROBE_FACTORS",
    "DataBudget",
    "PRUNERS",
    "TrainingPlan",
    "SCHEDULES",
    "check_schedule",
    "isoflop_key",
    "schedule_options",
    "ARCH_HELP",
    "ARCH_INDEX",
    "ARCH_KEYS",
    "ARCH_RECORD",
    "PARAM_COUNT",
    "PLAN_PARAMS",
    "TRAINING",
    "TRAINING_PARAMS",
    "Attr",
    "gpu_share",
    "TrainingParam",
    "training_param",
]


# The names of the stopping rules a study may choose (--pruner): Optuna's median rule, successive
# halving over the plan (rungs at MIN_FRACTION * ETA**k of each trial's epochs), or none.  Each is
# one class of search/_rules.py; its registration there (register_rule) adds its name here, so the
# config and the command line accept it.
PRUNERS: list[str] = ["median", "halving", "none"]
DEFAULT_ETA = 3
DEFAULT_MIN_FRACTION = "1/9"
# --ladder's confirmation when --confirm is not stated: its 3 best architectures per budget (the
# finalists) each retrained with 1 new seed, and the winner chosen on the mean over the same seeds
# (a paired comparison) with their search trials: 2 runs each at a ladder budget, 3 at the smallest
# (whose design trains each architecture twice).  3 x 1 adds 3 full-length runs a budget; on the
# truths' replays (bench/search_efficiency.py, tuned at plan seed 0) it was within 1 std more often
# than 2 x 2 at three quarters of the confirmation's cost: a third finalist guards against the
# single-run ranking that picks the two, where a second seed of each only sharpens a choice among them.
LADDER_FINALISTS = 3
LADDER_CONFIRM_SEEDS = 1
# ... in two waves (search/_confirmation.py): the third finalist retrained only where its search run is
# within the first two's pooled seed noise of their leader.  On the replays (docs/searching.md) this cut
# the confirmation's FLOPs at every table and left every share within 1 std unchanged at the evaluation seed.
LADDER_SEQUENTIAL = True
# --ladder's two options chosen by the rule of docs/searching.md ("Choosing the defaults"), read on
# replays graded on noise they never saw (--noise fresh):
# - confirming at a trusted rung (search/_confirmation.py `mark_rung`) is off: every confirmation run
#   trains to full length (--confirm-at-rung turns it on);
# - the largest budget trains the next smaller budget's finalists and the centred extremes, once each
#   at full length (search/_ladder.py `finalist_rows`; --no-carry-finalists plans it as the others).
LADDER_CONFIRM_AT_RUNG = False
LADDER_CARRY_FINALISTS = True
# --lr-probe's rates (search/_lrfit.py): the best architecture of each ladder budget below the largest
# retrained at its rate times each factor, one run each, so that with its own run(s) at the rate itself
# it has MIN_RATES_FOR_QUADRATIC (4) rates and the budget *locates* its best rate.  Lopsided towards low
# rates: a run at 4x can diverge, and a failed run gives the parabola no point, where one at 1/4 cannot
# (on T1's 400K sweep, bench/truths/t1_lr.csv, against 3e-3: x1/4 cost 0.05-0.08, x2 0.005-0.04).
LR_PROBE_FACTORS = (0.25, 0.5, 2.0)



@dataclass(frozen=True)
class TrainingPlan:
    """How far one claim of a trial trains, as its study's stopping rule decided (search/_rules.py),
    in terms the trainer knows (workers/_train.py's train()):

    - ``validate_at``: epochs always validated (besides every ``eval_every``-th and the last);
    - ``score_at``: epochs where the rule scores the trial (a successive-halving rung; under WSD a
      cooldown branched from the constant-rate state there), one score per listed epoch (an epoch
      listed twice is scored twice: a short trial's rungs that round to one epoch);
    - ``stop_after``: the epoch after which this claim stops and hands its state back to be held
      (None: train to the trial's full length);
    - ``scored``: every epoch the rule scores the trial at over all its claims, recorded with the trial
      (its rung_epochs; empty when the rule scores nothing);
    - ``scores``, ``branch_epochs``: what earlier claims scored, and ``scores_from_checkpoint``: a
      trial never held (a replicate) carries its scores in its checkpoint, not in the queue;
    - ``ends``: the trial ends at ``stop_after`` (its last score its value) instead of being held.
    """

    validate_at: tuple[int, ...] = ()
    score_at: tuple[int, ...] = ()
    stop_after: int | None = None
    scored: tuple[int, ...] = ()
    scores: tuple[float, ...] = ()
    branch_epochs: tuple[float, ...] = ()
    scores_from_checkpoint: bool = False
    ends: bool = False  # the trial ends at ``stop_after`` (a confirmation run at a trusted rung), not held


# The learning-rate schedules of the trainer (workers/_train.py): cosine decay, or WSD (warm-up,
# a stable rate, then a 1-sqrt cooldown over the last `cooldown` fraction of the steps).
SCHEDULES = ("cosine", "wsd")


def check_schedule(schedule: str, cooldown: float) -> None:
    if schedule not in SCHEDULES or not 0 <= cooldown < 1:
        raise ArchhpoError(f"Unknown schedule {schedule!r} or cooldown {cooldown} outside [0, 1); "
                           "use --schedule cosine or wsd and --cooldown such as 0.2.")


def schedule_options(schedule: str, cooldown: float) -> dict[str, Any]:
    """The schedule as study/trial options: nothing for cosine (a study's identity is unchanged)."""
    check_schedule(schedule, cooldown)
    return {} if schedule == "cosine" else {"schedule": schedule, "cooldown": float(cooldown)}


# ----------------------------------------------------------------------------- a study's stored options
def isoflop_key(arch: Mapping[str, Any]) -> str:
    """An architecture's key in an IsoFLOP study's planned samples: its dimensions, then its choices
    ('64-2-4-256'), so a best JSON's architecture replays the same data."""
    choices = arch.get("choices") or {}
    tail = [f"{k}={choices[k]}" for k in sorted(choices)]
    return "-".join([*(str(int(arch[k])) for k in ARCH_KEYS), *tail])
