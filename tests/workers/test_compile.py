"""torch.compile where it wins: measured per family on a CPU it wins nowhere
(BENCHMARKS.md §9), so no study compiles unless asked. `--compile` is a study option: stored only
when on (a study launched without it keeps its identity), it compiles every trial's model in place
(checkpoints keep the eager model's keys), a best JSON carries it, so `train --from` replays a
compiled trial exactly, and the memory estimate counts the attention maps PyTorch's own dropout
keeps (a compiled model cannot call the fused CPU kernels)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest
import torch

from archhpo.cli import main as cli_main
from archhpo.models import get_family
from archhpo.report._export import export_studies
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import Worker
from archhpo.workers import _build as build
from archhpo.workers._memory import TRAIN_MAPS_CPU, estimate_training_bytes, trial_shape
from tests.conftest import run_cli

LM_DATA = "synthetic:tokens=3000"


def test_compile_is_off_unless_asked_and_stored_only_when_on() -> None:
    plain = prepare_settings("c", "100K", family="lm", data=LM_DATA, quick=True)
    assert "compile" not in plain.options.keys, "a study without --compile keeps the options it always had"
    on = prepare_settings("c", "100K", family="lm", data=LM_DATA, quick=True, compile_models=True)
    assert on.options.compile is True
    assert "--compile" in run_cli("run", "--help").stdout


def test_a_compiled_trial_checkpoints_eager_keys_and_replays_exactly(sqlite_url: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    s = prepare_settings("comp", "100K", family="lm", data=LM_DATA, quick=True, pruner="none", n_trials=2,
                         compile_models=True, family_options={"seq_len": 16})
    launch(sqlite_url, dataclasses.replace(s, plan=s.plan[:1]))
    compiled: list[bool] = []
    real = build.build_trial

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        built = real(*args, **kwargs)
        compiled.append(built.model._compiled_call_impl is not None)
        return built

    saved: list[list[str]] = []
    # Dynamo traces the model as a study's would, but with the "eager" backend: inductor's C++ build
    # took 4 of this test's 4.5 minutes on 2 cores, and what is tested is archhpo's bookkeeping
    # (compiled in place, eager keys saved, the replay compiled), not inductor's code.
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, **{**kw, "backend": "eager"}))
    monkeypatch.setattr("archhpo.workers._loop.build_trial", spy)
    monkeypatch.setattr("archhpo.workers._loop._atomic_save", lambda obj, path: saved.append(list(obj["model"])))
    torch.set_num_threads(1)
    q = TrialQueue(sqlite_url, s.study_name)
    assert Worker([q], device="cpu", threads=1, checkpoint_dir=tmp_path / "ck").run().complete == 1
    assert compiled == [True]
    assert saved and not any(k.startswith("_orig_mod.") for k in saved[-1]), "the eager model's keys"
    (trial,) = q.storage.get_all_trials(q.study_id)
    export_studies(q.storage, [s.study_name], tmp_path)
    best = tmp_path / "comp_100K_best.json"
    assert json.loads(best.read_text())["options"]["compile"] is True
    monkeypatch.setattr("archhpo.cli._train.build_trial", spy)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["train", "--from", str(best), "--device", "cpu", "--threads", "1"]) == 0
    assert compiled == [True, True], "the replay compiles as the trial did"
    assert json.loads(out.getvalue().strip().splitlines()[-1])["val_loss"] == trial.value


def test_a_compiled_cpu_trial_is_sized_with_its_attention_maps() -> None:
    fam = get_family("signal")
    cfg = fam.config_for({"d_model": 64, "n_layers": 3, "n_heads": 4, "d_ff": 256},
                         {"channels": 4, "num_bins": 32, "seq_len": 159, "encoder": "cat"})  # 636 tokens
    arch = {"param_count": 152_544, "d_model": 64, "n_layers": 3, "n_heads": 4, "d_ff": 256}
    eager, comp = (trial_shape(fam, cfg, arch, 32, 8, compiled=c) for c in (False, True))
    maps = 32 * 3 * TRAIN_MAPS_CPU * 4 * (4 * 159) ** 2 * 4  # batch x layers x maps x heads x T^2 x 4 B
    from archhpo.models._cpu_kernels import lib
    kernels = lib() is not None
    assert estimate_training_bytes(comp, "cpu") - estimate_training_bytes(eager, "cpu") == (maps if kernels else 0)
    assert estimate_training_bytes(comp, "cuda") == estimate_training_bytes(eager, "cuda"), "CUDA keeps none"
