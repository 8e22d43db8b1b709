"""Creating a study with its plan (launch) and everything a worker reads back from it.

One Optuna study per (experiment, budget).  Its user attributes hold all a worker on another
machine needs (family, data spec, task options, the architecture list, the plan), so a worker
needs only the storage URL and the study name.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna
from optuna.storages import RDBStorage

from archhpo.budgets import GridRow, budget_label, parse_budget, pin_label
from archhpo.config import (
    Placement,
    StoredOptions,
    StudyConfig,
    check_experiment,
    family_options_of,
    option_fields,
    stored_options,
)
from archhpo.errors import ArchhpoError, StorageError, StudyError
from archhpo.models import Family, get_family
from archhpo.models._mup import refuse_unchecked
from archhpo.schema import (
    DEFAULT_INTERVALS,
    OBJECTIVE,
    TRAINING_PARAMS,
    Attr,
    DataBudget,
)
from archhpo.search._baselines import BASELINE_RULES
from archhpo.search._choices import _rows, _split_choices
from archhpo.search._confirmation import AT_RUNG_KEY
from archhpo.search._identity import _differences
from archhpo.search._ladder import finalist_slots, ladder_trials
from archhpo.search._optuna_private import rdb_storage_of, study_id_of
from archhpo.search._plan import PlanEntry, ladder_plan, make_plan
from archhpo.search._rules import MedianRule, make_rule
from archhpo.search._settings import (  # the study's record (re-exported: __all__)
    LADDER_KEY,
    StudySettings,
    load_study,
    read_settings,
    settings_attr,
    study_name,
)
from archhpo.search._space import FULL_SPACE, QUICK_SPACE, SearchSpace
from archhpo.search._storage import open_storage, plan_lock, plan_slots_of


def study_label(budget: str | int | None, pins: Mapping[str, Sequence[int]] | None = None) -> str:
    """The budget label of a study's name: '2M'; with pinned dimensions 'd64-L3-h4-ff256' (no
    budget) or '2M-L2+3' (pins within a budget)."""
    parts = [budget_label(budget) if budget not in (None, "") else "", pin_label(pins or {})]
    label = "-".join(p for p in parts if p)
    if not label:
        raise StudyError("Give a --budget (e.g. 2M) or pin the architecture (--d-model 64 --n-layers 3 "
                         "--n-heads 4 --d-ff 256).")
    return label


def make_pruner(name: str, quick: bool) -> optuna.pruners.BasePruner:
    """The study's pruner as an Optuna object, for plain Optuna loops (archhpo's queue applies
    the MedianRule directly)."""
    return optuna.pruners.NopPruner() if name == "none" else MedianRule.for_study(quick).optuna_pruner()


@dataclass(frozen=True)
class LaunchResult:
    settings: StudySettings
    created: bool  # False when an identical study already existed (nothing was duplicated)
    enqueued: int


def prepare_settings(
    config: StudyConfig | str, budget: str | int | None = None, *, ladder_below: Sequence[str] = (),
    **keywords: Any,
) -> StudySettings:
    """Validate one budget of a study and compute its grid and plan, touching no database.

    config: the study (archhpo.config.StudyConfig, checked when it was built) with at most one data
    ratio (StudyConfig.per_ratio splits several); budget: the budget planned (None: pins only);
    ladder_below: the smaller budgets' studies of a --ladder, smallest first (search/_ladder.py
    fills this plan from theirs).  `prepare_settings("exp", "2M", n_trials=6, quick=True, ...)`,
    the keyword form the tests and benchmarks use, builds the config with `keyword_config`.
    """
    if not isinstance(config, StudyConfig):
        config = keyword_config(config, **keywords)
    elif keywords:
        raise TypeError(f"prepare_settings(StudyConfig, ...) takes no study keywords: {', '.join(keywords)}")
    pins = {dim: list(values) for dim, values in config.pins.items()}
    label, value = study_label(budget, pins), parse_budget(budget) if budget not in (None, "") else None
    rules = tuple(BASELINE_RULES) if config.confirm.baselines else ()
    fam = get_family(config.family)
    refuse_unchecked(config.family, config.parametrization)  # µP only where its coordinate check passed
    data_budget = _data_budget(fam, *config.data.ratio, value)
    fixed_params = dict(config.fixed_params)
    if data_budget is not None:
        label = f"{label}-{data_budget.label}"
        fixed_params = {"epochs": DEFAULT_INTERVALS, **fixed_params}
    scalars, choices = _split_choices(config.family_values())
    largest = _ladder_largest(config, value)
    options = stored_options(config, Placement(tuple(ladder_below), largest, value),
                             _records(config, ladder_below, rules, data_budget), scalars)
    probe = tuple(options.get("lr_probe", ()))  # --lr-probe's factors: below the ladder's largest only
    spec, info = _data_and_info(fam, config.data.spec, options, scalars, choices)
    rows = _rows(fam, info, choices, pins, label, value, config.tolerance)
    space, study_params = _space(fam, config.quick, fixed_params, config.paired_seeds, config.param_ranges)
    plan = _study_plan(rows, config, space, study_params, len(ladder_below), rules, probe, largest)
    return StudySettings(
        experiment=config.experiment, budget=label, budget_value=value or 0, family=config.family,
        tolerance=config.tolerance, data=spec, options=StoredOptions.from_dict(options), info=info,
        archs=[r.as_dict() for r in rows], plan=plan,
        space=space.as_dict(), n_trials=config.trials, pruner=config.pruning.rule, choices=choices, pins=pins,
    )


# prepare_settings' keyword form: its keywords that are named otherwise among the options.
_KEYWORD_OPTIONS = {"n_trials": "trials", "confirm_seeds": "seeds", "compile_models": "compile"}


def keyword_config(
    experiment: str, *, family_options: Mapping[str, Any] | None = None,
    pins: Mapping[str, Any] | None = None, fixed_params: Mapping[str, Any] | None = None,
    param_ranges: Mapping[str, tuple[float, float]] | None = None, tokens_per_param: float | None = None, samples_per_param: float | None = None, **options: Any,
) -> StudyConfig:
    """The StudyConfig of prepare_settings' keyword form (n_trials=, confirm_seeds=, compile_models=,
    a single tokens_per_param / samples_per_param; every other keyword is an option's name)."""
    values = {_KEYWORD_OPTIONS.get(k, k): v for k, v in options.items()}
    unknown = sorted(set(values) - set(option_fields()))
    if unknown:
        raise TypeError(f"prepare_settings() got unexpected keywords: {', '.join(unknown)}")
    ratios = {"tokens_per_param": tokens_per_param, "samples_per_param": samples_per_param}
    values.update({k: [r] for k, r in ratios.items() if r is not None}, experiment=experiment)
    config = StudyConfig.from_options(values)
    family = None
    if family_options:
        family = family_options_of(config.family, get_family(config.family).flags, family_options)
    return replace(config, pins=dict(pins or {}), fixed_params=dict(fixed_params or {}),
                   param_ranges=dict(param_ranges or {}), family_options=family)


