"""Creating a study with its plan (launch) and everything a worker reads back from it.

One Optuna study per (experiment, budget).  Its user attributes hold all a worker on another
machine needs (family, data spec, task options, the architecture list, the plan), so a worker
needs only the storage URL and the study name.
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from optuna.storages import RDBStorage

from archhpo._options import default as _default
from archhpo.budgets import (
    ARCH_DIMS,
    GridRow,
    budget_label,
    build_grid,
    candidates,
    check_tolerance,
    parse_budget,
    pin_label,
    pinned_grid,
    require_rows,
)
from archhpo.errors import ArchhpoError, BudgetError, ConfigError, StorageError, StudyError
from archhpo.models import Family, get_family
from archhpo.schema import DEFAULT_INTERVALS, PRUNERS, TRAINING_PARAMS, Attr, DataBudget, schedule_options
from archhpo.search._baselines import BASELINE_RULES
from archhpo.search._halving import Halving, parse_fraction
from archhpo.search._ladder import ladder_trials
from archhpo.search._optuna_private import rdb_storage_of, study_id_of
from archhpo.search._plan import PlanEntry, ladder_plan, make_plan
from archhpo.search._space import FULL_SPACE, QUICK_SPACE, SearchSpace
from archhpo.search._storage import open_storage, plan_lock, plan_slots_of

SCHEMA_VERSION = 1
LADDER_KEY = "archhpo_ladder"  # a ladder budget's carried values and phase-1 assignments (search/_ladder.py)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")



def study_name(experiment: str, budget: str) -> str:
    return f"{experiment}_{budget}"


def study_label(budget: str | int | None, pins: Mapping[str, Sequence[int]] | None = None) -> str:
    """The budget label of a study's name: '2M'; with pinned dimensions 'd64-L3-h4-ff256' (no
    budget) or '2M-L2+3' (pins within a budget)."""
    parts = [budget_label(budget) if budget not in (None, "") else "", pin_label(pins or {})]
    label = "-".join(p for p in parts if p)
    if not label:
        raise StudyError("Give a --budget (e.g. 2M) or pin the architecture (--d-model 64 --n-layers 3 "
                         "--n-heads 4 --d-ff 256).")
    return label


def check_experiment(name: str) -> str:
    if not _NAME.match(name):
        raise StudyError(
            f"Experiment name {name!r} must start with a letter or digit and use only letters, digits, "
            "'_', '.' and '-'; pick another --experiment."
        )
    return name


@dataclass
class StudySettings:
    """What `launch` stores in the study; the single source of truth for every worker."""

    experiment: str
    budget: str
    budget_value: int
    family: str
    tolerance: float
    data: dict[str, Any]
    options: dict[str, Any]  # horizon, threshold, quick, seed (+ family options)
    info: dict[str, Any]  # data shape facts the family's config needs
    archs: list[dict[str, Any]]  # GridRow dicts, indexed by arch_idx
    plan: list[dict[str, Any]]  # PlanEntry dicts
    space: dict[str, Any]
    n_trials: int
    pruner: str = "median"
    schema: int = SCHEMA_VERSION
    phase2_params: dict[str, Any] | None = field(default=None)
    # Categorical grid dimensions ({"encoder": ["sum", "linear"]}); each arch row has its "choices".
    choices: dict[str, list[Any]] = field(default_factory=dict)
    # Pinned architecture dimensions ({"d_model": [64], "n_layers": [2, 3]}); {} for a plain budget.
    pins: dict[str, list[int]] = field(default_factory=dict)
    # Phase 3 (confirmation), set by plan upkeep once phases 1-2 are final:
    # [{"rank": k, "arch_idx": i, "params": {...}, "selection_value": v, "trial": n}] (missing ranks:
    # fewer architectures finished than --confirm asked for; their slots are skipped).
    phase3: list[dict[str, Any]] | None = field(default=None)

    @property
    def study_name(self) -> str:
        return study_name(self.experiment, self.budget)

    @property
    def search_space(self) -> SearchSpace:
        return SearchSpace.from_dict(self.space)

    def to_attrs(self) -> dict[str, Any]:
        return {f"archhpo_{k}": v for k, v in self.__dict__.items()}

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], name: str) -> StudySettings:
        fields = {k[len("archhpo_"):]: v for k, v in attrs.items() if k.startswith("archhpo_")}
        if "plan" not in fields:
            raise StudyError(
                f"Study {name!r} was not created by `archhpo launch` (it has no plan); "
                "launch it first or check --experiment/--budget."
            )
        if fields.get("schema", 0) > SCHEMA_VERSION:
            raise StudyError(f"Study {name!r} was written by a newer archhpo; upgrade archhpo on this machine.")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in fields.items() if k in known})


@dataclass(frozen=True)
class MedianRule:
    """Optuna's median rule (MedianPruner's), defined once: stop a trial at epoch `step` when
    its best loss so far is worse than the median of the COMPLETE trials' losses at that epoch,
    once `n_startup_trials` of them have a value there and from epoch `n_warmup_steps` on.

    The queue applies it in one query (search/_queue.py: asking MedianPruner itself reloads
    every trial of the study on each report); `optuna_pruner` is the same rule for a plain
    Optuna loop (the baseline in bench/).  Which trials it may judge at all: `prunable`."""

    n_startup_trials: int = 5  # finished trials before the median means anything
    n_warmup_steps: int = 10  # never before the model had a fair start

    @classmethod
    def for_study(cls, quick: bool) -> MedianRule:
        return cls(n_warmup_steps=1) if quick else cls()

    def stops(self, step: int, best: float, completed: Sequence[float]) -> bool:
        """`completed`: the finite values of the COMPLETE trials at `step`, sorted."""
        if step < self.n_warmup_steps or len(completed) < self.n_startup_trials:
            return False
        return best > _sorted_median(completed)

    def optuna_pruner(self) -> optuna.pruners.MedianPruner:
        return optuna.pruners.MedianPruner(n_startup_trials=self.n_startup_trials,
                                           n_warmup_steps=self.n_warmup_steps)


def _sorted_median(values: Sequence[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def make_pruner(name: str, quick: bool) -> optuna.pruners.BasePruner:
    """The study's pruner as an Optuna object, for plain Optuna loops (archhpo's queue applies
    the MedianRule directly)."""
    return optuna.pruners.NopPruner() if name == "none" else MedianRule.for_study(quick).optuna_pruner()


def load_study(storage: RDBStorage, name: str) -> optuna.Study:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            # The plan fixes every parameter, so the sampler never chooses: random is the cheapest.
            return optuna.load_study(study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler())
        except KeyError:
            raise StudyError(
                f"No study named {name!r} in this storage; run `archhpo launch` with the same "
                "--experiment, --budget and --storage first."
            ) from None


def read_settings(storage: RDBStorage, name: str) -> StudySettings:
    return StudySettings.from_attrs(load_study(storage, name).user_attrs, name)


@dataclass(frozen=True)
class LaunchResult:
    settings: StudySettings
    created: bool  # False when an identical study already existed (nothing was duplicated)
    enqueued: int


def prepare_settings(
    experiment: str, budget: str | int | None = None, *, family: str = _default("family"),
    n_trials: int = _default("trials"), data: str = _default("data"), horizon: int = _default("horizon"),
    threshold: float = _default("threshold"), seed: int = _default("seed"), quick: bool = _default("quick"),
    tolerance: float = _default("tolerance"), pruner: str = _default("pruner"),
    family_options: Mapping[str, Any] | None = None, pins: Mapping[str, int | Sequence[int]] | None = None,
    fixed_params: Mapping[str, Any] | None = None, paired_seeds: int = _default("paired_seeds"),
    confirm: int = _default("confirm"), confirm_seeds: int = _default("seeds"),
    schedule: str = _default("schedule"), cooldown: float = _default("cooldown"), eta: int = _default("eta"),
    min_fraction: str = _default("min_fraction"), ladder_below: Sequence[str] = (),
    baselines: bool = _default("baselines"), compile_models: bool = _default("compile"),
    tokens_per_param: float | None = None, samples_per_param: float | None = None, data_seed: int | None = None,
) -> StudySettings:
    """Validate everything and compute the grid and plan, touching no database.

    family_options: a family flag's value or a list of values (a categorical grid dimension); pins:
    architecture dimensions fixed to a value or a list; fixed_params: training parameters every trial
    uses; paired_seeds: S > 0 trains every configuration with seeds 0..S-1 (no phase 2); confirm,
    confirm_seeds: retrain the `confirm` best architectures with `confirm_seeds` seeds; schedule,
    cooldown, eta, min_fraction: stored in the options under wsd / halving; ladder_below: the smaller
    budgets' studies of a --ladder, smallest first (search/_ladder.py fills this plan from theirs);
    baselines: also train the shapes of search/_baselines.py's rules with the confirmation seeds;
    compile_models: every trial's model is compiled (``torch.compile``; stored only when on);
    tokens_per_param / samples_per_param: every trial trains on R x the budget's N tokens (samples),
    and the study's name ends in '-tR' ('-sR'); data_seed: the data of every trial, paired or
    confirmation trials included (None: the study seed's, or a paired seed's).
    """
    check_experiment(experiment)
    pins = _normalise_pins(pins or {})
    label, value = study_label(budget, pins), parse_budget(budget) if budget not in (None, "") else None
    _check_study_options(tolerance, horizon, pruner, paired_seeds, confirm, confirm_seeds)
    rules = _baseline_rules(baselines, confirm)
    fam = get_family(family)
    data_budget = _data_budget(fam, tokens_per_param, samples_per_param, value)
    if data_budget is not None:
        label = f"{label}-{data_budget.label}"
        fixed_params = {"epochs": DEFAULT_INTERVALS, **dict(fixed_params or {})}
    scalars, choices = _split_choices(family_options or {})
    halving = Halving(eta, parse_fraction(min_fraction)) if pruner == "halving" else None
    options: dict[str, Any] = {
        "horizon": horizon, "threshold": threshold, "quick": quick, "seed": seed, **scalars,
        **_training_options(paired_seeds, confirm, confirm_seeds, schedule, cooldown, halving),
        **({"ladder": {"below": list(ladder_below)}} if ladder_below else {}),
        **({"baselines": list(rules)} if rules else {}),
        **({"compile": True} if compile_models else {}),
        **({DataBudget.OPTION: data_budget.as_option()} if data_budget is not None else {}),
        **({"data_seed": int(data_seed)} if data_seed is not None else {})}
    spec, info = _data_and_info(fam, data, options, scalars, choices)
    rows = _rows(fam, info, choices, pins, label, value, tolerance)
    space, study_params = _space(fam, quick, dict(fixed_params or {}), paired_seeds)
    plan = _study_plan(rows, n_trials, space, seed, paired_seeds, study_params, confirm, confirm_seeds,
                       len(ladder_below), rules)
    return StudySettings(
        experiment=experiment, budget=label, budget_value=value or 0, family=family,
        tolerance=tolerance, data=spec, options=options, info=info,
        archs=[r.as_dict() for r in rows], plan=[e.as_dict() for e in plan],
        space=space.as_dict(), n_trials=n_trials, pruner=pruner, choices=choices, pins=pins,
    )


def _study_plan(rows: list[GridRow], n_trials: int, space: SearchSpace, seed: int, paired_seeds: int,
                study_params: dict[str, Any] | None, confirm: int, confirm_seeds: int, ladder_step: int,
                baselines: Sequence[str]) -> list[PlanEntry]:
    """The design's plan, or a ladder budget's (`ladder_step` > 0: filled once the smaller are final)."""
    if not ladder_step:
        return make_plan(rows, n_trials, space, seed, paired_seeds=paired_seeds, study_params=study_params,
                         confirm=confirm, confirm_seeds=confirm_seeds, baselines=baselines)
    if paired_seeds:
        raise StudyError("--ladder plans larger budgets from the smaller ones' winners; a paired study "
                         "trains every configuration anyway: drop --ladder or --paired-seeds.")
    n_ext = sum(1 for r in rows if r.extreme)
    return ladder_plan(ladder_trials(n_trials, ladder_step, n_ext), confirm, confirm_seeds, baselines)


def _data_budget(fam: Family, tokens: float | None, samples: float | None, budget: int | None) -> DataBudget | None:
    """The study's data per parameter, or None (whole epochs); refused where it cannot apply."""
    if tokens is None and samples is None:
        return None
    if tokens is not None and samples is not None:
        raise StudyError("Give --tokens-per-param or --samples-per-param, not both.")
    if tokens is not None and fam.data_unit != "tokens":
        raise StudyError(f"The {fam.name} family trains on samples, not tokens: state its data with "
                         f"--samples-per-param R (R training samples per parameter of the budget).")
    if samples is not None and fam.data_unit == "tokens":
        raise StudyError(f"The {fam.name} family trains on tokens: state its data with --tokens-per-param R.")
    if not budget:
        raise StudyError("--tokens-per-param and --samples-per-param scale the data with the budget's N: give "
                         "a --budget (pins may narrow it).")
    unit, ratio = ("tokens", tokens) if tokens is not None else ("samples", samples)
    try:
        return DataBudget(unit, float(ratio), int(budget))  # type: ignore[arg-type]
    except ArchhpoError as exc:
        raise StudyError(str(exc)) from None


