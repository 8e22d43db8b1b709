"""Trainer throughput: archhpo's trainer against a plain DataLoader loop on the same model.

Both loops do the same work per step on the same PatchTST (same initial weights, dropout on):
forward, BCE loss, backward, clip_grad_norm_(1.0), AdamW step, LambdaLR step.  They differ only
in how a batch is made:

- ``archhpo``: ``workers.train`` itself -- the split is one tensor on the device, each epoch one
  ``randperm``, each batch one index gather (``x[idx]``);
- ``dataloader``: ``torch.utils.data.DataLoader(TensorDataset(x, y), batch_size, shuffle=True)``
  (num_workers=0, default collate: one ``__getitem__`` per sample, then ``torch.stack``), plus
  ``.to(device)`` per batch when the device is a GPU.

Each measurement times a fixed number of optimiser steps after a few warm-up steps; the
training set is tiled to exactly ``steps * batch`` samples so both loops run exactly that many
full batches (the trainer's end-of-epoch validation runs on a single sample).  The two loops
alternate within each repeat so background load hits both alike; the table shows the median of
the repeats.  "other CPU load" is the machine's busy CPU during a cell minus this process's, in
cores (2 = another job took both cores).  A second, model-free table times only the batch-making path of each loop.

    python bench/trainer_throughput.py                   # CPU, both configs, batch 64 and 256
    python bench/trainer_throughput.py --json out.json   # also write the raw numbers
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data as tud
from _common import machine_busy_s  # noqa: E402  (bench/ is on sys.path when run as a script)
from torch import nn

from archhpo.models import TensorDataset, get_family
from archhpo.workers import TrainConfig, train
from archhpo.workers._train import lr_lambda

CONFIGS: dict[str, dict[str, int]] = {
    "deep": {"d_model": 64, "n_layers": 48, "n_heads": 8, "d_ff": 256},  # 2,405,953 params
    "wide": {"d_model": 256, "n_layers": 2, "n_heads": 8, "d_ff": 1024},
}
DATA = "synthetic:steps=6000"
LR, WD, WARMUP, CLIP = 3e-4, 1e-4, 100, 1.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tiled(data: TensorDataset, n: int) -> TensorDataset:
    """Exactly n training samples (the split repeated as needed) and a 1-sample validation set."""
    idx = torch.arange(n) % data.n_train
    return TensorDataset(
        tuple(t[idx].contiguous() for t in data.train_inputs), data.train_target[idx].contiguous(),
        tuple(t[:1] for t in data.val_inputs), data.val_target[:1], dict(data.info),
    )


def run_archhpo(model: nn.Module, data: TensorDataset, loss_fn: Callable, batch: int, device: torch.device) -> float:
    """Seconds for one epoch of workers.train over `data` (n_train = steps * batch)."""
    cfg = TrainConfig(learning_rate=LR, epochs=1, batch_size=batch, weight_decay=WD, warmup_steps=WARMUP,
                      grad_clip=CLIP, eval_batch_size=1024, seed=0)
    _sync(device)
    start = time.perf_counter()
    train(model, data, loss_fn, cfg)
    _sync(device)
    return time.perf_counter() - start


def run_dataloader(
    model: nn.Module, data: TensorDataset, loss_fn: Callable, batch: int, device: torch.device
) -> float:
    """Seconds for one epoch of a plain DataLoader loop doing the trainer's per-step work."""
    x, y = data.train_inputs[0], data.train_target
    if device.type == "cuda":  # the usual GPU setup: data stays on the host, batches are copied
        x, y = x.cpu(), y.cpu()
    loader = tud.DataLoader(tud.TensorDataset(x, y), batch_size=batch, shuffle=True,
                            pin_memory=device.type == "cuda")
    steps = math.ceil(len(y) / batch)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(WARMUP, steps, 0.0))
    autocast = device.type == "cuda"
    _sync(device)
    start = time.perf_counter()
    model.train()
    loss_sum = torch.zeros((), device=device)
    for xb, yb in loader:
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        loss_sum += loss.detach() * yb.numel()
    float(loss_sum)  # the trainer also syncs once per epoch
    _sync(device)
    return time.perf_counter() - start