def _ladder_largest(config: StudyConfig, budget: int | None) -> bool:
    """Whether `budget` is its ladder's largest (no budget above reads what it measures)."""
    return budget is not None and budget >= max((parse_budget(b) for b in config.budgets), default=budget)


def _study_plan(rows: list[GridRow], config: StudyConfig, space: SearchSpace, study_params: dict[str, Any] | None,
                ladder_step: int, baselines: Sequence[str], lr_probe: Sequence[float] = (),
                largest: bool = False) -> list[PlanEntry]:
    """The design's plan, or a ladder budget's (`ladder_step` > 0: filled once the smaller are final);
    under --carry-finalists the ladder's `largest` budget has one phase-1 slot per architecture the
    rule can carry (search/_ladder.py `finalist_slots`)."""
    confirm, seeds = config.confirm.top, config.confirm.seeds
    if not ladder_step:
        return make_plan(rows, config.trials, space, config.seed, paired_seeds=config.paired_seeds,
                         study_params=study_params, confirm=confirm, confirm_seeds=seeds, baselines=baselines,
                         lr_probe=lr_probe)
    if config.paired_seeds:
        raise StudyError("--ladder plans larger budgets from the smaller ones' winners; a paired study "
                         "trains every configuration anyway: drop --ladder or --paired-seeds.")
    n_ext = sum(1 for r in rows if r.extreme)
    n_trials = ladder_trials(config.trials, ladder_step, n_ext, n_archs=len(rows))
    if config.pruning.carry_finalists and largest:
        n_trials = finalist_slots(n_ext, len(rows))  # the finalists and the extremes, once each
    return ladder_plan(n_trials, confirm, seeds, baselines, lr_probe)


def _data_budget(fam: Family, tokens: float | None, samples: float | None, budget: int | None) -> DataBudget | None:
    """The study's data per parameter, or None (whole epochs); refused where it cannot apply."""
    if tokens is None and samples is None:
        return None
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


