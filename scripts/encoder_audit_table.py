"""The encoder audit's Table 1, archhpo's study beside the paper's runs (docs/encoder_audit.md).

Reads the study's export (``archhpo export``: one row per finished trial, ``choices`` naming the
encoder, ``seed`` the paired seed) and the paper's per-seed results
(``docs/encoder_audit_paper_seeds.csv``, taken from its repository), and prints three markdown
tables:

- per encoder: archhpo's mean ± std over the seeds that ran, the paper's Table 1 mean ± std over
  its 20 seeds, the difference with a Welch 95% interval (none from one seed), whether it is within
  the aim's 0.05, and the mean trial time;
- per seed: archhpo's value beside the paper's run of the same seed (the same data and split bit
  for bit; other initial weights, dropout masks and batch order);
- as far as a draw: for each encoder, how many of the paper's own n-seed subsets (every one of
  the C(20, n) subsets of its 20 runs, n = archhpo's seed count) have a mean at least as far
  from Table 1's mean as archhpo's has.  A small count says archhpo's mean is not one the paper's
  spread of seeds produces by itself; a large one says the difference is within that spread;
- the tiers: the paper orders them linear family < cat < ci < sum; each tier's range of means and
  whether archhpo's means keep that order.

    python scripts/encoder_audit_table.py docs/encoder_audit_study/experiment_results.csv \\
        [--paper docs/encoder_audit_paper_seeds.csv]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from scipy import stats

ENCODERS = ("linear-ppe", "linear", "linear-ortho", "concat", "mlp", "cat", "ci", "sum")  # Table 1's tiers
TIERS = {"linear family": ("linear-ppe", "linear", "linear-ortho", "concat", "mlp"),
         "cat": ("cat",), "ci": ("ci",), "sum": ("sum",)}
AIM = 0.05  # the aim: every encoder's mean within 0.05 NLL of Table 1


def _rows(path: Path) -> Iterable[dict[str, str]]:
    with open(path, newline="") as fh:
        yield from csv.DictReader(line for line in fh if not line.startswith("#"))


def read_study(path: Path) -> dict[str, dict[int, tuple[float, int, float]]]:
    """encoder -> seed -> (best validation NLL, best epoch, duration_s) of the COMPLETE trials."""
    out: dict[str, dict[int, tuple[float, int, float]]] = defaultdict(dict)
    for r in _rows(path):
        if r["state"] != "COMPLETE":
            continue
        enc = json.loads(r["choices"])["encoder"]
        out[enc][int(r["seed"])] = (float(r["val_loss"]), int(r["best_epoch"]), float(r["duration_s"] or "nan"))
    return out


def read_paper(path: Path) -> dict[str, dict[int, tuple[float, int]]]:
    """encoder -> seed -> (best validation NLL, best epoch) of the paper's runs."""
    out: dict[str, dict[int, tuple[float, int]]] = defaultdict(dict)
    for r in _rows(path):
        out[r["encoder"]][int(r["seed"])] = (float(r["best_val_nll"]), int(r["best_epoch"]))
    return out


