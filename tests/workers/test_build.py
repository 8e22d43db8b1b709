"""One way to build a trial: the worker and `archhpo train --from X_best.json`
build through workers._build.build_trial, so on a CPU with one thread the replay gives back
EXACTLY the trial's value, for every family and every signal encoder.

The plans here leave the warm-up within the first epoch and train signal for more epochs than
its eval_every (20), so the family's training defaults (min_lr_ratio, eval_every, grad_clip)
change the value: a replay on another schedule, or a worker that ignored them, fails `==`.
The slot is 1 and the study seed 3, so a replay that ignored the slot or the seed fails too.
The same through real processes (`archhpo worker`, `export`, `train --from --threads 1`):
tests/e2e/test_families.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from archhpo.cli import main as cli_main
from archhpo.config import StoredOptions
from archhpo.report._export import export_studies
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._space import SearchSpace
from archhpo.workers import TrainConfig, TrialSpec, Worker, build_trial, trial_seeds
from archhpo.workers._train import trial_seed
from tests.conftest import TINY_DATA

SIGNAL_ENCODERS = ("sum", "linear", "linear-ortho", "linear-ppe", "mlp", "concat", "ci", "cat")
SIGNAL_DATA = "multisignal:series=36,length=12"
# Past eval_every (20) for every encoder but `cat` (a token per step and channel: the slowest on a
# CPU), whose 6 epochs still leave the warm-up after 2 of 6 steps (min_lr_ratio matters).
SIGNAL_EPOCHS = {e: 6 if e == "cat" else 21 for e in SIGNAL_ENCODERS}

# family, budget, data, family options, epochs
CASES: dict[str, tuple[str, str, str, dict[str, Any], int]] = {
    "patchtst": ("patchtst", "200K", TINY_DATA, {}, 2),
    "ft_transformer-sequence": ("ft_transformer", "150K", "synthetic:symbols=10,steps=80",
                                {"variant": "sequence", "seq_len": 5}, 2),
    "ft_transformer-tabular": ("ft_transformer", "150K", "synthetic:symbols=20,steps=120", {"variant": "tabular"}, 2),
    "csn_transformer": ("csn_transformer", "400K", "synthetic:symbols=10,steps=120", {}, 2),
    "char_cls": ("char_cls", "150K", "synthetic:n=300", {}, 2),
    "lm": ("lm", "100K", "synthetic:tokens=4000", {"seq_len": 16}, 2),
    **{f"signal-{e}": ("signal", "150K", SIGNAL_DATA, {"encoder": e, "channels": 4}, SIGNAL_EPOCHS[e])
       for e in SIGNAL_ENCODERS},
}


def _tiny_study(url: str, name: str, family: str, budget: str, data: str, fam_opts: dict[str, Any],
                epochs: int, seed: int | None = None, paired: bool = False) -> Any:
    """A one-trial study (plan slot 1) on the smallest architecture of the grid."""
    s = prepare_settings(name, budget, family=family, n_trials=8, data=data, seed=3, quick=True,
                         pruner="none", family_options=fam_opts)
    arch_idx = min(range(len(s.archs)), key=lambda i: s.archs[i]["param_count"])
    params = {"learning_rate": 1e-3, "epochs": epochs, "batch_size": 32, "weight_decay": 1e-4, "warmup_steps": 2}
    space = SearchSpace(learning_rate=(1e-4, 1e-3), epochs=(epochs,), batch_size=(32,), weight_decay=(1e-5, 1e-3),
                        warmup_steps=(2,))
    entry = dataclasses.replace(s.plan[0], slot=1, phase=1, arch_idx=arch_idx, params=params,
                                seed=s.plan[0].seed if seed is None else seed)
    options = StoredOptions.from_dict({**s.options.as_dict(), "paired_seeds": 1}) if paired else s.options
    s = dataclasses.replace(s, plan=[entry], space=space.as_dict(), options=options)
    launch(url, s)
    return s


def _train_from(path: Path, threads: int = 1) -> dict[str, Any]:
    """`archhpo train --from PATH --device cpu --threads N`, in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["train", "--from", str(path), "--device", "cpu", "--threads", str(threads)]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_train_from_best_json_gives_exactly_the_trials_value(sqlite_url: str, case: str, tmp_path: Path) -> None:
    family, budget, data, fam_opts, epochs = CASES[case]
    url = sqlite_url
    s = _tiny_study(url, "exact", family, budget, data, fam_opts, epochs)
    torch.set_num_threads(1)
    q = TrialQueue(url, s.study_name)
    summary = Worker([q], device="cpu", threads=1).run()
    assert summary.complete == 1, summary
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert trial.user_attrs["plan_slot"] == 1
    export_studies(q.storage, [s.study_name], tmp_path)
    best_path = tmp_path / f"exact_{s.budget}_best.json"
    best = json.loads(best_path.read_text())
    assert best["best_value"] == trial.value
    again = _train_from(best_path)
    assert again["val_loss"] == trial.value, f"{case}: replay {again['val_loss']!r} != trial {trial.value!r}"
    assert again["param_count"] == trial.user_attrs["param_count"]
    if family == "signal":
        assert again["params"]["eval_every"] == 20 and again["params"]["min_lr_ratio"] == 0.01
        assert sorted(trial.intermediate_values) == ([20, 21] if epochs > 20 else [epochs]), "eval_every 20"
        assert trial.user_attrs.get("encoder", fam_opts["encoder"]) == fam_opts["encoder"]
    assert trial.user_attrs["flops_per_sample"] > 0
    assert trial.user_attrs["train_flops"] == again["train_flops"] > 0, "flops per sample x samples trained"
    assert trial.user_attrs["samples_per_s"] > 0


