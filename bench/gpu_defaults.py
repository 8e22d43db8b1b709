"""The ``defaults``, ``tokens`` and ``ranks`` sections of bench/gpu.py (issue 58 parts 4 and 5).

- ``defaults``: each GPU default a trial takes on CUDA, on and off, at an lm row (``--defaults-rows``,
  default 124M) on the trainer's path (``gpu_lm.measure``): the padded head (``eager`` against
  ``unpadded-head``), ``torch.compile`` (its compile time apart), the batch the memory plan allows
  (``plan-batch``: the largest up to ``--plan-batch-max`` that trains without accumulating, against
  ``--lm-batch``), and validation (``workers._train.evaluate`` over ``--val-windows`` windows at the
  1 GiB cap's batch against ``workers._batch.plan_eval_batch``'s).
- ``tokens``: the same row trained from a token file (``--data tokens:PATH``: memory-mapped,
  gathered on the host, pinned and copied asynchronously) against windows already on the GPU.
- ``ranks``: one trial across K ranks (``bench/gpu_ranks.py`` under torchrun, DDP, one GPU per
  rank) for K = 1, 2, 4, 8 up to the GPUs present, at ``--lm-batch`` windows per rank: aggregate
  tokens/s and the scaling against K = 1.

``--dry-run``: tiny configs on CPU (gloo for ranks, K = 1 and 2), to prove the sections and tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gpu_lm  # bench/gpu_lm.py (this folder is on sys.path when bench/gpu.py runs)
import numpy as np
import torch

from archhpo.models import get_family
from archhpo.models.lm_spec import flops_per_token
from archhpo.workers._batch import eval_batch, plan_batch, plan_eval_batch, vocab_logits
from archhpo.workers._device import mfu, release_memory
from archhpo.workers._train import TrainConfig, evaluate, train

BENCH = Path(__file__).resolve().parent
DEFAULT_VARIANTS = ("eager", "unpadded-head", "compile", "plan-batch")
RANKS = (1, 2, 4, 8)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plan_batch_size(row: str, device: torch.device, args: argparse.Namespace) -> int:
    """The largest power of two up to ``--plan-batch-max`` whose whole batch the plan fits at once."""
    cfg = gpu_lm.config(row, args)
    best = 1
    size = 1
    while size <= args.plan_batch_max:
        if plan_batch(gpu_lm.shape(cfg, size), device, "plan", vocab_logits("lm", cfg)).accumulation == 1:
            best = size
        size *= 2
    return best


def validation(row: str, device: torch.device, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Seconds of one validation over ``--val-windows`` windows: at the 1 GiB cap's batch (a host
    sync per batch, as before) and at the batch the plan leaves room for."""
    cfg, model, plan, tcfg = gpu_lm.setup(row, args.lm_batch, device, args)
    data = gpu_lm.windows(1, cfg, device, val=args.val_windows)
    logits, shape = vocab_logits("lm", cfg), gpu_lm.shape(cfg, args.lm_batch)
    loss = get_family("lm").loss
    metrics = get_family("lm").metrics
    out = []
    for name, batch in (("capped", eval_batch(logits, args.val_windows)),
                        ("planned", plan_eval_batch(plan, shape, device, logits, args.val_windows))):
        evaluate(model, data, loss, metrics, batch, device.type == "cuda")  # warm: kernels, allocator
        _sync(device)
        start = time.perf_counter()
        evaluate(model, data, loss, metrics, batch, device.type == "cuda")
        _sync(device)
        out.append({"row": f"{row} (tiny)" if args.cpu_smoke else row, "validation": name, "eval_batch": batch,
                    "windows": args.val_windows, "batches": -(-args.val_windows // batch),
                    "seconds": round(time.perf_counter() - start, 3)})
    del model
    release_memory(device)
    return out


def section_defaults(device: torch.device, args: argparse.Namespace, guarded: Any) -> dict[str, Any]:
    """Each default on and off at each ``--defaults-rows`` row, then the validation timings."""
    steps: list[dict[str, Any]] = []
    vals: list[dict[str, Any]] = []
    for row in args.defaults_rows:
        one = argparse.Namespace(**{**vars(args), "lm_rows": [row]})
        steps += gpu_lm.section_lm(device, one, guarded, DEFAULT_VARIANTS,
                                   {"plan-batch": plan_batch_size(row, device, args)})
        timed = guarded(lambda row=row: {"rows": validation(row, device, args)})
        vals += timed.get("rows") or [{"row": row, "validation": "error", "eval_batch": "", "batches": "",
                                       "windows": args.val_windows, "seconds": None, **timed}]
    return {"steps": steps, "validation": vals}


def write_tokens(path: Path, n_tokens: int, vocab: int) -> None:
    """A flat uint16 token file (nanoGPT's train.bin) of random ids, written in 16 Mi-token blocks."""
    gen = np.random.default_rng(0)
    with open(path, "wb") as fh:
        for lo in range(0, n_tokens, 2**24):
            fh.write(gen.integers(0, vocab, min(2**24, n_tokens - lo), dtype=np.uint16).tobytes())


def _timed_train(model: torch.nn.Module, data: Any, cfg: Any, tcfg: TrainConfig, steps: int,
                 device: torch.device) -> dict[str, Any]:
    """tokens/s of `steps` optimizer steps on `data` (train()'s own step time), after a warm call."""
    loss = get_family("lm").loss
    batch = tcfg.batch_size
    train(model, data, loss, dataclasses.replace(tcfg, epoch_samples=gpu_lm.WARM_STEPS * batch))
    result = train(model, data, loss, dataclasses.replace(tcfg, epoch_samples=steps * batch))
    secs = max(result.train_s, 1e-9)
    samples = steps * batch
    m = mfu(flops_per_token(cfg) * cfg.seq_len * samples, secs, device)
    return {"steps": steps, "tokens_per_s": round(samples * cfg.seq_len / secs, 1),
            "step_ms": round(1000 * secs / steps, 2), "step_mfu": None if m is None else round(m, 4)}


def token_file(cfg: Any, args: argparse.Namespace) -> tuple[Path, int]:
    """The bench's token file (written once into ``--tokens-dir``, else a fresh temporary folder)."""
    folder = Path(args.tokens_dir or tempfile.mkdtemp(prefix="archhpo-tokens-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.bin"
    n_tokens = max(args.tokens_file_mtokens * 2**20, 4 * (cfg.seq_len + 1) * args.lm_batch)
    if not path.exists() or path.stat().st_size != 2 * n_tokens:
        write_tokens(path, n_tokens, cfg.vocab_size)
    return path, n_tokens


def tokens_row(row: str, source: str, device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    """One row trained from the token file (`source` "token file"), through the family's own
    loader (``--data tokens:PATH``), or from windows made on the device ("on the device")."""
    cfg, model, _, tcfg = gpu_lm.setup(row, args.lm_batch, device, args)
    out: dict[str, Any] = {"row": f"{row} (tiny)" if args.cpu_smoke else row, "data": source, "file_tokens": None}
    if source == "token file":
        fam = get_family("lm")
        path, out["file_tokens"] = token_file(cfg, args)
        opts = {"seq_len": cfg.seq_len, "vocab_size": cfg.vocab_size}
        data = fam.load_data(fam.parse_data(f"tokens:{path},vocab={cfg.vocab_size}", opts), opts)
    else:
        data = gpu_lm.windows(args.lm_batch * 8, cfg, device)
    out.update(_timed_train(model, data, cfg, tcfg, args.tokens_steps, device))
    del model, data
    release_memory(device)
    return out


def section_tokens(device: torch.device, args: argparse.Namespace, guarded: Any) -> list[dict[str, Any]]:
    """Each ``--defaults-rows`` row trained from a token file on disk and from on-device windows."""
    rows = []
    for row in args.defaults_rows:
        for source in ("token file", "on the device"):
            print(f"tokens {row} {source} ...", file=sys.stderr)
            r = {"row": row, "data": source, "file_tokens": None, **guarded(tokens_row, row, source, device, args)}
            rows.append(r)
            print(f"  {r}", file=sys.stderr)
    return rows


def section_ranks(device: torch.device, args: argparse.Namespace, guarded: Any) -> list[dict[str, Any]]:
    """K = 1, 2, 4, 8 ranks (those the GPUs allow; 1 and 2 on CPU), each a torchrun launch."""
    have = 2 if device.type == "cpu" else torch.cuda.device_count()
    rows: list[dict[str, Any]] = []
    for k in [k for k in RANKS if k <= have]:
        print(f"ranks K={k} ...", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rank0.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={k}",
                   str(BENCH / "gpu_ranks.py"), "--row", args.ranks_row, "--batch-per-rank", str(args.lm_batch),
                   "--steps", str(args.ranks_steps), "--seq-len", str(args.seq_len), "--out", str(out)]
            if args.cpu_smoke:
                cmd.append("--dry-run")
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ranks_timeout_s)
            if res.returncode != 0 or not out.exists():
                rows.append({"ranks": k, "error": (res.stderr.strip().splitlines() or ["no output"])[-1]})
                continue
            rows.append({"ranks": k, **json.loads(out.read_text())})
        print(f"  {rows[-1]}", file=sys.stderr)
    one = next((r for r in rows if r["ranks"] == 1 and "error" not in r), None)
    for r in rows:
        if one is not None and "error" not in r:
            r["scaling"] = round(r["tokens_per_s"] / one["tokens_per_s"], 3)
    return rows


def _f(v: Any) -> str:
    return gpu_lm.fmt(v)


def markdown(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    defaults = result.get("defaults")
    if defaults:
        lines += gpu_lm.markdown(defaults["steps"], gpu_lm.vocab(defaults["steps"]),
                                 "The GPU defaults on and off (eager = a CUDA trial's path: padded head, "
                                 "no compile)")
        lines += ["Validation (one pass; capped = the 1 GiB cap's batch, a host sync each; planned = the "
                  "batch the memory plan leaves room for):", "",
                  "| row | validation | eval batch | batches | windows | seconds |", "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['row']} | {r['validation']} | {r['eval_batch']} | {r['batches']} | {r['windows']} | "
                  f"{_f(r['seconds'])} |" for r in defaults["validation"]]
        lines.append("")
    if result.get("tokens"):
        lines += ["Token file against on-device windows (train()'s step time; the file memory-mapped, "
                  "batches gathered on the host, pinned, copied asynchronously):", "",
                  "| row | data | file tokens | steps | tokens/s | step ms | step MFU |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in result["tokens"]:
            if "error" in r:
                lines.append(f"| {r['row']} | {r['data']} | {r['error'][:80]} | | | | |")
                continue
            lines.append(f"| {r['row']} | {r['data']} | {_f(r['file_tokens'])} | {r['steps']} | "
                         f"{_f(r['tokens_per_s'])} | {_f(r['step_ms'])} | {gpu_lm.fmt(r['step_mfu'], True)} |")
        lines.append("")
    if result.get("ranks"):
        lines += ["One trial across K ranks (DDP, one GPU a rank, the same windows per rank; scaling = "
                  "aggregate tokens/s over K = 1's):", "",
                  "| K | row | global batch | steps | tokens/s | step ms | scaling |", "|---:|---|---:|---:|---:|---:|---:|"]
        for r in result["ranks"]:
            if "error" in r:
                lines.append(f"| {r['ranks']} | {r['error'][:80]} | | | | | |")
                continue
            lines.append(f"| {r['ranks']} | {r['row']} | {r['global_batch']} | {r['steps']} | "
                         f"{_f(r['tokens_per_s'])} | {_f(r['step_ms'])} | {_f(r.get('scaling'))} |")
        lines.append("")
    return lines


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--defaults-rows", nargs="+", default=["124M"], choices=list(gpu_lm.GPU_ROWS),
                    help="defaults, tokens: the lm rows")
    ap.add_argument("--plan-batch-max", type=int, default=64, help="defaults: the largest batch plan-batch tries")
    ap.add_argument("--val-windows", type=int, default=64, help="defaults: validation windows timed")
    ap.add_argument("--tokens-file-mtokens", type=int, default=100, help="tokens: the file's size in Mi tokens")
    ap.add_argument("--tokens-dir", default=None, help="tokens: where the token file is written (kept)")
    ap.add_argument("--tokens-steps", type=int, default=50, help="tokens: timed steps")
    ap.add_argument("--ranks-row", default="124M", choices=list(gpu_lm.GPU_ROWS), help="ranks: the lm row")
    ap.add_argument("--ranks-steps", type=int, default=30, help="ranks: timed steps per K")
    ap.add_argument("--ranks-timeout-s", type=float, default=300.0, help="ranks: the most one K may take")


__all__ = ["DEFAULT_VARIANTS", "add_arguments", "markdown", "section_defaults", "section_ranks", "section_tokens"]
