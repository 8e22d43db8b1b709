"""Studies with their data stated per parameter (`--tokens-per-param R`, `--samples-per-param R`)
and the data seed kept apart from the init seed (`--data-seed S`).

Every trial of a budget trains on D = R x the budget's N tokens: its `epochs` are validation
intervals of D/epochs, drawn from passes over the training set (`interval_order`); the synthetic
language is generated to D (one pass), a smaller data set repeats. The tiny studies here train
the smallest lm shape with seq_len 16 on R x 75K tokens.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from archhpo.cli import main as cli_main
from archhpo.errors import ArchhpoError, StudyError
from archhpo.models import get_family
from archhpo.models.data import language
from archhpo.report._export import export_studies
from archhpo.schema import DEFAULT_INTERVALS, DataBudget
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import TrialSpec, Worker, build_trial
from archhpo.workers._train import TrainConfig, interval_order, train

LM_PINS = {"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}  # the smallest lm shape: 67,776 at seq 16


def _lm_study(name: str, ratio: float, **kw: Any) -> Any:
    kw = {"family": "lm", "n_trials": 4, "data": "synthetic:vocab=8", "quick": True,
          "family_options": {"seq_len": 16, "vocab_size": 8}, "pins": LM_PINS, "tokens_per_param": ratio,
          "fixed_params": {"learning_rate": 3e-3, "batch_size": 16, "warmup_steps": 5}, **kw}
    return prepare_settings(name, "75K", **kw)


# ----------------------------------------------------------------------------- the interval order
@pytest.mark.parametrize(("n_train", "size"), [(10, 3), (7, 7), (5, 12), (9, 4)])
def test_intervals_cut_one_stream_of_passes_each_a_permutation(n_train: int, size: int) -> None:
    intervals = 3 * n_train  # several passes whatever the sizes
    stream = torch.cat([interval_order(n_train, size, e, seed=4) for e in range(1, intervals + 1)])
    assert len(stream) == intervals * size
    for p in range(len(stream) // n_train):  # every whole pass sees every sample exactly once
        assert sorted(stream[p * n_train:(p + 1) * n_train].tolist()) == list(range(n_train))
    again = torch.cat([interval_order(n_train, size, e, seed=4) for e in range(1, intervals + 1)])
    assert torch.equal(stream, again), "the order is a function of (seed, interval) alone"
    other = torch.cat([interval_order(n_train, size, e, seed=5) for e in range(1, intervals + 1)])
    assert not torch.equal(stream, other)


def test_a_run_stopped_inside_an_interval_resumes_bit_for_bit() -> None:
    spec = TrialSpec(family="lm", data={"kind": "synthetic", "vocab": 8, "order": 3, "language": 0, "tokens": 4000},
                     options={"seq_len": 16, "seed": 0}, info={"vocab_size": 8, "seq_len": 16}, arch=LM_PINS,
                     params={"learning_rate": 3e-3, "epochs": 3, "batch_size": 16, "weight_decay": 1e-4,
                             "warmup_steps": 2})
    torch.set_num_threads(1)
    cfg = TrainConfig(learning_rate=3e-3, epochs=3, batch_size=16, warmup_steps=2, epoch_samples=400, seed=7)

    def run(stop_after: int | None) -> tuple[list[float], dict[str, Any] | None]:
        b = build_trial(spec, "cpu")
        saved: dict[str, Any] = {}
        calls = iter(range(10**6))

        def should_stop() -> bool:
            return stop_after is not None and next(calls) == stop_after

        try:
            r = train(b.model, b.data, b.family.loss, cfg, checkpoint=saved.update, should_stop=should_stop)
            return [h["val_loss"] for h in r.history], None
        except Exception:  # TrialStopped: resume from what it saved
            return [], dict(saved)

    whole, _ = run(None)
    _, state = run(40)  # inside interval 2 (25 steps an interval)
    assert state is not None and state["epoch"] == 1 and state["partial"]["steps"] > 0
    b = build_trial(spec, "cpu")
    r = train(b.model, b.data, b.family.loss, cfg, resume=state)
    assert [h["val_loss"] for h in r.history] == whole


# ----------------------------------------------------------------------------- the study
def test_a_budget_trains_every_shape_on_r_times_its_n_tokens() -> None:
    s = _lm_study("tpp", 2)
    assert s.study_name == "tpp_75K-d64-L2-h2-ff128-t2"
    budget = s.options.budget
    assert budget == DataBudget("tokens", 2.0, 75_000) and budget.target == 150_000
    assert s.data["tokens"] == math.ceil(150_000 / 16) * 16, "the synthetic language is generated to D"
    assert {e.params["epochs"] for e in s.plan if e.params} <= {DEFAULT_INTERVALS}
    spec = TrialSpec(family="lm", data=s.data, options=s.options.as_dict(), info=s.info, arch=s.archs[0],
                     params={"learning_rate": 3e-3, "epochs": 9, "batch_size": 16, "weight_decay": 0.0,
                             "warmup_steps": 5})
    cfg = spec.train_config()
    assert cfg.epoch_samples == math.ceil(math.ceil(150_000 / 16) / 9)
    assert cfg.epoch_samples * 9 * 16 >= 150_000 > (cfg.epoch_samples - 1) * 9 * 16


def test_epochs_given_count_the_intervals_and_several_ratios_make_several_studies(tmp_path: Path) -> None:
    s = _lm_study("tpp", 4, fixed_params={"epochs": 3, "learning_rate": 3e-3, "batch_size": 16, "warmup_steps": 5})
    assert s.space["epochs"] == [3]
    out = io.StringIO()
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with contextlib.redirect_stderr(out):
        assert cli_main(["launch", "--experiment", "r", "--family", "lm", "--budget", "75K", "--data",
                         "synthetic:vocab=8", "--vocab-size", "8", "--seq-len", "16", "--quick", "--trials", "2",
                         "--tokens-per-param", "1", "--tokens-per-param", "5", "--storage", url]) == 0
    assert "study r_75K-t1 " in out.getvalue() and "study r_75K-t5 " in out.getvalue()


@pytest.mark.parametrize(("family", "flag", "says"), [
    ("patchtst", {"tokens_per_param": 10}, "--samples-per-param"),
    ("lm", {"samples_per_param": 10}, "--tokens-per-param"),
    ("lm", {"tokens_per_param": 10, "samples_per_param": 10}, "not both"),
    ("lm", {"tokens_per_param": -1}, "positive"),
    ("lm", {"tokens_per_param": float("nan")}, "positive"),
])
def test_a_data_budget_that_cannot_apply_is_refused_with_the_option_to_use(family: str, flag: dict[str, Any],
                                                                            says: str) -> None:
    with pytest.raises(StudyError, match=says):
        prepare_settings("bad", "200K", family=family, n_trials=2, quick=True, **flag)


def test_a_data_budget_needs_a_budget_not_pins_alone() -> None:
    with pytest.raises(StudyError, match="give a --budget"):
        prepare_settings("bad", None, family="lm", n_trials=2, quick=True, pins=LM_PINS, tokens_per_param=10)


def test_the_cli_refuses_a_ratio_given_twice_before_writing(tmp_path: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli_main(["launch", "--experiment", "x", "--family", "lm", "--budget", "100K", "--quick",
                         "--tokens-per-param", "10", "--tokens-per-param", "10",
                         "--storage", f"sqlite:///{tmp_path / 'x.db'}"])
    assert code != 0 and "listed twice" in err.getvalue() and not (tmp_path / "x.db").exists()


def test_validation_is_the_same_windows_at_every_budget_and_training_is_sized_to_d() -> None:
    fam = get_family("lm")
    small, large = (DataBudget("tokens", 1.0, n).as_option() for n in (20_000, 60_000))
    loaded = []
    for budget in (small, large):
        options = {"seq_len": 16, "seed": 0, DataBudget.OPTION: budget}
        spec = fam.parse_data("synthetic:vocab=8", options)
        loaded.append(fam.load_data(spec, {**options, "quick": True}))  # --quick does not cap D
    assert [d.n_train for d in loaded] == [20_000 // 16, 60_000 // 16]
    assert torch.equal(loaded[0].val_target, loaded[1].val_target)
    assert loaded[0].n_val == language.BUDGET_VAL_TOKENS // 16
    explicit = fam.parse_data("synthetic:vocab=8,tokens=5000", {"seq_len": 16, DataBudget.OPTION: small})
    assert explicit["tokens"] == 5000, "tokens= given: the data stay that size and the passes repeat"


# ----------------------------------------------------------------------------- end to end
def _csv_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "experiment_results.csv") as fh:
        return list(csv.DictReader(fh))


def test_a_halving_study_records_tokens_and_passes_and_replays(sqlite_url: str, tmp_path: Path) -> None:
    """Repeated data (tokens=4000 < D), WSD and halving: rungs are fractions of D, the CSV says
    what each trial trained, and `train --from` gives back the winner's value exactly."""
    torch.set_num_threads(1)
    s = _lm_study("halv", 0.2, data="synthetic:vocab=8,tokens=4000", pruner="halving", schedule="wsd",
                  paired_seeds=0, n_trials=3, pins={**LM_PINS, "n_heads": [2, 4]})
    launch(sqlite_url, s)
    q = TrialQueue(sqlite_url, s.study_name)
    summary = Worker([q], device="cpu", threads=1).run()
    assert summary.complete >= 1 and summary.failed == 0
    export_studies(q.storage, [s.study_name], tmp_path)
    rows = _csv_rows(tmp_path)
    header = list(rows[0])
    assert header[18:20] == ["train_tokens", "tokens_per_param"], "they follow the design's 18 columns"
    budget = s.options.budget
    assert budget is not None
    target = budget.target  # 15,000 tokens
    for r in rows:
        assert float(r["tokens_per_param"]) == 0.2
        tokens, passes = int(r["train_tokens"]), float(r["data_passes"])
        assert passes == pytest.approx(int(r["train_samples"]) / (4000 // 16), abs=1e-4)
        if r["state"] == "COMPLETE":
            assert target <= tokens < target + 9 * 16, "D, rounded up to whole samples per interval"
            assert passes > 3, "4,000 tokens repeat to make 15,000"
        else:  # held at the first rung (1/9 of D) and pruned there
            assert tokens == math.ceil(math.ceil(target / 16) / 9) * 16
    best_path = tmp_path / f"halv_{s.budget}_best.json"
    best = json.loads(best_path.read_text())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["train", "--from", str(best_path), "--device", "cpu", "--threads", "1"]) == 0
    assert json.loads(out.getvalue().strip().splitlines()[-1])["val_loss"] == best["best_value"]


def test_a_data_seed_fixes_the_data_and_paired_seeds_vary_the_init_only() -> None:
    def spec(seed: int, data_seed: int | None) -> TrialSpec:
        s = _lm_study("ds", 0.1, paired_seeds=2, data_seed=data_seed, data="synthetic:vocab=8,tokens=2000")
        return TrialSpec(family="lm", data=s.data, options=s.options.as_dict(), info=s.info, arch=s.archs[0],
                         params=dict(s.plan[0].params or {}), slot=0, seed=seed)

    fixed = [spec(k, 5) for k in (0, 1)]
    assert fixed[0].data_spec_and_options() == fixed[1].data_spec_and_options()
    assert fixed[0].seeds().data == 5 and fixed[0].seeds().init != fixed[1].seeds().init
    varied = [spec(k, None) for k in (0, 1)]
    assert varied[0].data_spec_and_options() != varied[1].data_spec_and_options(), "today's paired seeds"
    built = [build_trial(s, "cpu") for s in fixed]
    assert torch.equal(built[0].data.train_target, built[1].data.train_target)
    assert not torch.equal(next(built[0].model.parameters()), next(built[1].model.parameters()))


def test_a_worker_addresses_a_ratio_study_by_budget_and_ratio(sqlite_url: str) -> None:
    s = _lm_study("addr", 0.1)
    launch(sqlite_url, s)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli_main(["export", "--experiment", "addr", "--budget", "75K", "--d-model", "64", "--n-layers", "2",
                         "--n-heads", "2", "--d-ff", "128", "--tokens-per-param", "0.1", "--storage", sqlite_url,
                         "--out", str(Path(sqlite_url.removeprefix("sqlite:///")).parent / "o")])
    assert code == 0, err.getvalue()


def test_data_budget_checks_its_own_fields() -> None:
    with pytest.raises(ArchhpoError, match="unit"):
        DataBudget("bytes", 1.0, 10)
    with pytest.raises(ArchhpoError, match="--budget"):
        DataBudget("tokens", 1.0, 0)
    assert DataBudget("samples", 2.5, 4).target == 10 and DataBudget("samples", 2.5, 4).label == "s2.5"


def test_a_ladder_of_ratio_studies_plans_each_larger_budget_from_the_smaller_at_the_same_r(sqlite_url: str) -> None:
    """`--ladder` with two ratios: two chains (75K-tR -> 150K-tR); the larger budget's trials,
    planned from the smaller's winner, keep the interval count and train on R x 150K tokens."""
    from optuna.trial import TrialState

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli_main(["launch", "--experiment", "lad", "--family", "lm", "--budget", "75K", "--budget", "150K",
                         "--ladder", "--data", "synthetic:vocab=8", "--vocab-size", "8", "--seq-len", "16",
                         "--quick", "--trials", "4", "--tokens-per-param", "0.1", "--tokens-per-param", "0.2",
                         "--storage", sqlite_url]) == 0, err.getvalue()
    for ratio in ("0.1", "0.2"):
        small, large = TrialQueue(sqlite_url, f"lad_75K-t{ratio}"), TrialQueue(sqlite_url, f"lad_150K-t{ratio}")
        assert large.claim({"host": "t"}) is None, "planned only once the smaller budget is final"
        while not small.maintain().done:
            while (c := small.claim({"host": "t"})) is not None:
                small.finish(c, TrialState.COMPLETE, 1.0 + 0.01 * c.slot, {})
        large.maintain()
        claim = large.claim({"host": "t"})
        assert claim is not None and claim.params["epochs"] == DEFAULT_INTERVALS
        budget = large.settings.options.budget
        assert budget is not None and budget.target == math.ceil(float(ratio) * 150_000)
        spec = TrialSpec(family="lm", data=large.settings.data, options=large.settings.options.as_dict(),
                         info=large.settings.info, arch=claim.arch, params=claim.params)
        assert spec.train_config().epoch_samples == budget.samples_per_interval(16, DEFAULT_INTERVALS)
