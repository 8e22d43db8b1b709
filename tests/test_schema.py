"""One schema: the architecture keys and the training parameters are written out only in
archhpo/schema.py, and the layers that list them read them from there."""

from __future__ import annotations

import ast
from pathlib import Path

from archhpo import schema
from archhpo.config import StoredOptions

REPO = Path(__file__).resolve().parents[1]
PACKAGE = ("archhpo", "budgets", "cluster", "models", "report", "search", "workers")


def _literal_lists(names: tuple[str, ...]) -> list[str]:
    """Every tuple/list/set literal outside archhpo/schema.py naming all of `names` as strings."""
    found = []
    for folder in PACKAGE:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == REPO / "archhpo" / "schema.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Tuple | ast.List | ast.Set):
                    strings = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                    if set(names) <= strings:
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_second_literal_list_of_the_architecture_keys() -> None:
    assert _literal_lists(schema.ARCH_KEYS) == []


def test_no_second_literal_list_of_the_training_parameters() -> None:
    assert _literal_lists(schema.TRAINING_PARAMS) == []


def test_the_scan_finds_a_literal_list() -> None:
    """The scan itself works: schema.py's own definition is what it would report elsewhere."""
    tree = ast.parse((REPO / "archhpo" / "schema.py").read_text())
    tuples = [n for n in ast.walk(tree) if isinstance(n, ast.Tuple)
              and {e.value for e in n.elts if isinstance(e, ast.Constant)} >= set(schema.ARCH_KEYS)]
    assert len(tuples) == 1


def test_layers_read_the_schema() -> None:
    from archhpo.budgets import ARCH_DIMS
    from archhpo.cli._options import ARCH_OPTIONS, TRAINING_OPTIONS
    from archhpo.report._frame import ARCH_COLUMNS, TRAINING_COLUMNS
    from archhpo.search._space import FULL_SPACE, QUICK_SPACE
    from archhpo.workers._build import PLANNED_KEYS

    assert ARCH_OPTIONS is ARCH_DIMS is schema.ARCH_KEYS
    assert ARCH_COLUMNS is schema.ARCH_RECORD
    assert TRAINING_OPTIONS is TRAINING_COLUMNS is PLANNED_KEYS is schema.TRAINING_PARAMS
    for param in schema.TRAINING:
        assert getattr(FULL_SPACE, param.name) == param.full
        assert getattr(QUICK_SPACE, param.name) == param.quick


def test_training_parameters_are_the_searched_ones() -> None:
    from archhpo.search._space import FULL_SPACE

    assert tuple(FULL_SPACE.distributions(3)) == schema.PLAN_PARAMS
    assert tuple(FULL_SPACE.as_dict()) == schema.TRAINING_PARAMS


def test_stored_options_round_trip_key_for_key_and_type_what_they_hold() -> None:
    stored = {"horizon": 1, "threshold": 0.01, "quick": False, "seed": 0, "seq_len": 128, "paired_seeds": 3,
              "schedule": "wsd", "cooldown": 0.2, "halving": {"eta": 3, "min_fraction": "1/9"},
              "ladder": {"below": ["x_100K"]}, "baselines": ["kaplan"], "compile": True,
              "data_budget": {"unit": "tokens", "per_param": 10.0, "budget_params": 100000, "target": 1000000},
              "data_seed": 0, "some_future_key": [1, 2]}
    options = StoredOptions.from_dict(stored)
    assert list(options.as_dict().items()) == list(stored.items()), "the same keys, values and order"
    assert options.family == {"seq_len": 128, "some_future_key": [1, 2]}, "unknown keys are the family's"
    assert options.paired_seeds == 3 and options.compile and options.baselines == ("kaplan",)
    assert options.ladder_below == ("x_100K",) and options.budget == schema.DataBudget("tokens", 10.0, 100000)
    shuffled = StoredOptions.from_dict(dict(reversed(stored.items())))
    assert shuffled == options and list(shuffled.as_dict()) == list(reversed(stored)), "order aside, equal"
    plain = StoredOptions.from_dict({"horizon": 1, "threshold": 0.01, "quick": True, "seed": 2})
    assert plain.as_dict() == {"horizon": 1, "threshold": 0.01, "quick": True, "seed": 2}, "nothing added"
    assert plain.paired_seeds == 0 and plain.budget is None and plain.ladder_below == () and plain.data_seed is None
    built = StoredOptions(quick=True, seed=2, family={"seq_len": 8}, paired_seeds=2)
    assert built.as_dict() == {"horizon": 1, "threshold": 0.01, "quick": True, "seed": 2, "seq_len": 8,
                               "paired_seeds": 2}
