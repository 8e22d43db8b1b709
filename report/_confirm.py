"""Seed statistics: the confirmation phase's summary and the per-configuration summary of a paired
study, from trials or result rows (a database, or `experiment_results.csv` written by archhpo).

`confirmation_summary(trials_or_rows)` is what the best JSON's "confirmation" key holds and what
`archhpo report` shows: for each confirmed architecture (rank 0 = the phase-1/2 winner) the mean,
std, n and per-seed values of its confirmation trials, and a paired, seed-by-seed comparison of
the winner against the runner-up: mean lead, its std, a t-based 95% interval, and one sentence
saying whether the lead lies within seed noise.  Where that comparison has a pair, the winner is
chosen on the finalists' means (`chosen_on_means`: each finalist's confirmation runs on the shared
seeds plus its phase-1/2 trials trained with exactly the same parameters).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from archhpo.report._noise import (
    MIN_PAIRS,
    fmt,
    lead_statement,
    paired_difference,
    pooled_statement,
    seed_stats,
)
from archhpo.schema import ARCH_KEYS, TRAINING_PARAMS, training_param
from archhpo.search._noise import pooled_lead


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
    row.update({k: t.params.get(k) for k in TRAINING_PARAMS})
    row.update(
        trial=t.number, state=t.state.name, phase=ua.get("phase"), seed=ua.get("seed"), rank=ua.get("rank"),
        val_loss=t.value, choices=arch.get("choices", ua.get("choices", {})),
        best_epoch=ua.get("best_epoch"), fail_reason=ua.get("fail_reason"), baseline=ua.get("baseline"),
        lr_probe=ua.get("lr_probe"), rung_scores=ua.get("rung_scores") or [], confirm_rung=ua.get("confirm_rung"),
    )
    return row


def _training(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The training parameters a row was trained with, each as its schema type (a CSV's "50" and a
    trial's 50 compare equal), or None where any is missing (an old CSV: nothing to match on)."""
    out: dict[str, Any] = {}
    for name in TRAINING_PARAMS:
        x = _num(row.get(name))
        if x is None:
            return None
        out[name] = int(x) if training_param(name).type is int else x
    return out


