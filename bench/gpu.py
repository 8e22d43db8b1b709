"""GPU benchmark (issue 9): what archhpo's trials achieve on the GPU present, in one command.

Every measurement goes through the path a planned trial takes: ``workers.build_trial`` (data,
family TrainConfig, seeds, model) and ``workers.train`` (bf16 autocast, fused AdamW, data on the
GPU, one host sync per epoch), with ``workers._device.configure_cuda_speed`` (TF32) as a worker
sets it.  The training set is the synthetic PatchTST data tiled to a whole number of batches.

- ``throughput``: samples/s, MFU (family ``flops_per_sample`` x samples/s over the GPU's dense
  bf16 peak) and peak memory of PatchTST at ~2M (deep d64/L48 and wide d256/L2), 20M and 200M
  parameters, batch 64 and 256.
- ``compile``: the 2M configs again with ``torch.compile`` (default, and "reduce-overhead",
  which captures CUDA graphs): steady samples/s, compile time (the first epoch's extra time),
  and the eager training time above which compiling pays for itself.
- ``2b``: the largest row of the 2B grid (d2048/L48/ff8192, 2.42B parameters) at batch 256
  (then 64 if 256 runs out of memory): peak memory against the estimate, steps/s, MFU.
- ``packing``: 1, 2, 4 and 8 separate processes, each training the 2M deep config on the same
  GPU at once: aggregate samples/s against one alone.
- ``lm`` (issue 33, ``bench/gpu_lm.py``): step MFU of the lm family at 124M (GPT-2 small), 200M and
  2B, vocabulary 50,257, context 1024: eager (the trial path), foreach vs fused AdamW, bf16
  weights vs bf16 autocast, torch.compile with its compile time apart, and the SDPA kernel a
  profiled step ran.  Not in the default sections: ``--sections lm`` (under 10 minutes, docs/gpu.md).
- ``defaults``, ``tokens``, ``ranks`` (issue 58, ``bench/gpu_defaults.py``): each GPU default on and
  off (padded head, torch.compile, the planned batch, validation batches), training from a token
  file against on-device windows, and one trial across K = 1, 2, 4, 8 ranks.  Asked for by name.

    python bench/gpu.py                          # everything (timed once on an H100: BENCHMARKS.md §4)
    python bench/gpu.py --sections throughput,packing --out results/
    python bench/gpu.py --sections lm --out results/   # the lm table (docs/gpu.md: from a fresh machine)
    python bench/gpu.py --sections lm --dry-run        # CPU, tiny configs: proves the script and table
    python bench/gpu.py --sections defaults,tokens,ranks,lm --lm-variants eager compile --seconds 3 --out results/
                                                 # docs/gpu.md's table from a fresh machine (under 10 minutes)
    python bench/gpu.py --help

The compile section, which compiles each 2M model twice per batch size, is the slowest: where a
command has a time limit, run the sections one at a time (``--sections compile``).

Writes ``gpu_bench.json`` and ``gpu_bench.md`` (GPU name, driver, torch, CUDA, date) into
``--out`` and prints the markdown.  Needs PyTorch with CUDA and archhpo's own dependencies;
never imports Ray or PostgreSQL drivers.  Without a GPU it refuses and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import multiprocessing as mp
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import gpu_defaults  # bench/gpu_defaults.py: the defaults, tokens and ranks sections
import gpu_lm  # bench/gpu_lm.py: the lm section (this folder is on sys.path when run as a script)
import gpu_profile  # bench/gpu_profile.py: the PatchTST profile section
import torch

from archhpo.models import TensorDataset, get_family
from archhpo.workers._build import DataCache, TrialSpec, build_trial
from archhpo.workers._device import (
    configure_cuda_speed,
    dense_bf16_peak_flops,
    driver_version,
    mfu,
    release_memory,
)
from archhpo.workers._memory import estimate_training_bytes, is_oom, trial_shape
from archhpo.workers._train import train

FAMILY = "patchtst"
DATA = "synthetic:steps=6000"  # ~4,000 training windows, tiled to the steps a measurement needs
CONFIGS: dict[str, dict[str, int]] = {  # every one a row of its budget's grid (docs/design.md §3)
    "2M-deep": {"d_model": 64, "n_layers": 48, "n_heads": 8, "d_ff": 256},  # 2,405,953 params
    "2M-wide": {"d_model": 256, "n_layers": 2, "n_heads": 8, "d_ff": 1024},  # 1,606,401
    "20M": {"d_model": 512, "n_layers": 6, "n_heads": 8, "d_ff": 2048},  # 18,968,065
    "200M": {"d_model": 1024, "n_layers": 16, "n_heads": 16, "d_ff": 4096},  # 201,647,105
}
CONFIG_2B = {"d_model": 2048, "n_layers": 48, "n_heads": 16, "d_ff": 8192}  # 2,417,412,097: 2B's largest
TINY = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64}  # --cpu-smoke only
SECTIONS = ("throughput", "compile", "2b", "packing", "lm", "profile", "defaults", "tokens", "ranks")
DEFAULT_SECTIONS = SECTIONS[:4]  # lm (the GPT-2-scale table), profile and issue 58's are asked for by name
PARAMS = {"learning_rate": 3e-4, "epochs": 1, "batch_size": 64, "weight_decay": 1e-4, "warmup_steps": 100}
NO_GPU = ("bench/gpu.py: no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is False), "
          "so there is nothing to measure here; run it on a machine with an NVIDIA GPU.")


# ------------------------------------------------------------------------------------------ helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tiled(data: TensorDataset, n: int) -> TensorDataset:
    """Exactly n training samples (the split repeated as needed); the validation split unchanged."""
    idx = torch.arange(n, device=data.train_target.device) % data.n_train
    return TensorDataset(tuple(t[idx].contiguous() for t in data.train_inputs), data.train_target[idx].contiguous(),
                         data.val_inputs, data.val_target, dict(data.info))


def _spec(arch: dict[str, int], batch: int, data: dict[str, Any], info: dict[str, Any]) -> TrialSpec:
    return TrialSpec(family=FAMILY, data=data, options={"seed": 0}, info=info, arch=dict(arch),
                     params={**PARAMS, "batch_size": batch}, slot=0)


def _data_spec() -> tuple[dict[str, Any], dict[str, Any]]:
    fam = get_family(FAMILY)
    spec = fam.parse_data(DATA, {})
    return spec, fam.data_info(spec, {})


def _epoch(model: torch.nn.Module, data: TensorDataset, cfg: Any, loss: Any, device: torch.device) -> float:
    """Seconds of one trainer epoch (its validation included, as in a trial), device-synchronised."""
    _sync(device)
    start = time.perf_counter()
    train(model, data, loss, cfg)
    _sync(device)
    return time.perf_counter() - start


def measure(
    arch: dict[str, int], batch: int, device: torch.device, *, seconds: float, cache: DataCache,
    compile_mode: str | None = None, warmup_steps: int = 10, max_steps: int = 5000,
) -> dict[str, Any]:
    """Train one config the way a trial does; steady samples/s over about `seconds`."""
    fam = get_family(FAMILY)
    data_spec, info = _data_spec()
    built = build_trial(_spec(arch, batch, data_spec, info), device, data_cache=cache)
    cfg = dataclasses.replace(built.train_config, epochs=1, eval_every=1, batch_size=batch)
    model: torch.nn.Module = built.model
    n_params = sum(p.numel() for p in model.parameters())
    row: dict[str, Any] = {"arch": arch, "params": n_params, "batch": batch, "compile": compile_mode or "eager",
                           "flops_per_sample": built.flops_per_sample,
                           "estimate_gib": round(estimate_training_bytes(trial_shape(
                               fam, built.config, {**arch, "param_count": n_params}, batch,
                               min(built.train_config.eval_batch_size, built.data.n_val),
                               built.data.device_bytes(device)),
                               device.type) / 2**30, 2)}
    if compile_mode is not None:
        model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # First epoch: cuBLAS/cuDNN set-up, the allocator's first growth, and (compiled) the compile.
    first = _epoch(model, tiled(built.data, warmup_steps * batch), cfg, fam.loss, device)
    per_step = _epoch(model, tiled(built.data, warmup_steps * batch), cfg, fam.loss, device) / warmup_steps
    steps = int(min(max_steps, max(warmup_steps, seconds / max(per_step, 1e-6))))
    timed = tiled(built.data, steps * batch)
    secs = _epoch(model, timed, cfg, fam.loss, device)
    samples = steps * batch
    row.update(steps=steps, seconds=round(secs, 3), samples_per_s=round(samples / secs, 1),
               steps_per_s=round(steps / secs, 3), first_epoch_s=round(first, 3),
               first_epoch_extra_s=round(first - warmup_steps * secs / steps, 3))
    if built.flops_per_sample:
        m = mfu(built.flops_per_sample * samples, secs, device)
        row["mfu"] = None if m is None else round(m, 4)
        row["tflops"] = round(built.flops_per_sample * samples / secs / 1e12, 2)
    if device.type == "cuda":
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    del model, built, timed
    release_memory(device)
    return row


def _guarded(fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    """A measurement, or a row saying why it could not be made (OOM, a compiler error)."""
    try:
        return fn(*args, **kw)
    except Exception as exc:
        kind = "out of memory" if is_oom(exc) else type(exc).__name__
        print(f"  ... {kind}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", file=sys.stderr)
        if not is_oom(exc):
            traceback.print_exc(file=sys.stderr)
        release_memory(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        return {"error": f"{kind}: {str(exc)[:500]}"}


# ----------------------------------------------------------------------------------------- sections
def section_throughput(device: torch.device, args: argparse.Namespace, cache: DataCache) -> list[dict[str, Any]]:
    rows = []
    for name in args.configs:
        for batch in args.batches:
            print(f"throughput {name} batch {batch} ...", file=sys.stderr)
            row = _guarded(measure, CONFIGS[name], batch, device, seconds=args.seconds, cache=cache)
            rows.append({"config": name, "batch": batch, **row})
    return rows


def section_compile(device: torch.device, args: argparse.Namespace, cache: DataCache) -> list[dict[str, Any]]:
    """torch.compile against eager on the launch-bound 2M configs named in --configs; compile time
    counted.  Each row is printed as it is measured, so a run cut off by a time limit still says
    what it measured (the 48-layer 2M-deep compiles for minutes)."""
    rows = []
    for name in [c for c in args.configs if c in ("2M-deep", "2M-wide")]:
        for batch in args.batches:
            eager = _guarded(measure, CONFIGS[name], batch, device, seconds=args.seconds, cache=cache)
            rows.append({"config": name, "batch": batch, **eager})
            for mode in ("default", "reduce-overhead"):
                print(f"compile {name} batch {batch} mode {mode} ...", file=sys.stderr)
                torch._dynamo.reset()
                row = _guarded(measure, CONFIGS[name], batch, device, seconds=args.seconds, cache=cache,
                               compile_mode=mode)
                if "error" not in row and "error" not in eager:
                    # compile time = the compiled first epoch's extra time beyond eager's first epoch
                    compile_s = max(0.0, row["first_epoch_extra_s"] - eager["first_epoch_extra_s"])
                    row["compile_s"] = round(compile_s, 1)
                    row["speedup"] = round(row["samples_per_s"] / eager["samples_per_s"], 3)
                    gain = 1 - eager["samples_per_s"] / row["samples_per_s"]  # share of eager time saved
                    row["break_even_eager_s"] = round(compile_s / gain, 1) if gain > 0 else None
                rows.append({"config": name, "batch": batch, **row})
                print(f"  {json.dumps(rows[-1], default=str)}", file=sys.stderr)
    torch._dynamo.reset()
    return rows


def _built(name: str, batch: int, device: torch.device, cache: DataCache, args: argparse.Namespace) -> tuple[Any, ...]:
    """For the profile section: (model, data_for(steps), train config, loss, FLOPs per sample) of a
    PatchTST config, or of an lm row named ``lm-<row>`` (``lm-124M``)."""
    if name.startswith("lm-"):
        return gpu_lm.built(name.removeprefix("lm-"), batch, device, args)
    fam = get_family(FAMILY)
    data_spec, info = _data_spec()
    built = build_trial(_spec(CONFIGS[name], batch, data_spec, info), device, data_cache=cache)
    cfg = dataclasses.replace(built.train_config, epochs=1, eval_every=1, batch_size=batch)
    return (built.model, lambda steps: tiled(built.data, steps * batch), cfg, fam.loss,
            built.flops_per_sample or 0.0)


def section_2b(device: torch.device, args: argparse.Namespace, cache: DataCache) -> list[dict[str, Any]]:
    rows = []
    for batch in (256, 64):
        print(f"2B batch {batch} ...", file=sys.stderr)
        row = _guarded(measure, CONFIG_2B, batch, device, seconds=args.seconds, cache=cache,
                       warmup_steps=3, max_steps=200)
        rows.append({"config": "2B", "batch": batch, **row})
        if "error" not in row:
            break  # the largest batch that trains is the answer
    return rows


def _packed_trial(arch: dict[str, int], batch: int, seconds: float, barrier: Any, out: Any, dev: str) -> None:
    """One packed trial (its own process, like a worker): build, warm up, wait for all, train."""
    try:
        device = torch.device(dev)
        if device.type == "cuda":
            configure_cuda_speed()
        else:
            torch.set_num_threads(1)
        fam = get_family(FAMILY)
        data_spec, info = _data_spec()
        built = build_trial(_spec(arch, batch, data_spec, info), device)
        cfg = dataclasses.replace(built.train_config, epochs=1, batch_size=batch)
        warm = 10
        _epoch(built.model, tiled(built.data, warm * batch), cfg, fam.loss, device)
        per_step = _epoch(built.model, tiled(built.data, warm * batch), cfg, fam.loss, device) / warm
        steps = max(warm, int(seconds / per_step))
        data = tiled(built.data, steps * batch)
        barrier.wait(timeout=600)
        start = time.monotonic()
        _epoch(built.model, data, cfg, fam.loss, device)
        end = time.monotonic()
        out.put({"samples": steps * batch, "start": start, "end": end, "alone_per_step_s": per_step,
                 "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
                 if device.type == "cuda" else None})
    except BaseException as exc:  # the parent reports it
        barrier.abort()
        out.put({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})


def section_packing(device: torch.device, args: argparse.Namespace, cache: DataCache) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    rows: list[dict[str, Any]] = []
    alone = None
    for n in args.packing:
        print(f"packing {n} x 2M-deep batch {args.packing_batch} ...", file=sys.stderr)
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_packed_trial, args=(CONFIGS["2M-deep"], args.packing_batch, args.seconds,
                                                         barrier, out, str(device))) for _ in range(n)]
        for p in procs:
            p.start()
        results = [out.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            rows.append({"trials": n, "error": errors[0]})
            continue
        span = max(r["end"] for r in results) - min(r["start"] for r in results)
        agg = sum(r["samples"] for r in results) / span
        if n == 1:
            alone = agg
        rows.append({"trials": n, "aggregate_samples_per_s": round(agg, 1),
                     "per_trial_samples_per_s": round(agg / n, 1),
                     "vs_one_alone": round(agg / alone, 3) if alone else None,
                     "peak_memory_gib_per_trial": max((r["peak_memory_gib"] or 0) for r in results) or None})
    return rows


# ------------------------------------------------------------------------------------------- report
def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "platform": platform.platform(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=torch.cuda.get_device_name(device), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    driver=driver_version(), dense_bf16_peak_tflops=(dense_bf16_peak_flops(props.name) or 0) / 1e12
                    or None, gpus_visible=torch.cuda.device_count())
    return info


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [f"### GPU benchmark: {m.get('gpu', 'cpu')} ({m['date_utc']})", "",
             f"GPU {m.get('gpu', '-')} ({m.get('gpu_memory_gib', '-')} GiB), driver {m.get('driver') or '-'}, "
             f"torch {m['torch']}, CUDA {m.get('cuda') or '-'}, Python {m['python']}; dense bf16 peak used for "
             f"MFU: {m.get('dense_bf16_peak_tflops') or 'unknown'} TFLOP/s.  `python bench/gpu.py "
             f"{result['argv']}`".rstrip() + "", ""]
    head = "| config | params | batch | samples/s | MFU | TFLOP/s | peak GiB | estimate GiB |"
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|"

    def row(r: dict[str, Any]) -> str:
        if "error" in r:
            return f"| {r['config']} | - | {r['batch']} | {r['error'][:60]} | | | | |"
        return (f"| {r['config']} | {_fmt(r['params'])} | {r['batch']} | {_fmt(r['samples_per_s'])} | "
                f"{_fmt(r.get('mfu'), True)} | {_fmt(r.get('tflops'))} | {_fmt(r.get('peak_memory_gib'))} | "
                f"{_fmt(r['estimate_gib'])} |")

    if result.get("throughput"):
        lines += ["Samples/s (eager, as trials run today):", "", head, sep, *map(row, result["throughput"]), ""]
    if result.get("compile"):
        lines += ["torch.compile against eager (compile time = the compiled first epoch's extra time; "
                  "break-even = eager training time above which compiling wins):", "",
                  "| config | batch | mode | samples/s | speed-up | compile s | break-even (eager s) |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for r in result["compile"]:
            if "error" in r:
                lines.append(f"| {r['config']} | {r['batch']} | {r.get('compile', '?')} | {r['error'][:60]} | | | |")
            else:
                lines.append(f"| {r['config']} | {r['batch']} | {r['compile']} | {_fmt(r['samples_per_s'])} | "
                             f"{_fmt(r.get('speedup'))} | {_fmt(r.get('compile_s'))} | "
                             f"{_fmt(r.get('break_even_eager_s'))} |")
        lines.append("")
    if result.get("2b"):
        lines += ["2B (largest row of the 2B grid):", "", head.replace("| samples/s |", "| steps/s |"), sep]
        for r in result["2b"]:
            lines.append(row({**r, "samples_per_s": r.get("steps_per_s")}) if "error" not in r else row(r))
        lines.append("")
    if result.get("lm"):
        lines += gpu_lm.markdown(result["lm"], result["lm"][0]["vocab"])
    if result.get("profile"):
        lines += gpu_profile.markdown(result["profile"])
    lines += gpu_defaults.markdown(result)
    if result.get("packing"):
        lines += ["Packed 2M-deep trials on one GPU (separate processes, batch "
                  f"{result['packing_batch']}):", "",
                  "| trials | aggregate samples/s | per trial | vs one alone | peak GiB per trial |",
                  "|---:|---:|---:|---:|---:|"]
        for r in result["packing"]:
            if "error" in r:
                lines.append(f"| {r['trials']} | {r['error'][:60]} | | | |")
            else:
                lines.append(f"| {r['trials']} | {_fmt(r['aggregate_samples_per_s'])} | "
                             f"{_fmt(r['per_trial_samples_per_s'])} | {_fmt(r['vs_one_alone'])}x | "
                             f"{_fmt(r['peak_memory_gib_per_trial'])} |")
        lines.append("")
    if any(result.get(s) for s in DEFAULT_SECTIONS):
        lines += ["Targets (issue 9): " + "; ".join(targets(result)), ""]
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> list[str]:
    out = []
    at200 = [r.get("mfu") for r in result.get("throughput", []) if r.get("config") == "200M" and r.get("mfu")]
    if at200:
        out.append(f"MFU at 200M >= 40%: {'met' if max(at200) >= 0.4 else 'NOT met'} ({_fmt(max(at200), True)})")
    else:
        out.append("MFU at 200M: not measured")
    four = [r for r in result.get("packing", []) if r.get("trials") == 4 and "error" not in r]
    if four:
        ratio = four[0]["vs_one_alone"]
        out.append(f"4 packed 2M trials >= 2.5x one: {'met' if ratio and ratio >= 2.5 else 'NOT met'} ({ratio}x)")
    else:
        out.append("4 packed 2M trials: not measured")
    b2 = [r for r in result.get("2b", []) if "error" not in r]
    out.append(f"2B trains on one GPU: {'yes, batch ' + str(b2[0]['batch']) if b2 else 'NO / not measured'}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                    help=f"comma-separated, of {', '.join(SECTIONS)} (default: all but lm, profile, defaults, "
                         "tokens and ranks)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--packing", type=int, nargs="+", default=[1, 2, 4, 8], help="trials packed on one GPU")
    ap.add_argument("--packing-batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0, help="timed training per measurement")
    ap.add_argument("--out", default=".", help="folder for gpu_bench.json and gpu_bench.md")
    ap.add_argument("--cpu-smoke", "--dry-run", action="store_true",
                    help="check this script on CPU with a tiny model (measures nothing worth reporting)")
    gpu_lm.add_arguments(ap)
    gpu_profile.add_arguments(ap)
    gpu_defaults.add_arguments(ap)
    args = ap.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = sorted(set(sections) - set(SECTIONS))
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    if args.cpu_smoke:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        CONFIGS.update({k: TINY for k in CONFIGS})
        CONFIG_2B.update(TINY)
    elif not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", torch.cuda.current_device())
        configure_cuda_speed()
    result: dict[str, Any] = {"machine": machine(device), "argv": " ".join(sys.argv[1:] if argv is None else argv),
                              "packing_batch": args.packing_batch, "data": DATA}
    cache = DataCache(1)
    runners = {"throughput": section_throughput, "compile": section_compile, "2b": section_2b,
               "packing": section_packing,
               "lm": lambda device, args, cache: gpu_lm.section_lm(device, args, _guarded),
               "defaults": lambda device, args, cache: gpu_defaults.section_defaults(device, args, _guarded),
               "tokens": lambda device, args, cache: gpu_defaults.section_tokens(device, args, _guarded),
               "ranks": lambda device, args, cache: gpu_defaults.section_ranks(device, args, _guarded),
               "profile": lambda device, args, cache: gpu_profile.section_profile(
                   device, args, lambda name, batch: _built(name, batch, device, cache, args), _guarded)}
    t0 = time.perf_counter()
    for name in sections:
        result[name] = runners[name](device, args, cache)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_bench.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    md = markdown(result)
    (out / "gpu_bench.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
