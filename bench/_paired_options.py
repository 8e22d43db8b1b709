"""`--ladder`'s options replayed on the same draws as its default (`search_efficiency.py
--compare-options`): every other setting of --trust-each-budget, --confirm-at-rung and
--carry-finalists; each one's FLOPs ratio, share within 1 std at every budget and regret (its
paired regret against the design: what the rule in force in docs/searching.md reads), their
differences from the default on the same repeats (paired, so the replay's sampling noise mostly
cancels), with bootstrap intervals over the repeats, and the older rule's reading.

The older rule (docs/searching.md, "Choosing the defaults"), written before T2's 800K was seen: an option
becomes `--ladder`'s default when, on every complete truth in the regime of real studies (T1, T2,
T3), it loses no share (the paired difference's interval is not wholly below 0) and costs no FLOPs
(not wholly above 0), and on at least one of them it saves FLOPs (wholly below 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from archhpo.schema import LADDER_CARRY_FINALISTS, LADDER_CONFIRM_AT_RUNG

# (--trust-each-budget, --confirm-at-rung, --carry-finalists) as `archhpo run --ladder` runs without any of them
DEFAULT = (False, LADDER_CONFIRM_AT_RUNG, LADDER_CARRY_FINALISTS)
Setting = tuple[bool, bool, bool]


def flags(each_budget: bool, at_rung: bool, carry_finalists: bool = DEFAULT[2]) -> str:
    """The flags that make `archhpo run --ladder` run with these settings ("" for the default's)."""
    out = ["--trust-each-budget"] if each_budget != DEFAULT[0] else []
    if at_rung != DEFAULT[1]:
        out.append("--confirm-at-rung" if at_rung else "--no-confirm-at-rung")
    if carry_finalists != DEFAULT[2]:
        out.append("--carry-finalists" if carry_finalists else "--no-carry-finalists")
    return " ".join(out)


def _name(setting: Setting) -> str:
    return flags(*setting).replace("--", "").replace("-", "_").replace(" ", "+")


def _others() -> list[Setting]:
    """Every setting but the default: one option changed, then two, then all three (in flag order)."""
    flips = [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]
    return [tuple(not v if k in f else v for k, v in enumerate(DEFAULT)) for f in flips]  # type: ignore[misc]


# name -> (--trust-each-budget, --confirm-at-rung, --carry-finalists): every other setting of --ladder's three
# options, each named by the flags that give it ("trust_each_budget", "no_confirm_at_rung", "carry_finalists",
# combinations joined by "+")
OPTIONS: dict[str, Setting] = {_name(s): s for s in _others()}
FLAGS = {name: flags(*setting) for name, setting in OPTIONS.items()}


@dataclass
class Runs:
    """One strategy over the repeats: per repeat its FLOPs (every budget summed) and its regret per budget
    (in seed stds); per budget its FLOPs summed over the repeats."""

    spent: list[float] = field(default_factory=list)
    regrets: list[list[float]] = field(default_factory=list)
    per_budget: list[float] = field(default_factory=list)

    def add(self, step: int, flops: float, regret: float) -> None:
        """One budget of the current repeat (start a repeat with `new_repeat`)."""
        if step >= len(self.per_budget):
            self.per_budget.append(0.0)
        self.per_budget[step] += flops
        self.spent[-1] += flops
        self.regrets[-1].append(regret)

    def new_repeat(self) -> None:
        self.spent.append(0.0)
        self.regrets.append([])


def within(regrets: Sequence[Sequence[float]]) -> list[float]:
    """Per repeat, 1.0 where the choice was within 1 seed std of the best at every budget."""
    return [float(all(r <= 1 for r in rep)) for rep in regrets]


def mean_regrets(regrets: Sequence[Sequence[float]]) -> list[float]:
    """Per repeat, the mean over budgets of its regret (in seed stds): what the paired regret compares."""
    return [sum(rep) / len(rep) for rep in regrets]


def regret_measures(regrets: Sequence[Sequence[float]], design: Sequence[Sequence[float]], picks: Any,
                    q: tuple[float, float]) -> dict[str, Any]:
    """A strategy's regret in seed stds: the mean over budgets (and repeats), at the largest budget, per
    budget, and paired against the design's on the same repeats ({"estimate": mean over repeats of
    its mean-over-budgets regret minus the design's, "ci90": the bootstrap interval of that mean over
    the resamples `picks`, percentiles `q`})."""
    import numpy as np

    n_budgets = len(regrets[0])
    per_budget = [sum(rep[i] for rep in regrets) / len(regrets) for i in range(n_budgets)]
    diff = np.asarray(mean_regrets(regrets)) - np.asarray(mean_regrets(design))
    return {"regret_std": sum(per_budget) / n_budgets, "regret_std_top": per_budget[-1],
            "regret_std_per_budget": per_budget,
            "paired_regret_vs_design": {"estimate": float(diff.mean()),
                                        "ci90": [float(v) for v in np.percentile(diff[picks].mean(axis=1), q)]}}


def _judge(lo: float, hi: float, lower: str, higher: str) -> str:
    return lower if hi < 0 else higher if lo > 0 else "tied"


def compare(default: Runs, design: Runs, options: dict[str, Runs], seed: int, n_boot: int,
            level: float) -> dict[str, Any]:
    """Per option its measures and its paired differences from the default, each with the `level`
    bootstrap interval over repeats (the same resamples for every option, as search_efficiency's
    `repeat_intervals` draws them), and how each difference is judged: "lower"/"higher" when the whole
    interval lies on one side of 0, else "tied" (a tie within the replay's noise)."""
    import numpy as np

    n = len(default.spent)
    picks = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    q = (50 * (1 - level), 50 * (1 + level))
    total = np.asarray(design.spent)[picks].sum(axis=1)
    base_ratio = np.asarray(default.spent)[picks].sum(axis=1) / total
    base_share = np.asarray(within(default.regrets))[picks].mean(axis=1)
    # ratios of the per-budget sums, as search_efficiency's `_measures` adds them (the same floats)
    base = {"flops_ratio": sum(default.per_budget) / sum(design.per_budget),
            "share_within_1std": sum(within(default.regrets)) / n}
    out: dict[str, Any] = {}
    for name, runs in options.items():
        ratio = np.asarray(runs.spent)[picks].sum(axis=1) / total
        share = np.asarray(within(runs.regrets))[picks].mean(axis=1)
        interval = {key: [float(v) for v in np.percentile(values, q)] for key, values in (
            ("flops_ratio", ratio), ("share_within_1std", share),
            ("flops_minus_default", ratio - base_ratio), ("share_minus_default", share - base_share))}
        measures = {"flops_ratio": sum(runs.per_budget) / sum(design.per_budget),
                    "share_within_1std": sum(within(runs.regrets)) / n}
        out[name] = {
            "flags": FLAGS[name], **measures, **regret_measures(runs.regrets, design.regrets, picks, q),
            "flops_ratio_per_budget": [f / d for f, d in zip(runs.per_budget, design.per_budget, strict=True)],
            "within_1std_per_budget": [sum(rep[i] <= 1 for rep in runs.regrets) / n
                                       for i in range(len(runs.per_budget))],
            "flops_minus_default": measures["flops_ratio"] - base["flops_ratio"],
            "share_minus_default": measures["share_within_1std"] - base["share_within_1std"],
            "interval": interval,
            "flops": _judge(*interval["flops_minus_default"], "lower", "higher"),
            "share": _judge(*interval["share_minus_default"], "lower", "higher"),
        }
    return out


def markdown(options: dict[str, Any], default: dict[str, Any], budgets: Sequence[str]) -> str:
    """The options against the default on the same draws, a table, and the old rule's reading on this
    truth (docs/searching.md, "Choosing the defaults"); then every setting's paired regret against the
    design, what the rule in force reads."""
    lines = [f"`--ladder`'s options on the default's draws (paired; 90% intervals over the repeats; the default: "
             f"{default['flops_ratio']:.3f} of the design's FLOPs, {default['share_within_1std']:.0%} within 1 std):",
             f"| option | FLOPs / design | minus the default | within 1 std at every budget | minus the default "
             f"| within 1 std, per budget: {', '.join(budgets)} | on this truth |",
             "|---|---:|---|---:|---|---|---|"]
    for m in options.values():
        iv = m["interval"]
        lines.append(
            f"| {m['flags']} | {m['flops_ratio']:.3f} | {m['flops_minus_default']:+.3f} "
            f"[{iv['flops_minus_default'][0]:+.3f}, {iv['flops_minus_default'][1]:+.3f}] | "
            f"{m['share_within_1std']:.0%} | {m['share_minus_default']:+.2f} "
            f"[{iv['share_minus_default'][0]:+.2f}, {iv['share_minus_default'][1]:+.2f}] | "
            + " / ".join(f"{x:.0%}" for x in m["within_1std_per_budget"]) + f" | {reading(m)} |")
    return "\n".join([*lines, "", regret_table({"(the default)": default, **options})])


def regret_table(settings: dict[str, Any]) -> str:
    """Every setting's paired mean regret against the design (seed stds, 90% interval), its regret at
    the largest budget and its FLOPs: a markdown table."""
    lines = ["| setting | paired regret vs design (std) [90%] | mean regret (std) | at the largest budget "
             "| FLOPs / design |", "|---|---|---:|---:|---:|"]
    for name, m in settings.items():
        p = m["paired_regret_vs_design"]
        lines.append(f"| {m.get('flags') or name} | {p['estimate']:+.2f} [{p['ci90'][0]:+.2f}, {p['ci90'][1]:+.2f}] "
                     f"| {m['regret_std']:.2f} | {m['regret_std_top']:.2f} | {m['flops_ratio']:.3f} |")
    return "\n".join(lines)


def reading(m: dict[str, Any]) -> str:
    """What the default-choosing rule reads off one option on one truth."""
    if m["share"] == "lower":
        return "loses share: not a default"
    if m["flops"] == "higher":
        return "costs FLOPs: not a default"
    if m["flops"] == "lower":
        return "saves FLOPs, share " + ("higher" if m["share"] == "higher" else "tied")
    return "no resolved difference"