def _all_rows(trials_or_rows: Iterable[Any], archs: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Every trial or row, whatever its state, with the keys the summaries read."""
    out = []
    for item in trials_or_rows:
        row = dict(item) if isinstance(item, Mapping) else _row_from_trial(item, archs)
        reason = row.get("fail_reason")
        out.append({
            "trial": _int(row.get("trial")), "phase": _int(row.get("phase")) or 1,
            "seed": _int(row.get("seed")), "rank": _int(row.get("rank")),
            "state": str(row.get("state") or "COMPLETE").upper(),
            "value": _num(row.get("val_loss", row.get("value"))),
            "arch": {k: _int(row.get(k)) for k in (*ARCH_KEYS, "param_count")},
            "choices": _choices(row.get("choices")), "best_epoch": _int(row.get("best_epoch")),
            "reason": reason if isinstance(reason, str) and reason else None,
            "baseline": rule if isinstance(rule := row.get("baseline"), str) and rule else None,
            "lr_probe": _num(row.get("lr_probe")), "params": _training(row),
            "rung_scores": _scores(row.get("rung_scores")), "confirm_rung": _int(row.get("confirm_rung")),
        })
    return out


def _scores(v: Any) -> list[float]:
    """A row's rung scores: a list, or the CSV's JSON text of one."""
    if isinstance(v, str) and v.strip():
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            return []
    return [float(x) for x in v] if isinstance(v, list | tuple) else []


def _confirm_rung(rows: Iterable[Mapping[str, Any]]) -> int | None:
    """The rung the study's finalists were confirmed at (--confirm-at-rung), else None."""
    return next((r["confirm_rung"] for r in rows if r["phase"] == 3 and r["confirm_rung"] is not None), None)


def _rung_statement(rung: int | None) -> str:
    """The confirmation's first sentence under --confirm-at-rung (else nothing)."""
    if rung is None:
        return ""
    return (f"The finalists were confirmed at rung {rung}, the lowest rung this budget trusts (--confirm-at-rung): "
            "every value compared here is a score at that rung (under WSD a cooldown branch's loss), not a "
            "full-length loss. ")


def _at_rung(rows: Iterable[dict[str, Any]], rung: int) -> list[dict[str, Any]]:
    """The runs a confirmation at `rung` compares, each valued at that rung: its confirmation runs
    (they ended there) and the COMPLETE search runs' scores recorded there (search/_confirmation.py
    `run_value` counts the same)."""
    out = []
    for r in rows:
        if r["phase"] == 3 and r["confirm_rung"] == rung and r["value"] is not None:
            out.append({**r, "state": "COMPLETE"})
        elif r["phase"] != 3 and r["state"] == "COMPLETE" and len(r["rung_scores"]) > rung:
            out.append({**r, "value": r["rung_scores"][rung]})
    return out


def _rows(trials_or_rows: Iterable[Any], archs: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    # Pruned, failed and unfinished trials have no comparable value.
    return [r for r in _all_rows(trials_or_rows, archs) if r["state"] == "COMPLETE" and r["value"] is not None]


def _key(r: Mapping[str, Any]) -> str:
    return json.dumps([r["arch"].get(k) for k in ARCH_KEYS] + [r["choices"]], sort_keys=True)


def _selection(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per configuration, its best phase-1/2 trial (what plan upkeep ranked it by)."""
    selection: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["phase"] in (1, 2):
            cur = selection.get(_key(r))
            if cur is None or (r["value"], r["trial"] or 0) < (cur["value"], cur["trial"] or 0):
                selection[_key(r)] = r
    return selection


def _ranked(confirm: list[dict[str, Any]], selection: Mapping[str, dict[str, Any]]
            ) -> list[tuple[int, list[dict[str, Any]]]]:
    """The confirmed configurations with their rank: the trials' "rank" where they carry it,
    else the position by selection value."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in confirm:
        groups.setdefault(_key(r), []).append(r)
    order = sorted(groups, key=lambda k: (selection[k]["value"], selection[k]["trial"] or 0)
                   if k in selection else (math.inf, 0))
    ranked = []
    for pos, key in enumerate(order):
        explicit = {r["rank"] for r in groups[key] if r["rank"] is not None}
        ranked.append((min(explicit) if explicit else pos, groups[key]))
    return sorted(ranked, key=lambda item: item[0])


def _architecture(rank: int, members: list[dict[str, Any]], sel: Mapping[str, Any] | None) -> dict[str, Any]:
    values = {r["seed"]: r["value"] for r in sorted(members, key=lambda r: r["trial"] or 0)}
    # Every confirmation run of a rank is enqueued with the same parameters; rows that disagree (or
    # lack them) leave none, so no search trial is matched against a guess.
    trained = {json.dumps(r["params"], sort_keys=True) for r in members}
    return {
        "rank": rank, "architecture": members[0]["arch"], "choices": members[0]["choices"],
        "selection_value": sel["value"] if sel else None, "selection_trial": sel["trial"] if sel else None,
        "params": members[0]["params"] if len(trained) == 1 else None, **seed_stats(values),
    }


def _search_runs(done: list[dict[str, Any]], archs_out: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Per confirmed rank, the COMPLETE phase-1/2 trials of its configuration (architecture and
    choices) as {"trial", "value", "params"}, by trial number: what `chosen_on_means` may add."""
    out: dict[int, list[dict[str, Any]]] = {}
    for a in archs_out:
        key = _key({"arch": a["architecture"], "choices": a["choices"]})
        out[a["rank"]] = [{"trial": r["trial"], "value": r["value"], "params": r["params"]}
                          for r in sorted(done, key=lambda r: r["trial"] or 0)
                          if r["phase"] in (1, 2) and _key(r) == key]
    return out


def _unfinished(rows: list[dict[str, Any]], archs_out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The confirmation slots (rank, seed) without a finished trial, each with its last attempt:
    trial, state and the worker's reason (FAIL for good, or still WAITING/RUNNING)."""
    rank_of = {_key({"arch": a["architecture"], "choices": a["choices"]}): a["rank"] for a in archs_out}
    done = {(a["rank"], int(s)) for a in archs_out for s in a["values"]}
    last: dict[tuple[int | None, int], dict[str, Any]] = {}
    for r in sorted((r for r in rows if r["phase"] == 3 and r["seed"] is not None), key=lambda r: r["trial"] or 0):
        rank = r["rank"] if r["rank"] is not None else rank_of.get(_key(r))
        last[(rank, r["seed"])] = r
    return [{"rank": rank, "seed": seed, "trial": r["trial"], "state": r["state"], "reason": r["reason"]}
            for (rank, seed), r in sorted(last.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1]))
            if (rank, seed) not in done]


def _comparison(by_rank: Mapping[int, dict[str, Any]], seeds: list[int], names: Sequence[str] = ()
                ) -> tuple[dict[str, Any] | None, str]:
    """Rank 0 against rank 1, seed by seed over their complete pairs, and the sentence saying it
    (`names`: what the sentence calls them, "the winner" and "the runner-up" unless given)."""
    if not (0 in by_rank and 1 in by_rank):
        if by_rank:
            return None, "Only one architecture was confirmed; there is no runner-up to compare with."
        return None, "No confirmation trial has finished yet."
    win = {int(s): v for s, v in by_rank[0]["values"].items()}
    run = {int(s): v for s, v in by_rank[1]["values"].items()}
    lead = paired_difference(win, run)
    ci = lead["ci95"]
    unpaired = [s for s in seeds if s not in lead["seeds"]]
    comparison = {
        "winner_rank": 0, "runner_up_rank": 1, "n_pairs": lead["n_pairs"], "seeds": lead["seeds"],
        "unpaired_seeds": unpaired, "differences": lead["differences"], "lead": lead["mean"], "std": lead["std"],
        "se": lead["se"], "ci95": ci, "within_noise": (ci[0] <= 0 <= ci[1]) if ci else None,
    }
    statement = lead_statement(lead, *names)
    if unpaired:
        statement += (f" Seed(s) {', '.join(map(str, unpaired))} lack a finished trial of rank 0 or 1 and are left "
                      f"out: the comparison uses {lead['n_pairs']} complete pair(s) of {len(seeds)} seeds.")
    return comparison, statement


def _unfinished_text(missing: list[dict[str, Any]]) -> str:
    if not missing:
        return ""
    named = "; ".join(
        f"rank {m['rank']} seed {m['seed']} (trial {m['trial']}, {m['state']}"
        + (f": {m['reason']})" if m["reason"] else ")") for m in missing)
    return f" Confirmation trials without a result: {named}."


def baseline_statement(rule: str, lead: Mapping[str, Any], same_shape: bool) -> str:
    """One sentence on a rule's shape against the searched best (lead = rule minus best, lower is better)."""
    shape = f"the {rule} rule's shape"
    if same_shape:
        return f"The {rule} rule picks the searched best's architecture itself: nothing to beat."
    n, mean, ci = lead["n_pairs"], lead["mean"], lead["ci95"]
    if n == 0 or mean is None:
        return f"No seed has finished for both the searched best and {shape}; nothing to compare yet."
    if ci is None:
        return (f"The searched best leads {shape} by {fmt(mean)} on {n} seed(s); {MIN_PAIRS} or more complete "
                "pairs are needed to judge seed noise.")
    interval = f"paired 95% interval [{fmt(ci[0])}, {fmt(ci[1])}] over {n} seeds"
    if ci[0] <= 0 <= ci[1]:
        return (f"{shape.capitalize()} is within seed noise of the searched best (difference {fmt(mean)}, "
                f"{interval}): the rule is good enough at this budget.")
    if mean > 0:
        return f"The search beats {shape} by {fmt(mean)} ({interval})."
    return f"{shape.capitalize()} beat the searched best by {fmt(-mean)} ({interval}): the search missed it."


def baseline_summary(rows: list[dict[str, Any]], best: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Per --baselines rule: its shape's seed statistics and its paired difference from the
    confirmed best (rank 0), seed by seed: {"rule", "architecture", "choices", "n", "mean", "std",
    "values", "same_as_best", "difference": paired_difference (rule minus best), "statement"}."""
    from archhpo.search._baselines import BASELINE_RULES

    out = []
    for rule in [r for r in BASELINE_RULES if any(x["baseline"] == r for x in rows)]:
        members = sorted((x for x in rows if x["baseline"] == rule and x["state"] == "COMPLETE"
                          and x["value"] is not None and x["seed"] is not None), key=lambda x: x["trial"] or 0)
        values = {x["seed"]: x["value"] for x in members}
        planned = next(x for x in rows if x["baseline"] == rule)
        best_values = {int(k): v for k, v in best["values"].items()} if best else {}
        same = best is not None and _key(planned) == _key({"arch": best["architecture"], "choices": best["choices"]})
        lead = paired_difference(best_values, values)
        out.append({"rule": rule, "rule_text": BASELINE_RULES[rule], "architecture": planned["arch"],
                    "choices": planned["choices"], **seed_stats(values), "same_as_best": same,
                    "difference": lead, "statement": baseline_statement(rule, lead, same)})
    return out


CHOSEN_ON_MEAN = "confirmation mean"  # the name kept: the means are a confirmation's, search trials included
CHOSEN_ON_TRIAL = "best trial"


def _runs_text(chosen: Mapping[str, Any]) -> str:
    """Which runs each finalist's mean is over: "rank 0: 3 runs (search trial(s) 4)"."""
    parts = []
    for rank in chosen["order"]:
        trials = chosen["search_trials"][str(rank)]
        extra = f"search trial(s) {', '.join(map(str, trials))}" if trials else "no search trial with those parameters"
        parts.append(f"rank {rank}: {chosen['n'][str(rank)]} runs ({extra})")
    return "; ".join(parts)


def _choice_statement(chosen: Mapping[str, Any], by_rank: Mapping[int, Mapping[str, Any]]) -> str:
    """One sentence on the winner chosen on the finalists' means (lower loss is better)."""
    means, seeds = chosen["means"], ", ".join(map(str, chosen["seeds"]))
    rank, runner = chosen["order"][0], chosen["order"][1]
    on = (f"each finalist's mean over confirmation seed(s) {seeds} and its phase-1/2 trials trained with the "
          f"same parameters ({_runs_text(chosen)})")
    if not chosen["reversed"]:
        return (f"The winner is chosen on {on}: the phase-1/2 best (rank 0) keeps its place, "
                f"{fmt(means[str(rank)])} against rank {runner}'s {fmt(means[str(runner)])}.")
    trial = by_rank[rank]["selection_trial"]
    return (f"The winner is chosen on {on}: rank {rank} (best phase-1/2 trial {trial}) has the lower mean, "
            f"{fmt(means[str(rank)])} against rank 0's {fmt(means['0'])}, reversing the phase-1/2 order.")


def _same_training(arch: Mapping[str, Any], runs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A finalist's search runs trained exactly as its confirmation was (every training parameter
    equal; none where its confirmation's are unknown), by trial number."""
    params = arch.get("params")
    if params is None:
        return []
    return sorted((r for r in runs if r.get("params") == params),
                  key=lambda r: (r.get("trial") is None, r.get("trial") or 0))


def chosen_on_means(architectures: Sequence[Mapping[str, Any]],
                    search: Mapping[int, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, Any] | None:
    """The winner chosen on the finalists' means.  `architectures`: `confirmation_summary`'s (each
    "rank", "values" {seed: value}, "selection_trial" and "params"); `search`: per rank, its
    configuration's COMPLETE phase-1/2 runs ({"trial", "value", "params"}).

    Each finalist's plain mean over its confirmation runs on the seeds every finalist finished (so one
    finalist's unshared bad draw cannot decide) and its search runs trained with exactly its
    confirmation's parameters: such a run is one more seed of the same configuration, and its optimism
    (it is the best of the search) holds for every finalist alike.  The lowest mean wins, a tie goes to
    the better rank.  The paired comparison stays on the confirmation seeds alone: it is the noise
    statement, this is only the choice.  None until rank 0 and another share a finished seed.

    Returns {"chosen_on": CHOSEN_ON_MEAN, "rank", "order", "seeds" (shared), "search_trials", "n",
    "means", "reversed" (another than rank 0 won), "trials" ({rank: its best phase-1/2 trial}),
    "pooled" (`pooled_lead` of the chosen over the next; None without a degree of freedom), "statement"}."""
    by_rank = {a["rank"]: a for a in architectures if a["values"]}
    shared = set.intersection(*(set(a["values"]) for a in by_rank.values())) if by_rank else set()
    if 0 not in by_rank or len(by_rank) < 2 or not shared:
        return None
    seeds = sorted(shared, key=int)
    counted = {rank: _same_training(a, (search or {}).get(rank, ())) for rank, a in by_rank.items()}
    runs = {rank: [a["values"][s] for s in seeds] + [r["value"] for r in counted[rank]] for rank, a in by_rank.items()}
    means = {rank: statistics.fmean(values) for rank, values in runs.items()}
    order = sorted(means, key=lambda rank: (means[rank], rank))
    ranks = sorted(means)
    chosen = {"chosen_on": CHOSEN_ON_MEAN, "rank": order[0], "order": order, "seeds": [int(s) for s in seeds],
              "search_trials": {str(r): [c["trial"] for c in counted[r]] for r in ranks},
              "n": {str(r): len(runs[r]) for r in ranks}, "means": {str(r): means[r] for r in ranks},
              "reversed": order[0] != 0, "trials": {str(r): by_rank[r]["selection_trial"] for r in ranks},
              "pooled": pooled_lead(runs, order[0], order[1])}
    noise = " " + pooled_statement(chosen["pooled"], order[0], order[1]) if chosen["pooled"] else ""
    return {**chosen, "statement": _choice_statement(chosen, by_rank) + noise}


def decision_statement(rank: Mapping[str, Any]) -> str:
    """One sentence on a sequential confirmation's decision about a later rank (search/_confirmation.py):
    confirmed within the first wave's pooled seed noise, or not retrained beyond it."""
    d, r = rank["decision"], rank["rank"]
    if d["lead"] is None:
        return f"Rank {r} was confirmed: no seed noise was measured on ranks 0-1 to judge it by."
    ci = d["ci95"]
    noise = (f"the first wave's pooled seed std {fmt(d['pooled_std'])}, {d['df']} degrees of freedom; 95% interval "
             f"[{fmt(ci[0])}, {fmt(ci[1])}]")
    behind = f"its search runs' mean {fmt(d['candidate_mean'])} trails rank {d['leader']}'s mean {fmt(d['leader_mean'])}"
    if d["confirm"]:
        return f"Rank {r} was confirmed: {behind} by {fmt(d['lead'])}, within {noise}."
    return (f"Rank {r} was not retrained: {behind} by {fmt(d['lead'])}, beyond {noise}; one more run could not "
            "make it the leader's equal.")


def confirmation_summary(
    trials_or_rows: Iterable[Any], archs: Sequence[Mapping[str, Any]] | None = None,
    ranks: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Summarise the confirmation phase (phase 3) of ONE study (one budget).

    trials_or_rows: the study's Optuna FrozenTrials (`archs` = StudySettings.archs takes the
    architecture from the study, else from the trials' user attributes), or `experiment_results.csv`
    rows.  Only COMPLETE trials give values (under --confirm-at-rung each run's score at its rung); the
    others are "unfinished".  A rank is the rows' "rank", else the position by best phase-1/2 value;
    `ranks`: the study's stored assignment (phase3).

    Returns {"n_architectures", "seeds", "architectures" (per rank: "architecture", "choices",
    "selection_value", "selection_trial", "params", "n", "mean", "std", "values"), "comparison" (rank
    0 against rank 1 on shared seeds: "lead", "std", "se", "ci95" (None below MIN_PAIRS pairs),
    "within_noise", ...; or None), "unfinished", "statement", "baselines" (`baseline_summary`),
    "chosen" (`chosen_on_means`), "decisions" (a sequential confirmation's later ranks)}."""
    everything = _all_rows(trials_or_rows, archs)
    # the rules' shapes are summarised apart; a learning-rate probe confirms no architecture (its rate is another)
    rows = [r for r in everything if r["baseline"] is None and r["lr_probe"] is None]
    done = [r for r in rows if r["state"] == "COMPLETE" and r["value"] is not None]
    selection = _selection(done)  # the finalists' ranks: by full-length values, whatever they are confirmed on
    if (rung := _confirm_rung(rows)) is not None:  # --confirm-at-rung: every run compared at that rung
        done, everything = _at_rung(rows, rung), _at_rung(everything, rung)
    confirm = [r for r in done if r["phase"] == 3 and r["seed"] is not None]
    archs_out = [_architecture(rank, members, selection.get(_key(members[0])))
                 for rank, members in _ranked(confirm, selection)]
    seeds = sorted({r["seed"] for r in rows if r["phase"] == 3 and r["seed"] is not None})
    by_rank = {a["rank"]: a for a in archs_out}
    chosen = chosen_on_means(archs_out, _search_runs(done, archs_out))
    # where the means reversed the order, rank 0 is no longer "the winner": the sentence names the ranks
    comparison, statement = _comparison(by_rank, seeds, ("the phase-1/2 best", "rank 1") if chosen and chosen["reversed"] else ())
    unfinished, decisions = _unfinished(rows, archs_out), [dict(r) for r in ranks or () if r.get("decision")]
    winner = by_rank[chosen["rank"]] if chosen else by_rank.get(0)  # the baselines face the budget's answer
    return {
        "n_architectures": len(archs_out), "seeds": seeds, "architectures": archs_out,
        "comparison": comparison, "unfinished": unfinished, "at_rung": rung,
        "statement": _rung_statement(rung) + statement + (" " + chosen["statement"] if chosen else "")
        + "".join(" " + decision_statement(r) for r in decisions) + _unfinished_text(unfinished),
        "decisions": decisions, "baselines": baseline_summary(everything, winner), "chosen": chosen,
    }


def frame_confirmation(frame: Any) -> dict[str, dict[str, Any]]:
    """Per budget with phase-3 trials of a `trials_frame` frame: its `confirmation_summary`."""
    out: dict[str, dict[str, Any]] = {}
    if not (frame["phase"] == 3).any():
        return out
    cols = [*ARCH_KEYS, "param_count", "trial", "state", "phase", "seed", "val_loss", "choices", "best_epoch",
            "fail_reason", "baseline", "lr_probe", *(k for k in TRAINING_PARAMS if k in frame),
            *(k for k in ("rung_scores", "confirm_rung") if k in frame)]
    for budget, group in frame.groupby("budget", sort=False):
        if not (group["phase"] == 3).any():
            continue
        rows = group[cols].assign(rank=group["confirm_rank"]).to_dict("records")
        out[str(budget)] = confirmation_summary(rows, ranks=(frame.attrs.get("confirm_ranks") or {}).get(str(budget)))
    return out


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


__all__ = ["CHOSEN_ON_MEAN", "CHOSEN_ON_TRIAL", "MIN_PAIRS", "baseline_statement", "baseline_summary", "chosen_on_means",
           "confirmation_summary", "decision_statement", "frame_confirmation", "lead_statement", "paired_difference", "paired_summary",
           "pooled_lead", "pooled_statement", "seed_stats"]
