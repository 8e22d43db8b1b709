"""The report's figures, drawn with matplotlib (Agg, no display) from a `trials_frame` frame.

Each ``plot_*`` function takes the frame (and, for the loss-parameter figure, the fit) and returns
a ``matplotlib.figure.Figure``, so a notebook can restyle or save it.  Scatter plots keep at
most `max_points` points (a deterministic sample that always keeps each budget's best trial)
and are rasterised in PDF output, so a 20,000-trial experiment stays quick and small.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display, ever (before anything imports pyplot)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from archhpo.report._canvas import _figure, _grid, _legend, _styled  # noqa: E402
from archhpo.report._frame import TRAINING_COLUMNS, best_and_runner_up, budgets_in, ranked  # noqa: E402

MAX_POINTS = 3000


def budget_colors(frame: pd.DataFrame) -> dict[str, Any]:
    """One colour per budget, smallest budget darkest (viridis), stable across figures; the
    scale stops before viridis' pale yellow so the largest budget's points stay visible."""
    labels = budgets_in(frame)
    cmap = matplotlib.colormaps["viridis"]
    n = max(len(labels) - 1, 1)
    return {b: cmap(0.75 * i / n) for i, b in enumerate(labels)}


def _finished(frame: pd.DataFrame) -> pd.DataFrame:
    """Trials with a validation loss (COMPLETE and PRUNED), confirmation retrains included."""
    return frame[frame["state"].isin(["COMPLETE", "PRUNED"]) & frame["val_loss"].notna()]


def _sample(df: pd.DataFrame, max_points: int, keep: pd.Index | None = None) -> pd.DataFrame:
    if len(df) <= max_points:
        return df
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(len(df), size=max_points, replace=False))
    out = df.iloc[pick]
    if keep is not None:
        extra = df.loc[df.index.intersection(keep).difference(out.index)]
        out = pd.concat([out, extra])
    return out


def baseline_loss(frame: pd.DataFrame, budget: str | None = None) -> float | None:
    """The trivial baseline loss (a model that ignores its input: the training base rate, or
    the unigram entropy), as the families record it in ``baseline_val_loss``; None if absent."""
    values = frame["baseline_val_loss"] if budget is None else frame.loc[frame["budget"] == budget, "baseline_val_loss"]
    values = values.dropna()
    return float(values.median()) if len(values) else None


def _draw_baseline(ax: Any, frame: pd.DataFrame, budget: str | None = None) -> None:
    """The trivial baseline (dashed) and, where the data know it, the floor no model can pass
    (dotted: the synthetic language's loss floor, else its entropy rate)."""
    base = baseline_loss(frame, budget)
    if base is not None:
        ax.axhline(base, color="0.35", ls="--", lw=1.0, label=f"trivial baseline {base:.4g}")
    floor = known_floor(frame)
    if floor is not None:
        ax.axhline(floor[1], color="tab:purple", ls=":", lw=1.2, label=f"{floor[0]} {floor[1]:.4g}")


def known_floor(frame: pd.DataFrame) -> tuple[str, float] | None:
    """(label, value) of the data's known floor (``frame.attrs["truth"]``): the loss floor on the
    training windows where recorded, else the entropy rate; None when the data know neither."""
    truth = frame.attrs.get("truth") or {}
    for key, label in (("loss_floor", "loss floor"), ("entropy_rate", "entropy rate")):
        value = truth.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            return label, float(value)
    return None


def _loss_label(frame: pd.DataFrame) -> str:
    from archhpo.report._units import METRIC, short_unit

    return f"{METRIC} ({short_unit(frame)})"


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _best_index(frame: pd.DataFrame) -> pd.Index:
    return pd.Index([b.name for b, _ in best_and_runner_up(frame).values() if b is not None])


def _scatter_by_budget(ax: Any, frame: pd.DataFrame, x: str, max_points: int, logx: bool = True,
                       mark_best: bool = True) -> bool:
    df = _finished(frame)
    df = df[df[x].notna() & (df[x] > 0 if logx else True)]
    if df.empty:
        return False
    best = _best_index(frame)
    colors = budget_colors(frame)
    shown = _sample(df, max_points, best)
    size = 14 if len(shown) < 400 else 5
    for budget, group in shown.groupby("budget", sort=False):
        full = group[group["state"] != "PRUNED"]
        ax.scatter(full[x], full["val_loss"], s=size, alpha=0.8, color=colors[budget], edgecolor="0.15", lw=0.3,
                   label=f"{budget} ({((df['budget'] == budget) & (df['state'] != 'PRUNED')).sum()} full-length)",
                   rasterized=True)
    pruned = shown[shown["state"] == "PRUNED"]
    if len(pruned):  # hollow: a pruned trial's value is a rung score, not a full-length loss
        ax.scatter(pruned[x], pruned["val_loss"], s=size, marker="o", facecolor="none",
                   edgecolor=[colors[b] for b in pruned["budget"]], lw=0.8, rasterized=True,
                   label=f"pruned ({int((df['state'] == 'PRUNED').sum())}, hollow: rung score)")
    if mark_best:
        b = df.loc[df.index.intersection(best)]
        ax.scatter(b[x], b["val_loss"], marker="*", s=160, color=[colors[v] for v in b["budget"]],
                   edgecolor="black", lw=0.8, zorder=5, label="best per budget")
    _draw_baseline(ax, frame)
    if logx:
        ax.set_xscale("log")
    ax.set_ylabel(_loss_label(frame))
    if len(shown) < len(df):
        ax.set_title(f"{len(shown):,} of {len(df):,} trials shown (random sample)", fontsize=8, loc="right")
    return True


EXTRAPOLATE = 2.0  # the law's curve goes on past the largest budget this far, dotted and labelled


@_styled
def plot_loss_vs_params(frame: pd.DataFrame, fit: dict[str, Any] | None = None,
                        max_points: int = MAX_POINTS) -> Figure:
    """Validation loss against exact parameter count: every finished trial coloured by budget,
    the best per budget as a star, the trivial baseline, and the fitted law with its 95%
    bootstrap band when the fit's status is ``fitted``."""
    fig = _figure(8.2, right=2.0)
    ax = fig.add_subplot()
    if not _scatter_by_budget(ax, frame, "param_count", max_points):
        _empty(ax, "no finished trial")
        return fig
    ax.set_xlabel("parameters (exact count)")
    _draw_law(ax, frame, fit)
    _legend(ax)
    fig.suptitle("Validation loss against parameter count")
    return fig


def law_not_drawn(fit: dict[str, Any] | None) -> str | None:
    """Why loss_vs_params draws no law, in a few words (None when it draws one: the fit's status
    is ``fitted``); the figure's title and the page's caption both say it."""
    from archhpo.report._law import loss_falls

    status = str((fit or {}).get("status"))
    if status == "fitted":
        return None
    if status == "no_scaling" and loss_falls(fit or {}):
        return "the loss falls, but no law is resolved"
    return {"no_scaling": "no measurable scaling", "interpolation": "an interpolation, not a fit",
            "unresolved": "law not resolved", "too_few_budgets": "too few budgets for a law"}.get(status, "no law fitted")


def caption(name: str, fit: dict[str, Any] | None = None) -> str:
    """The page's caption of figure `name`: `FIGURES`' text, and for loss_vs_params what it
    draws of the law (the law and its band only when fitted; otherwise that it is not drawn, and why)."""
    text = FIGURES[name]
    if name != "loss_vs_params":
        return text
    what = law_not_drawn(fit)
    return f"{text}, with the fitted law and its 95% band" if what is None else f"{text}; the law is not drawn: {what}"


def _draw_law(ax: Any, frame: pd.DataFrame, fit: dict[str, Any] | None) -> None:
    """The law and its band only when the fit's status is ``fitted``; otherwise say why not."""
    from archhpo.report._fit import band, predict

    if not fit:
        return
    if (what := law_not_drawn(fit)) is not None:
        # The reason is long (it is in the page and the JSON); a short title keeps the points clear.
        ax.set_title(f"{what}: no law drawn (reason in the report)", fontsize=8, loc="left", color="0.25")
        return
    counts = _finished(frame)["param_count"]
    limits = ax.get_xlim(), ax.get_ylim()  # the data's: a band never sets the axes
    n = np.logspace(math.log10(counts.min()), math.log10(counts.max()), 200)  # the data's range only
    low, high = band(fit, n)
    if np.any(high > low):
        ax.fill_between(n, low, high, color="tab:red", alpha=0.15, lw=0, label="95% bootstrap band")
    e, a, alpha = (fit[k]["estimate"] for k in ("E", "A", "alpha"))
    which = f" ({fit['ratio']} budgets)" if fit.get("ratio") else ""  # one ratio's law, never a pooled one
    ax.plot(n, predict(fit, n), color="tab:red", lw=1.5, label=f"L = {e:.3g} + {a:.3g}·N^-{alpha:.3g}{which}")
    beyond = np.logspace(math.log10(counts.max()), math.log10(counts.max() * EXTRAPOLATE), 50)
    ax.plot(beyond, predict(fit, beyond), color="tab:red", lw=1.2, ls=":",
            label=f"extrapolation (to {EXTRAPOLATE:g}x the largest N)")
    ax.set_xlim(limits[0][0], max(limits[0][1], counts.max() * EXTRAPOLATE * 1.1))
    ax.set_ylim(*limits[1])


@_styled
def plot_arch_plane(frame: pd.DataFrame) -> Figure:
    """Per budget, the (d_model, n_layers) plane coloured by the best loss reached there, the
    grid's extreme architectures ringed and the best cell starred."""
    labels = budgets_in(frame)
    fig, axes = _grid(len(labels), 4.3, 3.3, wspace=0.7, hspace=0.55, right=0.6, top=0.9)
    df = _finished(frame)
    df = df[df["d_model"].notna() & df["n_layers"].notna()]
    for ax, budget in zip(axes, labels, strict=False):
        ax.set_title(budget)
        sub = df[df["budget"] == budget]
        if sub.empty:
            _empty(ax, "no finished trial")
            continue
        cells = sub.groupby(["d_model", "n_layers"], as_index=False)["val_loss"].min()
        sc = ax.scatter(cells["d_model"], cells["n_layers"], c=cells["val_loss"], cmap="viridis_r", s=60,
                        edgecolor="0.3", lw=0.3)
        fig.colorbar(sc, ax=ax, label="best loss", shrink=0.85)
        ext = sub[sub["extreme"].fillna("").astype(str) != ""]
        if ext.empty:  # a CSV has no grid tags: ring the smallest and largest d_model and n_layers
            picks = [sub.loc[sub[k].idxmin()] for k in ("d_model", "n_layers")]
            picks += [sub.loc[sub[k].idxmax()] for k in ("d_model", "n_layers")]
            ext = pd.DataFrame(picks)
        ax.scatter(ext["d_model"], ext["n_layers"], s=150, facecolor="none", edgecolor="tab:red", lw=1.2,
                   label="extremes")
        best = cells.loc[cells["val_loss"].idxmin()]
        ax.scatter([best["d_model"]], [best["n_layers"]], marker="*", s=170, color="white", edgecolor="black",
                   zorder=5, label="best")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        for axis, values in ((ax.xaxis, cells["d_model"]), (ax.yaxis, cells["n_layers"])):
            ticks = sorted(set(values.astype(int)))
            if len(ticks) > 8:
                ticks = ticks[:: math.ceil(len(ticks) / 8)]
            axis.set_ticks(ticks, [str(t) for t in ticks])
            axis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("d_model")
        ax.set_ylabel("n_layers")
    if not labels:
        axes[0].set_visible(True)
        _empty(axes[0], "no budget")
    fig.suptitle("Best loss over the (d_model, n_layers) plane\n(red rings: the grid's extremes; star: best)")
    return fig


@_styled
def plot_loss_vs_depth_width(frame: pd.DataFrame, max_points: int = MAX_POINTS) -> Figure:
    """Validation loss against the depth-to-width ratio n_layers / d_model, coloured by budget."""
    fig = _figure(8.2, right=2.0)
    ax = fig.add_subplot()
    if not _scatter_by_budget(ax, frame, "depth_to_width", max_points):
        _empty(ax, "no finished trial")
        return fig
    ax.set_xlabel("depth-to-width ratio n_layers / d_model")
    _legend(ax)
    fig.suptitle("Validation loss against depth-to-width ratio")
    return fig


@_styled
def plot_val_curves(frame: pd.DataFrame, top: int = 5) -> Figure:
    """The per-epoch validation curves of each budget's `top` best trials."""
    labels = budgets_in(frame)
    fig, axes = _grid(len(labels), 4.2, 4.3, wspace=0.3, hspace=0.75, bottom=1.5)
    best = ranked(frame)
    short = False
    for ax, budget in zip(axes, labels, strict=False):
        sub = best[best["budget"] == budget].head(top)
        drawn = 0
        for rank, (_, row) in enumerate(sub.iterrows()):
            curve = [(e, v) for e, v in row["val_curve"] if v is not None and math.isfinite(v)]
            if not curve:
                continue
            xs, ys = zip(*curve, strict=True)
            ax.plot(xs, ys, marker="o" if len(xs) < 15 else None, ms=3, lw=1.2,
                    label=f"#{rank + 1} trial {int(row['trial'])} ({row['val_loss']:.4g})")
            drawn += 1
        if drawn:
            _draw_baseline(ax, frame, budget)
            ax.set_xlabel("epoch")
            ax.set_ylabel(_loss_label(frame))
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # epochs are whole
            # below the panel: inside it, a legend always covers some curve
            ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        else:
            _empty(ax, "no per-epoch curves recorded")
        short = short or drawn < top
        # "5 best" draws five or says how many it drew
        why = f"only {len(sub)} complete" if len(sub) < top else f"{len(sub) - drawn} without a curve"
        ax.set_title(budget if drawn == top else f"{budget}: {drawn} of {top} ({why})")
    if not labels:
        axes[0].set_visible(True)
        _empty(axes[0], "no budget")
    more = " (fewer where fewer finished: see each title)" if short else ""
    fig.suptitle(f"Validation curves of each budget's {top} best complete trials{more}")
    return fig


@_styled
def plot_phase1_params(frame: pd.DataFrame, max_points: int = MAX_POINTS) -> Figure:
    """Phase-1 training parameters (learning rate, epochs, batch size, weight decay, warm-up)
    against validation loss, coloured by budget (all trials when phases are unknown)."""
    df = _phase1(frame)
    varied = [c for c in TRAINING_COLUMNS if df[c].nunique() > 1] or list(TRAINING_COLUMNS)
    fig = _figure(2.3 * len(varied) + 0.8, 3.3, wspace=0.12, bottom=0.75, right=0.9)
    axes = list(np.atleast_1d(fig.subplots(1, len(varied), sharey=True)))
    colors = budget_colors(frame)
    shown = _sample(df, max_points)
    for ax, col in zip(axes, varied, strict=True):
        ax.set_xlabel(col)
        sub = shown[shown[col].notna()]
        if sub.empty:
            _empty(ax, "not recorded")
            continue
        for budget, group in sub.groupby("budget", sort=False):
            ax.scatter(group[col], group["val_loss"], s=10, alpha=0.85, color=colors[budget], edgecolor="0.15", lw=0.3,
                       label=budget, rasterized=True)
        _param_axis(ax, col, sub[col])
    axes[0].set_ylabel(_loss_label(frame))
    if not shown.empty:
        _legend(axes[-1], 6)
    fixed = [f"{c} {_fmt_value(df[c].dropna().iloc[0])}" for c in TRAINING_COLUMNS
             if c not in varied and df[c].notna().any()]
    fig.suptitle("Phase-1 training parameters against validation loss"
                 + (f"\n(fixed, not drawn: {', '.join(fixed)})" if fixed else ""))
    return fig


def _phase1(frame: pd.DataFrame) -> pd.DataFrame:
    df = _finished(frame)
    return df[df["phase"] == 1] if df["phase"].notna().any() else df


def _fmt_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, int | float) else str(v)


