"""--carry-finalists: a ladder's largest budget trains the next smaller budget's 3 best architectures
by mean (each carried to the grid row nearest its shape) and the grid's centred extremes, once each
at full length, then its confirmation; every budget below plans as without it.  The setting is
stored in the largest budget's options (a relaunch keeps it, one with another value is refused) and
needs --ladder."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from optuna.trial import TrialState

from archhpo.budgets import GridRow
from archhpo.cli import main
from archhpo.config import StoredOptions
from archhpo.schema import LADDER_FINALISTS, Attr
from archhpo.search import TrialQueue, keyword_config, prepare_settings
from archhpo.search._ladder import (
    Finished,
    carried_row,
    carry_up,
    centred_extremes,
    describe,
    finalist_rows,
    finalist_slots,
)
from archhpo.search._space import QUICK_SPACE
from archhpo.search._storage import open_storage
from archhpo.search._study import LADDER_KEY, read_settings
from archhpo.workers import Worker
from tests.conftest import TINY_DATA

PARAMS = {"learning_rate": 1e-3, "weight_decay": 1e-4, "epochs": 3, "batch_size": 64, "warmup_steps": 20}


def _row(i: int, d: int, layers: int, heads: int, ff: int, extreme: str = "") -> GridRow:
    return GridRow(budget="x", arch_idx=i, d_model=d, n_layers=layers, n_heads=heads, d_ff=ff, param_count=0,
                   estimate=None, extreme=extreme)


def _done(value: float, number: int, d: int, layers: int, heads: int, ff: int, lr_probe: bool = False) -> Finished:
    return Finished(value, number, d, layers, (d, layers, heads, ff), PARAMS, n_heads=heads, d_ff=ff,
                    lr_probe=lr_probe)


# The smaller budget: by mean B (1.10) < C (1.13) < A (1.15) < D (1.20); A holds the best single run,
# and D's learning-rate probe (0.5) is read for the rate only, never in a ranking.
BELOW = [
    _done(1.00, 0, 64, 2, 2, 128), _done(1.30, 4, 64, 2, 2, 128),  # A: aspect 32, head dim 32, d_ff ratio 2
    _done(1.10, 1, 64, 4, 2, 256),  # B: aspect 16, head dim 32, ratio 4
    _done(1.12, 2, 32, 4, 1, 64), _done(1.14, 5, 32, 4, 1, 64),  # C: aspect 8, head dim 32, ratio 2
    _done(1.20, 3, 64, 3, 4, 128), _done(0.50, 6, 64, 3, 4, 128, lr_probe=True),  # D: nearest row 3
]
# The largest budget's grid: rows 4 and 5 are twins (d256-L2); the grid marked row 4, whose head
# dimension and d_ff ratio lie farther from B's than row 5's do.
ROWS = [
    _row(0, 128, 4, 4, 256),  # A's shape exactly
    _row(1, 128, 4, 2, 256),
    _row(2, 128, 8, 4, 512),  # B's shape exactly
    _row(3, 128, 8, 4, 256),
    _row(4, 256, 2, 4, 512, "max_d_model;min_n_layers"),
    _row(5, 256, 2, 8, 1024),
    _row(6, 128, 16, 4, 256, "max_n_layers"),  # C's shape exactly, and an extreme
    _row(7, 64, 8, 2, 128, "min_d_model"),  # C's shape exactly too: the earlier row wins the tie
]


def test_the_largest_budget_plans_the_finalists_carried_to_their_nearest_shapes_and_the_centred_extremes() -> None:
    rows = finalist_rows(ROWS, BELOW)
    assert [r.arch_idx for r in rows] == [2, 6, 0, 5, 7], "B, C, A by mean; then the extremes, 6 listed once"
    assert [r.extreme for r in rows] == ["", "max_n_layers", "", "max_d_model;min_n_layers", "min_d_model"]
    assert finalist_slots(3, len(ROWS)) == 6 and finalist_slots(3, 4) == 4, "never more slots than rows"
    assert finalist_rows(ROWS, []) == [], "nothing finished below: nothing to carry"


def test_a_finalist_is_carried_to_the_row_nearest_its_proportions_ties_to_the_earlier() -> None:
    c = BELOW[3]  # aspect 8: rows 6 and 7 both match every ratio
    assert carried_row(ROWS, c) == 6 and carried_row(ROWS[::-1], c) == 0, "the earlier of the two, in either order"
    aspect_only = [_row(0, 128, 8, 4, 256), _row(1, 64, 16, 2, 128)]  # aspect 16 and 4: log 2 from 8 each way
    assert carried_row(aspect_only, c) == 0
    head_dim = [_row(0, 128, 16, 2, 256), _row(1, 128, 16, 4, 256)]  # head dim 64 and 32: C's is 32
    assert carried_row(head_dim, c) == 1, "the head dimension and d_ff ratio carry as the aspect ratio does"


def test_carry_up_with_finalists_assigns_the_rules_rows_once_in_order_and_skips_the_other_slots() -> None:
    slots = list(range(finalist_slots(3, len(ROWS))))
    record = carry_up(BELOW, 100_000, 200_000, ROWS, QUICK_SPACE, slots, seed=0, finalists=True)
    assert [a["arch_idx"] for a in record["assignments"]] == [2, 6, 0, 5, 7]
    assert [a["slot"] for a in record["assignments"]] == [0, 1, 2, 3, 4] and record["skipped_slots"] == 1
    assert record["carry_finalists"] == {"from_trials": [1, 2, 0], "arch_idx": [2, 6, 0]}
    assert record["region_size"] == 5 and "region: --carry-finalists" in record["rule"]
    assert ("--carry-finalists: the finalists carried (trial 1 to arch 2, trial 2 to arch 6, trial 0 to arch 0) "
            "and the extremes: 5 of 8 architectures") in describe({**record, "from_budget": "100K"})
    plain = carry_up(BELOW, 100_000, 200_000, ROWS, QUICK_SPACE, slots, seed=0)
    assert "carry_finalists" not in plain and {a["arch_idx"] for a in plain["assignments"]} != {2, 6, 0, 5, 7}
    assert plain["carried"] == record["carried"], "the training parameters are carried as without it"


def _ladder(carry: bool, budgets: tuple[str, ...] = ("200K", "500K", "1M")) -> Any:
    base = keyword_config("cf", n_trials=8, data=TINY_DATA, quick=True, seed=0, fixed_params={"epochs": 3},
                          confirm=LADDER_FINALISTS, confirm_seeds=1, sequential_confirm=True)
    return replace(base, budgets=budgets, ladder=True, pruning=replace(base.pruning, rule="halving",
                                                                      confirm_at_rung=True, carry_finalists=carry))


def _settings(config: Any) -> list[Any]:
    out: list[Any] = []
    for budget in config.budgets:
        out.append(prepare_settings(config, budget, ladder_below=[s.study_name for s in out]))
    return out


def test_only_the_ladders_largest_budget_stores_it_and_plans_one_slot_per_finalist_and_extreme() -> None:
    plain, carried = _settings(_ladder(False)), _settings(_ladder(True))
    for before, now in zip(plain[:-1], carried[:-1], strict=True):
        assert now.to_attrs() == before.to_attrs(), "below the largest budget nothing changes"
        assert not now.options.carry_finalists
    large, was = carried[-1], plain[-1]
    assert large.options.ladder == {**(was.options.ladder or {}), "carry": "finalists"}
    assert large.options.carry_finalists and not was.options.carry_finalists
    n_ext = sum(1 for a in large.archs if a["extreme"])
    assert sum(e.phase == 1 for e in large.plan) == finalist_slots(n_ext, len(large.archs))
    assert [(e.rank, e.seed) for e in large.plan if e.phase == 3] == [(e.rank, e.seed) for e in was.plan
                                                                      if e.phase == 3], "the same confirmation"


def test_a_study_stored_without_the_key_reads_false_and_is_written_back_byte_for_byte() -> None:
    stored = {"horizon": 1, "threshold": 0.01, "quick": True, "seed": 0, "ladder": {"below": ["x_200K"]}}
    options = StoredOptions.from_dict(stored)
    assert options.carry_finalists is False and options.as_dict() == stored
    assert list(options.as_dict()["ladder"]) == ["below"]
    assert StoredOptions.from_dict({**stored, "ladder": {"below": ["x_200K"], "carry": "finalists"}}).carry_finalists


def _launch(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def test_the_setting_round_trips_through_a_study_file_the_stored_study_and_a_relaunch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    cfg = tmp_path / "study.toml"
    cfg.write_text(f'experiment = "cft"\nbudget = ["200K", "500K"]\nladder = true\ncarry_finalists = true\n'
                   f'quick = true\ntrials = 8\ndata = "{TINY_DATA}"\n')
    assert _launch(["launch", "--config", str(cfg), "--storage", url])[0] == 0
    storage = open_storage(url, create=False)
    small, large = (read_settings(storage, f"cft_{b}") for b in ("200K", "500K"))
    assert not small.options.carry_finalists and small.options.ladder is None
    assert large.options.carry_finalists and large.options.ladder["carry"] == "finalists"
    assert _launch(["launch", "--config", str(cfg), "--storage", url])[0] == 0, "the same file relaunches"
    assert _launch(["launch", "--config", str(cfg), "--carry-finalists", "--storage", url])[0] == 0
    code, err = _launch(["launch", "--config", str(cfg), "--no-carry-finalists", "--storage", url])
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("archhpo: error: Study 'cft_500K' already exists with different settings "
                                         "(options.ladder: stored {'below': ['cft_200K'], 'carry': 'finalists'}")
    assert "now {'below': ['cft_200K']}); launch under a new --experiment name" in last
    assert read_settings(storage, "cft_500K").to_attrs() == large.to_attrs(), "nothing written"


def test_run_and_launch_take_the_flag_and_its_negation() -> None:
    from archhpo.cli._main import _complete, build_parser
    from archhpo.cli._study_cmds import _study_config
    from archhpo.models import get_family

    fam = get_family("patchtst")
    for command in ("run", "launch"):
        line = [command, "--experiment", "e", "--budget", "200K", "--budget", "500K", "--ladder"]
        for extra, expected in (([], True), (["--carry-finalists"], True), (["--no-carry-finalists"], False)):
            args = build_parser(fam).parse_args([*line, *extra])
            _complete(args, fam, {}, None)
            assert _study_config(args).pruning.carry_finalists is expected, (command, extra)


@pytest.mark.parametrize("flag", [["--carry-finalists"], ["--no-carry-finalists"], ["--config", "FILE"]])
def test_carry_finalists_without_a_ladder_is_one_sentence_and_writes_nothing(tmp_path: Path, flag: list[str]) -> None:
    db = tmp_path / "s.db"
    cfg = tmp_path / "study.toml"
    cfg.write_text("carry_finalists = false\n")
    flag = [str(cfg) if f == "FILE" else f for f in flag]
    code, err = _launch(["launch", "--experiment", "x", "--budget", "200K", "--budget", "500K", "--quick", *flag,
                         "--storage", f"sqlite:///{db}"])
    assert code == 2 and not db.exists()
    assert err.strip().endswith("--carry-finalists and --no-carry-finalists choose what a ladder's largest budget "
                                "trains, so they need --ladder; add --ladder or drop the flag.")
    assert err.count("\n") == 1


def _expected(small: TrialQueue, large: TrialQueue) -> list[int]:
    """The rule, read off the smaller budget's stored trials: its 3 best architectures by the mean of
    their full-length runs (confirmation included; ties by the earlier best run), each carried to its
    nearest row, then the largest grid's extremes centred on the best's head dimension and d_ff ratio."""
    runs: dict[int, list[Any]] = {}
    for t in small.storage.get_all_trials(small.study_id, deepcopy=False, states=(TrialState.COMPLETE,)):
        runs.setdefault(int(t.params["arch_idx"]), []).append(t)
    ranked = sorted(runs.items(), key=lambda kv: (sum(t.value for t in kv[1]) / len(kv[1]),
                                                  min(kv[1], key=lambda t: (t.value, t.number)).number))
    top = []
    for arch_idx, _ in ranked[:LADDER_FINALISTS]:
        a = small.settings.archs[arch_idx]
        top.append(Finished(0.0, 0, a["d_model"], a["n_layers"], (arch_idx,), PARAMS, n_heads=a["n_heads"],
                            d_ff=a["d_ff"]))
    rows = centred_extremes([GridRow(**a) for a in large.settings.archs], top[0])
    picked = [carried_row(rows, t) for t in top] + [k for k, r in enumerate(rows) if r.extreme]
    return [rows[k].arch_idx for k in dict.fromkeys(picked)]


def test_a_real_ladder_trains_the_carried_finalists_and_extremes_once_at_full_length_then_confirms(
        tmp_path: Path) -> None:
    """lm, --quick, 75K then 150K, trained by a worker: the largest budget's phase 1 is exactly the
    rule's architectures, once each, every one (and every confirmation run) trained to full length."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    code, err = _launch(["launch", "--experiment", "cf", "--family", "lm", "--budget", "75K", "--budget", "150K",
                         "--ladder", "--carry-finalists", "--data", "synthetic:vocab=8,tokens=3000", "--vocab-size",
                         "8", "--seq-len", "16", "--quick", "--trials", "6", "--epochs", "3", "--storage", url])
    assert code == 0, err
    small, large = TrialQueue(url, "cf_75K"), TrialQueue(url, "cf_150K")
    torch.set_num_threads(1)
    Worker([small, large], device="cpu", threads=1, checkpoint_dir=tmp_path / "ck").run()
    assert large.maintain().done
    trials = large.storage.get_all_trials(large.study_id, deepcopy=False)
    assert {t.state for t in trials} == {TrialState.COMPLETE}, "nothing pruned at the largest budget"
    first = sorted((t for t in trials if t.user_attrs[Attr.PHASE] == 1), key=lambda t: t.user_attrs[Attr.PLAN_SLOT])
    expected = _expected(small, large)
    assert len(expected) >= LADDER_FINALISTS and [int(t.params["arch_idx"]) for t in first] == expected
    record = large.upkeep.study_attr(LADDER_KEY)
    assert record["skipped_slots"] == sum(e.phase == 1 for e in large.settings.plan) - len(expected)
    confirm = [t for t in trials if t.user_attrs[Attr.PHASE] == 3]
    assert 2 <= len(confirm) <= LADDER_FINALISTS and {int(t.params["arch_idx"]) for t in confirm} <= set(expected)
    for t in first + confirm:
        assert sorted(t.intermediate_values) == [1, 2, 3], "full length"
        assert t.user_attrs[Attr.FLOPS_SPENT] == t.user_attrs[Attr.FLOPS_FULL]
        assert not t.user_attrs.get(Attr.RUNG_SCORES) and t.user_attrs.get(Attr.CONFIRM_RUNG) is None


