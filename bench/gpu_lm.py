"""The ``lm`` section of bench/gpu.py (issue 33 part 5): step MFU of the lm family at GPT-2 scale.

For each row of ``archhpo.models.lm_spec.GPU_ROWS`` (124M = GPT-2 small, 200M, 2B; vocabulary
50,257, context ``--seq-len``, default 1024) and each variant:

- ``eager``: the path a trial takes (``workers.train``: bf16 autocast, fused AdamW, data on the GPU,
  no host sync in a step), at the largest micro-batch the memory estimate allows
  (``workers._batch.plan_batch``) up to ``--lm-batch``, accumulating to ``--lm-batch``;
- ``foreach``: the same with PyTorch's foreach AdamW, to show what the fused one is worth;
- ``bf16-weights``: the model's weights (and so AdamW's state) in bf16 instead of fp32 + autocast;
- ``compile``: ``torch.compile`` (default mode); its compile time is the first call's extra time
  over the steady steps, reported in its own column, never inside the step time;
- ``unpadded-head`` (bench/gpu_defaults.py's section): the tied head over the bare vocabulary, where a
  CUDA trial pads its kernel to a multiple of 64 (``models/lm.py``).

Step time is ``TrainResult.train_s``: the timed steps only (validation and set-up outside), from
the exact FLOPs (``flops_per_sample``: attention included, the causal half not discounted, as
nanoGPT's ``estimate_mfu``).  The eager variant's SDPA kernel is read from one profiled step
(``torch.profiler``): the aten op, e.g. ``_scaled_dot_product_flash_attention`` = the flash kernel.

The data are random token windows made on the device (the time of a step does not depend on which
tokens it reads).  ``--dry-run`` (alias ``--cpu-smoke``) runs it all on CPU with tiny configs and
compiles with the ``eager`` backend, to prove the script and its table; it measures nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

import archhpo.workers._train as trainer
from archhpo.models import TensorDataset, get_family
from archhpo.models.lm_spec import GPU_ROWS, LMConfig, flops_per_token, gpu_config, param_count
from archhpo.workers._batch import plan_batch, vocab_logits
from archhpo.workers._device import mfu, release_memory
from archhpo.workers._memory import TrialShape
from archhpo.workers._train import TrainConfig, train

VARIANTS = ("eager", "foreach", "bf16-weights", "compile")  # the lm section's; measure() also knows unpadded-head
TINY = {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}  # --dry-run: every row is this
TINY_VOCAB, TINY_SEQ = 256, 32
WARM_STEPS = 3


def config(row: str, args: argparse.Namespace) -> LMConfig:
    if args.cpu_smoke:
        return LMConfig(**TINY, vocab_size=TINY_VOCAB, seq_len=TINY_SEQ)
    return gpu_config(row, args.seq_len)


def windows(n: int, cfg: LMConfig, device: torch.device, val: int = 1) -> TensorDataset:
    """n random training windows (and `val` validation windows) of seq_len + 1 tokens, on the device."""
    ids = torch.randint(0, cfg.vocab_size, (n + val, cfg.seq_len + 1), device=device)
    return TensorDataset((ids[:n, :-1],), ids[:n, 1:], (ids[n:, :-1],), ids[n:, 1:], {})


@contextmanager
def _adamw(variant: str) -> Iterator[None]:
    """The trainer's AdamW options for this variant (foreach instead of fused)."""
    real = trainer.adamw_options
    if variant == "foreach":
        trainer.adamw_options = lambda device: {"foreach": True}  # type: ignore[assignment]
    try:
        yield
    finally:
        trainer.adamw_options = real  # type: ignore[assignment]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(model: torch.nn.Module, cfg: LMConfig, tcfg: TrainConfig, steps: int, device: torch.device,
         variant: str) -> tuple[float, float]:
    """Train `steps` optimizer steps; (wall seconds, timed-step seconds)."""
    data = windows(steps * tcfg.batch_size, cfg, device)
    _sync(device)
    start = time.perf_counter()
    with _adamw(variant):
        result = train(model, data, get_family("lm").loss, tcfg)
    _sync(device)
    return time.perf_counter() - start, result.train_s


