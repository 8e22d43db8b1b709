"""`archhpo train`: one configuration, from flags or from a best JSON, metrics as one JSON line.

Reproducing a study's trial uses the same seeds as the worker (seed, plan slot), so a best JSON
from a CPU study gives back the trial's validation loss.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from archhpo.errors import ArchhpoError
from archhpo.models import get_family
from archhpo.search._space import FULL_SPACE, QUICK_SPACE
from archhpo.workers import TrainConfig, describe_result, resolve_device, train, trial_seed


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


def train_command(args: argparse.Namespace) -> dict[str, Any]:
    best = _load_best(args.from_json) if args.from_json else None
    family_name = best.get("family", args.family) if best else args.family
    fam = get_family(family_name)
    options: dict[str, Any] = dict(best.get("options", {})) if best else {}
    for key in ("horizon", "threshold", "seed"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    options.setdefault("horizon", 1)
    options.setdefault("threshold", 0.01)
    options.setdefault("seed", 0)
    if args.quick:
        options["quick"] = True
    flag_values = {f.name: getattr(args, f"fam_{f.name}") for f in fam.flags
                   if getattr(args, f"fam_{f.name}", None) is not None}
    options.update(flag_values)
    if best and args.data is None:
        spec = best["data"]
        if spec.get("kind") == "file":  # re-validate and re-hash the file on this machine
            spec = fam.parse_data(spec["path"], options)
    else:
        spec = fam.parse_data(args.data or "synthetic", options)
    info = {**flag_values, **fam.data_info(spec, options)}  # the data wins on shapes
    if best:
        info = {**best.get("info", {}), **info}
        arch = {k: best["architecture"][k] for k in ("d_model", "n_layers", "n_heads", "d_ff")}
        params = dict(best["best_params"])
        slot = int(best.get("plan_slot", 0))
    else:
        arch = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads, "d_ff": args.d_ff}
        missing = [k for k, v in arch.items() if v is None]
        if missing:
            raise ArchhpoError(f"Missing {', '.join('--' + k.replace('_', '-') for k in missing)}; "
                               "give the architecture or --from a best JSON.")
        space = QUICK_SPACE if options.get("quick") else FULL_SPACE
        params = {**space.default(), **dict(fam.train_defaults)}
        slot = 0
    for key in ("learning_rate", "epochs", "batch_size", "weight_decay", "warmup_steps"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    cfg = fam.config_for(arch, info)
    device = resolve_device(args.device)
    data = fam.load_data(spec, options)
    baseline = fam.baseline_loss(data)
    torch.manual_seed(trial_seed(int(options.get("seed", 0)), slot))
    model = fam.build(cfg).to(device)
    known = set(TrainConfig.__dataclass_fields__)
    tcfg = TrainConfig(**{k: v for k, v in {**fam.train_defaults, **params}.items() if k in known} | {"seed": slot})
    start = time.perf_counter()
    result = train(model, data.to(device), fam.loss, tcfg, metrics_fn=fam.metrics)
    out = {
        "family": fam.name, **describe_result(result), "baseline_val_loss": baseline,
        "param_count": fam.param_count(cfg), "duration_s": round(time.perf_counter() - start, 3),
        "architecture": arch, "params": {k: params[k] for k in known & set(params)},
    }
    if args.save:
        path = Path(args.save)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save({"family": fam.name, "config": asdict(cfg), "state_dict": model.state_dict(),
                    "metrics": out}, tmp)
        tmp.replace(path)
        out["saved"] = str(path)
    return out
