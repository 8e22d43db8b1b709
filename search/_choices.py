"""A study's architecture rows (search/_study.py's prepare_settings): the family options split into
scalars and categorical choices, and per combination of choices the budget's grid or the pinned rows."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from archhpo.budgets import GridRow, build_grid, candidates, pinned_grid, require_rows
from archhpo.errors import ConfigError, StudyError
from archhpo.models import Family


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