def batching_only(data: TensorDataset, batch: int, device: torch.device, repeats: int) -> dict[str, float]:
    """Microseconds per batch of each loop's batch-making path alone (no model)."""
    x, y = data.train_inputs[0], data.train_target
    out: dict[str, float] = {}

    def by_index() -> int:
        perm = torch.randperm(len(y), device=device)
        n = 0
        for i in range(0, len(y), batch):
            idx = perm[i : i + batch]
            x[idx], y[idx]  # the gather is the work being timed
            n += 1
        _sync(device)
        return n

    def by_loader() -> int:
        xs, ys = (x.cpu(), y.cpu()) if device.type == "cuda" else (x, y)
        n = 0
        loader = tud.DataLoader(tud.TensorDataset(xs, ys), batch_size=batch, shuffle=True,
                                pin_memory=device.type == "cuda")
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            n += 1
        _sync(device)
        return n

    for name, fn in (("archhpo", by_index), ("dataloader", by_loader)):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            n = fn()
            times.append((time.perf_counter() - start) / n * 1e6)
        out[name] = statistics.median(times)
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "platform": platform.platform(), "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "?")
        with open("/proc/loadavg") as fh:
            info["loadavg"] = " ".join(fh.read().split()[:3])
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--steps", type=int, default=16, help="timed optimiser steps per measurement")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before each measurement")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per cell (median shown)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--devices", nargs="+", default=None,
                    help="cpu and/or cuda (default: cpu, plus cuda when a GPU is visible)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    load_before = machine().get("loadavg", "?")
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    fam = get_family("patchtst")
    spec = fam.parse_data(DATA, {})
    full = fam.load_data(spec, {})
    info = fam.data_info(spec, {})
    rows: list[dict[str, Any]] = []
    batching: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for dev_name in devices:
        device = torch.device(dev_name)
        for cname in args.configs:
            torch.manual_seed(0)
            model = fam.build(fam.config_for(CONFIGS[cname], info)).to(device)
            n_params = sum(p.numel() for p in model.parameters())
            init = copy.deepcopy(model.state_dict())
            for batch in args.batches:
                warm = tiled(full, args.warmup * batch).to(device)
                timed = tiled(full, args.steps * batch).to(device)
                busy0, cpu0, wall0 = machine_busy_s(), time.process_time(), time.perf_counter()
                runners = {"archhpo": run_archhpo, "dataloader": run_dataloader}
                times: dict[str, list[float]] = {k: [] for k in runners}
                for rep in range(args.repeats):
                    order = list(runners) if rep % 2 == 0 else list(reversed(runners))
                    for name in order:
                        model.load_state_dict(init)
                        runners[name](model, warm, fam.loss, batch, device)  # warm-up
                        model.load_state_dict(init)
                        times[name].append(runners[name](model, timed, fam.loss, batch, device))
                wall = time.perf_counter() - wall0
                # Cores' worth of CPU used by everything but this process during the cell.
                other = max(0.0, (machine_busy_s() - busy0 - (time.process_time() - cpu0)) / wall)
                for name, ts in times.items():
                    rows.append({
                        "device": dev_name, "config": cname, "params": n_params, "batch": batch, "loop": name,
                        "steps": args.steps, "seconds": ts, "other_cpu_cores": other,
                        "samples_per_s": args.steps * batch / statistics.median(ts),
                        "ms_per_step": statistics.median(ts) / args.steps * 1e3,
                    })
                print(f"# {dev_name} {cname} batch {batch}: " + ", ".join(
                    f"{r['loop']} {r['samples_per_s']:.0f}/s" for r in rows[-2:]), file=sys.stderr, flush=True)
                if cname == args.configs[0]:
                    us = batching_only(full, batch, device, repeats=5)
                    batching.append({"device": dev_name, "batch": batch, **{f"{k}_us": v for k, v in us.items()}})
    elapsed = time.perf_counter() - t_all

    m = machine()
    print(f"Trainer throughput -- PatchTST on {DATA}, {args.steps} timed steps after {args.warmup} warm-up, "
          f"median of {args.repeats}, torch threads {args.threads}, {m.get('cpu', '?')}, "
          f"load average before the run {load_before}")
    print()
    print("| device | config | params | batch | archhpo trainer (samples/s) | DataLoader loop (samples/s) "
          "| trainer / DataLoader | trainer ms/step | other CPU load (cores) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        ratio = a["samples_per_s"] / b["samples_per_s"]
        desc = "d{d_model} L{n_layers} h{n_heads} ff{d_ff}".format(**CONFIGS[a["config"]])
        print(f"| {a['device']} | {a['config']} ({desc}) | {a['params']:,} | {a['batch']} "
              f"| {a['samples_per_s']:,.0f} | {b['samples_per_s']:,.0f} | {ratio:.2f}x | {a['ms_per_step']:.1f} "
              f"| {a['other_cpu_cores']:.2f} |")
    print()
    print("Batch-making path alone (no model), microseconds per batch, median of 5 epochs over the "
          f"{full.n_train}-sample training split:")
    print()
    print("| device | batch | index gather (archhpo) | DataLoader + collate |")
    print("|---|---:|---:|---:|")
    for r in batching:
        print(f"| {r['device']} | {r['batch']} | {r['archhpo_us']:,.0f} | {r['dataloader_us']:,.0f} |")
    print()
    print(f"Total benchmark time {elapsed:.0f} s.")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": m, "args": vars(args), "rows": rows, "batching": batching,
                       "elapsed_s": elapsed}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
