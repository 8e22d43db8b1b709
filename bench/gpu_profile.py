"""The ``profile`` section of bench/gpu.py (issue 33 part 3): why a trial runs at the MFU it does.

PatchTST 200M by default (``--profile-config``: another PatchTST config, or an lm row as
``lm-124M``; ``--profile-compile`` compiles it first, outside what is timed).  One trainer call (``workers.train``, the path a trial takes) of a few steps runs under
``torch.profiler`` with CUDA activity.  From its kernel events it reports:

- ``step_mfu``: exact FLOPs over ``TrainResult.train_s`` (the timed steps only), beside the
  epoch's MFU with validation inside (how §4 of docs/benchmarks.md measured 6.7%);
- ``gpu_busy``: the union of kernel intervals over the span from the first kernel to the last, so
  ``1 - gpu_busy`` is the share of that span the GPU sat idle between kernels (launch gaps, host
  syncs, Python);
- ``kernels_per_step`` and the median gap between consecutive kernels;
- the share of kernel time by kind (matmul, attention, elementwise/other) and the top kernels.

A chrome trace of the profiled steps is written gzipped beside ``gpu_bench.json``.
``--dry-run`` profiles a tiny model on CPU (no kernels: the GPU columns stay empty).
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

MATMUL = ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "cublas", "nvjet", "matmul")
ATTENTION = ("flash", "fmha", "attention", "softmax")


def kind(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ATTENTION):
        return "attention"
    if any(k in low for k in MATMUL):
        return "matmul"
    return "other"


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def kernel_stats(kernels: list[tuple[str, float, float]], steps: int) -> dict[str, Any]:
    """(name, start_us, end_us) of every GPU kernel -> busy share, gaps, kinds and the top kernels."""
    if not kernels:
        return {}
    kernels = sorted(kernels, key=lambda k: k[1])
    span = kernels[-1][2] - kernels[0][1]
    busy = _union([(a, b) for _, a, b in kernels])
    gaps = [max(0.0, kernels[i + 1][1] - kernels[i][2]) for i in range(len(kernels) - 1)]
    by_name: dict[str, float] = {}
    by_kind = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for name, a, b in kernels:
        by_name[name] = by_name.get(name, 0.0) + (b - a)
        by_kind[kind(name)] += b - a
    total = sum(by_kind.values()) or 1.0
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    return {"gpu_busy": round(busy / span, 4) if span > 0 else None, "span_ms": round(span / 1000, 2),
            "kernels_per_step": round(len(kernels) / steps, 1),
            "median_gap_us": round(statistics.median(gaps), 2) if gaps else None,
            "share": {k: round(v / total, 4) for k, v in by_kind.items()},
            "top": [(n[:90], round(100 * t / total, 1)) for n, t in top]}


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # the trace's GPU work (not gpu_user_annotation spans)


def trace_kernels(trace: dict[str, Any] | list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every kernel, copy and memset of a chrome trace
    (``torch.profiler``'s ``export_chrome_trace``).  The optimizer's ``gpu_user_annotation`` span
    is a label over other kernels, not work, so it is left out."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in events if e.get("cat") in GPU_CATS and float(e.get("dur", 0)) > 0]


def profile_steps(run: Callable[[], Any], steps: int, device: torch.device, trace: Path) -> dict[str, Any]:
    """Profile ``run()`` (one trainer call of ``steps`` steps), write its chrome trace gzipped to
    ``trace`` and summarise its kernels."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    raw = trace.with_suffix("")
    prof.export_chrome_trace(str(raw))
    text = raw.read_bytes()
    raw.unlink()
    with gzip.open(trace, "wb") as dst:
        dst.write(text)
    return kernel_stats(trace_kernels(json.loads(text)), steps)


def section_profile(device: torch.device, args: Any, build: Callable[..., Any], guarded: Any) -> list[dict[str, Any]]:
    """PatchTST 200M (bench/gpu.py's CONFIGS) at each --profile-batches: step MFU and the kernel trace.

    ``build(name, batch)`` -> (model, data_for(steps), cfg, loss, flops_per_sample) from bench/gpu.py."""
    rows = []
    for batch in args.profile_batches:
        print(f"profile {args.profile_config} batch {batch} ...", file=sys.stderr)
        rows.append({"config": args.profile_config + (" compiled" if args.profile_compile else ""), "batch": batch,
                     **guarded(_profile_one, device, args, build, batch)})
        print(f"  {rows[-1]}", file=sys.stderr)
    return rows