def _baseline_rules(baselines: bool, confirm: int) -> tuple[str, ...]:
    """The rules --baselines trains; they pair seed by seed with the confirmed best, so they need --confirm."""
    if not baselines:
        return ()
    if not confirm:
        raise StudyError("--baselines compares rule-picked shapes with the searched best seed by seed, so it "
                         "needs the confirmation phase: add --confirm 1 (or more) and --seeds 3 (or more).")
    return tuple(BASELINE_RULES)


def _training_options(paired_seeds: int, confirm: int, confirm_seeds: int, schedule: str, cooldown: float,
                      halving: Halving | None) -> dict[str, Any]:
    """The options that shape how trials are trained and stopped; only those set are stored, so a
    study that uses none of them keeps its identity."""
    options: dict[str, Any] = {}
    if paired_seeds:
        options["paired_seeds"] = paired_seeds
    if confirm:
        options.update(confirm=confirm, confirm_seeds=confirm_seeds)
    options.update(schedule_options(schedule, cooldown))
    if halving is not None:
        halving.check_schedule(schedule, cooldown)
        options["halving"] = halving.as_option()
    return options


def _check_study_options(tolerance: float, horizon: int, pruner: str, paired_seeds: int, confirm: int,
                         confirm_seeds: int) -> None:
    check_tolerance(tolerance)
    if horizon < 1:
        raise BudgetError(f"--horizon must be at least 1 step, got {horizon}.")
    if pruner not in PRUNERS:
        raise StudyError(f"Unknown pruner {pruner!r}; choose one of: {', '.join(PRUNERS)}.")
    _check_seeds(paired_seeds, confirm, confirm_seeds)