def _records(config: StudyConfig, ladder_below: Sequence[str], baselines: Sequence[str],
             data_budget: DataBudget | None) -> dict[str, Any]:
    """What the planner stores beside the settings (archhpo.config.RECORDS): the stopping rule's
    settings, a ladder budget's smaller studies, the baselines' rules and the data per parameter."""
    records: dict[str, Any] = dict(make_rule(config).study_options())  # the stopping rule's (search/_rules.py)
    if ladder_below:
        records["ladder"] = {"below": list(ladder_below)}
    if baselines:
        records["baselines"] = list(baselines)
    if data_budget is not None:
        records[DataBudget.OPTION] = data_budget.as_option()
    return records


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
    ranges: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[SearchSpace, dict[str, Any] | None]:
    """The study's search space (its learning-rate range moved onto the family's own rate where it
    lies outside, `SearchSpace.bracketing`; stated ranges replacing the default ones, fixed
    parameters one point), and for a paired study the one set of training parameters."""
    space = (QUICK_SPACE if quick else FULL_SPACE).bracketing(fam.train_defaults.get("learning_rate"))
    space = space.within(ranges or {}).fixed(fixed_params)
    if not paired_seeds:
        return space, None
    # one set of training parameters for every configuration and seed
    family_defaults = {k: v for k, v in fam.train_defaults.items() if k in TRAINING_PARAMS and not quick}
    space = space.fixed({**space.default(), **family_defaults, **fixed_params})
    return space, space.default()  # exactly the values the distributions hold


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
            if study.metric_names is None:  # the dashboard names the objective, not "Objective 0"
                study.set_metric_names([OBJECTIVE])
        if study.direction != optuna.study.StudyDirection.MINIMIZE:
            raise StudyError(f"Study {name!r} exists but maximises; use another --experiment name.")
        attrs = study.user_attrs
        created = settings_attr("plan") not in attrs
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


def centre_first(plan: Sequence[PlanEntry]) -> list[PlanEntry]:
    """The plan in queue order: as planned, except an IsoFLOP plan's sizes (`isoflop_size`), queued
    from the middle size outwards (the smaller first at equal distance), so that a study stopped
    early, or trained only where affordable, holds the sizes around its centre: an extrapolation's
    N* before its flanks. The slots, and so the stored plan, are unchanged."""
    found = [(e.attrs or {}).get("isoflop_size") for e in plan]
    sizes = [int(s) for s in found if s is not None]
    if not sizes or len(sizes) < len(found):
        return list(plan)
    middle = (max(sizes) + min(sizes)) / 2
    return [e for _, e in sorted(zip(sizes, plan, strict=True), key=lambda p: (abs(p[0] - middle), p[0]))]


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
    which its phase-1 slots wait; a slot the stored record leaves out (beyond the region's size) is
    skipped, never enqueued (search/_status._never_filled counts it final)."""
    have = planned_slots(study)
    by_rank = {int(r["rank"]): r for r in ranks or []}
    by_slot = {int(a["slot"]): a for a in (ladder or {}).get("assignments", [])}
    n = 0
    for entry in centre_first(settings.plan):
        if entry.phase != phase or entry.slot in have:
            continue
        arch_idx, training = entry.arch_idx, entry.params if entry.params is not None else params
        if entry.phase == 1 and arch_idx is None:  # a ladder budget's slot
            if entry.slot not in by_slot:
                continue  # no record yet (it waits), or skipped by the record: one slot per region architecture
            arch_idx, training = by_slot[entry.slot]["arch_idx"], by_slot[entry.slot]["params"]
        if entry.phase == 3:
            assigned = by_rank.get(int(entry.rank or 0))
            if assigned is None:
                continue  # fewer architectures finished than --confirm asked for
            arch_idx, training = assigned["arch_idx"], assigned["params"]
        if training is None or arch_idx is None:
            raise StudyError(f"Phase-{phase} entry {entry.slot} has no architecture or training parameters.")
        attrs: dict[str, Any] = {**(entry.attrs or {}), "plan_slot": entry.slot, "phase": entry.phase, "attempt": 1}
        if entry.seed is not None:
            attrs["seed"] = entry.seed
        if entry.rank is not None:
            attrs["rank"] = entry.rank
        if entry.baseline is not None:
            attrs["baseline"] = entry.baseline
        if entry.lr_probe is not None:
            attrs[Attr.LR_PROBE] = entry.lr_probe
        at_rung = by_rank[int(entry.rank or 0)].get(AT_RUNG_KEY) if entry.phase == 3 else None
        if at_rung is not None:  # --confirm-at-rung, where the budget trusts a rung
            attrs[Attr.CONFIRM_RUNG] = int(at_rung)
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
        if attrs.get(settings_attr("experiment")) == experiment and settings_attr("plan") in attrs:
            found.append((attrs.get(settings_attr("budget_value"), 0), summary.study_name))
    return [name for _, name in sorted(found)]


__all__ = [
    "LaunchResult",
    "MedianRule",
    "StorageError",
    "StudyError",
    "StudySettings",
    "check_experiment",
    "experiment_studies",
    "keyword_config",
    "launch",
    "load_study",
    "make_pruner",
    "open_study",
    "prepare_settings",
    "read_settings",
    "study_label",
    "study_name",
]
