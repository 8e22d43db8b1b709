"""Learning-rate transfer across width: the lm family on the synthetic language, under sp and µP.

``run`` trains every (parametrization, d_model, n_layers, learning_rate, seed) of the grid at a fixed
number of training tokens per parameter, one thread, and appends one CSV row per finished run (parametrization, d_model, n_layers, learning_rate, seed, val_loss, tokens, seconds).
Rows already in the CSV are skipped, so the sweep can be killed at any moment and started again,
and ``--shard I/N`` splits the pending runs between N processes writing the same file.

Two sweeps share the CSV: the width sweep (every width at ``N_LAYERS``) and the depth sweep (every
depth at ``DEPTH_WIDTH``, which reuses the width sweep's runs at that width and depth).

``analyse`` takes the seed means per (parametrization, width, depth, rate), the optimum of each as
the vertex of the parabola in log rate through the best rate and its two neighbours (T1's rule,
bench/truths/lr_sweep.py; a best rate at the grid's end is a bound), and per sweep the ratio of the
largest optimum to the smallest; it prints a table and writes a JSON.  Command, cost and result: bench/transfer/README.md, docs/mup.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "truths"))  # lr_sweep.py: the one rule for a sweep's best rate
CSV_PATH = HERE / "lr_transfer.csv"
JSON_PATH = HERE / "lr_transfer.json"
FIELDS = ("parametrization", "d_model", "n_layers", "learning_rate", "seed", "val_loss", "tokens", "seconds")
KEY = ("parametrization", "d_model", "n_layers", "learning_rate", "seed")  # what makes a run
# The sweep's grid (README.md: sized to about 2-3 core-hours on this machine).
WIDTHS = (16, 32, 64, 128)
RATES = tuple(1e-3 * 2 ** (k / 2) for k in range(12))  # 1e-3 .. 4.5e-2, spaced by sqrt(2)
SEEDS = (0, 1, 2)
N_LAYERS = 2  # the width sweep's depth
# The depth sweep (README.md): 1 to 8 layers (8x) at width 32, µP's base width still 16 (m = 2)
DEPTHS = (1, 2, 4, 8)
DEPTH_WIDTH = 32
BASE_WIDTH = 16
# "completep": µP with CompleteP's depth scaling (mup_base_depth, README.md), base depth the width sweep's
BASE_DEPTH = N_LAYERS
PARAMETRIZATIONS = ("sp", "mup", "completep")
N_HEADS = 4  # fixed: d_head grows with width, the case µP's 1/d_head attention is for
TOKENS_PER_PARAM = 2.0
# 128 tokens a step, so that the smallest width still takes about 120 steps at 2 tokens a parameter
BATCH = 8
SEQ_LEN = 16


@dataclass(frozen=True)
class Run:
    parametrization: str
    d_model: int
    learning_rate: float
    seed: int
    n_layers: int = N_LAYERS

    def key(self) -> tuple[str, int, int, str, int]:
        return (self.parametrization, self.d_model, self.n_layers, rate_text(self.learning_rate), self.seed)


def rate_text(lr: float) -> str:
    """A rate as the CSV writes it (and as resumption compares it)."""
    return f"{lr:.6g}"


def done_keys(path: Path) -> set[tuple[str, int, int, str, int]]:
    """The runs the CSV already holds."""
    if not path.exists():
        return set()
    with path.open(newline="") as fh:
        return {(r["parametrization"], int(r["d_model"]), int(r["n_layers"]), rate_text(float(r["learning_rate"])),
                 int(r["seed"])) for r in csv.DictReader(fh)}


def grid(parametrizations: Sequence[str], widths: Sequence[int], rates: Sequence[float],
         seeds: Sequence[int], depths: Sequence[int] = (N_LAYERS,)) -> list[Run]:
    """Every run of the sweep, seed by seed: a part that stops early still holds whole seeds of every
    width and depth under every parametrization."""
    return [Run(p, w, lr, s, d) for s in seeds for w in widths for d in depths for p in parametrizations
            for lr in rates]


def _config(run: Run, base_width: int, seq_len: int) -> Any:
    from archhpo.models.lm import LMConfig

    mup = run.parametrization in ("mup", "completep")
    return LMConfig(d_model=run.d_model, n_layers=run.n_layers, n_heads=N_HEADS, d_ff=4 * run.d_model,
                    seq_len=seq_len, parametrization="mup" if mup else "sp",
                    mup_base_width=base_width if mup else None,
                    mup_base_depth=BASE_DEPTH if run.parametrization == "completep" else None)


def train_one(run: Run, base_width: int, tokens_per_param: float, batch: int = BATCH,
              seq_len: int = SEQ_LEN) -> dict[str, Any]:
    """Train one run on fresh synthetic tokens (the same data for every rate and seed of a width)."""
    import torch

    from archhpo.errors import NonFiniteLoss
    from archhpo.models.data import language
    from archhpo.models.lm import LM, next_token_nll, param_count
    from archhpo.models.lm_spec import FAMILY
    from archhpo.workers import TrainConfig, train

    cfg = _config(run, base_width, seq_len)
    tokens = max(seq_len * batch, round(tokens_per_param * param_count(cfg)))
    options = {"seq_len": seq_len, "seed": 0}
    data = language.load_data(language.parse_data(f"synthetic:tokens={tokens}", options), options)
    steps = math.ceil(data.n_train / batch)
    defaults = dict(FAMILY.train_defaults)
    tcfg = TrainConfig(learning_rate=run.learning_rate, epochs=1, batch_size=batch, seed=run.seed,
                       warmup_steps=max(1, steps // 20), weight_decay=float(defaults["weight_decay"]),
                       min_lr_ratio=float(defaults["min_lr_ratio"]), grad_clip=float(defaults["grad_clip"]))
    torch.manual_seed(run.seed)
    model = LM(cfg)
    start = time.perf_counter()
    try:
        val = train(model, data, next_token_nll, tcfg).best_val_loss
    except NonFiniteLoss:
        val = math.inf  # diverged: a row all the same, so the rate is not retried
    return {"parametrization": run.parametrization, "d_model": run.d_model, "n_layers": run.n_layers,
            "learning_rate": rate_text(run.learning_rate), "seed": run.seed, "val_loss": f"{val:.6f}",
            "tokens": data.n_train * seq_len, "seconds": f"{time.perf_counter() - start:.2f}"}


def append_row(path: Path, row: dict[str, Any]) -> None:
    """One line, written at once (O_APPEND), so shards sharing the file never interleave a row."""
    new = not path.exists() or path.stat().st_size == 0
    line = ",".join(str(row[f]) for f in FIELDS) + "\n"
    with path.open("a", newline="") as fh:
        fh.write((",".join(FIELDS) + "\n" if new else "") + line)


def _shard(text: str) -> tuple[int, int]:
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
        raise argparse.ArgumentTypeError(f"--shard must be I/N with 0 <= I < N, got {text!r}.")
    return int(i), int(n)


def check_grid(args: argparse.Namespace, base: int) -> str | None:
    """What is wrong with the grid, in one sentence, before anything trains; None when nothing."""
    from archhpo.errors import ArchhpoError

    if not set(args.parametrizations) <= set(PARAMETRIZATIONS):
        return f"--parametrizations takes {', '.join(PARAMETRIZATIONS)}, got {','.join(args.parametrizations)}."
    if any(lr <= 0 or not math.isfinite(lr) for lr in args.rates) or args.tokens_per_param <= 0:
        return "--rates and --tokens-per-param must be finite and above 0."
    if any(d < 1 for d in args.depths):
        return f"--depths must be at least 1 layer, got {','.join(map(str, args.depths))}."
    try:
        for w in args.widths:
            _config(Run("mup", w, 1.0, 0, min(args.depths)), base, args.seq_len)
    except ArchhpoError as exc:
        return f"{exc} (widths must be multiples of {N_HEADS} heads); fix --widths or --base-width."
    return None


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)  # one core a process: the sweep's cost is counted in core-hours
    base = BASE_WIDTH if args.base_width is None else args.base_width
    problem = check_grid(args, base)
    if problem:
        print(f"sweep: {problem}", file=sys.stderr)
        return 2
    done = done_keys(args.csv)
    runs = [r for r in grid(args.parametrizations, args.widths, args.rates, args.seeds, args.depths)
            if r.key() not in done]
    index, count = args.shard
    runs = runs[index::count]
    print(f"sweep: {len(runs)} runs to do ({len(done)} in {args.csv}), base width {base}", file=sys.stderr)
    for i, run in enumerate(runs, 1):
        row = train_one(run, base, args.tokens_per_param, args.batch, args.seq_len)
        if run.key() in done_keys(args.csv):  # another shard finished it meanwhile
            continue
        append_row(args.csv, row)
        print(f"[{i}/{len(runs)}] {row['parametrization']} d{row['d_model']} L{row['n_layers']} lr {row['learning_rate']} "
              f"seed {row['seed']}: val {row['val_loss']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    return 0


def read_rows(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as fh:
        return [{"parametrization": r["parametrization"], "d_model": int(r["d_model"]), "n_layers": int(r["n_layers"]),
                 "learning_rate": float(r["learning_rate"]), "seed": int(r["seed"]),
                 "val_loss": float(r["val_loss"])} for r in csv.DictReader(fh)]


def vertex(rates: Sequence[float], losses: Sequence[float]) -> tuple[float, str | None]:
    """The optimum rate over the finite means: T1's rule (bench/truths/lr_sweep.py ``best_rate``:
    the parabola's vertex in log rate through the lowest mean and its neighbours); a lowest mean at
    the grid's end is that rate and "low" or "high" (a bound)."""
    from lr_sweep import best_rate

    pts = sorted((lr, v) for lr, v in zip(rates, losses, strict=True) if math.isfinite(v))
    if not pts:
        raise ValueError("every rate diverged: no optimum")
    rate, how = best_rate(pts)
    if how != "bound":
        return rate, None
    return rate, "low" if rate == pts[0][0] else "high"


