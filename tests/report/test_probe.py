"""The report's learning-rate probe line (report/_probe.py): the probed architecture's mean loss at
each factor of its rate, and whether they locate its best rate, read from the trials frame alone."""

from __future__ import annotations

import math

import pandas as pd

from archhpo.report._html import _ladder_section
from archhpo.report._probe import probe_notes


def _frame(vertex: float) -> pd.DataFrame:
    """At 200K: architecture 1 (d_model 64, 2 layers) at rate 1e-3 twice (its search and confirmation
    runs) and probed at x1/4, x1/2, x2, on a parabola in log rate with its vertex at `vertex`;
    architecture 2 once; one FAILED probe retry that counts for nothing."""
    def loss(lr: float) -> float:
        return 2.0 + 0.1 * math.log(lr / vertex) ** 2

    rows = [{"budget": "200K", "state": "COMPLETE", "arch_idx": 1, "d_model": 64, "n_layers": 2,
             "learning_rate": 1e-3 * f, "lr_probe": probe, "val_loss": loss(1e-3 * f)}
            for f, probe in ((1, None), (1, None), (0.25, 0.25), (0.5, 0.5), (2, 2.0))]
    rows.append({"budget": "200K", "state": "COMPLETE", "arch_idx": 2, "d_model": 64, "n_layers": 3,
                 "learning_rate": 5e-4, "lr_probe": None, "val_loss": 1.9})
    rows.append({"budget": "200K", "state": "FAIL", "arch_idx": 1, "d_model": 64, "n_layers": 2,
                 "learning_rate": 2e-3, "lr_probe": 2.0, "val_loss": None})
    rows.append({"budget": "500K", "state": "COMPLETE", "arch_idx": 0, "d_model": 128, "n_layers": 2,
                 "learning_rate": 1e-3, "lr_probe": None, "val_loss": 1.8})
    return pd.DataFrame(rows)


def _listed(vertex: float) -> str:
    return ", ".join(f"x{f:g}: {2.0 + 0.1 * math.log(1e-3 * f / vertex) ** 2:.4f}" for f in (0.25, 0.5, 1, 2))


def test_a_probe_that_brackets_the_best_rate_locates_it() -> None:
    notes = probe_notes(_frame(1.2e-3))
    assert list(notes) == ["200K"], "the largest budget has no probe, and says nothing"
    assert notes["200K"] == f"d_model 64, 2 layers, its rate 0.001 {_listed(1.2e-3)} (mean losses); best rate located at 0.0012"


def test_a_best_rate_above_every_rate_probed_is_said_not_located() -> None:
    notes = probe_notes(_frame(5e-3))
    assert notes["200K"] == (f"d_model 64, 2 layers, its rate 0.001 {_listed(5e-3)} (mean losses); not located (the "
                             "best lies above the highest rate tried); its best run's rate 0.002")


def test_a_report_without_probes_has_no_probe_section() -> None:
    frame = _frame(1.2e-3)
    assert "<h3>Learning-rate probe: the best architecture at other rates</h3>" in _ladder_section(frame)
    assert probe_notes(frame.drop(columns="lr_probe")) == {}
    assert probe_notes(frame.assign(lr_probe=None)) == {} and _ladder_section(frame.assign(lr_probe=None)) == []
