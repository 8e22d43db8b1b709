"""CPU cost of dropout: a training step with dropout 0.1 against the same step with dropout 0.

One step = forward, loss, backward, AdamW step, on one thread.  Models: every signal encoder at
the encoder audit's Table 1 config (C 4, d 64, 4 heads, 3 layers, d_ff 256, 159 steps, batch 32),
three shared ``Block``s (used by ft_transformer, csn_transformer; d 64, 4 heads, d_ff 256)
on a (32, 159, 64) input, and the ``lm`` family (its causal mask; d 64, 3 layers, 4 heads, d_ff 256,
32 sequences of 128 tokens).  For each model three variants share the initial weights and alternate within each repeat,
so background load hits them alike:

- ``p=0``: dropout 0 (SDPA's flash kernel, no random numbers);
- ``p=0.1``: dropout 0.1 as archhpo trains it now (``archhpo.models._dropout``: the fused C
  kernels of ``_cpu_kernels.c``; ``ARCHHPO_CPU_KERNELS=0`` measures its tensor path instead);
- ``stock p=0.1``: dropout 0.1 through PyTorch's own modules (``nn.TransformerEncoderLayer`` /
  ``nn.Dropout`` / SDPA ``dropout_p``), i.e. before this change (signal only).

The table shows the median ms per step and the ratio p=0.1 / p=0 (the target is <= 1.3).

    python bench/cpu_dropout.py [--repeats 5] [--steps 3] [--encoders linear,cat]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _common import git_commit, machine_busy_s  # noqa: E402

from archhpo.models import lm, signal  # noqa: E402
from archhpo.models._blocks import Block, EncoderLayer  # noqa: E402


def _stock(model: nn.Module) -> nn.Module:
    """The same model with every EncoderLayer swapped for PyTorch's own layer (same weights)."""
    model = copy.deepcopy(model)
    for mod in model.modules():
        for name, child in list(mod.named_children()):
            if isinstance(child, EncoderLayer):
                stock = nn.TransformerEncoderLayer(
                    child.linear1.in_features, child.self_attn.num_heads, child.linear1.out_features,
                    dropout=child.dropout.p, activation="gelu", batch_first=True, norm_first=True)
                stock.load_state_dict(child.state_dict())
                setattr(mod, name, stock)
    return model


def _set_p(model: nn.Module, p: float) -> nn.Module:
    model = copy.deepcopy(model)
    for mod in model.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = p
        if isinstance(mod, nn.MultiheadAttention):
            mod.dropout = p
        if hasattr(mod, "dropout") and isinstance(mod.dropout, float):
            mod.dropout = p  # _blocks.Attention
    return model


def _stepper(model: nn.Module, x: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss(model(x)).backward()
        opt.step()
    return step


def _models(encoders: list[str]) -> list[tuple[str, nn.Module, torch.Tensor, Callable]]:
    out = []
    for enc in encoders:
        cfg = signal.SignalConfig(d_model=64, n_layers=3, n_heads=4, d_ff=256, encoder=enc, channels=4,
                                  num_bins=32, seq_len=159, dropout=0.1)
        torch.manual_seed(0)
        x = torch.randn(32, 159, 4)
        y = torch.randint(0, 32, (32, 159))
        out.append((f"signal {enc}", signal.SignalTransformer(cfg), x, lambda lg, y=y: signal.binned_nll(lg, y)))
    torch.manual_seed(0)
    blocks = nn.Sequential(*(Block(64, 4, 256, dropout=0.1) for _ in range(3)))
    out.append(("Block x3 (shared)", blocks, torch.randn(32, 159, 64), lambda h: h.float().pow(2).mean()))
    torch.manual_seed(0)
    cfg_lm = lm.LMConfig(d_model=64, n_layers=3, n_heads=4, d_ff=256, seq_len=128, dropout=0.1)
    ids = torch.randint(0, cfg_lm.vocab_size, (32, 129))
    out.append(("lm (causal, 128 tokens)", lm.LM(cfg_lm), ids[:, :-1], lambda lg, y=ids[:, 1:]: lm.next_token_nll(lg, y)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--encoders", default=",".join(signal.ENCODERS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"commit {git_commit()}, {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, 1 thread per measurement")
    print("| model | p=0 ms | p=0.1 ms | stock p=0.1 ms | p=0.1 / p=0 | stock / p=0.1 | other CPU load (cores) |")
    print("|---|---|---|---|---|---|---|")
    for name, model, x, loss in _models(args.encoders.split(",")):
        variants = {"p0": _set_p(model, 0.0), "p1": model}
        if name.startswith("signal"):
            variants["stock"] = _stock(model)
        steps = {k: _stepper(m, x, loss) for k, m in variants.items()}
        times: dict[str, list[float]] = {k: [] for k in steps}
        busy0, cpu0, wall0 = machine_busy_s(), time.process_time(), time.perf_counter()
        for fn in steps.values():
            fn()  # warm-up
        for _ in range(args.repeats):
            for k, fn in steps.items():
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                times[k].append((time.perf_counter() - t0) / args.steps * 1e3)
        other = (machine_busy_s() - busy0 - (time.process_time() - cpu0)) / (time.perf_counter() - wall0)
        med = {k: statistics.median(v) for k, v in times.items()}
        stock = f"{med['stock']:.0f}" if "stock" in med else "-"
        speedup = f"{med['stock'] / med['p1']:.2f}x" if "stock" in med else "-"
        print(f"| {name} | {med['p0']:.0f} | {med['p1']:.0f} | {stock} | {med['p1'] / med['p0']:.2f} | "
              f"{speedup} | {other:.1f} |", flush=True)


if __name__ == "__main__":
    main()
