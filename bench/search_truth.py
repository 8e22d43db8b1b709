"""The ground-truth table of bench/search_efficiency.py, read from archhpo studies.

The studies are a paired study under successive halving (`--paired-seeds S --pruner halving`):
every grid architecture of every budget trained to full length with S seeds, each trial
recording the rung scores halving would have used (WSD cooldown branches, README "Successive
halving").  An optional second experiment with `--schedule cosine` gives, at the same rung
epochs, the losses of cosine runs cut short.  One row per (budget, architecture, seed):

    budget, budget_params, arch_idx, d_model, n_layers, n_heads, d_ff, param_count, seed, epochs,
    flops_per_epoch, loss, curve, rung_epochs, rung_loss, branch_epochs, cosine_rung_loss,
    train_tokens, tokens_per_param, data_seed, duration_s

(lists ';'-joined: `curve` is the validation loss after each epoch of the constant-rate run,
`rung_loss` the rung scores, the last one the full-length loss).

    python bench/search_truth.py --storage sqlite:///truth.db --experiment truth \
        [--cosine-storage sqlite:///truthcos.db --cosine-experiment truthcos] --out bench/search_truth.csv
    python bench/search_truth.py --table bench/search_truth.csv --summary
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("budget", "budget_params", "arch_idx", "d_model", "n_layers", "n_heads", "d_ff", "param_count", "seed",
           "epochs", "flops_per_epoch", "loss", "curve", "rung_epochs", "rung_loss", "branch_epochs",
           "cosine_rung_loss", "train_tokens", "tokens_per_param", "data_seed", "duration_s")


def _join(values: Sequence[float | int]) -> str:
    return ";".join(repr(float(v)) if isinstance(v, float) else str(v) for v in values)


def _studies(storage: str, experiment: str) -> list[Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage)
                   if s.study_name.startswith(f"{experiment}_"))
    if not names:
        raise SystemExit(f"search_truth: no study of experiment {experiment!r} in {storage}; check --experiment.")
    return [optuna.load_study(study_name=n, storage=storage) for n in names]


def _key(study: Any, t: Any) -> tuple[str, int, int]:
    return (study.user_attrs["archhpo_budget"], int(t.params["arch_idx"]), int(t.user_attrs["seed"]))


def read_rows(storage: str, experiment: str) -> list[dict[str, Any]]:
    """Every COMPLETE trial of the experiment's studies as a table row (cosine column empty)."""
    rows = []
    for study in _studies(storage, experiment):
        for t in study.get_trials(deepcopy=False):
            if t.state.name != "COMPLETE":
                continue
            a, epochs = t.user_attrs, int(t.params["epochs"])
            rows.append({
                "budget": study.user_attrs["archhpo_budget"], "budget_params": study.user_attrs["archhpo_budget_value"],
                "arch_idx": int(t.params["arch_idx"]), **{k: a[k] for k in ("d_model", "n_layers", "n_heads", "d_ff")},
                "param_count": a["param_count"], "seed": int(a["seed"]), "epochs": epochs,
                "flops_per_epoch": int(a["flops_full"]) // epochs, "loss": t.value,
                "curve": _join([t.intermediate_values[e] for e in range(1, epochs + 1)]),
                "rung_epochs": _join(a["rung_epochs"]), "rung_loss": _join(a["rung_scores"]),
                "branch_epochs": _join(a["branch_epochs"]), "cosine_rung_loss": "",
                # the data (a --tokens-per-param truth; empty for the first truth's epoch studies) and cost
                "train_tokens": a.get("train_tokens", ""), "tokens_per_param": a.get("tokens_per_param", ""),
                "data_seed": study.user_attrs["archhpo_options"].get("data_seed", ""),
                "duration_s": a.get("duration_s", ""),
            })
    return sorted(rows, key=lambda r: (r["budget_params"], r["arch_idx"], r["seed"]))