def _param_axis(ax: Any, col: str, values: pd.Series) -> None:
    """Readable ticks for a training parameter: log axes get at most three labelled decades
    (no minor labels to overlap), categorical ones (epochs, batch size, warm-up) their values."""
    if col in ("learning_rate", "weight_decay"):
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        lo, hi = float(values[values > 0].min()), float(values.max())
        if hi / lo < 100:  # a range inside two decades: ends and middle, one significant digit
            ticks = sorted({float(f"{t:.0e}") for t in (lo, math.sqrt(lo * hi), hi)})
            ax.set_xticks(ticks, [f"{t:.0e}".replace("e-0", "e-") for t in ticks])
        else:
            ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(numticks=3))
        return
    if col == "batch_size":
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ticks = sorted(set(values.astype(int)))
    if len(ticks) > 5:
        ticks = ticks[:: math.ceil(len(ticks) / 5)]
    ax.set_xticks(ticks, [str(t) for t in ticks])


@_styled
def plot_loss_vs_compute(frame: pd.DataFrame, max_points: int = MAX_POINTS) -> Figure:
    """Validation loss against training compute (FLOPs of every sample trained on)."""
    fig = _figure(8.2, right=2.0)
    ax = fig.add_subplot()
    if not _scatter_by_budget(ax, frame, "train_flops", max_points):
        _empty(ax, "no training compute recorded (train_flops)")
        return fig
    ax.set_xlabel("training compute (FLOPs)")
    _legend(ax)
    fig.suptitle("Validation loss against training compute")
    return fig


