"""The coordinate check of µP (docs/mup.md): do the activations keep their size as the lm widens?

Each width trains a few seeds for STEPS AdamW steps (the trainer's own parameter groups:
``LM.optimizer_groups``) on one fixed batch of the synthetic language at one learning rate (a batch
learnt by heart: the logits then grow as fast as the updates let them, not to the size the
language's entropy asks for, so a width-dependent update shows), with forward hooks on
the token embedding, each block's attention and MLP outputs and the logits.  A layer's RMS is read
over the last READ_STEPS steps and averaged over the seeds; its slope is the least-squares slope of
log RMS against log d_model.  µP passes when every slope lies within ±MUP_TOLERANCE; the standard
parametrization's logits grow at SP_LOGITS_SLOPE or more, which shows the check can fail.
The steps matter: the head's output settles only after about 30 (microsoft/mup#71).

    python bench/coord_check.py --json coord.json --png docs/mup_coord_check.png

writes ``{"mup": {"slopes": {layer: s}, "rms": ..., "widths": ...}, "sp": {...}, "settings": ...}``
and the usual figure: RMS against width per layer, one panel per parametrization.
tests/models/test_coord_check.py runs a reduced version (one layer, two seeds, 64 to 512).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from archhpo.models.data import language
from archhpo.models.lm import LM, LMConfig, next_token_nll

STEPS = 30  # the head's coordinates settle only after about 30 steps (microsoft/mup#71)
READ_STEPS = 3  # the RMS is the mean over the last steps, so one step's noise does not set a slope
MUP_TOLERANCE = 0.15  # |slope| under µP: flat in width
SP_LOGITS_SLOPE = 0.5  # the standard parametrization's logits grow at least this fast


@dataclass(frozen=True)
class CheckSettings:
    """One coordinate check: the widths (d_model; the first is µP's base width), the seeds, the
    training steps and the tiny data and model shape that keep it cheap on a CPU."""

    widths: tuple[int, ...] = (64, 128, 256, 512)
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = STEPS
    n_layers: int = 2
    n_heads: int = 4  # fixed: the head dimension grows with the width, as µP's attention rule assumes
    ff_ratio: int = 4
    learning_rate: float = 1e-3  # at 5e-3 and above SP's widest runs break down and hide its trend
    batch_size: int = 8
    seq_len: int = 16
    vocab_size: int = language.DEFAULT_VOCAB
    parametrizations: tuple[str, ...] = field(default=("mup", "sp"))

    @property
    def base_width(self) -> int:
        return min(self.widths)


def layer_names(n_layers: int) -> list[str]:
    """The layers the check reads, in the model's order."""
    return ["embedding", *(f"block{i}.{part}" for i in range(n_layers) for part in ("attn", "mlp")), "logits"]


def _batch(s: CheckSettings, seed: int) -> torch.Tensor:
    """The (batch, seq_len + 1) token windows every width of one seed trains on at every step."""
    windows = language.sample_windows(s.vocab_size, language.DEFAULT_ORDER, 0, s.batch_size, s.seq_len + 1, seed)
    return torch.as_tensor(np.asarray(windows), dtype=torch.long)


def _model(s: CheckSettings, parametrization: str, width: int) -> LM:
    cfg = LMConfig(d_model=width, n_layers=s.n_layers, n_heads=s.n_heads, d_ff=s.ff_ratio * width,
                   vocab_size=s.vocab_size, seq_len=s.seq_len, parametrization=parametrization,
                   mup_base_width=s.base_width if parametrization == "mup" else None)
    return LM(cfg)


def _hooks(model: LM, sink: dict[str, float]) -> list[Any]:
    """Forward hooks writing each read layer's output RMS into `sink` (the last forward's)."""
    def hook(name: str) -> Any:
        def record(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
            sink[name] = float(output.detach().float().pow(2).mean().sqrt())
        return record

    handles = [model.tok_embed.register_forward_hook(hook("embedding"))]
    for i, block in enumerate(model.blocks):
        handles.append(block.attn.register_forward_hook(hook(f"block{i}.attn")))  # type: ignore[union-attr]
        handles.append(block.ff.register_forward_hook(hook(f"block{i}.mlp")))  # type: ignore[union-attr]
    handles.append(model.register_forward_hook(hook("logits")))
    return handles


def run_width(s: CheckSettings, parametrization: str, width: int, seed: int, ids: torch.Tensor) -> dict[str, float]:
    """One width and seed: train `s.steps` AdamW steps with the trainer's parameter groups and a
    constant rate, and return each layer's output RMS averaged over the last READ_STEPS steps."""
    torch.manual_seed(seed)
    model = _model(s, parametrization, width)
    groups = model.optimizer_groups(s.learning_rate, 0.0)
    opt = torch.optim.AdamW(model.parameters() if groups is None else groups, lr=s.learning_rate, weight_decay=0.0)
    sink: dict[str, float] = {}
    handles = _hooks(model, sink)
    read: dict[str, list[float]] = {}
    for step in range(s.steps):
        loss = next_token_nll(model(ids[:, :-1]), ids[:, 1:])
        if step >= s.steps - READ_STEPS:
            for name, value in sink.items():
                read.setdefault(name, []).append(value)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for handle in handles:
        handle.remove()
    return {name: float(np.mean(values)) for name, values in read.items()}


def slope(widths: Sequence[int], values: Sequence[float]) -> float:
    """The least-squares slope of log value against log width."""
    return float(np.polyfit(np.log(np.asarray(widths, dtype=float)), np.log(np.asarray(values, dtype=float)), 1)[0])


def check(s: CheckSettings, parametrization: str) -> dict[str, Any]:
    """One parametrization's check: per layer the RMS at each width (mean over the seeds) and its slope."""
    per_seed = {seed: _batch(s, seed) for seed in s.seeds}
    rms: dict[str, list[float]] = {name: [] for name in layer_names(s.n_layers)}
    for width in s.widths:
        runs = [run_width(s, parametrization, width, seed, per_seed[seed]) for seed in s.seeds]
        for name in rms:
            rms[name].append(float(np.mean([r[name] for r in runs])))
    if not all(math.isfinite(v) and v > 0 for values in rms.values() for v in values):
        raise FloatingPointError(f"{parametrization}: an activation became non-finite; lower --lr.")
    return {"widths": list(s.widths), "rms": rms, "slopes": {name: slope(s.widths, v) for name, v in rms.items()}}


def verdict(result: dict[str, Any]) -> dict[str, bool]:
    """µP passes when every slope lies within ±MUP_TOLERANCE; SP's logits grow at SP_LOGITS_SLOPE or more."""
    out = {}
    if "mup" in result:
        out["mup"] = all(abs(v) <= MUP_TOLERANCE for v in result["mup"]["slopes"].values())
    if "sp" in result:
        out["sp_logits_grow"] = result["sp"]["slopes"]["logits"] >= SP_LOGITS_SLOPE
    return out


def run(s: CheckSettings) -> dict[str, Any]:
    """Every parametrization's check, the settings and the verdicts."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    result: dict[str, Any] = {p: check(s, p) for p in s.parametrizations}
    result["settings"] = {**asdict(s), "read_steps": READ_STEPS, "base_width": s.base_width}
    result["verdict"] = verdict(result)
    return result


def figure(result: dict[str, Any], path: Path) -> None:
    """RMS against d_model on log-log axes, a line per layer, one panel per parametrization."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    kinds = [p for p in ("sp", "mup") if p in result]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.4), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds, strict=True):
        part = result[kind]
        for name, values in part["rms"].items():
            ax.plot(part["widths"], values, marker="o", label=f"{name} ({part['slopes'][name]:+.2f})")
        ax.set(xscale="log", yscale="log", xlabel="d_model", ylabel=f"activation RMS (last {READ_STEPS} steps)",
               title={"sp": "standard parametrization", "mup": "µP"}[kind])
        ax.set_xticks(part["widths"], [str(w) for w in part["widths"]])
        ax.xaxis.set_minor_formatter(NullFormatter())  # the widths are labelled; log minor labels overlap them
        ax.legend(fontsize=7, title="layer (log-log slope)", title_fontsize=7, loc="upper left",
                  bbox_to_anchor=(0.0, -0.16), ncol=2, frameon=False)
    steps, seeds = result["settings"]["steps"], len(result["settings"]["seeds"])
    fig.suptitle(f"Coordinate check: lm after {steps} AdamW steps, mean of {seeds} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True, help="where the slopes and RMS go")
    p.add_argument("--png", type=Path, help="the figure (RMS against width per layer)")
    p.add_argument("--widths", type=lambda t: tuple(int(w) for w in t.split(",")), default=CheckSettings.widths,
                   help="comma-separated d_model values; the smallest is µP's base width")
    p.add_argument("--seeds", type=int, default=len(CheckSettings.seeds))
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--layers", type=int, default=CheckSettings.n_layers)
    p.add_argument("--lr", type=float, default=CheckSettings.learning_rate)
    p.add_argument("--replot", action="store_true", help="draw --png from the result already in --json, training nothing")
    args = p.parse_args(argv)
    if args.replot:
        if args.png is None or not args.json.is_file():
            p.error("--replot draws --png from an existing --json result: give both.")
        figure(json.loads(args.json.read_text()), args.png)
        return 0
    widths = args.widths
    if len(widths) < 2 or min(widths) < 1 or any(w % CheckSettings.n_heads for w in widths):
        p.error(f"--widths needs at least two d_model values, each a multiple of {CheckSettings.n_heads}.")
    if args.steps <= READ_STEPS or args.seeds < 1 or args.layers < 1 or not args.lr > 0:
        p.error(f"--steps must exceed {READ_STEPS}, and --seeds, --layers and --lr must be positive.")
    for out in (args.json, args.png):
        if out is not None and not out.parent.is_dir():
            p.error(f"{out.parent} is not a folder: create it or write elsewhere.")
    s = CheckSettings(widths=widths, seeds=tuple(range(args.seeds)), steps=args.steps, n_layers=args.layers,
                      learning_rate=args.lr)
    result = run(s)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.png is not None:
        figure(result, args.png)
    for kind in s.parametrizations:
        print(kind, " ".join(f"{k} {v:+.3f}" for k, v in result[kind]["slopes"].items()))
    print("verdict:", result["verdict"])
    return 0 if all(result["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
