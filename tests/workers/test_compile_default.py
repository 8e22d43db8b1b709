"""A trial's build on CPU keeps the eager model however many steps it plans (the CUDA compile
default is off there), and an asked compile stays lazy as before."""

from __future__ import annotations

from archhpo.models import get_family
from archhpo.workers._build import TrialSpec, build_trial
from archhpo.workers._device import COMPILE_MIN_STEPS


def _spec(compile_asked: bool) -> TrialSpec:
    fam = get_family("lm")
    spec = fam.parse_data("synthetic:tokens=6000", {"seq_len": 16})
    return TrialSpec(family="lm", data=spec, options={"seed": 0, "compile": compile_asked, "seq_len": 16},
                     info=fam.data_info(spec, {"seq_len": 16}), arch={"d_model": 16, "n_layers": 1, "n_heads": 2,
                                                                     "d_ff": 32},
                     params={"batch_size": 4, "learning_rate": 1e-3, "epochs": 50, "weight_decay": 0.0,
                             "warmup_steps": 0}, slot=0)


def test_a_long_cpu_trial_builds_eager_and_records_no_compile_time() -> None:
    """Thousands of planned steps (past COMPILE_MIN_STEPS) on CPU: the model is not compiled."""
    built = build_trial(_spec(False), "cpu")
    steps = built.train_config.steps_per_epoch(built.data.n_train) * built.train_config.epochs
    assert steps >= COMPILE_MIN_STEPS
    assert built.model._compiled_call_impl is None and built.compile_s is None
    asked = build_trial(_spec(True), "cpu")
    assert asked.model._compiled_call_impl is not None and asked.compile_s is None  # lazy, as before