FIGURES = {
    "loss_vs_params": "Validation loss against exact parameter count",  # `caption` adds the law's status
    "arch_plane": "Best loss over the (d_model, n_layers) plane, per budget",
    "loss_vs_depth_width": "Validation loss against depth-to-width ratio",
    "val_curves": "Validation curves of each budget's five best complete trials (fewer where fewer finished)",
    "phase1_params": "Phase-1 training parameters against validation loss",
    "loss_vs_compute": "Validation loss against training compute",
    "isoflops": "IsoFLOP curves of the fitted L(N, D), with the trials",
    "isoflop_profiles": "IsoFLOP profiles: loss against N per compute budget, the parabolas and their vertices",
    "frontier": "The compute-optimal frontier: N_opt and D_opt against C (Approach 2)",
}


def left_out(frame: pd.DataFrame, fit: dict[str, Any] | None = None) -> dict[str, str]:
    """Every figure of `FIGURES` that `make_figures` does not draw, by file stem, each with the
    one-line reason the page prints instead: nothing to compare (a single point per panel, a
    fixed value) or, for the IsoFLOP figures, no fit to draw (`fit` as `make_figures` takes it)."""
    return {**_nothing_to_compare(frame), **_no_fit_to_draw(fit)}


def _no_fit_to_draw(fit: dict[str, Any] | None) -> dict[str, str]:
    """The figures drawn from a fit (isoflops, isoflop_profiles, frontier) it does not allow, with why."""
    fit = fit or {}
    nd, iso = fit.get("nd_fit") or {}, fit.get("isoflop_fit") or {}
    out: dict[str, str] = {}
    if nd.get("status") != "fitted":
        out["isoflops"] = f"no fitted L(N, D) to draw (its status: {nd.get('status') or 'not fitted'})"
    why = str(iso.get("reason") or "no trial records a compute budget: not an IsoFLOP study").rstrip(".")
    if not iso.get("vertices"):
        out["isoflop_profiles"] = f"no IsoFLOP profile to draw ({why})"
    if iso.get("status") != "fitted":
        out["frontier"] = f"no fitted N_opt(C) to draw ({why})"
    return out