@pytest.mark.parametrize("paired", [False, True])
def test_a_seeded_trial_replays_exactly_with_its_seed(sqlite_url: str, paired: bool, tmp_path: Path) -> None:
    url = sqlite_url
    s = _tiny_study(url, "seeded", "patchtst", "200K", TINY_DATA, {}, 2, seed=5, paired=paired)
    q = TrialQueue(url, s.study_name)
    assert Worker([q], device="cpu", threads=1).run().complete == 1
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert trial.user_attrs["seed"] == 5
    export_studies(q.storage, [s.study_name], tmp_path)
    best_path = tmp_path / f"seeded_{s.budget}_best.json"
    again = _train_from(best_path)
    assert again["seed"] == 5 and again["seeds"] == dataclasses.asdict(trial_seeds(3, 1, 5, paired))
    assert again["val_loss"] == trial.value


def test_seeds_contract() -> None:
    assert trial_seeds(3, 7) == trial_seeds(3, 7, None, paired=True)
    plain = trial_seeds(3, 7)
    assert (plain.data, plain.init, plain.batches) == (3, trial_seed(3, 7), 7)
    conf = trial_seeds(3, 7, seed=2)  # confirmation: the study's data, slot-independent seeds
    assert conf.data == 3 and conf == trial_seeds(3, 99, seed=2)
    paired = trial_seeds(3, 7, seed=2, paired=True)  # paired: the seed drives the data too
    assert paired.data == 2 and paired.init == conf.init and paired.batches == conf.batches
    assert trial_seeds(3, 7, seed=4).init != conf.init
    # confirmation seed s never repeats an ordinary trial's seeds (slot s of a seed-0 study)
    for s in range(5):
        replicate, ordinary = trial_seeds(0, 9, seed=s), trial_seeds(0, s)
        assert (replicate.init, replicate.batches) != (ordinary.init, ordinary.batches)


def _spec(**kw: Any) -> TrialSpec:
    base = dict(family="signal", data={"kind": "multisignal", "series": 40, "length": 24, "channels": 4, "seed": 0,
                                       "num_bins": 8},
                options={"seed": 0, "quick": True}, info={"channels": 4, "num_bins": 8, "seq_len": 23},
                arch={"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "choices": {"encoder": "cat"}},
                params={"learning_rate": 1e-3, "epochs": 3, "batch_size": 8, "weight_decay": 0.0, "warmup_steps": 0},
                slot=2)
    base.update(kw)
    return TrialSpec(**base)  # type: ignore[arg-type]


def test_planned_params_win_and_family_defaults_fill_the_rest() -> None:
    tcfg = _spec().train_config()
    assert isinstance(tcfg, TrainConfig)
    # signal's train_defaults say lr 3e-4, batch 32, warm-up 0: the plan's values win ...
    assert (tcfg.learning_rate, tcfg.batch_size, tcfg.warmup_steps, tcfg.weight_decay) == (1e-3, 8, 0, 0.0)
    # ... and its other defaults reach the trainer.
    assert (tcfg.min_lr_ratio, tcfg.eval_every, tcfg.grad_clip) == (0.01, 20, 1.0)
    assert tcfg.seed == 2  # the batch order of slot 2


def test_choices_reach_the_model_and_a_paired_seed_the_data() -> None:
    built = build_trial(_spec(), "cpu")
    assert built.config.encoder == "cat"
    plain = _spec(seed=9)
    paired = _spec(seed=9, options={"seed": 0, "quick": True, "paired_seeds": 2})
    assert plain.data_spec_and_options()[0]["seed"] == 0, "confirmation: the study's data"
    spec, options = paired.data_spec_and_options()
    assert spec["seed"] == 9 and options["seed"] == 9
    a, b = build_trial(plain, "cpu"), build_trial(paired, "cpu")
    assert not torch.equal(a.data.val_target, b.data.val_target)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))
