"""An IsoFLOP study's settings: one study per compute budget C (``--isoflop C``), planned by
budgets/_isoflop.py and stored like every study (so launching twice never duplicates it).

Each C's study holds only the architectures its planner chose (the sizes' grid rows, K per size
with ``--shapes K``), one phase-1 trial each, all trained with one set of training parameters (the
stated ones over the space's defaults, as a paired study's) and never stopped early. Each trial's
data is its own: the whole samples that put its FLOPs within 1% of C, stored per architecture in the
study's options (the ``isoflop`` record, which the worker reads) and on the trial as the user
attributes compute_budget, param_count, train_tokens and isoflop_size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from archhpo.budgets._isoflop import IsoflopPlan, plan_isoflops
from archhpo.config import Placement, StoredOptions, StudyConfig, stored_options
from archhpo.errors import ArchhpoError, StudyError
from archhpo.models import get_family
from archhpo.schema import DEFAULT_INTERVALS, isoflop_key
from archhpo.search._choices import _split_choices
from archhpo.search._plan import PlanEntry
from archhpo.search._settings import StudySettings
from archhpo.search._space import SearchSpace


def compute_label(compute: float) -> str:
    """A compute budget's study label: 1e13 -> 'C1e13', 3e12 -> 'C3e12', 1.5e13 -> 'C1.5e13'."""
    return "C" + f"{float(compute):.3g}".replace("+", "")


def isoflop_settings(config: StudyConfig, law: Mapping[str, Any] | None = None) -> list[StudySettings]:
    """One StudySettings per ``--isoflop C`` of `config`, in increasing C, touching no database;
    `law` an earlier study's fitted ``isoflop_fit`` (--centre-from, read by the command line)."""
    from archhpo.search._study import _data_and_info, _records, _space

    iso = config.isoflop
    if not iso.computes:
        raise StudyError("An IsoFLOP study needs at least one compute budget: give --isoflop C, e.g. --isoflop 1e13.")
    if iso.centre_from and law is None:
        raise StudyError(f"--centre-from {iso.centre_from}: its IsoFLOP law was not read; give --centre instead.")
    if config.param_ranges:
        raise StudyError("An IsoFLOP study trains every size with one set of training parameters; give each "
                         "as one value (--learning-rate 3e-3), not a range.")
    fam = get_family(config.family)
    scalars, choices = _split_choices(config.family_values())
    if choices:
        raise StudyError(f"--isoflop plans one architecture per size, so --{next(iter(choices)).replace('_', '-')} "
                         "takes one value; launch one experiment per value.")
    space, params = _space(fam, config.quick, {"epochs": DEFAULT_INTERVALS, **config.fixed_params}, 1)
    assert params is not None
    options = stored_options(config, Placement(), _records(config, (), (), None), scalars)
    spec, info = _data_and_info(fam, config.data.spec, options, scalars, choices)
    centres = {c: config.isoflop.centre_of(c) for c in iso.computes}
    try:
        plans = plan_isoflops(fam, info, iso.computes, {c: v for c, v in centres.items() if v is not None},
                              sizes=iso.sizes, span=iso.span, law=law, shapes=iso.shapes,
                              intervals=int(params["epochs"]), pins={d: list(v) for d, v in config.pins.items()})
    except ArchhpoError as exc:
        raise StudyError(str(exc)) from None
    return [_settings(config, plan, scalars, spec, info, space, params) for plan in plans]


def _settings(config: StudyConfig, plan: IsoflopPlan, scalars: Mapping[str, Any], spec: dict[str, Any],
              info: dict[str, Any], space: SearchSpace, params: dict[str, Any]) -> StudySettings:
    """The study of one compute budget: its planned rows as the architectures, one trial each."""
    label = compute_label(plan.compute_budget)
    rows = [replace(t.row, arch_idx=i, budget=label) for i, t in enumerate(plan.trials)]
    from archhpo.search._study import _records

    record = {
        "compute_budget": float(plan.compute_budget), "centre": float(plan.centre), "centre_source": plan.centre_source,
        "span": float(plan.span), "sizes": len(plan.targets), "shapes": int(config.isoflop.shapes),
        "samples": {isoflop_key(r.as_dict()): int(t.samples) for r, t in zip(rows, plan.trials, strict=True)}}
    stored = stored_options(config, Placement(), {**_records(config, (), (), None), "isoflop": record}, scalars)
    entries = [PlanEntry(i, 1, i, dict(params), attrs=t.user_attrs()) for i, t in enumerate(plan.trials)]
    return StudySettings(
        experiment=config.experiment, budget=label, budget_value=max(1, round(plan.centre)), family=config.family,
        tolerance=config.tolerance, data=spec, options=StoredOptions.from_dict(stored), info=info,
        archs=[r.as_dict() for r in rows], plan=entries, space=space.as_dict(), n_trials=len(entries),
        pruner="none", choices={}, pins={d: list(v) for d, v in config.pins.items()},
    )


__all__ = ["compute_label", "isoflop_settings"]