def _nothing_to_compare(frame: pd.DataFrame) -> dict[str, str]:
    """The frame's figures with nothing to compare, with why (see `left_out`)."""
    done = _finished(frame)
    out: dict[str, str] = {}
    if done["param_count"].nunique() < 2:
        out["loss_vs_params"] = "one parameter count among the finished trials: nothing to compare"
    cells = done.dropna(subset=["d_model", "n_layers"]).groupby("budget")[["d_model", "n_layers"]].nunique()
    if (cells.max(axis=1) <= 1).all():
        out["arch_plane"] = "one (d_model, n_layers) cell per budget: a single point per panel"
    if done["depth_to_width"].nunique() < 2:
        out["loss_vs_depth_width"] = "one depth-to-width ratio among the finished trials: nothing to compare"
    if not ranked(frame)["val_curve"].map(len).gt(0).any():
        out["val_curves"] = "no per-epoch validation curve recorded"
    phase1 = _phase1(frame)
    if not any(phase1[c].nunique() > 1 for c in TRAINING_COLUMNS):
        fixed = ", ".join(f"{c} {_fmt_value(phase1[c].dropna().iloc[0])}" for c in TRAINING_COLUMNS
                          if phase1[c].notna().any())
        out["phase1_params"] = f"every training parameter was fixed ({fixed or 'none recorded'})"
    if done["train_flops"].nunique() < 2:
        out["loss_vs_compute"] = ("no training compute recorded (train_flops)" if done["train_flops"].isna().all()
                                  else "one training compute among the finished trials: nothing to compare")
    return out


