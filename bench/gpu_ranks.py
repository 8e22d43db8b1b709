"""One rank of bench/gpu.py's ``ranks`` section, launched K times by torchrun (one GPU a rank, nccl;
gloo on CPU with ``--dry-run``): an lm row trained by ``workers.train`` on a K-rank group
(``workers._distributed``: DDP), ``--batch-per-rank`` windows per rank and step. Rank 0 writes
``--out`` (JSON): the global batch, the steps, aggregate tokens/s and step ms of the timed steps.

    python -m torch.distributed.run --standalone --nproc-per-node 4 bench/gpu_ranks.py --out r.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import gpu_lm  # bench/gpu_lm.py (this script's folder is on sys.path)
import torch

from archhpo.models import get_family
from archhpo.workers._device import configure_cuda_speed
from archhpo.workers._distributed import Ranks, join_group
from archhpo.workers._train import train


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--row", default="124M", choices=list(gpu_lm.GPU_ROWS))
    ap.add_argument("--batch-per-rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", dest="cpu_smoke", action="store_true", help="tiny config on CPU (gloo)")
    args = ap.parse_args(argv)
    group = join_group("cpu" if args.cpu_smoke else "auto")
    device = group.device if group is not None else torch.device("cpu" if args.cpu_smoke else "cuda")
    if device.type == "cuda":
        configure_cuda_speed()
    else:
        torch.set_num_threads(1)
    world = group.world if group is not None else 1
    batch = args.batch_per_rank * world
    cfg, model, _, tcfg = gpu_lm.setup(args.row, batch, device, argparse.Namespace(
        cpu_smoke=args.cpu_smoke, seq_len=args.seq_len))
    tcfg = dataclasses.replace(tcfg, micro_batch=None)  # each rank's share is its own micro-batch
    torch.manual_seed(1)  # the same windows on every rank: each trains its share of every batch
    data = gpu_lm.windows(batch * 4, cfg, device)
    ranks = None if group is None else Ranks(group, "ddp")
    loss = get_family("lm").loss
    train(model, data, loss, dataclasses.replace(tcfg, epoch_samples=gpu_lm.WARM_STEPS * batch), ranks=ranks)
    result = train(model, data, loss, dataclasses.replace(tcfg, epoch_samples=args.steps * batch), ranks=ranks)
    if group is None or group.lead:
        secs = max(result.train_s, 1e-9)
        Path(args.out).write_text(json.dumps({
            "row": f"{args.row} (tiny)" if args.cpu_smoke else args.row, "global_batch": batch, "steps": args.steps,
            "tokens_per_s": round(args.steps * batch * cfg.seq_len / secs, 1),
            "step_ms": round(1000 * secs / args.steps, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
