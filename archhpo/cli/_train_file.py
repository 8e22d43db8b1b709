"""What `archhpo train --from` accepts: a best JSON as `archhpo run` and `export` write it
(report/_export.py best_summary), checked against its family before anything is built.

A replay trusts nothing in the file: a key archhpo does not write, a value of the wrong type or
outside what the family's config accepts, or a generated data set too large to hold is refused
in one sentence (ArchhpoError: exit 2, nothing written), not met later as a traceback, an
allocation of 128 GB or a generator that never ends.  These checks need no torch; the memory
check (cli/_train.py, `fit_memory`) then sizes the trial with the workers' estimate, as a worker
does, before the data is loaded and again before the model is built.  `trial_fields` reads the
line and the file into the trial's fields here, so `archhpo train` refuses a bad one before torch
or Optuna is imported (cli/_main.py cmd_train).
"""

from __future__ import annotations

import argparse
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from archhpo.cli._options import default
from archhpo.config import PARAMETRIZATIONS, StoredOptions
from archhpo.errors import ArchhpoError
from archhpo.models import Family, get_family
from archhpo.schema import (
    ARCH_KEYS,
    ARCH_RECORD,
    PARAM_COUNT,
    PLAN_PARAMS,
    TRAINING,
    TRAINING_PARAMS,
    DataBudget,
    schedule_options,
)

BEST_KEYS = frozenset({
    # best_summary's keys (report/_export.py), its flops_summary's, and those of a confirmed or paired study
    "experiment", "budget", "best_params", "best_value", "n_trials_completed", "n_trials_pruned", "timestamp",
    "study_name", "optuna_version", "architecture", "family", "best_trial", "plan_slot", "n_trials_failed",
    "n_trials_planned", "baseline_val_loss", "data", "options", "info", "choices", "seed",
    "flops_spent", "flops_full_plan", "confirmation", "chosen_on", "reverses_trial", "paired",
})
OBJECT_KEYS = ("data", "options", "info", "choices")  # each a JSON object when present

MUP_KEYS = ("parametrization", "mup_base_width", "mup_base_depth")  # µP's options (docs/mup.md), replayed as stored

# A generated data set is made whole in host memory before the first step, so its size settings
# are capped: 2e9 tokens are 16 GB as int64 windows (the lm family), 1e7 rows, series or steps are
# far beyond any study archhpo plans on generated data.  A file's size is its own (re-read here).
DATA_CAPS = {"tokens": 2_000_000_000, "n": 10_000_000, "series": 10_000_000, "steps": 10_000_000,
             "symbols": 1_000_000, "length": 1_000_000, "features": 100_000, "channels": 100_000}
# Training values past these are no study's (archhpo's spaces top at 100 epochs and batch 256):
# the micro-batch plan tries every split of a batch, and each epoch validates once.
PARAM_CAPS = {"epochs": 100_000, "batch_size": 2**20, "warmup_steps": 10**9}


def _refuse(path: str, what: str) -> ArchhpoError:
    return ArchhpoError(f"{path}: {what}")


def load_best(path: str) -> dict[str, Any]:
    """The best JSON at `path` as a dict; a missing, unreadable, corrupt or non-object file is refused."""
    try:
        best = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ArchhpoError(f"Best-config file {path} does not exist; pass a *_best.json from `archhpo run`.") from None
    except (OSError, UnicodeDecodeError, ValueError):
        best = None
    if not isinstance(best, dict):  # corrupt, or JSON that is not an object: one sentence for both
        raise ArchhpoError(f"{path} does not hold a best-config JSON object; pass a *_best.json written by "
                           "`archhpo run` or `archhpo export`.")
    return best


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _unknown(path: str, where: str, keys: Mapping[str, Any], known: tuple[str, ...] | frozenset[str]) -> None:
    extra = sorted(set(keys) - set(known))
    if extra:
        shown = ", ".join(f"{where}{k}" for k in extra)
        many = len(extra) > 1
        raise _refuse(path, f"unknown key{'s' if many else ''} {shown} (archhpo writes none such); "
                            f"remove {'them' if many else 'it'} or export the study again.")


