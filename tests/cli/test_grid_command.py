"""`archhpo grid`: the architectures that fit a budget, and with --n-heads/--d-ff/... lists only the
rows a study pinning them within the budget plans (renumbered, its extremes marked again)."""

from __future__ import annotations

import json

import pytest

from archhpo.budgets import build_grid, parse_budget, pinned_grid
from archhpo.cli import main
from archhpo.models import get_family

LM = ["--family", "lm", "--budget", "250K", "--tolerance", "0.15", "--seq-len", "128", "--format", "json"]


def _grid(capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, object]]:
    assert main(["grid", *LM, *extra]) == 0
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return rows


def test_a_head_count_list_lists_only_those_rows_as_a_pinned_study_plans_them(capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    every = _grid(capsys)
    some = _grid(capsys, "--n-heads", "2,4,8")
    assert {r["n_heads"] for r in every} > {2, 4, 8} == {r["n_heads"] for r in some}
    assert [r["arch_idx"] for r in some] == list(range(len(some)))
    fam = get_family("lm")
    info = {"seq_len": 128, "vocab_size": 32, "order": 3, "dropout": 0.0}
    expected = pinned_grid(fam, info, {"n_heads": [2, 4, 8]}, "250K", parse_budget("250K"), 0.15)
    assert some == [r.as_dict() for r in expected]
    assert len(some) < len(build_grid(fam, parse_budget("250K"), info, 0.15))
    assert sum(1 for r in some if r["extreme"]) == 2  # d64-L8 and d128-L2: each holds two marks


def test_a_filter_nothing_fits_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grid", *LM, "--n-heads", "3"]) == 2
    err = capsys.readouterr().err
    assert "No lm architecture with n_heads=3 fits 250K ±15%; change the lists or widen --tolerance." in err
    assert err.count("\n") == 1