def _value(arch_idx: int) -> float:
    return 1.0 + 0.01 * (arch_idx % 7)


def _play(q: TrialQueue, claims: list[Any]) -> None:
    """Settle every claim as a worker would, each rung score ordered as the finals are (so the
    smallest budget's rungs are trusted): parked where the plan stops, ended at a confirmation's
    rung, else finished at full length; every claim's plan kept in `claims`."""
    for _ in range(50):
        while (c := q.claim({"host": "t", "device": "cpu"})) is not None:
            claims.append(c.plan)
            v = _value(int(c.params["arch_idx"]))
            if c.plan.ends:
                scores = [v + 0.1 * (3 - r) for r in range(len(c.plan.score_at))]
                q.finish(c, TrialState.PRUNED, scores[-1], {Attr.RUNG_SCORES: scores, Attr.RUNG: len(scores) - 1})
            elif c.plan.stop_after is not None:
                assert q.park(c, v + 0.1 * (2 - c.rung), {})
            else:
                done = len(c.plan.scores)
                scores = [*c.plan.scores, *(v + 0.1 * (2 - done - i) for i in range(len(c.plan.score_at))), v]
                q.finish(c, TrialState.COMPLETE, v, {Attr.RUNG_SCORES: scores} if c.plan.scored else {})
        if q.maintain().done:
            return
    raise AssertionError("the plan did not finish")