def _data_and_info(
    fam: Family, data: str, options: Mapping[str, Any], scalars: Mapping[str, Any], choices: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data spec and its info; a choice (list of values) may not be a flag that shapes the data."""
    spec = fam.parse_data(data, options)
    info = fam.data_info(spec, options)
    for key in choices:
        if key in info:
            raise StudyError(
                f"--{key.replace('_', '-')} shapes the data, so it takes one value per study; launch one "
                "study per value (e.g. under different --experiment names)."
            )
    for key, choice in scalars.items():
        info.setdefault(key, choice)  # model-only choices (variant, encoder); the data wins on shapes
    return spec, info


def _space(
    fam: Family, quick: bool, fixed_params: dict[str, Any], paired_seeds: int,
) -> tuple[SearchSpace, dict[str, Any] | None]:
    """The study's search space, and for a paired study the one set of training parameters."""
    space = (QUICK_SPACE if quick else FULL_SPACE).fixed(fixed_params)
    if not paired_seeds:
        return space, None
    # one set of training parameters for every configuration and seed
    family_defaults = {k: v for k, v in fam.train_defaults.items() if k in TRAINING_PARAMS and not quick}
    space = space.fixed({**space.default(), **family_defaults, **fixed_params})
    return space, space.default()  # exactly the values the distributions hold


def _normalise_pins(pins: Mapping[str, int | Sequence[int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for dim, values in pins.items():
        if dim not in ARCH_DIMS:
            raise StudyError(f"Cannot pin {dim!r}; pin one of: {', '.join(ARCH_DIMS)}.")
        if values is None:
            continue
        items = [values] if isinstance(values, int) else list(values)
        if items:
            out[dim] = sorted(set(items))
    return out


def _check_seeds(paired_seeds: int, confirm: int, confirm_seeds: int) -> None:
    if paired_seeds < 0 or confirm < 0:
        raise BudgetError("--paired-seeds and --confirm must be 0 (off) or positive.")
    if confirm and confirm_seeds < 1:
        raise BudgetError(f"--seeds must be at least 1 with --confirm, got {confirm_seeds}.")
    if paired_seeds and confirm:
        raise BudgetError(
            "A paired study already trains every configuration with every seed; use --paired-seeds or "
            "--confirm, not both."
        )


def _split_choices(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Family options: scalars, and lists of two or more values (categorical grid dimensions)."""
    scalars: dict[str, Any] = {}
    choices: dict[str, list[Any]] = {}
    for key, v in values.items():
        if isinstance(v, list):
            if len(v) != len(set(map(repr, v))):
                raise StudyError(f"--{key.replace('_', '-')} lists a value twice ({v}); give each value once.")
            if len(v) == 1:
                scalars[key] = v[0]
            elif v:
                choices[key] = list(v)
        else:
            scalars[key] = v
    return scalars, choices


def _check_choice(fam: Family, info: Mapping[str, Any], combo: Mapping[str, Any]) -> None:
    """A clear error for a choice value the family rejects (e.g. an unknown encoder)."""
    first: ConfigError | None = None
    for arch in candidates():
        try:
            fam.config_for(arch, {**info, **combo})
            return
        except ConfigError as exc:
            first = first or exc
    what = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in combo.items())
    raise ConfigError(f"{what}: {first}")


def _rows(
    fam: Family, info: Mapping[str, Any], choices: Mapping[str, list[Any]], pins: Mapping[str, list[int]],
    label: str, budget: int | None, tolerance: float,
) -> list[GridRow]:
    """The study's architecture rows: per combination of choices, the budget's grid or the pinned
    rows, with their choices; arch_idx runs over all of them (choice-major)."""
    combos = [dict(zip(choices, vals, strict=True)) for vals in itertools.product(*choices.values())] or [{}]
    rows: list[GridRow] = []
    for combo in combos:
        if combo:
            _check_choice(fam, info, combo)
        merged = {**info, **combo}
        what = fam.name + (" (" + ", ".join(f"{k}={v}" for k, v in combo.items()) + ")" if combo else "")
        if pins:
            part = pinned_grid(fam, merged, pins, label, budget, tolerance)
        else:
            assert budget is not None
            part = require_rows(build_grid(fam, budget, merged, tolerance), budget, tolerance, what)
        rows += [replace(r, arch_idx=len(rows) + i, budget=label, choices=dict(combo)) for i, r in enumerate(part)]
    return rows


# Settings that must agree when a study is launched again (data may be re-resolved to the
# same absolute path; everything that changes the plan or the results must match).
_IDENTITY = ("family", "tolerance", "data", "options", "n_trials", "pruner", "budget_value", "choices", "pins",
             "space")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _differences(stored: StudySettings, new: StudySettings) -> list[str]:
    """'n_trials: stored 4, now 6' for each identity setting that differs (a dict such as
    `options` by its differing keys), so a refused relaunch shows what to repeat."""
    out = []
    for key in _IDENTITY:
        old, now = getattr(stored, key), getattr(new, key)
        if old == now:
            continue
        if isinstance(old, dict) and isinstance(now, dict):
            for k in sorted(set(old) | set(now), key=str):
                if old.get(k) != now.get(k):
                    out.append(f"{key}.{k}: stored {_short(old.get(k))}, now {_short(now.get(k))}")
        else:
            out.append(f"{key}: stored {_short(old)}, now {_short(now)}")
    return out


def launch(storage_url: str, settings: StudySettings, storage: RDBStorage | None = None) -> LaunchResult:
    """Create the study and enqueue phase 1, or reload it; launching twice never duplicates."""
    storage = storage or open_storage(storage_url)
    name = settings.study_name
    with plan_lock(storage, name):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(
                study_name=name, storage=storage, direction="minimize", load_if_exists=True,
                sampler=optuna.samplers.RandomSampler(),
            )
        if study.direction != optuna.study.StudyDirection.MINIMIZE:
            raise StudyError(f"Study {name!r} exists but maximises; use another --experiment name.")
        attrs = study.user_attrs
        created = "archhpo_plan" not in attrs
        if created:
            for key, value in settings.to_attrs().items():
                study.set_user_attr(key, value)
            stored = settings
        else:
            stored = StudySettings.from_attrs(attrs, name)
            diffs = _differences(stored, settings)
            if diffs:
                raise StudyError(
                    f"Study {name!r} already exists with different settings ({'; '.join(diffs)}); "
                    "launch under a new --experiment name or repeat the original options."
                )
        enqueued = enqueue_missing(study, stored, phase=1, ladder=attrs.get(LADDER_KEY))
    return LaunchResult(stored, created, enqueued)


def planned_slots(study: optuna.Study) -> set[int]:
    rdb = rdb_storage_of(study)
    if rdb is not None:  # one light query (loading every trial took seconds at 10,000 trials)
        return plan_slots_of(rdb, study_id_of(study))
    return {
        int(t.user_attrs[Attr.PLAN_SLOT])
        for t in study.get_trials(deepcopy=False)
        if Attr.PLAN_SLOT in t.user_attrs
    }


def enqueue_missing(
    study: optuna.Study,
    settings: StudySettings,
    phase: int,
    params: dict[str, Any] | None = None,
    ranks: list[dict[str, Any]] | None = None,
    ladder: Mapping[str, Any] | None = None,
) -> int:
    """Enqueue every plan entry of `phase` that has no trial yet (call under plan_lock).

    params: phase 2's training parameters; ranks: phase 3's assignments (StudySettings.phase3),
    whose missing ranks are skipped; ladder: a ladder budget's phase-1 assignments (by slot), without
    which its phase-1 slots wait."""
    have = planned_slots(study)
    by_rank = {int(r["rank"]): r for r in ranks or []}
    by_slot = {int(a["slot"]): a for a in (ladder or {}).get("assignments", [])}
    n = 0
    for entry in map(lambda d: PlanEntry(**d), settings.plan):
        if entry.phase != phase or entry.slot in have:
            continue
        arch_idx, training = entry.arch_idx, entry.params if entry.params is not None else params
        if entry.phase == 1 and arch_idx is None:  # a ladder budget's slot
            if entry.slot not in by_slot:
                continue
            arch_idx, training = by_slot[entry.slot]["arch_idx"], by_slot[entry.slot]["params"]
        if entry.phase == 3:
            assigned = by_rank.get(int(entry.rank or 0))
            if assigned is None:
                continue  # fewer architectures finished than --confirm asked for
            arch_idx, training = assigned["arch_idx"], assigned["params"]
        if training is None or arch_idx is None:
            raise StudyError(f"Phase-{phase} entry {entry.slot} has no architecture or training parameters.")
        attrs: dict[str, Any] = {"plan_slot": entry.slot, "phase": entry.phase, "attempt": 1}
        if entry.seed is not None:
            attrs["seed"] = entry.seed
        if entry.rank is not None:
            attrs["rank"] = entry.rank
        if entry.baseline is not None:
            attrs["baseline"] = entry.baseline
        study.enqueue_trial({"arch_idx": arch_idx, **training}, user_attrs=attrs)
        n += 1
    return n


def open_study(storage_url: str, experiment: str, budget: str) -> tuple[RDBStorage, optuna.Study, StudySettings]:
    name = study_name(check_experiment(experiment), budget_label(budget))
    storage = open_storage(storage_url, create=False)
    study = load_study(storage, name)
    return storage, study, StudySettings.from_attrs(study.user_attrs, name)


def experiment_studies(storage: RDBStorage, experiment: str) -> list[str]:
    """Names of every archhpo study of this experiment in the storage, smallest budget first."""
    found = []
    # get_all_studies, not get_all_study_summaries: the summaries load every trial of every study.
    for summary in storage.get_all_studies():
        attrs = summary.user_attrs
        if attrs.get("archhpo_experiment") == experiment and "archhpo_plan" in attrs:
            found.append((attrs.get("archhpo_budget_value", 0), summary.study_name))
    return [name for _, name in sorted(found)]


__all__ = [
    "LaunchResult",
    "MedianRule",
    "StorageError",
    "StudyError",
    "StudySettings",
    "check_experiment",
    "experiment_studies",
    "launch",
    "load_study",
    "make_pruner",
    "open_study",
    "prepare_settings",
    "read_settings",
    "study_label",
    "study_name",
]