def welch(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """mean(a) - mean(b) with its Welch 95% interval; None when either side has fewer than 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.975, df)) * math.sqrt(va + vb)
    diff = statistics.mean(a) - statistics.mean(b)
    return diff, diff - half, diff + half


def _mean_std(v: list[float]) -> str:
    return f"{statistics.mean(v):.4f} ± {statistics.stdev(v):.4f}" if len(v) > 1 else f"{v[0]:.4f}"


def encoder_table(ours: dict[str, dict[int, tuple[float, int, float]]],
                  paper: dict[str, dict[int, tuple[float, int]]]) -> list[str]:
    lines = ["| encoder | archhpo mean ± std | seeds | paper Table 1 (20 seeds) | archhpo − Table 1 [95% CI] "
             f"| within {AIM} | paper seeds 0-4 mean | trial time (min, mean) |",
             "|---|---|---|---|---|---|---|---|"]
    for enc in ENCODERS:
        p = [v for _, v in sorted((s, x[0]) for s, x in paper[enc].items())]
        p04 = [paper[enc][s][0] for s in range(5) if s in paper[enc]]
        mine = ours.get(enc, {})
        if not mine:
            lines.append(f"| {enc} | not run | 0 | {_mean_std(p)} | – | – | {statistics.mean(p04):.4f} | – |")
            continue
        v = [mine[s][0] for s in sorted(mine)]
        diff = statistics.mean(v) - statistics.mean(p)
        w = welch(v, p)
        ci = f"{diff:+.4f} [{w[1]:+.4f}, {w[2]:+.4f}]" if w else f"{diff:+.4f} (one seed)"
        minutes = [mine[s][2] / 60 for s in mine if math.isfinite(mine[s][2])]
        time = f"{statistics.mean(minutes):.0f}" if minutes else "–"
        lines.append(f"| {enc} | {_mean_std(v)} | {','.join(map(str, sorted(mine)))} | {_mean_std(p)} | {ci} "
                     f"| {'yes' if abs(diff) <= AIM else '**no**'} | {statistics.mean(p04):.4f} | {time} |")
    return lines


def seed_table(ours: dict[str, dict[int, tuple[float, int, float]]],
               paper: dict[str, dict[int, tuple[float, int]]]) -> list[str]:
    seeds = sorted({s for enc in ours.values() for s in enc})
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [f"| encoder | run | {head} |", "|---|---|" + "---|" * len(seeds)]
    for enc in ENCODERS:
        if enc not in ours:
            continue
        cells = [f"{ours[enc][s][0]:.4f} ({ours[enc][s][1]})" if s in ours[enc] else "–" for s in seeds]
        ref = [f"{paper[enc][s][0]:.4f} ({paper[enc][s][1]})" if s in paper[enc] else "–" for s in seeds]
        lines += [f"| {enc} | archhpo | {' | '.join(cells)} |", f"| | paper | {' | '.join(ref)} |"]
    return lines


def subsets_as_far(p: list[float], v: list[float]) -> int:
    """How many len(v)-seed subsets of the paper's runs p have a mean at least as far from mean(p)
    as mean(v) is: exact, over all C(len(p), len(v)) subsets (15,504 for 5 of 20)."""
    centre, n = statistics.mean(p), len(v)
    gap = abs(statistics.mean(v) - centre) - 1e-12  # a subset exactly as far counts
    return sum(abs(sum(c) / n - centre) >= gap for c in itertools.combinations(p, n))


def draw_lines(ours: dict[str, dict[int, tuple[float, int, float]]],
               paper: dict[str, dict[int, tuple[float, int]]]) -> list[str]:
    """Per encoder: how often n of the paper's own seeds land as far from Table 1 as archhpo's n."""
    lines = ["| encoder | archhpo − Table 1 | seeds | paper's own subsets of as many seeds at least as far |",
             "|---|---|---|---|"]
    for enc in ENCODERS:
        if len(ours.get(enc, {})) < 2:
            continue
        p, v = [x[0] for x in paper[enc].values()], [x[0] for x in ours[enc].values()]
        far, total = subsets_as_far(p, v), math.comb(len(p), len(v))
        lines.append(f"| {enc} | {statistics.mean(v) - statistics.mean(p):+.4f} | {len(v)} "
                     f"| {far:,} of {total:,} ({far / total:.2%}) |")
    return lines


def tier_lines(means: dict[str, float], label: str) -> list[str]:
    """Each tier's range of means, and whether every tier lies wholly below the next."""
    ranges = []
    for tier, encs in TIERS.items():
        have = [means[e] for e in encs if e in means]
        if have:
            ranges.append((tier, min(have), max(have)))
    text = ", ".join(f"{t} {lo:.3f}" + (f"–{hi:.3f}" if hi > lo else "") for t, lo, hi in ranges)
    gaps = [(a[0], b[0], b[1] - a[2]) for a, b in zip(ranges, ranges[1:], strict=False)]
    held = all(g > 0 for _, _, g in gaps)
    order = "; ".join(f"{a} < {b} by {g:+.3f}" for a, b, g in gaps)
    missing = [t for t in TIERS if t not in {r[0] for r in ranges}]
    verdict = "in the paper's order" if held else "**not** in the paper's order"
    note = f" ({', '.join(missing)} not run)" if missing else ""
    return [f"- {label}: {text}: {verdict}{note} ({order})."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="the study's experiment_results.csv (archhpo export)")
    ap.add_argument("--paper", type=Path, default=Path(__file__).parent.parent / "docs" / "encoder_audit_paper_seeds.csv")
    args = ap.parse_args()
    ours, paper = read_study(args.results), read_paper(args.paper)
    print("\n".join(encoder_table(ours, paper)), end="\n\n")
    print("\n".join(seed_table(ours, paper)), end="\n\n")
    print("\n".join(draw_lines(ours, paper)), end="\n\n")
    ours_means = {e: statistics.mean(x[0] for x in ours[e].values()) for e in ours}
    paper_means = {e: statistics.mean(x[0] for x in paper[e].values()) for e in paper}
    print("\n".join(tier_lines(ours_means, "archhpo") + tier_lines(paper_means, "paper (20 seeds)")))


if __name__ == "__main__":
    main()
