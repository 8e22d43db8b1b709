"""The confirmation phase (--confirm K --seeds S): planned, created once when phases 1-2 are final,
retried like any slot, exported as phase 3, and summarised with a paired comparison."""

from __future__ import annotations

import csv
import io
import json
import statistics
import threading
from pathlib import Path

import pytest
from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.errors import BudgetError
from archhpo.report._export import csv_text
from archhpo.search import (
    CSV_COLUMNS,
    SPEC_COLUMNS,
    TrialQueue,
    confirmation_summary,
    export_studies,
    launch,
    open_storage,
    prepare_settings,
)
from archhpo.search._space import PARAM_NAMES
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}


def _settings(**kw):  # type: ignore[no-untyped-def]
    args = {"n_trials": 8, "data": TINY_DATA, "quick": True, "seed": 0, "pruner": "none",
            "confirm": 2, "confirm_seeds": 3}
    return prepare_settings("cf", "500K", **{**args, **kw})


# ----------------------------------------------------------------------------- the plan
def test_default_plan_has_no_confirmation_and_stays_50_trials() -> None:
    s = prepare_settings("d", "2M")
    assert len(s.plan) == 50 and {e["phase"] for e in s.plan} == {1, 2}
    assert all(e["seed"] is None and "rank" not in e for e in s.plan)
    assert "confirm" not in s.options


def test_confirmation_slots_are_planned_seed_by_seed() -> None:
    s = _settings()
    p3 = [e for e in s.plan if e["phase"] == 3]
    assert len(p3) == 2 * 3 and len(s.plan) == 8 + 6
    assert [(e["seed"], e["rank"]) for e in p3] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(e["arch_idx"] is None and e["params"] is None for e in p3)
    assert s.options["confirm"] == 2 and s.options["confirm_seeds"] == 3


def test_confirmation_never_asks_for_more_ranks_than_architectures() -> None:
    s = prepare_settings("cf", None, pins={"d_model": [64], "n_layers": [2, 3], "n_heads": [4], "d_ff": [128]},
                         data=TINY_DATA, quick=True, confirm=5, confirm_seeds=2)
    assert {e["rank"] for e in s.plan if e["phase"] == 3} == {0, 1}


@pytest.mark.parametrize("kw", [{"confirm_seeds": 0}, {"confirm": -1}, {"paired_seeds": 2}])
def test_bad_confirmation_settings_are_refused(kw: dict) -> None:
    with pytest.raises(BudgetError):
        _settings(**kw)


# ----------------------------------------------------------------------------- the queue
def _finish_all(q: TrialQueue, values: dict[int, float] | None = None, fail_slots: set[int] = frozenset()) -> None:
    """Finish every WAITING trial instantly; value by plan slot (default: slot-based)."""
    while (c := q.claim(WORKER)) is not None:
        if c.slot in fail_slots:
            q.finish(c, TrialState.FAIL, None, {"fail_reason": "refused for the test"})
            continue
        v = (values or {}).get(c.slot, 1.0 + 0.01 * c.slot)
        q.finish(c, TrialState.COMPLETE, v, {"duration_s": 0.1, "train_loss": v})