def _profile_one(device: torch.device, args: Any, build: Callable[..., Any], batch: int) -> dict[str, Any]:
    from archhpo.workers._device import mfu, release_memory
    from archhpo.workers._train import train

    model, data_for, cfg, loss, fps = build(args.profile_config, batch)
    if args.profile_compile:  # the first call below compiles, outside the timed and profiled calls
        model = torch.compile(model, backend="eager" if device.type == "cpu" else "inductor")
    steps = args.profile_steps
    train(model, data_for(3), loss, cfg)  # warm: cuBLAS set-up, the allocator's growth
    data = data_for(steps)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    result = train(model, data, loss, cfg)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    epoch_s = time.perf_counter() - t0
    flops = fps * steps * batch
    out: dict[str, Any] = {"steps": steps, "step_ms": round(1000 * result.train_s / steps, 2),
                           "epoch_s": round(epoch_s, 3), "train_s": round(result.train_s, 3)}
    for key, secs in (("step_mfu", result.train_s), ("epoch_mfu", epoch_s)):
        m = mfu(flops, secs, device)
        out[key] = None if m is None else round(m, 4)
    tag = "_compiled" if args.profile_compile else ""
    trace = Path(args.out) / f"trace_{args.profile_config}{tag}_b{batch}.json.gz"
    trace.parent.mkdir(parents=True, exist_ok=True)
    run = partial(train, model, data_for(min(steps, 5)), loss, cfg)
    out.update(profile_steps(run, min(steps, 5), device, trace))
    if not args.profile_trace:
        trace.unlink()
    del model, data, run
    release_memory(device)
    return out


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["PatchTST profile (step MFU = timed steps only; epoch MFU = with validation, as §4; GPU busy = "
             "kernel time over the first-to-last-kernel span of 5 profiled steps):", "",
             "| config | batch | step ms | step MFU | epoch MFU | GPU busy | kernels/step | median gap µs "
             "| matmul / attention / other | top kernels (% of kernel time) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['batch']} | {r['error'][:80]} | | | | | | | |")
            continue
        pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        share = r.get("share") or {}
        top = "; ".join(f"{n} {p}" for n, p in r.get("top", [])[:4])
        lines.append(f"| {r['config']} | {r['batch']} | {r['step_ms']} | {pct(r.get('step_mfu'))} | "
                     f"{pct(r.get('epoch_mfu'))} | {pct(r.get('gpu_busy'))} | {r.get('kernels_per_step', '-')} | "
                     f"{r.get('median_gap_us', '-')} | " + " / ".join(pct(share.get(k)) for k in
                                                                     ("matmul", "attention", "other"))
                     + f" | {top} |")
    return [*lines, ""]


def add_arguments(ap: Any) -> None:
    ap.add_argument("--profile-config", default="200M",
                    help="profile: a PatchTST config of bench/gpu.py (2M-deep, 2M-wide, 20M, 200M) or an lm row "
                         "as lm-124M, lm-200M, lm-2B (context --seq-len)")
    ap.add_argument("--profile-compile", action="store_true", help="profile: torch.compile the model first")
    ap.add_argument("--profile-batches", type=int, nargs="+", default=[256, 64])
    ap.add_argument("--profile-steps", type=int, default=20, help="profile: timed steps (5 of them profiled)")
    ap.add_argument("--profile-trace", action="store_true",
                    help="profile: keep the chrome trace (gzipped) beside gpu_bench.json")


__all__ = ["add_arguments", "kernel_stats", "markdown", "section_profile", "trace_kernels"]


def main(argv: list[str] | None = None) -> int:
    """Re-read kept traces: ``python bench/gpu_profile.py trace_200M_b256.json.gz --steps 5``."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("traces", nargs="+", type=Path, help="gzipped chrome traces written by --profile-trace")
    ap.add_argument("--steps", type=int, default=5, help="training steps the trace holds")
    args = ap.parse_args(argv)
    for path in args.traces:
        stats = kernel_stats(trace_kernels(json.loads(gzip.decompress(path.read_bytes()))), args.steps)
        print(json.dumps({"trace": path.name, **stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