BOOT_DRAWS = 1000  # the seed bootstrap of the ratio's interval


def _mean_losses(by_rate: Mapping[float, Mapping[int, float]], seeds: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
    """The rates and their mean losses over `seeds` (every seed when None; inf stays inf: a diverged seed)."""
    rates = sorted(by_rate)
    losses = []
    for lr in rates:
        vals = list(by_rate[lr].values()) if seeds is None else [by_rate[lr][s] for s in seeds if s in by_rate[lr]]
        losses.append(sum(vals) / len(vals) if vals else math.inf)
    return rates, losses


def _optima(by_key: Mapping[int, Mapping[float, Mapping[int, float]]]) -> dict[str, Any]:
    """Each key's optimum (a width or a depth), largest/smallest optimum (a bound when either end is),
    and that ratio's 90% interval from a seed bootstrap: each key's seeds drawn with replacement (the
    same draw at every rate of that key, since a seed is one model's initialisation and batch order)."""
    optima: dict[str, Any] = {}
    for key, by_rate in sorted(by_key.items()):
        rates, losses = _mean_losses(by_rate)
        lr, bound = vertex(rates, losses)
        optima[str(key)] = {"learning_rate": lr, "bound": bound, "best_mean_val_loss": min(losses),
                            "seeds": min(len(v) for v in by_rate.values()), "rates": len(rates)}
    lrs = [o["learning_rate"] for o in optima.values()]
    rng = random.Random(0)
    draws = []
    for _ in range(BOOT_DRAWS):
        picked = []
        for by_rate in by_key.values():
            seeds = sorted({s for v in by_rate.values() for s in v})
            drawn = [rng.choice(seeds) for _ in seeds]
            rates, losses = _mean_losses(by_rate, drawn)
            picked.append(vertex(rates, losses)[0])
        draws.append(max(picked) / min(picked))
    draws.sort()
    ci = [draws[int(0.05 * (len(draws) - 1))], draws[int(math.ceil(0.95 * (len(draws) - 1)))]]
    return {"optima": optima, "ratio": max(lrs) / min(lrs), "ratio_ci90": ci,
            "ratio_is_bound": any(o["bound"] is not None for o in optima.values())}


def analyse(rows: Iterable[dict[str, Any]], n_layers: int = N_LAYERS, depth_width: int = DEPTH_WIDTH) -> dict[str, Any]:
    """Per parametrization, the width sweep (every width at ``n_layers``: ``optima`` keyed by width,
    ``ratio``, ``ratio_is_bound``) and, where the CSV holds more than one depth at ``depth_width``, the
    depth sweep under ``depth`` (``d_model``, and ``optima`` keyed by depth, ``ratio``, ``ratio_is_bound``)."""
    def cells() -> defaultdict[int, defaultdict[float, dict[int, float]]]:
        return defaultdict(lambda: defaultdict(dict))

    widths: dict[str, defaultdict[int, defaultdict[float, dict[int, float]]]] = defaultdict(cells)
    depths: dict[str, defaultdict[int, defaultdict[float, dict[int, float]]]] = defaultdict(cells)
    for r in rows:
        depth = int(r.get("n_layers", N_LAYERS))
        if depth == n_layers:
            widths[r["parametrization"]][r["d_model"]][r["learning_rate"]][int(r["seed"])] = r["val_loss"]
        if r["d_model"] == depth_width:
            depths[r["parametrization"]][depth][r["learning_rate"]][int(r["seed"])] = r["val_loss"]
    out: dict[str, Any] = {}
    for param in sorted(set(widths) | set(depths)):
        entry = _optima(widths[param]) if widths.get(param) else {}
        if len(depths.get(param, {})) > 1:
            entry["depth"] = {"d_model": depth_width, **_optima(depths[param])}
        out[param] = entry
    return out


def table(result: dict[str, Any]) -> str:
    lines = [f"{'param':<6}{'width':>7}{'layers':>7}{'optimum lr':>13}  bound  {'best val':>9}"]
    for param, entry in result.items():
        for width, o in entry.get("optima", {}).items():
            lines.append(f"{param:<6}{width:>7}{N_LAYERS:>7}{o['learning_rate']:>13.4g}  {o['bound'] or '-':<5}  "
                         f"{o['best_mean_val_loss']:>9.4f}")
        if len(entry.get("optima", {})) > 1:  # one width (a depth sweep's label): no ratio to read
            bound = " (a bound: an optimum at the grid's end)" if entry["ratio_is_bound"] else ""
            lo, hi = entry["ratio_ci90"]
            lines.append(f"{param}: over width, largest/smallest optimum = {entry['ratio']:.3g} "
                         f"(90% seed bootstrap {lo:.3g}-{hi:.3g}){bound}")
        depth = entry.get("depth")
        if depth:
            for layers, o in depth["optima"].items():
                lines.append(f"{param:<6}{depth['d_model']:>7}{layers:>7}{o['learning_rate']:>13.4g}  "
                             f"{o['bound'] or '-':<5}  {o['best_mean_val_loss']:>9.4f}")
            bound = " (a bound: an optimum at the grid's end)" if depth["ratio_is_bound"] else ""
            lo, hi = depth["ratio_ci90"]
            lines.append(f"{param}: over depth, largest/smallest optimum = {depth['ratio']:.3g} "
                         f"(90% seed bootstrap {lo:.3g}-{hi:.3g}){bound}")
    return "\n".join(lines)


def cmd_analyse(args: argparse.Namespace) -> int:
    if not args.csv.exists():
        print(f"sweep: {args.csv} does not exist; run `sweep.py run` first.", file=sys.stderr)
        return 2
    result = analyse(read_rows(args.csv))
    print(table(result))
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.json)
    return 0