def _maintain_together(url: str, name: str, n: int = 6) -> None:
    queues = [TrialQueue(url, name) for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def go(q: TrialQueue) -> None:
        try:
            barrier.wait()
            q.maintain()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(q,)) for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_phase3_is_created_once_with_the_best_architectures_and_their_params(storage_url: str) -> None:
    s = _settings()
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    _finish_all(q)  # phase 1
    _maintain_together(storage_url, s.study_name)  # phase 2 (created once)
    assert q.status().phase3_pending and not q.status().phase12_final
    assert [e["slot"] for e in s.plan if e["phase"] == 2] == [6, 7]
    _finish_all(q, {7: 0.1, 6: 0.2})  # phase 2's slot 7 is the best, then slot 6; phase 1 is worse
    assert q.status().phase12_final
    _maintain_together(storage_url, s.study_name)  # phase 3, raced by six upkeeps
    trials = q.storage.get_all_trials(q.study_id)
    slots = sorted(t.user_attrs["plan_slot"] for t in trials)
    assert slots == list(range(len(s.plan))), "every slot exactly once"
    by_slot = {t.user_attrs["plan_slot"]: t for t in trials}
    arch = {r: by_slot[slot].params["arch_idx"] for r, slot in ((0, 7), (1, 6))}
    for e in s.plan:
        if e["phase"] == 3:
            t = by_slot[e["slot"]]
            assert t.user_attrs["seed"] == e["seed"] and t.user_attrs["rank"] == e["rank"]
            best = by_slot[7 if e["rank"] == 0 else 6]
            design = {k: best.params[k] for k in PARAM_NAMES}  # (best.params also holds the arch's dims)
            assert t.system_attrs["fixed_params"] == design, "the best trial's parameters"
            assert t.system_attrs["fixed_params"]["arch_idx"] == arch[e["rank"]]
    stored = q.storage.get_study_user_attrs(q.study_id)["archhpo_phase3"]
    assert [r["rank"] for r in stored] == [0, 1] and stored[0]["selection_value"] == 0.1
    # A lost confirmation trial is retried with its seed, rank and parameters.
    c = q.claim(WORKER)
    assert c is not None and c.phase == 3 and c.seed is not None
    with open_storage(storage_url).engine.begin() as conn:  # the worker vanished: FAIL, no reason
        from sqlalchemy import text

        conn.execute(text("UPDATE trials SET state = 'FAIL' WHERE trial_id = :t"), {"t": c.trial_id})
    q.maintain()
    retry = [t for t in q.storage.get_all_trials(q.study_id) if t.user_attrs.get("retry_of") == c.number]
    assert len(retry) == 1 and retry[0].user_attrs["seed"] == c.seed and retry[0].user_attrs["phase"] == 3
    assert retry[0].system_attrs["fixed_params"] == c.params
    _finish_all(q)
    status = q.maintain()
    assert status.done and status.complete == len(s.plan) and status.skipped == 0
    assert status.best_value == 0.1, "the answer is phases 1-2's best, confirmation retrains aside"


