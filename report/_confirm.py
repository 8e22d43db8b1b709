"""Seed statistics: the confirmation phase's summary and the per-configuration summary of a paired
study, from trials or result rows (a database, or `experiment_results.csv` written by archhpo).

`confirmation_summary(trials_or_rows)` is what the best JSON's "confirmation" key holds and what
`archhpo report` shows: for each confirmed architecture (rank 0 = the phase-1/2 winner) the mean,
std, n and per-seed values of its confirmation trials, and a paired, seed-by-seed comparison of
the winner against the runner-up: mean lead, its std, a t-based 95% interval, and one sentence
saying whether the lead lies within seed noise.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from archhpo.schema import ARCH_KEYS


def _num(v: Any) -> float | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _int(v: Any) -> int | None:
    x = _num(v)
    return int(x) if x is not None else None


def _choices(v: Any) -> dict[str, Any]:
    if isinstance(v, dict):
        return v
    if isinstance(v, str) and v.strip():
        try:
            parsed = json.loads(v)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _row_from_trial(t: Any, archs: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """A FrozenTrial as a result row (the keys `confirmation_summary` reads)."""
    ua = t.user_attrs
    arch: Mapping[str, Any] = {}
    if archs is not None and "arch_idx" in t.params:
        arch = archs[int(t.params["arch_idx"])]
    row = {k: arch.get(k, ua.get(k)) for k in (*ARCH_KEYS, "param_count")}
    row.update(
        trial=t.number, state=t.state.name, phase=ua.get("phase"), seed=ua.get("seed"), rank=ua.get("rank"),
        val_loss=t.value, choices=arch.get("choices", ua.get("choices", {})),
        best_epoch=ua.get("best_epoch"),
    )
    return row


def _rows(trials_or_rows: Iterable[Any], archs: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    out = []
    for item in trials_or_rows:
        row = dict(item) if isinstance(item, Mapping) else _row_from_trial(item, archs)
        state = str(row.get("state") or "COMPLETE").upper()
        value = _num(row.get("val_loss", row.get("value")))
        if state != "COMPLETE" or value is None:
            continue  # pruned, failed and unfinished trials have no comparable value
        out.append({
            "trial": _int(row.get("trial")), "phase": _int(row.get("phase")) or 1,
            "seed": _int(row.get("seed")), "rank": _int(row.get("rank")), "value": value,
            "arch": {k: _int(row.get(k)) for k in (*ARCH_KEYS, "param_count")},
            "choices": _choices(row.get("choices")), "best_epoch": _int(row.get("best_epoch")),
        })
    return out


def _key(r: Mapping[str, Any]) -> str:
    return json.dumps([r["arch"].get(k) for k in ARCH_KEYS] + [r["choices"]], sort_keys=True)


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile for n paired values (df = n - 1)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def seed_stats(values: Mapping[int, float]) -> dict[str, Any]:
    """mean, std (sample, n-1), n and the per-seed values of one configuration."""
    vals = [values[s] for s in sorted(values)]
    return {
        "n": len(vals),
        "mean": statistics.fmean(vals) if vals else None,
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
        "values": {str(s): values[s] for s in sorted(values)},
    }


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> dict[str, Any]:
    """b - a over the seeds both have: mean, std, standard error and the t interval."""
    seeds = sorted(set(a) & set(b))
    diffs = [b[s] - a[s] for s in seeds]
    out: dict[str, Any] = {"n_pairs": len(diffs), "seeds": seeds, "differences": diffs,
                           "mean": statistics.fmean(diffs) if diffs else None, "std": None, "se": None,
                           "ci95": None}
    if len(diffs) > 1:
        sd = statistics.stdev(diffs)
        se = sd / math.sqrt(len(diffs))
        half = t_quantile(len(diffs), level) * se
        out.update(std=sd, se=se, ci95=[out["mean"] - half, out["mean"] + half])
    return out


def _fmt(x: float) -> str:
    return f"{x:.3f}" if abs(x) >= 5e-4 or x == 0 else f"{x:.1e}"


def lead_statement(lead: Mapping[str, Any], winner: str = "the winner", other: str = "the runner-up") -> str:
    """One plain sentence about a paired lead (runner-up minus winner, lower loss is better)."""
    n, mean, ci = lead["n_pairs"], lead["mean"], lead["ci95"]
    if n == 0 or mean is None:
        return f"No seed has finished for both {winner} and {other}; nothing to compare yet."
    if ci is None:
        return (f"{winner.capitalize()} leads {other} by {_fmt(mean)} on the one seed both finished; "
                "two or more seeds are needed to judge seed noise.")
    interval = f"paired 95% interval [{_fmt(ci[0])}, {_fmt(ci[1])}] over {n} seeds"
    if ci[0] <= 0 <= ci[1]:
        if mean >= 0:
            return f"{winner.capitalize()}'s lead of {_fmt(mean)} over {other} lies within seed noise ({interval})."
        return (f"{other.capitalize()} did better on these seeds by {_fmt(-mean)}, within seed noise "
                f"({interval}): the two cannot be told apart.")
    if mean > 0:
        return f"{winner.capitalize()}'s lead of {_fmt(mean)} over {other} is larger than seed noise ({interval})."
    return (f"{other.capitalize()} beat {winner} by {_fmt(-mean)} beyond seed noise ({interval}): the "
            "phase-1/2 ranking does not hold up.")


def confirmation_summary(
    trials_or_rows: Iterable[Any], archs: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """Summarise the confirmation phase (phase 3) of ONE study (one budget).

    trials_or_rows: Optuna FrozenTrials of the study (pass `archs` = StudySettings.archs to take
    the architecture from the study, else it is read from the trials' user attributes), or result
    rows as `experiment_results.csv` holds them (dicts with d_model, n_layers, n_heads, d_ff,
    param_count, choices, phase, seed, state, val_loss, trial; an optional rank).  Only COMPLETE
    trials count.  A confirmed architecture's rank is its "rank" attribute when the rows carry
    it, else its position by best phase-1/2 value (how plan upkeep ranked it).

    Returns {"n_architectures", "seeds", "architectures": [{"rank", "architecture", "choices",
    "selection_value", "selection_trial", "n", "mean", "std", "values": {seed: value}}, ...],
    "comparison": {"winner_rank": 0, "runner_up_rank": 1, "n_pairs", "seeds", "differences",
    "lead": mean(runner-up - winner), "std", "se", "ci95", "within_noise"} or None, "statement"}.
    """
    rows = _rows(trials_or_rows, archs)
    selection: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["phase"] in (1, 2):
            cur = selection.get(_key(r))
            if cur is None or (r["value"], r["trial"] or 0) < (cur["value"], cur["trial"] or 0):
                selection[_key(r)] = r
    confirm = [r for r in rows if r["phase"] == 3 and r["seed"] is not None]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in confirm:
        groups.setdefault(_key(r), []).append(r)
    ranked: list[tuple[int, str]] = []
    order = sorted(groups, key=lambda k: (selection[k]["value"], selection[k]["trial"] or 0)
                   if k in selection else (math.inf, 0))
    for pos, key in enumerate(order):
        explicit = {r["rank"] for r in groups[key] if r["rank"] is not None}
        ranked.append((min(explicit) if explicit else pos, key))
    ranked.sort()
    archs_out = []
    for rank, key in ranked:
        members = groups[key]
        values = {r["seed"]: r["value"] for r in sorted(members, key=lambda r: r["trial"] or 0)}
        sel = selection.get(key)
        archs_out.append({
            "rank": rank, "architecture": members[0]["arch"], "choices": members[0]["choices"],
            "selection_value": sel["value"] if sel else None, "selection_trial": sel["trial"] if sel else None,
            **seed_stats(values),
        })
    by_rank = {a["rank"]: a for a in archs_out}
    comparison = None
    if 0 in by_rank and 1 in by_rank:
        win = {int(s): v for s, v in by_rank[0]["values"].items()}
        run = {int(s): v for s, v in by_rank[1]["values"].items()}
        lead = paired_difference(win, run)
        ci = lead["ci95"]
        comparison = {
            "winner_rank": 0, "runner_up_rank": 1, "n_pairs": lead["n_pairs"], "seeds": lead["seeds"],
            "differences": lead["differences"], "lead": lead["mean"], "std": lead["std"], "se": lead["se"],
            "ci95": ci, "within_noise": (ci[0] <= 0 <= ci[1]) if ci else None,
        }
        statement = lead_statement(lead)
    elif archs_out:
        statement = "Only one architecture was confirmed; there is no runner-up to compare with."
    else:
        statement = "No confirmation trial has finished yet."
    return {
        "n_architectures": len(archs_out),
        "seeds": sorted({r["seed"] for r in confirm}),
        "architectures": archs_out,
        "comparison": comparison,
        "statement": statement,
    }


def paired_summary(
    trials_or_rows: Iterable[Any], archs: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """A paired study (--paired-seeds): per configuration (architecture and choices, in order of
    first appearance) the mean, std, n and per-seed values of its COMPLETE trials."""
    rows = _rows(trials_or_rows, archs)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["trial"] or 0):
        if r["seed"] is not None:
            groups.setdefault(_key(r), []).append(r)
    out = []
    for members in groups.values():
        values = {r["seed"]: r["value"] for r in members}
        epochs = [r["best_epoch"] for r in members if r["best_epoch"] is not None]
        out.append({"architecture": members[0]["arch"], "choices": members[0]["choices"],
                    "mean_best_epoch": statistics.fmean(epochs) if epochs else None, **seed_stats(values)})
    return out


__all__ = ["confirmation_summary", "lead_statement", "paired_difference", "paired_summary", "seed_stats"]