def test_the_largest_budget_prunes_at_no_trusted_rung_and_confirms_at_full_length(sqlite_url: str) -> None:
    """The same ladder, whose smallest budget's rungs are trusted: without the setting its largest
    budget parks trials at a rung and confirms there; with it every claim trains to full length,
    scoring nothing on the way, and so does every confirmation run."""
    from archhpo.search import launch
    from archhpo.search._upkeep import PHASE3_KEY

    seen: dict[bool, tuple[dict[str, Any], list[Any], list[dict[str, Any]], list[Finished], list[GridRow]]] = {}
    for carry in (False, True):
        config = replace(_ladder(carry, ("200K", "500K")), experiment=f"t{int(carry)}", trials=12,
                         fixed_params={"epochs": 9})
        small = prepare_settings(config, "200K")
        large = prepare_settings(config, "500K", ladder_below=[small.study_name])
        launch(sqlite_url, small)
        launch(sqlite_url, large)
        _play(TrialQueue(sqlite_url, small.study_name), [])
        q, claims = TrialQueue(sqlite_url, large.study_name), []
        _play(q, claims)
        below = [Finished(float(t.value), t.number, int(t.user_attrs["d_model"]), int(t.user_attrs["n_layers"]),
                          (int(t.params["arch_idx"]),), PARAMS, n_heads=int(t.user_attrs["n_heads"]),
                          d_ff=int(t.user_attrs["d_ff"]))
                 for t in q.storage.get_all_trials(TrialQueue(sqlite_url, small.study_name).study_id, deepcopy=False,
                                                   states=(TrialState.COMPLETE,))]
        seen[carry] = (q.upkeep.study_attr(LADDER_KEY), claims, q.upkeep.study_attr(PHASE3_KEY), below,
                       [GridRow(**a) for a in large.archs])
    record, claims, ranks, _, _ = seen[False]
    assert record["trust"]["trusted"], "the smaller budget's rungs are trusted"
    assert any(p.stop_after is not None for p in claims) and any(r.get("at_rung") is not None for r in ranks)
    record, claims, ranks, below, rows = seen[True]
    assert record["trust"]["trusted"] == [] and record["trust"]["carry_finalists"]
    assert [a["arch_idx"] for a in record["assignments"]] == [r.arch_idx for r in finalist_rows(rows, below)]
    assert claims and all(p.stop_after is None and p.score_at == () and not p.ends for p in claims)
    assert ranks and all(r.get("at_rung") is None for r in ranks), "confirmed at full length"
    assert "; fidelity: every trial trained to full length (--carry-finalists)" in describe(record)
