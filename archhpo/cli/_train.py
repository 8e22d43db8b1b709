"""`archhpo train`: one configuration, from flags or from a best JSON, metrics as one JSON line.

A trial is built by the same function as in the worker (workers._build.build_trial: data, the
family's training defaults under the planned parameters, seeds), so on a CPU with the worker's
thread count (`--threads`), `train --from X_best.json` gives back exactly the trial's value.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from archhpo.cli._options import default
from archhpo.errors import ArchhpoError
from archhpo.models import get_family
from archhpo.schema import ARCH_KEYS, TRAINING_PARAMS, schedule_options
from archhpo.search._space import FULL_SPACE, QUICK_SPACE
from archhpo.workers import TrainConfig, TrialSpec, build_trial, describe_result, resolve_device, train


def _load_best(path: str) -> dict[str, Any]:
    try:
        best = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ArchhpoError(f"Best-config file {path} does not exist; pass a *_best.json from `archhpo run`.") from None
    except json.JSONDecodeError:
        raise ArchhpoError(f"{path} is not valid JSON; pass a *_best.json written by archhpo.") from None
    if not best.get("architecture") or not best.get("best_params"):
        raise ArchhpoError(f"{path} has no winning trial (architecture/best_params are empty); "
                           "wait for a trial to complete and export again.")
    return best


def _options_from(args: argparse.Namespace, fam: Any, best: dict[str, Any] | None
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trial's options (a best JSON's, unless a flag says otherwise) and the family flags given."""
    options: dict[str, Any] = dict(best.get("options", {})) if best else {}
    for key in ("horizon", "threshold", "seed"):
        if getattr(args, key, None) is not None:
            options[key] = getattr(args, key)
    for key in ("horizon", "threshold", "seed"):
        options.setdefault(key, default(key))  # one definition: archhpo/_options.py
    for key in ("quick", "compile"):  # switches: a flag turns one on; a best JSON keeps its study's
        if getattr(args, key, False):
            options[key] = True
    schedule, cooldown = (getattr(args, k, None) for k in ("schedule", "cooldown"))
    schedule = schedule if schedule is not None else options.pop("schedule", default("schedule"))
    cooldown = cooldown if cooldown is not None else options.pop("cooldown", default("cooldown"))
    options = {k: v for k, v in options.items() if k not in ("schedule", "cooldown")}
    options.update(schedule_options(schedule, cooldown))
    flag_values = {f.name: getattr(args, f"fam_{f.name}") for f in fam.flags
                   if getattr(args, f"fam_{f.name}", None) is not None}
    options.update(flag_values)
    return options, flag_values


def trial_spec_from_args(args: argparse.Namespace) -> TrialSpec:
    """The TrialSpec `train` runs: a best JSON's trial (plan slot, seed, choices), or the flags'."""
    best = _load_best(args.from_json) if args.from_json else None
    family_name = best.get("family", args.family) if best else args.family
    fam = get_family(family_name)
    options, flag_values = _options_from(args, fam, best)
    if best and args.data is None:
        spec = dict(best["data"])
        if "path" in spec:  # a file (every family's format): re-validated and re-hashed on this machine
            spec = fam.parse_data(spec["path"], options)
    else:
        spec = fam.parse_data(args.data or "synthetic", options)
    info = {**flag_values, **fam.data_info(spec, options)}  # the data wins on shapes
    if best:
        info = {**best.get("info", {}), **info}
        row = best["architecture"]
        arch: dict[str, Any] = {k: row[k] for k in ARCH_KEYS}
        # What the export writes (contract): top-level "choices", "seed" and "plan_slot".
        arch["choices"] = {**dict(row.get("choices") or {}), **dict(best.get("choices") or {})}
        params = {k: v for k, v in dict(best["best_params"]).items() if k != "arch_idx"}
        slot = int(best.get("plan_slot") or 0)
        seed = best.get("seed")
    else:
        arch = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads, "d_ff": args.d_ff}
        missing = [k for k, v in arch.items() if v is None]
        if missing:
            raise ArchhpoError(f"Missing {', '.join('--' + k.replace('_', '-') for k in missing)}; "
                               "give the architecture or --from a best JSON.")
        space = QUICK_SPACE if options.get("quick") else FULL_SPACE
        params = {**space.default(), **dict(fam.train_defaults)}
        slot, seed = 0, None
    for key in TRAINING_PARAMS:
        if getattr(args, key, None) is not None:
            params[key] = getattr(args, key)
    return TrialSpec(family=fam.name, data=spec, options=options, info=info, arch=arch, params=params,
                     slot=slot, seed=int(seed) if seed is not None else None)


def train_command(args: argparse.Namespace) -> dict[str, Any]:
    trial = trial_spec_from_args(args)
    device = resolve_device(args.device)
    if getattr(args, "threads", None):
        torch.set_num_threads(int(args.threads))
    if device.type == "cuda":  # the worker's CUDA settings (TF32 outside bf16 autocast)
        from archhpo.workers._device import configure_cuda_speed

        configure_cuda_speed()
    built = build_trial(trial, device)
    fam, cfg = built.family, built.config
    start = time.perf_counter()
    result = train(built.model, built.data, fam.loss, built.train_config, metrics_fn=fam.metrics)
    known = set(TrainConfig.__dataclass_fields__)
    out = {
        "family": fam.name, **describe_result(result), "baseline_val_loss": built.baseline_loss,
        "param_count": fam.param_count(cfg), "duration_s": round(time.perf_counter() - start, 3),
        "architecture": {k: trial.arch[k] for k in ARCH_KEYS}, "choices": trial.choices,
        "params": {k: v for k, v in asdict(built.train_config).items() if k in known},
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
