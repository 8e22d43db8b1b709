"""The replay of T1's ladder (bench/mup_carry_replay.py): a rate carried unchanged against today's
fitted exponent at T1's largest budget, graded on its learning-rate sweep."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _replay() -> Any:
    spec = importlib.util.spec_from_file_location("mup_carry_replay", REPO / "bench" / "mup_carry_replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mup_carry_replay"] = module
    spec.loader.exec_module(module)
    return module


def test_the_loss_at_a_rate_is_linear_in_log_rate_between_the_swept_points() -> None:
    loss_at = _replay().loss_at
    points = [(1e-3, 2.0), (4e-3, 1.0), (1.6e-2, 3.0)]
    assert loss_at(points, 2e-3) == pytest.approx(1.5, abs=1e-12)  # halfway in log rate
    assert loss_at(points, 8e-3) == pytest.approx(2.0, abs=1e-12)
    assert loss_at(points, 1e-4) == 2.0 and loss_at(points, 1.0) == 3.0, "an end is held beyond it"


def _same(a: Any, b: Any) -> bool:
    """Equal, floats within 1e-9 relative: the parabola fits' last bits follow the CPU's BLAS kernels
    (an AVX2 machine and an AVX-512 one differ there); everything else exactly."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_the_replay_reproduces_its_committed_result() -> None:
    module = _replay()
    result = json.loads(json.dumps(module.replay(module.RUN, module.SWEEP, module.TABLE)))
    committed = json.loads((REPO / "bench" / "mup_carry_replay.json").read_text())
    assert _same(result, committed), (result, committed)
    assert not _same({"x": 1.0}, {"x": 1.0 + 1e-6}) and not _same({"x": "a"}, {"x": "b"})
    unchanged, today = result["unchanged"], result["today"]
    # Carried unchanged: one rate for every swept width; today's is moved to each d_model.
    assert {v["carried"] for v in unchanged["graded"]} == {unchanged["rate"]}
    assert all(math.isclose(v["carried"], today["rate"] * today["width"] / 128) for v in today["graded"])
    assert unchanged["flops"] == today["flops"] < today["flops_with_probe"]
