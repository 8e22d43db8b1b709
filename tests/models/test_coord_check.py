"""The µP coordinate check (bench/coord_check.py), reduced to one layer and two seeds: under µP
every layer's activation size is flat in width from d_model 64 to 512 after 30 steps; under the
standard parametrization the logits grow with width, so the check can fail."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from archhpo.errors import ConfigError
from archhpo.models import family_names
from archhpo.models._mup import COORD_CHECKED, refuse_unchecked

REPO = Path(__file__).resolve().parents[2]


def _coord_check() -> Any:
    spec = importlib.util.spec_from_file_location("coord_check", REPO / "bench" / "coord_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["coord_check"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    cc = _coord_check()
    return cc.run(cc.CheckSettings(widths=(64, 128, 256, 512), seeds=(0, 1), steps=cc.STEPS, n_layers=1))


def test_under_mup_every_layers_activation_size_is_flat_in_width(result: dict[str, Any]) -> None:
    cc = _coord_check()
    slopes = result["mup"]["slopes"]
    assert set(slopes) == set(cc.layer_names(1)) == {"embedding", "block0.attn", "block0.mlp", "logits"}
    assert result["mup"]["widths"] == [64, 128, 256, 512] and result["settings"]["steps"] >= 30
    assert all(abs(s) <= cc.MUP_TOLERANCE for s in slopes.values()), slopes
    assert result["verdict"]["mup"] is True


def test_under_the_standard_parametrization_the_logits_grow_with_width(result: dict[str, Any]) -> None:
    cc = _coord_check()
    assert result["sp"]["slopes"]["logits"] >= cc.SP_LOGITS_SLOPE, result["sp"]["slopes"]
    assert result["verdict"]["sp_logits_grow"] is True
    # The two parametrizations are one model at the base width: the same numbers there.
    assert {k: v[0] for k, v in result["sp"]["rms"].items()} == {k: v[0] for k, v in result["mup"]["rms"].items()}


def test_the_slope_is_the_log_log_least_squares_slope() -> None:
    cc = _coord_check()
    assert cc.slope([64, 128, 256], [1.0, 2.0, 4.0]) == pytest.approx(1.0, abs=1e-12)
    assert cc.slope([64, 128, 256, 512], [3.0] * 4) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("family", family_names())
def test_a_mup_study_of_a_family_without_a_passed_check_is_refused_in_one_sentence(family: str) -> None:
    refuse_unchecked(family, "sp")  # the standard parametrization needs no check
    if family in COORD_CHECKED:
        refuse_unchecked(family, "mup")
        return
    with pytest.raises(ConfigError) as err:
        refuse_unchecked(family, "mup")
    message = str(err.value)
    assert message.count(". ") == 0 and message.endswith(".")
    assert f"{family} has none (only lm: docs/mup.md); drop --parametrization mup or study lm." in message


def test_the_families_with_a_check_are_the_ones_docs_mup_names() -> None:
    text = (REPO / "docs" / "mup.md").read_text()
    assert f"Only {', '.join(f'`{name}`' for name in COORD_CHECKED)}." in text
    assert set(COORD_CHECKED) <= set(family_names())
