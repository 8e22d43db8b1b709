"""The L(N) fit's 95% intervals are calibrated. Over 200 synthetic studies drawn
from a known law with 0.5% noise (bench/fit_calibration.py) at 4, 6 and 8 budgets, the intervals
of alpha and E hold the truth in 90-98% of them; every study counts, `fitted` or not. Each study measured its seed noise (3 seeds a
budget), which the intervals draw unless the residuals are significantly larger.
The test draws 200 bootstrap refits per fit; the product's default of 1000 is measured by the
bench (docs/reports.md records its table)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import numpy as np
import pytest

from archhpo.report._fit import fit_json, fit_law, fit_laws
from tests.conftest import REPO


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fit_calibration", REPO / "bench" / "fit_calibration.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fit_calibration"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("k", [4, 6, 8])
def test_the_95_percent_intervals_of_alpha_and_e_cover_the_truth_in_90_to_98_percent(k: int) -> None:
    row = _bench().coverage(k, studies=200, n_boot=200)
    assert row["studies"] == 200
    assert 0.90 <= row["alpha"] <= 0.98, row
    assert 0.90 <= row["E"] <= 0.98, row
    assert row["fitted"] == (0.0 if k == 4 else row["fitted"]), "4 budgets are never a law"


def test_many_studies_at_once_give_each_the_fit_it_gets_alone() -> None:
    bench = _bench()
    rng = np.random.default_rng(3)
    drawn = [bench.study(k, 0.005, rng) for k in (6, 8, 6)]
    together = fit_laws([(n, loss) for n, loss, _ in drawn], n_boot=100, seed=10, noise=[m for *_, m in drawn])
    for i, (n, loss, measured) in enumerate(drawn):
        alone = fit_law(n, loss, n_boot=100, seed=10 + i, noise=measured)
        assert fit_json(together[i]) == fit_json(alone)
