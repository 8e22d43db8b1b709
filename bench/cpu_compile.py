"""Does `torch.compile` pay for itself in a CPU trial? One family at a time, compile time included.

For every family (``family_names()``) the bench builds the trial a `--quick` study at `--budget`
would run first (plan slot 0: its architecture, training parameters, data and dropout, through
the worker's own `build_trial`), on one thread as a worker of `run --workers 2` on 2 cores has,
and times training steps exactly as the trainer takes them (index a batch, forward, loss,
backward, AdamW step):

- ``eager``: the model as archhpo trains it;
- ``compiled``: ``torch.compile(model)`` (default mode); its first steps, which compile, are timed
  apart as ``compile_s``.

A trial of S steps wins with compiling when ``compile_s + S * compiled < S * eager``; the table
gives the break-even S and the steps of the quick trial itself (its epochs × batches per epoch).

    python bench/cpu_compile.py [--budget 200K] [--steps 20] [--families lm,signal]
    python bench/cpu_compile.py --audit linear,cat     # signal at the encoder audit's Table 1 config
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import git_commit, machine_busy_s  # noqa: E402

from archhpo.models import family_names  # noqa: E402
from archhpo.search import prepare_settings  # noqa: E402
from archhpo.workers._build import TrialSpec, build_trial  # noqa: E402

AUDIT_PINS = {"d_model": 64, "n_layers": 3, "n_heads": 4, "d_ff": 256}  # the encoder audit's Table 1


def _first_trial(family: str, budget: str | None, encoder: str | None = None) -> TrialSpec:
    """Plan slot 0 of a quick study (or, with `encoder`, of docs/encoder_audit.md's study: Table 1
    config, 300 epochs), as the queue would hand it to a worker."""
    if encoder is not None:
        s = prepare_settings("bench", None, family="signal", pins=AUDIT_PINS, pruner="none", paired_seeds=1,
                             family_options={"encoder": encoder, "channels": 4}, fixed_params={"epochs": 300})
    else:
        s = prepare_settings("bench", budget, family=family, quick=True)
    entry = s.plan[0]
    return TrialSpec(family=family, data=s.data, options=s.options.as_dict(), info=s.info,
                     arch=s.archs[entry.arch_idx], params=dict(entry.params), slot=0)


def _stepper(model: torch.nn.Module, built: object, lr: float) -> Callable[[int], None]:
    data, fam, cfg = built.data, built.family, built.train_config  # type: ignore[attr-defined]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    model.train()
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(data.n_train, generator=gen)

    def step(i: int) -> None:
        at = (i * cfg.batch_size) % max(1, data.n_train - cfg.batch_size)
        idx = perm[at: at + cfg.batch_size]
        opt.zero_grad(set_to_none=True)
        loss = fam.loss(model(*(t[idx] for t in data.train_inputs)), data.train_target[idx])
        loss.backward()
        opt.step()
    return step


def _time(step: Callable[[int], None], first: int, n: int) -> list[float]:
    out = []
    for i in range(first, first + n):
        t0 = time.perf_counter()
        step(i)
        out.append(time.perf_counter() - t0)
    return out


def measure(family: str, budget: str | None, steps: int, encoder: str | None = None) -> dict[str, object]:
    spec = _first_trial(family, budget, encoder)
    eager = build_trial(spec, "cpu")
    compiled_built = build_trial(spec, "cpu")  # the same weights (same seeds), a second copy
    lr = float(eager.train_config.learning_rate)
    run_eager = _stepper(eager.model, eager, lr)
    run_comp = _stepper(torch.compile(compiled_built.model), compiled_built, lr)
    _time(run_eager, 0, 2)  # warm-up: allocator, first-call overheads
    compile_s = sum(_time(run_comp, 0, 2))  # the first steps compile (forward and backward graphs)
    eager_s, comp_s = [], []
    for i in range(steps):  # alternate so background load hits both alike
        eager_s += _time(run_eager, 2 + i, 1)
        comp_s += _time(run_comp, 2 + i, 1)
    e, c = statistics.median(eager_s), statistics.median(comp_s)
    cfg, n_train = eager.train_config, eager.data.n_train
    trial_steps = math.ceil(n_train / cfg.batch_size) * cfg.epochs
    gain = e - c
    return {"family": family if encoder is None else f"signal {encoder} (audit)", "params": int(spec.arch["param_count"]), "eager_ms": 1e3 * e, "compiled_ms": 1e3 * c,
            "compile_s": compile_s, "break_even_steps": math.ceil(compile_s / gain) if gain > 0 else None,
            "trial_steps": trial_steps, "trial_wins": gain > 0 and compile_s + trial_steps * c < trial_steps * e}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="200K")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--families", default=",".join(family_names()))
    ap.add_argument("--audit", default="", help="signal encoders at the audit's Table 1 config instead, e.g. linear,cat")
    args = ap.parse_args()
    torch.set_num_threads(1)
    busy0, t0 = machine_busy_s(), time.monotonic()
    print(f"# commit {git_commit()}, {platform.node()}, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
          f"torch {torch.__version__}, 1 thread, load average {os.getloadavg()[0]:.2f}")
    print("| family | params | eager ms/step | compiled ms/step | compile s | break-even steps | trial steps "
          "| compiling wins the trial |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    cases = ([("signal", enc) for enc in args.audit.split(",")] if args.audit
             else [(fam, None) for fam in args.families.split(",")])
    for fam, enc in cases:
        r = measure(fam, args.budget, args.steps, enc)
        be = r["break_even_steps"] if r["break_even_steps"] is not None else "never (slower)"
        print(f"| {r['family']} | {r['params']:,} | {r['eager_ms']:.1f} | {r['compiled_ms']:.1f} | {r['compile_s']:.1f} | "
              f"{be} | {r['trial_steps']} | {'yes' if r['trial_wins'] else 'no'} |", flush=True)
    wall = time.monotonic() - t0
    print(f"# {wall:.0f} s; the machine's busy cores while measuring: {(machine_busy_s() - busy0) / wall:.2f}")


if __name__ == "__main__":
    main()
