"""The confirmation phase (--confirm K --seeds S): planned, created once when phases 1-2 are final,
retried like any slot, exported as phase 3, and summarised with a paired comparison."""

from __future__ import annotations

import csv
import html
import io
import json
import statistics
import threading
from pathlib import Path

import pytest
from optuna.trial import TrialState

from archhpo.cli import main
from archhpo.errors import BudgetError
from archhpo.report import CSV_COLUMNS, SPEC_COLUMNS, confirmation_summary, export_studies
from archhpo.report._export import csv_text
from archhpo.search import PlanEntry, TrialQueue, launch, open_storage, prepare_settings
from archhpo.search._rules import prunable
from archhpo.search._space import PARAM_NAMES
from archhpo.search._study import MedianRule
from tests.conftest import TINY_DATA

WORKER = {"host": "test", "device": "cpu"}


def _settings(**kw):  # type: ignore[no-untyped-def]
    args = {"n_trials": 8, "data": TINY_DATA, "quick": True, "seed": 0, "pruner": "none",
            "confirm": 2, "confirm_seeds": 3}
    return prepare_settings("cf", "500K", **{**args, **kw})


# ----------------------------------------------------------------------------- the plan
def test_default_plan_has_no_confirmation_and_stays_50_trials() -> None:
    s = prepare_settings("d", "2M")
    assert len(s.plan) == 50 and {e.phase for e in s.plan} == {1, 2}
    assert all(e.seed is None and "rank" not in e.as_dict() for e in s.plan)
    assert "confirm" not in s.options.keys


def test_confirmation_slots_are_planned_seed_by_seed() -> None:
    s = _settings()
    p3 = [e for e in s.plan if e.phase == 3]
    assert len(p3) == 2 * 3 and len(s.plan) == 8 + 6
    assert [(e.seed, e.rank) for e in p3] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(e.arch_idx is None and e.params is None for e in p3)
    assert s.options.confirm == 2 and s.options.confirm_seeds == 3


def test_confirmation_never_asks_for_more_ranks_than_architectures() -> None:
    s = prepare_settings("cf", None, pins={"d_model": [64], "n_layers": [2, 3], "n_heads": [4], "d_ff": [128]},
                         data=TINY_DATA, quick=True, confirm=5, confirm_seeds=2)
    assert {e.rank for e in s.plan if e.phase == 3} == {0, 1}


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
    assert [e.slot for e in s.plan if e.phase == 2] == [6, 7]
    _finish_all(q, {7: 0.1, 6: 0.2})  # phase 2's slot 7 is the best, then slot 6; phase 1 is worse
    assert q.status().phase12_final
    _maintain_together(storage_url, s.study_name)  # phase 3, raced by six upkeeps
    trials = q.storage.get_all_trials(q.study_id)
    slots = sorted(t.user_attrs["plan_slot"] for t in trials)
    assert slots == list(range(len(s.plan))), "every slot exactly once"
    by_slot = {t.user_attrs["plan_slot"]: t for t in trials}
    arch = {r: by_slot[slot].params["arch_idx"] for r, slot in ((0, 7), (1, 6))}
    for e in s.plan:
        if e.phase == 3:
            t = by_slot[e.slot]
            assert t.user_attrs["seed"] == e.seed and t.user_attrs["rank"] == e.rank
            best = by_slot[7 if e.rank == 0 else 6]
            design = {k: best.params[k] for k in PARAM_NAMES}  # (best.params also holds the arch's dims)
            assert t.system_attrs["fixed_params"] == design, "the best trial's parameters"
            assert t.system_attrs["fixed_params"]["arch_idx"] == arch[e.rank]
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