def check_best(best: dict[str, Any], path: str, family_flag: str | None = None) -> Family:
    """The file's family, once its keys, types and training values are what archhpo writes;
    `family_flag` is a --family given on the line, which must agree with the file's."""
    _unknown(path, "", best, BEST_KEYS)
    if not best.get("architecture") or not best.get("best_params"):
        raise ArchhpoError(f"{path} has no winning trial (architecture/best_params are empty); "
                           "wait for a trial to complete and export again.")
    name = best.get("family")
    if not isinstance(name, str):
        raise _refuse(path, f"family must be a family's name, got {name!r}; export the study again.")
    fam = get_family(name)  # an unknown name: the registry's one sentence
    if family_flag is not None and family_flag != fam.name:
        raise ArchhpoError(f"--family {family_flag} disagrees with the file's family {fam.name}; "
                           f"drop --family or pass a {family_flag} best JSON.")
    for key in OBJECT_KEYS:
        if best.get(key) is not None and not isinstance(best[key], dict):
            raise _refuse(path, f"{key} must be a JSON object, got {type(best[key]).__name__}; export the study again.")
    for key, least in (("seed", 0), ("plan_slot", 0)):
        value = best.get(key)
        if value is not None and not (_is_int(value) and value >= least):
            raise _refuse(path, f"{key} must be a whole number of at least {least} or null, got {value!r}.")
    check_architecture(best["architecture"], path)
    check_params(best["best_params"], path)
    check_options(best.get("options") or {}, path)
    _unknown(path, "choices.", best.get("choices") or {}, tuple(f.name for f in fam.flags))
    return fam


def check_architecture(arch: Any, path: str) -> None:
    """architecture: an object of the four dimensions (positive integers) and the parameter count."""
    if not isinstance(arch, dict):
        raise _refuse(path, f"architecture must be a JSON object, got {type(arch).__name__}; export the study again.")
    _unknown(path, "architecture.", arch, ARCH_RECORD)
    missing = [k for k in ARCH_KEYS if k not in arch]
    if missing:
        raise _refuse(path, f"architecture lacks {', '.join(missing)}; export the study again.")
    for key in (*ARCH_KEYS, PARAM_COUNT):
        value = arch.get(key, 1)
        if not (_is_int(value) and value >= 1):
            raise _refuse(path, f"architecture.{key} must be a positive integer, got {value!r}.")


def check_params(params: Any, path: str | None, flags: bool = False) -> None:
    """best_params (or, `flags`, the training flags given): the plan's parameters, each of its
    type, rates finite and positive, counts within PARAM_CAPS."""
    if not isinstance(params, dict):
        raise _refuse(str(path), f"best_params must be a JSON object, got {type(params).__name__}; "
                                 "export the study again.")
    _unknown(str(path), "best_params.", params, PLAN_PARAMS)
    least = {"learning_rate": 0.0, "weight_decay": 0.0, "epochs": 1, "batch_size": 1, "warmup_steps": 0}
    for p in TRAINING:
        if p.name not in params:
            continue
        value, shown = params[p.name], f"--{p.name.replace('_', '-')}" if flags else f"best_params.{p.name}"
        typed = _is_int(value) if p.type is int else _is_number(value)
        low, cap, positive = least[p.name], PARAM_CAPS.get(p.name, math.inf), p.name == "learning_rate"
        if not typed:
            what = f"{shown} must be {'an integer' if p.type is int else 'a number'}, got {value!r}."
        elif not math.isfinite(value) or value < low or (positive and value <= low):
            what = f"{shown} must be a finite number {'above 0' if positive else f'of at least {low}'}, got {value!r}."
        elif value > cap:
            what = f"{shown} = {value:,} is beyond {cap:,}, more than any study trains; lower it."
        else:
            continue
        raise ArchhpoError(what) if path is None else _refuse(path, what)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    names = {int: "an integer", float: "a number", bool: "true or false", str: "text", type(None): "null"}
    origin = typing.get_origin(hint) or hint
    return names.get(origin, "a list" if origin is tuple else "an object")


def _fits(value: Any, hint: Any) -> bool:
    """`value` (as JSON gives it) of the annotated type `hint` (int, float, bool, str, None, a
    Mapping, a tuple, or a union of them)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(hint))
    checks = {int: _is_int, float: _is_number, bool: lambda v: isinstance(v, bool),
              str: lambda v: isinstance(v, str), type(None): lambda v: v is None, tuple: lambda v: isinstance(v, list),
              Mapping: lambda v: isinstance(v, dict)}
    return checks.get(origin or hint, lambda v: True)(value)


def check_options(options: Mapping[str, Any], path: str) -> None:
    """options: every option a study stores (archhpo.config.StoredOptions) of its type, seeds and
    counts not negative, the data budget readable; a family's own options its data parser checks."""
    hints = typing.get_type_hints(StoredOptions)
    for f in fields(StoredOptions):
        if f.name in ("family", "keys") or f.name not in options:
            continue
        value = options[f.name]
        if not _fits(value, hints[f.name]):
            raise _refuse(path, f"options.{f.name} must be {_type_name(hints[f.name])}, got {value!r}.")
        if _is_number(value) and not (math.isfinite(value) and (f.name == "threshold" or value >= 0)):
            bound = "" if f.name == "threshold" else " of at least 0"
            raise _refuse(path, f"options.{f.name} must be a finite number{bound}, got {value!r}.")
    try:
        DataBudget.of(options)
    except (ArchhpoError, KeyError, TypeError, ValueError) as exc:
        raise _refuse(path, f"options.data_budget {options.get('data_budget')!r} is not one archhpo writes "
                            f"({exc!r}); export the study again.") from None