def test_missing_ranks_are_skipped_when_too_few_architectures_finished(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    s = _settings(n_trials=4)  # 3 phase-1 architectures and 1 in phase 2, one trial each
    launch(url, s)
    q = TrialQueue(url, s.study_name)
    _finish_all(q, fail_slots={0, 1, 2})  # phase 1 fails for good
    q.maintain()
    _finish_all(q)  # phase 2: one architecture finished
    status = q.maintain()
    assert status.skipped == 3, "rank 1 x 3 seeds has nothing to confirm"
    _finish_all(q)
    status = q.maintain()
    assert status.done and status.complete == 1 + 3 and status.failed == 3


# ----------------------------------------------------------------------------- statistics
def _rows(win: list[float], run: list[float]) -> list[dict]:
    rows = []
    arch = [{"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "param_count": 100},
            {"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 256, "param_count": 300}]
    n = 0
    for a, sel in zip(arch, (0.50, 0.51), strict=True):  # phase-1 selection values
        rows.append({**a, "trial": n, "phase": 1, "seed": None, "state": "COMPLETE", "val_loss": sel, "choices": "{}"})
        n += 1
    for s, (w, r) in enumerate(zip(win, run, strict=True)):
        for a, v in zip(arch, (w, r), strict=True):
            rows.append({**a, "trial": n, "phase": 3, "seed": s, "state": "COMPLETE", "val_loss": v, "choices": "{}"})
            n += 1
    return rows


def test_summary_of_a_lead_within_seed_noise() -> None:
    win, run = [0.50, 0.52, 0.49, 0.51], [0.51, 0.50, 0.52, 0.50]
    out = confirmation_summary(_rows(win, run))
    a0, a1 = out["architectures"]
    assert a0["rank"] == 0 and a0["architecture"]["d_model"] == 64 and a1["architecture"]["d_model"] == 128
    assert a0["n"] == 4 and a0["mean"] == pytest.approx(statistics.fmean(win))
    assert a0["std"] == pytest.approx(statistics.stdev(win)) and a0["values"]["2"] == 0.49
    c = out["comparison"]
    diffs = [r - w for w, r in zip(win, run, strict=True)]
    assert c["lead"] == pytest.approx(statistics.fmean(diffs)) and c["n_pairs"] == 4
    half = 3.182446305284263 * statistics.stdev(diffs) / 2  # t(0.975, df=3) * sd / sqrt(4)
    assert c["ci95"] == pytest.approx([c["lead"] - half, c["lead"] + half])
    assert c["within_noise"] is True and "within seed noise" in out["statement"]


def test_summary_of_a_real_lead_and_of_csv_rows() -> None:
    win, run = [0.50, 0.51, 0.49, 0.50, 0.50], [0.53, 0.54, 0.52, 0.535, 0.53]
    rows = _rows(win, run)
    out = confirmation_summary(rows)
    assert out["comparison"]["within_noise"] is False
    assert "larger than seed noise" in out["statement"]
    # The same rows through experiment_results.csv (all values strings) give the same summary.
    full = [{**{k: "" for k in CSV_COLUMNS}, **r} for r in rows]
    back = list(csv.DictReader(io.StringIO(csv_text(full))))
    assert confirmation_summary(back) == out
    # A CSV written before the extra columns existed has no phase: nothing to confirm, no error.
    old = [{k: r[k] for k in SPEC_COLUMNS if k in r} for r in back]
    assert confirmation_summary(old)["architectures"] == []


def test_summary_with_one_seed_or_one_architecture() -> None:
    out = confirmation_summary(_rows([0.5], [0.6]))
    assert out["comparison"]["ci95"] is None and "two or more seeds" in out["statement"]
    only = [r for r in _rows([0.5, 0.6], [0.6, 0.7]) if r["d_model"] == 64]
    assert confirmation_summary(only)["comparison"] is None
    assert confirmation_summary([])["statement"].startswith("No confirmation")


# ----------------------------------------------------------------------------- end to end
def test_confirmation_end_to_end_with_a_real_worker(storage_url: str, tmp_path: Path) -> None:
    """launch --confirm 2 --seeds 2 → a plain worker trains all slots → export: phase 3 in the CSV,
    the best JSON keeps its keys and adds "confirmation"."""
    import torch

    from archhpo.workers import Worker

    torch.set_num_threads(1)
    out = tmp_path / "res"
    rc = main(["launch", "--experiment", "cf", "--budget", "200K", "--trials", "4", "--quick", "--epochs", "2",
               "--data", TINY_DATA, "--pruner", "none", "--confirm", "2", "--seeds", "2", "--storage", storage_url])
    assert rc == 0
    summary = Worker([TrialQueue(storage_url, "cf_200K")], device="cpu", threads=1).run()
    assert summary.complete == 4 + 4 and summary.failed == 0
    assert main(["export", "--experiment", "cf", "--storage", storage_url, "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "experiment_results.csv").open()))
    assert tuple(rows[0])[: len(SPEC_COLUMNS)] == SPEC_COLUMNS
    assert sorted(r["phase"] for r in rows) == ["1"] * 3 + ["2"] + ["3"] * 4
    assert sorted(r["seed"] for r in rows if r["phase"] == "3") == ["0", "0", "1", "1"]
    best = json.loads((out / "cf_200K_best.json").read_text())
    phase1 = min(float(r["val_loss"]) for r in rows if r["phase"] == "1")
    assert best["best_value"] == pytest.approx(phase1) and best["n_trials_planned"] == 8
    conf = best["confirmation"]
    assert [a["rank"] for a in conf["architectures"]] == [0, 1]
    assert conf["architectures"][0]["architecture"]["param_count"] == best["architecture"]["param_count"]
    assert conf["comparison"]["n_pairs"] == 2 and conf["statement"]
    # Relaunching the same study adds nothing and keeps the confirmation.
    assert main(["launch", "--experiment", "cf", "--budget", "200K", "--trials", "4", "--quick", "--epochs", "2",
                 "--data", TINY_DATA, "--pruner", "none", "--confirm", "2", "--seeds", "2",
                 "--storage", storage_url]) == 0
    assert len(open_storage(storage_url).get_all_trials(TrialQueue(storage_url, "cf_200K").study_id)) == 8
    assert export_studies(open_storage(storage_url), ["cf_200K"], out)