def test_missing_ranks_are_skipped_when_too_few_architectures_finished(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
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
    assert out["comparison"]["ci95"] is None and "3 or more complete pairs" in out["statement"]
    only = [r for r in _rows([0.5, 0.6], [0.6, 0.7]) if r["d_model"] == 64]
    assert confirmation_summary(only)["comparison"] is None
    assert confirmation_summary([])["statement"].startswith("No confirmation")


def test_two_pairs_give_no_interval() -> None:
    out = confirmation_summary(_rows([0.50, 0.52], [0.60, 0.61]))
    c = out["comparison"]
    assert c["n_pairs"] == 2 and c["lead"] == pytest.approx(0.095) and c["ci95"] is None
    assert c["within_noise"] is None and "on 2 seeds; 3 or more complete pairs" in out["statement"]


def test_summary_names_unfinished_trials_and_compares_complete_pairs_only() -> None:
    win, run = [0.50, 0.52, 0.49, 0.51], [0.51, 0.50, 0.52, 0.50]
    rows = _rows(win, run)
    lost = next(r for r in rows if r["phase"] == 3 and r["seed"] == 2 and r["d_model"] == 128)
    lost.update(state="FAIL", val_loss=None, fail_reason="NaN loss at epoch 2")
    waiting = next(r for r in rows if r["phase"] == 3 and r["seed"] == 3 and r["d_model"] == 64)
    waiting.update(state="RUNNING", val_loss=None)
    out = confirmation_summary(rows)
    a0, a1 = out["architectures"]
    assert (a0["n"], a1["n"]) == (3, 3) and a1["mean"] == pytest.approx(statistics.fmean([0.51, 0.50, 0.50]))
    c = out["comparison"]
    assert c["n_pairs"] == 2 and c["seeds"] == [0, 1] and c["unpaired_seeds"] == [2, 3]
    assert c["differences"] == pytest.approx([0.01, -0.02]) and c["ci95"] is None
    assert out["unfinished"] == [
        {"rank": 0, "seed": 3, "trial": waiting["trial"], "state": "RUNNING", "reason": None},
        {"rank": 1, "seed": 2, "trial": lost["trial"], "state": "FAIL", "reason": "NaN loss at epoch 2"},
    ]
    assert "the comparison uses 2 complete pair(s) of 4 seeds" in out["statement"]
    assert f"rank 1 seed 2 (trial {lost['trial']}, FAIL: NaN loss at epoch 2)" in out["statement"]


# ----------------------------------------------------------------------------- pruning
def test_only_search_trials_are_prunable() -> None:
    confirm = _settings(pruner="median")
    assert [prunable(e) for e in confirm.plan] == [e.phase != 3 for e in confirm.plan]
    assert any(prunable(e) for e in confirm.plan) and not all(prunable(e) for e in confirm.plan)
    paired = prepare_settings("pf", "500K", n_trials=4, data=TINY_DATA, quick=True, paired_seeds=2)
    assert paired.plan and not any(prunable(e) for e in paired.plan)
    assert not any(prunable(PlanEntry.from_dict(e.as_dict())) for e in paired.plan)


def test_the_median_rule_decides_as_optunas_median_pruner_does() -> None:
    """One definition of the rule: MedianRule.stops and the MedianPruner built from it agree."""
    import optuna

    rule = MedianRule.for_study(quick=True)
    study = optuna.create_study(pruner=rule.optuna_pruner())
    for v in (1.0, 2.0, 3.0, 4.0, 5.0):
        t = study.ask()
        t.report(v, 1)
        study.tell(t, v)
    decisions = []
    for step, best in ((0, 9.0), (1, 2.9), (1, 3.0), (1, 3.1), (2, 9.0)):
        t = study.ask()
        t.report(best, step)
        mine = rule.stops(step, best, [1.0, 2.0, 3.0, 4.0, 5.0] if step == 1 else [])
        assert t.should_prune() == mine, (step, best)
        decisions.append(mine)
        study.tell(t, state=TrialState.FAIL)  # kept out of the completed trials
    assert decisions == [False, False, False, True, False]


def test_the_median_rule_stops_search_trials_and_never_replicates(storage_url: str) -> None:
    s = _settings(pruner="median", n_trials=6, confirm=1, confirm_seeds=2)  # warm-up 1 epoch (quick)
    launch(storage_url, s)
    q = TrialQueue(storage_url, s.study_name)
    rule = MedianRule.for_study(quick=True)
    assert (rule.n_startup_trials, rule.n_warmup_steps) == (5, 1)
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):  # five finished trials: median 3.0 at epoch 1
        c = q.claim(WORKER)
        assert c is not None and c.phase == 1
        assert not q.report(c, 1, value), "fewer than five finished trials: nothing is pruned yet"
        q.finish(c, TrialState.COMPLETE, value, {"duration_s": 0.1})
    c = q.claim(WORKER)
    assert c is not None and c.phase in (1, 2) and prunable(c)
    assert not q.report(c, 0, 9.0), "epoch 0 is warm-up"
    assert q.report(c, 1, 3.5), "worse than the median at epoch 1: the search trial is pruned"
    q.finish(c, TrialState.PRUNED, None, {"duration_s": 0.1})
    assert q.maintain().phase12_final  # creates phase 3
    replicates = []
    while (c := q.claim(WORKER)) is not None:
        replicates.append(c)
        assert c.phase == 3 and not prunable(c)
        assert not q.report(c, 1, 100.0) and not q.report(c, 2, 100.0), "a replicate is never pruned"
    assert len(replicates) == 2


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