def sdpa_kernel(model: torch.nn.Module, cfg: LMConfig, tcfg: TrainConfig, device: torch.device) -> str:
    """The SDPA aten op(s) one profiled training step ran (flash, efficient, cudnn or math)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        _run(model, cfg, tcfg, 1, device, "eager")
    names = {e.key for e in prof.key_averages()}
    ops = sorted(n.removeprefix("aten::") for n in names if "scaled_dot_product" in n and "backward" not in n)
    ops = [o for o in ops if o != "scaled_dot_product_attention"] or ops
    kernels = sorted(n for n in names if "flash" in n.lower() and not n.startswith("aten::"))
    return ", ".join(ops) + (f" (kernel: {kernels[0][:60]})" if kernels else "")


def shape(cfg: LMConfig, batch: int) -> TrialShape:
    return TrialShape(param_count(cfg), batch, 1, cfg.seq_len, 1, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff)


def setup(row: str, batch: int, device: torch.device, args: argparse.Namespace) -> tuple[Any, ...]:
    """(config, model, batch plan, train config) of an lm row at the largest micro-batch the memory
    estimate allows (``workers._batch.plan_batch``), accumulating to ``batch``."""
    cfg = config(row, args)
    torch.manual_seed(0)
    with torch.device(device):  # built on the device: a 2B model never sits in host memory
        model: torch.nn.Module = get_family("lm").build(cfg)
    plan = plan_batch(shape(cfg, batch), device, f"lm {row}", vocab_logits("lm", cfg))
    tcfg = TrainConfig(epochs=1, batch_size=batch, warmup_steps=10, learning_rate=3e-4,
                       eval_batch_size=1, micro_batch=plan.micro_batch if plan.accumulation > 1 else None)
    return cfg, model, plan, tcfg


def measure(row: str, variant: str, device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    cfg, model, plan, tcfg = setup(row, args.lm_batch, device, args)
    if variant == "bf16-weights":
        model = model.to(torch.bfloat16)
    if variant == "unpadded-head":  # the tied head over the bare vocabulary (models/lm.py: HEAD_MULTIPLE)
        model.head_multiple = 1
    run = torch.compile(model, backend="eager" if args.cpu_smoke else "inductor") if variant == "compile" else model
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first, _ = _run(run, cfg, tcfg, WARM_STEPS, device, variant)  # cuBLAS set-up, allocator growth, compile
    _, warm = _run(run, cfg, tcfg, WARM_STEPS, device, variant)
    per_step = warm / WARM_STEPS
    steps = int(min(args.lm_max_steps, max(WARM_STEPS, args.seconds / max(per_step, 1e-6))))
    _, secs = _run(run, cfg, tcfg, steps, device, variant)
    samples = steps * args.lm_batch
    flops = flops_per_token(cfg) * cfg.seq_len * samples
    out: dict[str, Any] = {
        "row": f"{row} (tiny)" if args.cpu_smoke else row, "variant": variant, "params": param_count(cfg), "flops_per_token": flops_per_token(cfg),
        "seq_len": cfg.seq_len, "batch": args.lm_batch, "micro_batch": plan.micro_batch, "steps": steps,
        "step_ms": round(1000 * secs / steps, 2), "tokens_per_s": round(samples * cfg.seq_len / secs, 1),
        "tflops": round(flops / secs / 1e12, 3), "estimate_gib": round(plan.need_bytes / 2**30, 2),
        "warmup_extra_s": round(max(0.0, first - WARM_STEPS * secs / steps), 2),
    }
    m = mfu(flops, secs, device)
    out["step_mfu"] = None if m is None else round(m, 4)
    if device.type == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if variant == "eager":
        out["sdpa"] = sdpa_kernel(model, cfg, tcfg, device)
    del run, model
    release_memory(device)
    return out


def built(row: str, batch: int, device: torch.device, args: argparse.Namespace) -> tuple[Any, ...]:
    """For bench/gpu_profile.py: (model, data_for(steps), train config, loss, FLOPs per sample) of an
    lm row, at the micro-batch the memory estimate allows (as ``measure``)."""
    cfg, model, _, tcfg = setup(row, batch, device, args)
    return (model, lambda steps: windows(steps * batch, cfg, device), tcfg, get_family("lm").loss,
            float(flops_per_token(cfg) * cfg.seq_len))


def section_lm(device: torch.device, args: argparse.Namespace, guarded: Any, variants: tuple[str, ...] | None = None,
               batch_for: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Every row x variant (``args.lm_variants`` unless `variants`; `batch_for` gives a variant its
    own batch); each printed as it is measured (a run cut off still says what it had)."""
    rows: list[dict[str, Any]] = []
    for row in args.lm_rows:
        eager_warm = None
        for variant in variants or args.lm_variants:
            print(f"lm {row} {variant} ...", file=sys.stderr)
            if variant == "compile":
                torch._dynamo.reset()
            run_args = args
            if batch_for and variant in batch_for:
                run_args = argparse.Namespace(**{**vars(args), "lm_batch": batch_for[variant]})
            r = {"row": row, "variant": variant, "vocab": config(row, args).vocab_size,
                 **guarded(measure, row, variant, device, run_args)}
            if variant == "eager" and "error" not in r:
                eager_warm = r["warmup_extra_s"]
            if variant == "compile" and "error" not in r and eager_warm is not None:
                r["compile_s"] = round(max(0.0, r["warmup_extra_s"] - eager_warm), 1)
            rows.append(r)
            print(f"  {r}", file=sys.stderr)
    torch._dynamo.reset()
    return rows


def fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"


def vocab(rows: list[dict[str, Any]]) -> int:
    """The vocabulary the rows trained at (every row of a run has the same)."""
    return int(rows[0]["vocab"]) if rows else 0


def markdown(rows: list[dict[str, Any]], vocab: int, title: str = "lm at GPT-2 scale") -> list[str]:
    lines = [f"{title} (vocabulary {vocab:,}; step MFU = exact FLOPs over the timed steps only; "
             "compile s = the compiled first call's extra time beyond eager's):", "",
             "| row | params | FLOPs/token | context | variant | batch (micro) | tokens/s | step ms | step MFU "
             "| TFLOP/s | compile s | peak GiB | estimate GiB | SDPA op (profiler) |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['row']} | | | | {r['variant']} | | {r['error'][:80]} | | | | | | | |")
            continue
        batch = f"{r['batch']}" + (f" ({r['micro_batch']})" if r["micro_batch"] < r["batch"] else "")
        lines.append(
            f"| {r['row']} | {fmt(r['params'])} | {fmt(r['flops_per_token'])} | {r['seq_len']} | {r['variant']} | "
            f"{batch} | {fmt(r['tokens_per_s'])} | {fmt(r['step_ms'])} | {fmt(r.get('step_mfu'), True)} | "
            f"{fmt(r['tflops'])} | {fmt(r.get('compile_s'))} | {fmt(r.get('peak_memory_gib'))} | "
            f"{fmt(r['estimate_gib'])} | {r.get('sdpa', '')} |")
    return [*lines, ""]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lm-rows", nargs="+", default=list(GPU_ROWS), choices=list(GPU_ROWS))
    ap.add_argument("--lm-variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--lm-batch", type=int, default=16, help="lm: samples (windows) per optimizer step")
    ap.add_argument("--lm-max-steps", type=int, default=200, help="lm: at most this many timed steps")
    ap.add_argument("--seq-len", type=int, default=1024, help="lm: context (1024 or 2048)")


__all__ = ["GPU_ROWS", "VARIANTS", "WARM_STEPS", "add_arguments", "built", "config", "fmt", "markdown", "measure",
           "section_lm", "setup", "shape", "vocab", "windows"]
