"""What each budget's learning-rate probe (--lr-probe, search/_lrfit.py) found, for the report: the
best architecture's losses at its own rate and at each probe factor, and whether they locate its best
rate or why not.  Read from the trials frame alone, so a report from a CSV says it too.

The largest budget of a ladder has no probe, so its answer never shows what the probes saw below it:
a probe at x2 that beats every run at the rate the budget trained at says the study's learning-rate
range lies below the best rate, which this line makes visible where the answer cannot."""

from __future__ import annotations

import pandas as pd

from archhpo.search._lrfit import locate_rate


def probe_notes(frame: pd.DataFrame) -> dict[str, str]:
    """Per budget with COMPLETE --lr-probe trials: the probed architecture's mean loss at each factor
    of its rate (x1: its other runs, at the rate the probes multiply) and `locate_rate`'s verdict on
    them."""
    if "lr_probe" not in frame or not frame["lr_probe"].notna().any():
        return {}
    done = frame[(frame["state"] == "COMPLETE") & frame["val_loss"].notna()]
    out = {}
    for budget, group in done.groupby("budget", sort=False):
        probes = group[group["lr_probe"].notna()]
        if probes.empty:
            continue
        rate = float((probes["learning_rate"] / probes["lr_probe"]).iloc[0])  # the best's own rate
        runs = group[group["arch_idx"] == probes["arch_idx"].iloc[0]]
        factors = (runs["learning_rate"] / rate).round(6)
        means = runs.groupby(factors, sort=True)["val_loss"].mean()
        listed = ", ".join(f"x{f:g}: {v:.4f}" for f, v in means.items())
        found = locate_rate([(float(lr), float(v)) for lr, v in zip(runs["learning_rate"], runs["val_loss"], strict=True)])
        verdict = (f"best rate located at {found.rate:.3g}" if found.located
                   else f"not located ({found.why}); its best run's rate {found.rate:.3g}")
        row = runs.iloc[0]
        out[str(budget)] = (f"d_model {int(row['d_model'])}, {int(row['n_layers'])} layers, its rate {rate:.3g} "
                            f"{listed} (mean losses); {verdict}")
    return out


__all__ = ["probe_notes"]