def test_every_confirmation_trial_finishes_under_the_default_pruner(storage_url: str, tmp_path: Path) -> None:
    """`--confirm 2 --seeds 3` with the default (median) pruner and real workers ends with
    2 architectures x 3 seeds trained to the end and a seed-by-seed comparison of rank 0 and 1."""
    import torch

    from archhpo.workers import Worker

    torch.set_num_threads(1)
    out = tmp_path / "res"
    assert main(["launch", "--experiment", "cf", "--budget", "200K", "--trials", "5", "--quick", "--epochs", "4",
                 "--data", TINY_DATA, "--confirm", "2", "--seeds", "3", "--storage", storage_url]) == 0
    q = TrialQueue(storage_url, "cf_200K")
    assert q.settings.pruner == "median" and isinstance(q.rule, MedianRule)
    threads = [threading.Thread(target=Worker([TrialQueue(storage_url, "cf_200K")], device="cpu", threads=1).run)
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    trials = q.storage.get_all_trials(q.study_id)
    phase3 = [t for t in trials if t.user_attrs.get("phase") == 3]
    assert len(phase3) == 6 and all(t.state == TrialState.COMPLETE for t in phase3), \
        [(t.number, t.state.name) for t in phase3]
    assert all(len(t.intermediate_values) == 4 for t in phase3), "every replicate trained all 4 epochs"
    assert main(["export", "--experiment", "cf", "--storage", storage_url, "--out", str(out)]) == 0
    conf = json.loads((out / "cf_200K_best.json").read_text())["confirmation"]
    assert conf["n_architectures"] == 2 and conf["seeds"] == [0, 1, 2] and conf["unfinished"] == []
    values = {(t.user_attrs["rank"], t.user_attrs["seed"]): t.value for t in phase3}
    for a in conf["architectures"]:
        mine = [values[(a["rank"], s)] for s in range(3)]
        assert a["n"] == 3 and a["mean"] == pytest.approx(statistics.fmean(mine))
        assert a["std"] == pytest.approx(statistics.stdev(mine))
    c = conf["comparison"]
    diffs = [values[(1, s)] - values[(0, s)] for s in range(3)]
    assert c["n_pairs"] == 3 and c["unpaired_seeds"] == [] and c["differences"] == pytest.approx(diffs)
    half = 4.302652729911275 * statistics.stdev(diffs) / 3 ** 0.5  # t(0.975, df=2) * se
    assert c["ci95"] == pytest.approx([statistics.fmean(diffs) - half, statistics.fmean(diffs) + half])
    assert c["within_noise"] == (c["ci95"][0] <= 0 <= c["ci95"][1])
    assert ("within seed noise" in conf["statement"]) == c["within_noise"]
    # The report shows the same confirmation.
    assert main(["report", "--experiment", "cf", "--storage", storage_url, "--out", str(out)]) == 0
    page = (out / "cf_report.html").read_text()
    assert "3 complete pairs" in page and html.escape(conf["statement"]) in page


def test_a_lead_on_too_few_pairs_says_how_many_seeds_would_judge_it() -> None:
    """--ladder confirms with 1 seed, so its finalists share one: the sentence names the option that
    would give an interval, and no verdict on noise."""
    from archhpo.report._confirm import MIN_PAIRS, lead_statement, paired_difference

    one = lead_statement(paired_difference({0: 2.0}, {0: 2.1}))
    assert one == ("The winner leads the runner-up by 0.100 on the one seed both finished; 3 or more complete "
                   "pairs are needed to judge seed noise (confirm with --seeds 3 or more).")
    assert MIN_PAIRS == 3 and "noise (" in lead_statement(paired_difference({0: 2.0, 1: 2.0}, {0: 2.1, 1: 1.9}))
    assert "--seeds" not in lead_statement(paired_difference({0: 2.0, 1: 2.0, 2: 2.0}, {0: 2.1, 1: 2.2, 2: 2.1}))