def make_figures(frame: pd.DataFrame, fit: dict[str, Any] | None = None,
                 max_points: int = MAX_POINTS) -> dict[str, Figure]:
    """Every report figure with something to compare, by file stem (see `FIGURES`; `left_out`
    names the others and why)."""
    skip = left_out(frame, fit)
    plots = {
        "loss_vs_params": lambda: plot_loss_vs_params(frame, fit, max_points),
        "arch_plane": lambda: plot_arch_plane(frame),
        "loss_vs_depth_width": lambda: plot_loss_vs_depth_width(frame, max_points),
        "val_curves": lambda: plot_val_curves(frame),
        "phase1_params": lambda: plot_phase1_params(frame, max_points),
        "loss_vs_compute": lambda: plot_loss_vs_compute(frame, max_points),
    }
    from archhpo.report._isoflop_figures import isoflop_plots, plot_isoflops  # they import this module

    if fit and (fit.get("nd_fit") or {}).get("status") == "fitted":
        plots["isoflops"] = lambda: plot_isoflops(frame, fit["nd_fit"])
    answer = ((fit or {}).get("nd_fit") or {}).get("compute_optimal") or {}
    plots.update(isoflop_plots(frame, (fit or {}).get("isoflop_fit") or {}, answer.get("compute")))
    return {name: draw() for name, draw in plots.items() if name not in skip}


__all__ = [
    "FIGURES",
    "baseline_loss",
    "caption",
    "known_floor",
    "law_not_drawn",
    "left_out",
    "make_figures",
    "plot_arch_plane",
    "plot_loss_vs_compute",
    "plot_loss_vs_depth_width",
    "plot_loss_vs_params",
    "plot_phase1_params",
    "plot_val_curves",
]