def _numbers(kind: type) -> Any:
    def parse(text: str) -> tuple[Any, ...]:
        return tuple(kind(x) for x in text.split(","))
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the pending runs, one CSV row each")
    run.add_argument("--widths", type=_numbers(int), default=WIDTHS)
    run.add_argument("--rates", type=_numbers(float), default=RATES)
    run.add_argument("--seeds", type=_numbers(int), default=SEEDS)
    run.add_argument("--parametrizations", type=_numbers(str), default=("sp", "mup"))
    run.add_argument("--base-width", type=int, default=None, help=f"µP's base d_model (default {BASE_WIDTH})")
    run.add_argument("--tokens-per-param", type=float, default=TOKENS_PER_PARAM)
    run.add_argument("--depths", type=_numbers(int), default=(N_LAYERS,), help="the layers of every run")
    run.add_argument("--batch", type=int, default=BATCH)
    run.add_argument("--seq-len", type=int, default=SEQ_LEN)
    run.add_argument("--shard", type=_shard, default=(0, 1), help="I/N: this process's share of the pending runs")
    run.add_argument("--csv", type=Path, default=CSV_PATH)
    ana = sub.add_parser("analyse", help="the optimum per width and the transfer ratio")
    ana.add_argument("--csv", type=Path, default=CSV_PATH)
    ana.add_argument("--json", type=Path, default=JSON_PATH)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return cmd_run(args) if args.command == "run" else cmd_analyse(args)


if __name__ == "__main__":
    sys.exit(main())