def add_cosine(rows: list[dict[str, Any]], storage: str, experiment: str) -> int:
    """Fill cosine_rung_loss from a cosine experiment's trial of the same (budget, arch, seed):
    its loss at each rung epoch (the run cut short there; the last is its full-length value)."""
    found = 0
    cosine = {}
    for study in _studies(storage, experiment):
        for t in study.get_trials(deepcopy=False):
            if t.state.name == "COMPLETE":
                cosine[_key(study, t)] = t
    for r in rows:
        t = cosine.get((r["budget"], r["arch_idx"], r["seed"]))
        if t is None:
            continue
        epochs = [int(e) for e in r["rung_epochs"].split(";")]
        r["cosine_rung_loss"] = _join([t.intermediate_values[e] for e in epochs[:-1]] + [t.value])
        found += 1
    return found


def write_table(rows: list[dict[str, Any]], out: Path) -> None:
    with open(out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


# ------------------------------------------------------------------------------ summary
def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's on ranks, ties averaged); NaN for fewer than 3 points
    or a constant side."""
    if len(x) < 3:
        return math.nan
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx and vy else math.nan


def rung_correlations(rows: list[dict[str, str]], column: str) -> dict[str, list[float]]:
    """Per budget, per rung below full length: Spearman between the architectures' rung scores and
    their full-length losses, each the mean over the seeds that have both."""
    out: dict[str, list[float]] = {}
    by_budget: dict[str, dict[str, list[list[float]]]] = {}
    for r in rows:
        if not r[column]:
            continue
        scores = [float(v) for v in r[column].split(";")]
        by_budget.setdefault(r["budget"], {}).setdefault(r["arch_idx"], []).append(scores)
    for budget, archs in by_budget.items():
        means = {a: [sum(col) / len(col) for col in zip(*runs, strict=True)] for a, runs in archs.items()}
        n_rungs = min(len(m) for m in means.values())
        final = [m[-1] for m in means.values()]
        out[budget] = [spearman([m[k] for m in means.values()], final) for k in range(n_rungs - 1)]
    return out


def summary_markdown(rows: list[dict[str, str]]) -> str:
    wsd, cos = rung_correlations(rows, "rung_loss"), rung_correlations(rows, "cosine_rung_loss")
    epochs = {r["budget"]: r["rung_epochs"] for r in rows}
    lines = ["| budget | architectures | rung epochs | Spearman, WSD branch | Spearman, cosine cut short |",
             "|---|---:|---|---|---|"]
    for budget in dict.fromkeys(r["budget"] for r in rows):
        n = len({r["arch_idx"] for r in rows if r["budget"] == budget})
        fmt = lambda v: " / ".join(f"{x:+.2f}" for x in v) if v else "–"  # noqa: E731
        lines.append(f"| {budget} | {n} | {epochs[budget]} | {fmt(wsd.get(budget, []))} | {fmt(cos.get(budget, []))} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage")
    ap.add_argument("--experiment", default="truth")
    ap.add_argument("--cosine-storage")
    ap.add_argument("--cosine-experiment", default="truthcos")
    ap.add_argument("--out", type=Path, default=Path("bench/search_truth.csv"))
    ap.add_argument("--table", type=Path, help="summarise an existing table instead of reading studies")
    ap.add_argument("--summary", action="store_true", help="print the rung-score correlations")
    ap.add_argument("--seed", type=int, help="summarise this paired seed only (like for like with a 1-seed cosine run)")
    args = ap.parse_args(argv)
    if args.table is None:
        if not args.storage:
            print("search_truth: give --storage URL (the ground-truth studies) or --table FILE.", file=sys.stderr)
            return 2
        rows = read_rows(args.storage, args.experiment)
        if args.cosine_storage:
            print(f"# cosine runs matched for {add_cosine(rows, args.cosine_storage, args.cosine_experiment)} of "
                  f"{len(rows)} rows", file=sys.stderr)
        write_table(rows, args.out)
        print(f"# {len(rows)} rows written to {args.out}", file=sys.stderr)
        args.table = args.out
    if args.summary:
        with open(args.table) as fh:
            rows = [r for r in csv.DictReader(fh) if args.seed is None or int(r["seed"]) == args.seed]
        print(summary_markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
