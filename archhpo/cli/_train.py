"""`archhpo train`: one configuration, from flags or from a best JSON, metrics as one JSON line.

A trial is built by the same function as in the worker (workers._build.build_trial: data, the
family's training defaults under the planned parameters, seeds), so on a CPU with the worker's
thread count (`--threads`), `train --from X_best.json` gives back exactly the trial's value.
The file is checked first (cli/_train_file.py), then the trial is sized with the workers' memory
estimate and micro-batch plan, as a worker sizes it, before torch builds anything.  What it
trains and one line per validation interval go to stderr; the JSON result is stdout's last line.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from archhpo.cli._train_file import trial_fields
from archhpo.models import get_family
from archhpo.schema import ARCH_KEYS
from archhpo.workers import (
    TrainConfig,
    TrialSpec,
    build_trial,
    describe_result,
    resolve_device,
    train,
    trial_shape,
)
from archhpo.workers._batch import BatchPlan, eval_batch, plan_batch, use_plan, vocab_logits


def trial_spec_from_args(args: argparse.Namespace, fields: dict[str, Any] | None = None) -> TrialSpec:
    """The TrialSpec `train` runs: a best JSON's trial (plan slot, seed, choices), or the flags';
    `fields` are cli/_train_file.py's `trial_fields(args)` when the caller checked them already."""
    return TrialSpec(**(fields if fields is not None else trial_fields(args)))


def fit_memory(trial: TrialSpec, cfg: Any, tcfg: TrainConfig, device: torch.device, what: str,
               data: Any = None) -> BatchPlan:
    """The micro-batch plan a worker makes for this trial (workers/_batch.py): MemoryRefused, with
    the estimate, when not one sample fits `device`.  With the loaded `data`, exactly the worker's
    sizes; without it (before loading) a lower bound, as `run`'s capacity check (cluster/_capacity.py)
    takes: one evaluation sample, no dataset, so nothing the worker would train is refused."""
    fam = get_family(trial.family)
    logits = vocab_logits(fam.name, cfg)  # an lm's (L, V) logits: the estimate leaves them out
    batch, evals = int(tcfg.batch_size), 1
    on_device = 0
    if data is not None:
        evals = min(eval_batch(logits, int(tcfg.eval_batch_size)), max(1, data.n_val))
        batch = min(batch, data.n_train)
        on_device = data.device_bytes(device)  # none for an lm: its windows stay on the host
    arch = {**trial.arch, "param_count": fam.param_count(cfg)}  # counted, not the file's word
    shape = trial_shape(fam, cfg, arch, batch, evals, on_device, bool(trial.study_options.compile))
    return plan_batch(shape, device, what, logits)


def _check_memory(trial: TrialSpec, device: torch.device, source: str) -> tuple[Any, str]:
    """Refuse a trial that cannot fit before its data is loaded; the family's config, and the
    trial in words for the worker's check on the loaded data."""
    fam = get_family(trial.family)
    cfg = fam.config_for(trial.arch, trial.model_info())
    what = f"The architecture from {source} ({fam.param_count(cfg):,} parameters)"
    fit_memory(trial, cfg, trial.train_config(fam), device, what)
    return cfg, what


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _progress(total: int, unit: str, start: float) -> Any:
    """The trainer's per-validation callback (its checkpoint hook, given the run's state): one line
    on stderr per validated epoch or interval; it only reads the state."""
    def report(state: dict[str, Any]) -> None:
        last = state["history"][-1]
        _say(f"{unit} {last['epoch']}/{total}: train_loss {last['train_loss']:.4f} "
             f"val_loss {last['val_loss']:.4f} ({time.perf_counter() - start:.1f} s)")
    return report


def _header(trial: TrialSpec, cfg: Any, device: torch.device, source: str) -> str:
    fam = get_family(trial.family)
    d, layers, heads, ff = (trial.arch[k] for k in ARCH_KEYS)
    unit = "validation intervals" if trial.data_budget is not None else "epochs"
    return (f"archhpo train: {fam.name} d{d}-L{layers}-h{heads}-ff{ff} ({fam.param_count(cfg):,} parameters) "
            f"from {source}, {trial.train_config(fam).epochs} {unit} on {device.type}{_mup_words(trial)}")


def _mup_words(trial: TrialSpec) -> str:
    if trial.parametrization == "sp":
        return ""
    depth = "" if trial.mup_base_depth is None else f" and base depth {trial.mup_base_depth} (CompleteP)"
    return f", µP at base width {trial.mup_base_width or trial.arch['d_model']}{depth}"


def train_command(args: argparse.Namespace, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the trial of the line (or of `fields`, trial_fields(args) checked by the caller)."""
    trial = trial_spec_from_args(args, fields)  # the file checked: nothing of torch is built yet
    device = resolve_device(args.device)
    source = args.from_json or "the command line"
    cfg, what = _check_memory(trial, device, source)
    if getattr(args, "threads", None):
        torch.set_num_threads(int(args.threads))
    if device.type == "cuda":  # the worker's CUDA settings (TF32 outside bf16 autocast)
        from archhpo.workers._device import configure_cuda_speed

        configure_cuda_speed()
    _say(_header(trial, cfg, device, source))

    def size(cfg: Any, tcfg: TrainConfig, data: Any) -> None:  # the worker's check, on the loaded data
        tcfg.eval_batch_size = eval_batch(vocab_logits(trial.family, cfg), int(tcfg.eval_batch_size))
        use_plan(fit_memory(trial, cfg, tcfg, device, what, data), tcfg, {})

    built = build_trial(trial, device, before_build=size)
    return _train_built(args, trial, built)


def _train_built(args: argparse.Namespace, trial: TrialSpec, built: Any) -> dict[str, Any]:
    """Train the built trial, a progress line per validation; the result (saved with --save)."""
    fam, cfg = built.family, built.config
    start = time.perf_counter()
    unit = "interval" if built.data_budget is not None else "epoch"
    result = train(built.model, built.data, fam.loss, built.train_config, metrics_fn=fam.metrics,
                   checkpoint=_progress(int(built.train_config.epochs), unit, start))
    known = set(TrainConfig.__dataclass_fields__)
    out = {
        "family": fam.name, **describe_result(result), "baseline_val_loss": built.baseline_loss,
        "param_count": fam.param_count(cfg), "duration_s": round(time.perf_counter() - start, 3),
        "architecture": {k: trial.arch[k] for k in ARCH_KEYS}, "choices": trial.choices,
        "params": {k: v for k, v in asdict(built.train_config).items() if k in known},
        "parametrization": trial.parametrization, "mup_base_width": trial.mup_base_width,
        "mup_base_depth": trial.mup_base_depth,
        "plan_slot": trial.slot, "seed": trial.seed, "seeds": asdict(built.seeds),
        "threads": torch.get_num_threads(),
    }
    if built.flops_per_sample is not None:
        out["flops_per_sample"] = built.flops_per_sample
        out["train_flops"] = built.flops_per_sample * result.samples
    if args.save:
        path = Path(args.save)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save({"family": fam.name, "config": asdict(cfg), "state_dict": built.model.state_dict(),
                    "metrics": out, "trial": trial.as_dict()}, tmp)
        tmp.replace(path)
        out["saved"] = str(path)
    return out