def check_data(fam: Family, spec: Any, options: Mapping[str, Any], path: str) -> None:
    """A generated data spec: settings the family's data takes, of their types, under DATA_CAPS,
    and as a whole accepted by the family's own parser (the --data syntax, rebuilt from the spec).
    A file's spec is checked against the file once it is read again (`check_file_data`)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        raise _refuse(path, f"data must be a JSON object with a kind, got {spec!r}; export the study again.")
    if "path" in spec:
        if not isinstance(spec["path"], str):
            raise _refuse(path, f"data.path must be a file's path, got {spec['path']!r}.")
        return
    kind = spec["kind"]
    try:
        default = fam.parse_data(kind, options)
    except ArchhpoError as exc:
        raise _refuse(path, f"the {fam.name} family generates no {kind!r} data under these options ({exc})") from None
    for key, value in spec.items():
        _check_setting(fam, kind, default, key, value, options, path)
    text = f"{kind}:" + ",".join(f"{k}={v}" for k, v in spec.items() if k != "kind")
    try:
        fam.parse_data(text, options)
    except ArchhpoError as exc:
        raise _refuse(path, f"the {fam.name} family refuses its data ({exc})") from None


def _check_setting(fam: Family, kind: str, default: Mapping[str, Any], key: str, value: Any,
                   options: Mapping[str, Any], path: str) -> None:
    """One setting of a generated data spec: known to the family's parser, an integer (or text
    where the default is text), at most its DATA_CAPS entry."""
    if key == "kind":
        return
    if key not in default:  # an optional setting (lm's classes) is known if the parser takes it alone
        try:
            fam.parse_data(f"{kind}:{key}={value}", options)
        except ArchhpoError:
            settings = ", ".join(k for k in default if k != "kind")
            raise _refuse(path, f"data.{key} is not a setting of the {fam.name} family's {kind} data "
                                f"({settings}); remove it or pass --data.") from None
    text = isinstance(default.get(key), str)
    if not (isinstance(value, str) if text else _is_int(value)):
        raise _refuse(path, f"data.{key} must be {'text' if text else 'an integer'}, got {value!r}.")
    cap = DATA_CAPS.get(key)
    if cap is not None and value > cap:
        raise _refuse(path, f"data.{key} = {value:,} is beyond {cap:,}, the most archhpo generates in host memory "
                            "before training; lower it or train on a file with --data.")


def check_file_data(spec: Mapping[str, Any], parsed: Mapping[str, Any], path: str) -> None:
    """A file's spec against the spec the family's parser writes for that file now: no other keys."""
    _unknown(path, "data.", spec, tuple(parsed))


def check_config(fam: Family, arch: Mapping[str, Any], info: Mapping[str, Any], path: str) -> Any:
    """The family's config of the architecture under the data's facts (the family's own ranges:
    check_arch, n_heads dividing d_model, its flags' bounds); refused in the config's sentence."""
    try:
        return fam.config_for(arch, info)
    except ArchhpoError as exc:
        raise _refuse(path, str(exc)) from None
    except (TypeError, ValueError, KeyError) as exc:
        raise _refuse(path, f"its info and choices do not make a {fam.name} configuration ({exc}); "
                            "export the study again.") from None


def _options_from(args: argparse.Namespace, fam: Any, best: dict[str, Any] | None
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trial's options (a best JSON's, unless a flag says otherwise) and the family flags given."""
    options: dict[str, Any] = dict(best.get("options") or {}) if best else {}
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
    for key in MUP_KEYS:  # a flag over the file's value; a file (or line) without them trains sp
        if getattr(args, key, None) is not None:
            options[key] = getattr(args, key)
    flag_values = {f.name: getattr(args, f"fam_{f.name}") for f in fam.flags
                   if getattr(args, f"fam_{f.name}", None) is not None}
    options.update(flag_values)
    return options, flag_values


def check_parametrization(options: Mapping[str, Any], where: str) -> None:
    """The trial's parametrization ("sp" or "mup") and µP's base width (a positive integer or null)."""
    value = options.get("parametrization")
    if value is not None and value not in PARAMETRIZATIONS:
        raise ArchhpoError(f"{where}: parametrization must be one of {', '.join(PARAMETRIZATIONS)}, got {value!r}.")
    base = options.get("mup_base_width")
    if base is not None and not (_is_int(base) and base >= 1):
        raise ArchhpoError(f"{where}: mup_base_width must be a positive integer d_model, got {base!r}.")
    depth = options.get("mup_base_depth")
    if depth is not None and not (_is_int(depth) and depth >= 1):
        raise ArchhpoError(f"{where}: mup_base_depth must be a positive integer n_layers, got {depth!r}.")


def _data_spec(args: argparse.Namespace, fam: Family, best: dict[str, Any] | None,
               options: dict[str, Any]) -> dict[str, Any]:
    """The data spec: --data's, else the file's (checked; a data file re-validated and re-hashed here)."""
    if not best or args.data is not None:
        spec = fam.parse_data(args.data or "synthetic", options)
        check_data(fam, spec, options, "--data")  # a generated data set's caps hold for the flag too
        return spec
    spec = dict(best["data"] or {})
    check_data(fam, spec, options, args.from_json)
    if "path" in spec:
        parsed = fam.parse_data(_data_text(spec), options)
        check_file_data(spec, parsed, args.from_json)
        if _content(parsed) != _content(spec):
            raise _refuse(args.from_json, f"its data file {spec['path']} has changed since the study (its "
                                          "content hash differs); restore it, or pass --data to train on it as it is now.")
        return parsed
    return spec


def _content(spec: Mapping[str, Any]) -> list[Any]:
    """What pins a data file's content in its spec: a text's sha256, a token file's fingerprints."""
    val = spec.get("val")
    return [spec.get("sha256"), spec.get("fingerprint"), val.get("fingerprint") if isinstance(val, Mapping) else None]


def _data_text(spec: Mapping[str, Any]) -> str:
    """The --data text that wrote a file's spec: a text file's path, or a token file's
    ``tokens:PATH,vocab=V,dtype=D[,val=PATH]`` (its fingerprint is checked where it is loaded)."""
    if spec.get("kind") != "tokens":
        return str(spec["path"])
    val = spec.get("val")
    tail = f",val={val['path']}" if isinstance(val, Mapping) and "path" in val else ""
    return f"tokens:{spec['path']},vocab={spec.get('vocab')},dtype={spec.get('dtype')}{tail}"


def trial_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of the TrialSpec `train` runs (workers/_build.py), checked: a best JSON's trial
    (plan slot, seed, choices), or the flags'.  Neither torch nor Optuna is imported here (the
    flags' default parameters import the search space), so a bad line or file is refused fast."""
    best = load_best(args.from_json) if args.from_json else None
    if best is not None:
        given = getattr(args, "given", None)
        flag = args.family if given is None or "family" in given else None
        fam = check_best(best, args.from_json, flag)
    else:
        fam = get_family(args.family)
    options, flag_values = _options_from(args, fam, best)
    check_parametrization(options, args.from_json or "the command line")
    spec = _data_spec(args, fam, best, options)
    info = {**flag_values, **fam.data_info(spec, options)}  # the data wins on shapes
    if best:
        info = {**(best.get("info") or {}), **info}
        row = best["architecture"]
        arch: dict[str, Any] = {k: row[k] for k in ARCH_KEYS}
        # What the export writes (contract): top-level "choices", "seed" and "plan_slot".
        arch["choices"] = dict(best.get("choices") or {})
        params = {k: v for k, v in dict(best["best_params"]).items() if k != "arch_idx"}
        slot = int(best.get("plan_slot") or 0)
        seed = best.get("seed")
        check_config(fam, arch, {**info, **arch["choices"]}, args.from_json)
    else:
        arch = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads, "d_ff": args.d_ff}
        missing = [k for k, v in arch.items() if v is None]
        if missing:
            raise ArchhpoError(f"Missing {', '.join('--' + k.replace('_', '-') for k in missing)}; "
                               "give the architecture or --from a best JSON.")
        from archhpo.search._space import FULL_SPACE, QUICK_SPACE

        space = QUICK_SPACE if options.get("quick") else FULL_SPACE
        params = {**space.default(), **dict(fam.train_defaults)}
        slot, seed = 0, None
    flagged = {key: getattr(args, key) for key in TRAINING_PARAMS if getattr(args, key, None) is not None}
    check_params(flagged, None, flags=True)  # a flag over the file's value: the same bounds
    params.update(flagged)
    return {"family": fam.name, "data": spec, "options": options, "info": info, "arch": arch, "params": params,
            "slot": slot, "seed": int(seed) if seed is not None else None}


__all__ = ["BEST_KEYS", "DATA_CAPS", "MUP_KEYS", "PARAM_CAPS", "check_best", "check_config", "check_data",
           "check_file_data", "check_options", "check_params", "check_parametrization", "load_best", "trial_fields"]
