"""CPU training speed of the `signal` family: cores split across workers, and archhpo's trainer
against the paper's own ``fft_encode`` training loop.

``cores``: W processes × T torch threads each train the encoder audit's Table 1 model (linear
encoder, C 4, d 64, 4 heads, 3 layers, d_ff 256, dropout 0.1, batch 32, 159 steps) with
``workers.train``; aggregate samples/s = all samples trained / wall time from the common start
to the last process's end.  Configurations alternate within each repeat.

``paper``: per encoder, the same model, data and dropout through (a) the paper's
``train_and_trace(RunCfg(encoder, C=4, seed=0, epochs=E), "cpu")`` and (b) archhpo: the family's
own multisignal data (512 series of 160 steps, 4 channels, 32 bins; the paper's draw, bit for bit)
and ``workers.train``, E epochs, batch 32, lr 3e-4, AdamW wd 1e-4, clipping 1.0, both validating
after epoch 1 and at the end (and the paper every 5 epochs, as archhpo with E = 5 does anyway).
Each side is timed twice over the same work: its training loop alone (the paper's own
``seconds``, which its loop measures around the epochs and validations; ``workers.train`` timed
around the call) and the whole job (data generation, model building and the loop: the paper's
whole call; archhpo's ``load_data``, model build and ``train``). One thread, the sides
interleaved, median of N.
The paper's code is not part of this repository: pass a checkout with ``--paper``
(``git -C <mirror> archive HEAD fft_encode | tar -x -C DIR``).

    python bench/cpu_training.py cores [--steps 40] [--repeats 2]
    python bench/cpu_training.py paper --paper DIR [--epochs 1] [--encoders linear,cat]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import git_commit, machine_busy_s  # noqa: E402

PAPER_ENCODERS = ("sum", "linear", "linear-ortho", "linear-ppe", "mlp", "concat", "ci", "cat")  # its names too


def _data(series: int = 512):  # type: ignore[no-untyped-def]
    from archhpo.models import signal
    spec = signal.FAMILY.parse_data(f"multisignal:series={series},length=160,channels=4", {})
    return signal.FAMILY.load_data(spec, {})


def _archhpo_run(encoder: str, epochs: int, data, steps: int | None = None) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """Train like a trial (validating after epoch 1 and the last, as the paper's loop does);
    returns the samples trained and the seconds of the training call."""
    import torch

    from archhpo.models import signal
    from archhpo.schema import TrainingPlan
    from archhpo.workers import TrainConfig, train
    cfg = signal.SignalConfig(d_model=64, n_layers=3, n_heads=4, d_ff=256, encoder=encoder, channels=4,
                              num_bins=32, seq_len=159, dropout=0.1)
    torch.manual_seed(0)
    model = signal.SignalTransformer(cfg)
    if steps is not None:  # a fixed number of full batches: tile the training split
        idx = torch.arange(steps * 32) % data.train_target.shape[0]
        data = dataclasses.replace(data, train_inputs=tuple(x[idx] for x in data.train_inputs),
                                   train_target=data.train_target[idx])
    tcfg = TrainConfig(learning_rate=3e-4, epochs=epochs, batch_size=32, weight_decay=1e-4, warmup_steps=0,
                       grad_clip=1.0, min_lr_ratio=0.01, eval_every=5)
    t0 = time.perf_counter()
    res = train(model, data, signal.binned_nll, tcfg, plan=TrainingPlan(validate_at=(1,)))  # epoch 1 validated
    return res.samples, time.perf_counter() - t0


def _cores_child(threads: int, steps: int, start, done) -> None:  # type: ignore[no-untyped-def]
    import torch
    torch.set_num_threads(threads)
    data = _data(64)
    start.wait()
    _archhpo_run("linear", 1, data, steps=steps)
    done.put(steps * 32)


def _cores_once(workers: int, threads: int, steps: int) -> float:
    ctx = mp.get_context("spawn")
    start, done = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [ctx.Process(target=_cores_child, args=(threads, steps, start, done)) for _ in range(workers)]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    samples = sum(done.get() for _ in procs)
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    return samples / wall


def cores(args: argparse.Namespace) -> None:
    layouts = [(1, 2), (2, 1), (4, 1)]
    rates: dict[tuple[int, int], list[float]] = {k: [] for k in layouts}
    busy0, wall0 = machine_busy_s(), time.perf_counter()
    for _ in range(args.repeats):
        for w, t in layouts:
            rates[(w, t)].append(_cores_once(w, t, args.steps))
    load = (machine_busy_s() - busy0) / (time.perf_counter() - wall0)
    print("| workers × threads | aggregate samples/s (median) | runs |")
    print("|---|---|---|")
    for (w, t), r in rates.items():
        print(f"| {w}×{t} | {statistics.median(r):.0f} | {', '.join(f'{x:.0f}' for x in r)} |")
    print(f"whole machine busy (this benchmark included): {load:.2f} cores on average")


def _paper_run(path: str, encoder: str, epochs: int) -> float:
    """The paper's whole call; returns its own timer's seconds (the training loop)."""
    sys.path.insert(0, path)
    from fft_encode.experiments import RunCfg
    from fft_encode.runner import train_and_trace
    return float(train_and_trace(RunCfg(encoder=encoder, C=4, seed=0, epochs=epochs), "cpu")["seconds"])


def _paper_once(args: argparse.Namespace, enc: str) -> dict[str, float]:
    """One interleaved repeat: each side's loop and whole-job seconds."""
    t0 = time.perf_counter()
    paper_loop = _paper_run(args.paper, enc, args.epochs)
    paper_whole = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, archhpo_loop = _archhpo_run(enc, args.epochs, _data())
    archhpo_whole = time.perf_counter() - t0
    return {"paper_loop": paper_loop, "paper_whole": paper_whole,
            "archhpo_loop": archhpo_loop, "archhpo_whole": archhpo_whole}


def paper(args: argparse.Namespace) -> None:
    import torch
    torch.set_num_threads(1)
    _data()  # the first call builds the CPU kernels and warms imports: not a side's cost
    print("| encoder | paper's loop s | archhpo loop s | loop speed-up | paper whole s | archhpo whole s "
          "| whole speed-up | other CPU load (cores) |")
    print("|---|---|---|---|---|---|---|---|")
    for enc in args.encoders.split(","):
        busy0, cpu0, wall0 = machine_busy_s(), time.process_time(), time.perf_counter()
        runs = [_paper_once(args, enc) for _ in range(args.repeats)]
        other = (machine_busy_s() - busy0 - (time.process_time() - cpu0)) / (time.perf_counter() - wall0)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {enc} | {med['paper_loop']:.1f} | {med['archhpo_loop']:.1f} "
              f"| {med['paper_loop'] / med['archhpo_loop']:.2f}× | {med['paper_whole']:.1f} "
              f"| {med['archhpo_whole']:.1f} | {med['paper_whole'] / med['archhpo_whole']:.2f}× | {other:.1f} |",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cores")
    c.add_argument("--steps", type=int, default=40)
    c.add_argument("--repeats", type=int, default=2)
    p = sub.add_parser("paper")
    p.add_argument("--paper", required=True, help="a directory holding the paper's fft_encode package")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--encoders", default=",".join(PAPER_ENCODERS))
    args = ap.parse_args()
    print(f"commit {git_commit()}, {platform.node()}, {os.cpu_count()} cores, "
          f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
    if args.what == "cores":
        cores(args)
    else:
        paper(args)


if __name__ == "__main__":
    main()
