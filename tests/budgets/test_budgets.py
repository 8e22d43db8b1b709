"""Budget parsing and the docs/design.md §3 grid: exact counts, tolerance, stable indices, extremes."""

from __future__ import annotations

import json

import pytest
import torch

from archhpo.budgets import (
    D_MODELS,
    N_LAYERS,
    budget_label,
    build_grid,
    candidates,
    format_budget,
    parse_budget,
)
from archhpo.errors import BudgetError
from archhpo.models import get_family
from tests.conftest import run_cli

FAM = get_family("patchtst")
INFO = {"num_features": 8}


@pytest.mark.parametrize(
    ("text", "value"),
    [("2M", 2_000_000), ("20m", 20_000_000), ("200M", 200_000_000), ("2B", 2_000_000_000),
     ("500K", 500_000), ("1.5B", 1_500_000_000), ("123456", 123_456), (" 2M ", 2_000_000), (7, 7)],
)
def test_parse_budget_accepts_documented_forms(text: str | int, value: int) -> None:
    assert parse_budget(text) == value


@pytest.mark.parametrize("text", ["", "2Q", "M", "-2M", "0", "2.5.1M", "two million", "2 M B"])
def test_parse_budget_rejects_garbage_with_a_hint(text: str) -> None:
    with pytest.raises(BudgetError, match="2M|positive"):
        parse_budget(text)


@pytest.mark.parametrize(("value", "label"), [(2_000_000, "2M"), (1_500_000_000, "1.5B"), (500_000, "500K"),
                                               (123_456, "123.456K"), (999, "999")])
def test_format_budget_round_trips(value: int, label: str) -> None:
    assert format_budget(value) == label
    assert parse_budget(label) == value


def test_budget_label_normalises_user_spelling() -> None:
    assert budget_label("2000000") == budget_label("2m") == "2M"


def test_candidates_are_the_spec_cross_product_with_heads_dividing_d_model() -> None:
    rows = candidates()
    assert len(rows) == sum(1 for d in D_MODELS for h in (2, 4, 8, 16, 32) if d % h == 0) * len(N_LAYERS) * 2
    assert all(r["d_model"] % r["n_heads"] == 0 and r["d_ff"] in (2 * r["d_model"], 4 * r["d_model"]) for r in rows)
    keys = [(r["d_model"], r["n_layers"], r["n_heads"], r["d_ff"]) for r in rows]
    assert keys == sorted(keys)


@pytest.mark.parametrize("budget", [2_000_000, 20_000_000, 200_000_000, 2_000_000_000])
def test_grid_rows_fit_the_budget_exactly_and_are_indexed_in_order(budget: int) -> None:
    rows = build_grid(FAM, budget, INFO)
    assert rows, "every SPEC budget has architectures"
    assert [r.arch_idx for r in rows] == list(range(len(rows)))
    keys = [(r.d_model, r.n_layers, r.n_heads, r.d_ff) for r in rows]
    assert keys == sorted(keys)
    for r in rows:
        assert 0.75 * budget <= r.param_count <= 1.25 * budget
        assert r.param_count == FAM.param_count(FAM.config_for(r.arch(), INFO))
    # Nothing that fits was left out.
    fits = [a for a in candidates() if 0.75 * budget <= FAM.param_count(FAM.config_for(a, INFO)) <= 1.25 * budget]
    assert len(fits) == len(rows)


def test_tolerance_narrows_the_grid() -> None:
    wide, narrow = build_grid(FAM, 2_000_000, INFO, 0.25), build_grid(FAM, 2_000_000, INFO, 0.1)
    assert 0 < len(narrow) < len(wide)
    assert all(abs(r.param_count / 2e6 - 1) <= 0.1 for r in narrow)


def test_extremes_mark_smallest_and_largest_d_model_and_depth() -> None:
    rows = build_grid(FAM, 2_000_000, INFO)
    tags = {t: r for r in rows for t in r.extreme.split(";") if t}
    assert set(tags) == {"min_d_model", "max_d_model", "min_n_layers", "max_n_layers"}
    assert tags["min_d_model"].d_model == min(r.d_model for r in rows)
    assert tags["max_d_model"].d_model == max(r.d_model for r in rows)
    assert tags["min_n_layers"].n_layers == min(r.n_layers for r in rows)
    assert tags["max_n_layers"].n_layers == max(r.n_layers for r in rows)


def test_estimate_is_shown_beside_the_exact_count_and_is_lower() -> None:
    for r in build_grid(FAM, 2_000_000, INFO):
        assert r.estimate is not None and r.estimate < r.param_count  # it ignores biases and norms


def _spread(rows: list, k: int) -> list:
    step = max(1, len(rows) // k)
    return rows[::step][:k] + [r for r in rows if r.extreme]


GRID_SAMPLES = [(b, r) for b in (2_000_000, 20_000_000) for r in _spread(build_grid(FAM, b, INFO), 6)]
BIG_SAMPLES = [(b, r) for b in (200_000_000, 2_000_000_000) for r in _spread(build_grid(FAM, b, INFO), 3)]


@pytest.mark.parametrize(("budget", "row"), GRID_SAMPLES, ids=lambda x: getattr(x, "arch_idx", x))
def test_grid_count_equals_the_built_module(budget: int, row) -> None:  # type: ignore[no-untyped-def]
    model = FAM.build(FAM.config_for(row.arch(), INFO))
    assert sum(p.numel() for p in model.parameters()) == row.param_count


@pytest.mark.parametrize(("budget", "row"), BIG_SAMPLES, ids=lambda x: getattr(x, "arch_idx", x))
def test_large_grid_count_equals_module_on_meta_device(budget: int, row) -> None:  # type: ignore[no-untyped-def]
    with torch.device("meta"):  # no weights are allocated, even for 2B rows
        model = FAM.build(FAM.config_for(row.arch(), INFO))
    assert sum(p.numel() for p in model.parameters()) == row.param_count


def test_grid_cli_json_has_the_documented_keys() -> None:
    res = run_cli("grid", "--budget", "2M", "--budget", "20M", "--format", "json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert {r["budget"] for r in rows} == {"2M", "20M"}
    for key in ("budget", "arch_idx", "d_model", "n_layers", "n_heads", "d_ff", "param_count"):
        assert all(key in r for r in rows)


def test_grid_cli_csv_and_table_agree_with_json() -> None:
    as_json = json.loads(run_cli("grid", "--budget", "2M", "--format", "json").stdout)
    as_csv = run_cli("grid", "--budget", "2M", "--format", "csv").stdout.strip().splitlines()
    assert len(as_csv) == len(as_json) + 1 and as_csv[0].startswith("budget,arch_idx,d_model")
    table = run_cli("grid", "--budget", "2M").stdout
    assert f"{len(as_json)} architectures" in table and "max_n_layers" in table


def test_grid_num_features_changes_counts() -> None:
    few = json.loads(run_cli("grid", "--budget", "2M", "--format", "json", "--num-features", "2").stdout)
    many = json.loads(run_cli("grid", "--budget", "2M", "--format", "json", "--num-features", "64").stdout)
    first = {(r["d_model"], r["n_layers"], r["n_heads"], r["d_ff"]): r["param_count"] for r in few}
    second = {(r["d_model"], r["n_layers"], r["n_heads"], r["d_ff"]): r["param_count"] for r in many}
    common = set(first) & set(second)
    assert common and all(second[k] - first[k] == 62 * 10 * k[0] for k in common)
