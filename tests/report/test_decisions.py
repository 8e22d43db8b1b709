"""Decision accuracy: how often a smaller budget's ranking of shapes holds at a
larger budget, with a bootstrap interval, and an honest "not enough" below three shapes."""

from __future__ import annotations

import pandas as pd

from archhpo.report._decisions import decision_accuracy, decision_rows


def _frame(losses: dict[str, dict[tuple[int, int], float]]) -> pd.DataFrame:
    rows = []
    for i, (budget, shapes) in enumerate(losses.items()):
        for (layers, heads), loss in shapes.items():
            for seed, noise in enumerate((-0.001, 0.001)):  # two seeds: the mean is the loss
                rows.append({"budget": budget, "budget_value": 10 ** (6 + i), "trial": len(rows), "state": "COMPLETE",
                             "phase": 1, "val_loss": loss + noise, "n_layers": layers, "n_heads": heads,
                             "choice": "", "seed": seed})
    return pd.DataFrame(rows)


def test_pairs_of_shapes_that_keep_their_order_are_counted_exactly() -> None:
    small = {(2, 2): 1.0, (2, 4): 1.1, (3, 2): 1.2, (3, 4): 1.3}
    large = {(2, 2): 0.9, (2, 4): 0.8, (3, 2): 1.0, (3, 4): 1.1}  # only (2,2) vs (2,4) swaps
    result = decision_accuracy(_frame({"1M": small, "10M": large, "100M": {(2, 2): 0.5, (5, 5): 0.4}}))
    first = result[0]
    assert (first["small"], first["large"], first["shapes"], first["pairs"]) == ("1M", "10M", 4, 6)
    assert first["accuracy"] == 5 / 6
    assert first["ci95"][0] <= 5 / 6 <= first["ci95"][1] and 0 <= first["ci95"][0] and first["ci95"][1] <= 1
    assert result == decision_accuracy(_frame({"1M": small, "10M": large, "100M": {(2, 2): 0.5, (5, 5): 0.4}})), \
        "the bootstrap is seeded"
    assert [r["accuracy"] for r in result[1:]] == [None, None], "one shape in common: nothing to say"
    assert [r[0] for r in decision_rows(result)] == ["1M → 10M"], "one shape in common: left out of the table"


def test_a_reversed_ranking_scores_zero_and_a_tie_half() -> None:
    small = {(2, 2): 1.0, (2, 4): 1.1, (3, 2): 1.2}
    reversed_ = {(2, 2): 1.2, (2, 4): 1.1, (3, 2): 1.0}
    assert decision_accuracy(_frame({"1M": small, "10M": reversed_}))[0]["accuracy"] == 0.0
    tied = {(2, 2): 1.0, (2, 4): 1.0, (3, 2): 1.2}
    assert decision_accuracy(_frame({"1M": small, "10M": tied}))[0]["accuracy"] == (0.5 + 1 + 1) / 3
