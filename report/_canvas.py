"""The report's canvas: figures with fixed margins in inches, drawn under the report's style, and
every legend kept inside the canvas (`fit_legends`, applied by `_styled` to each figure returned).

Shared by `archhpo.report._figures` and `archhpo.report._isoflop_figures`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display, ever (before anything imports pyplot)

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

_STYLE: Any = {"font.size": 9, "axes.titlesize": 10, "axes.grid": True, "grid.alpha": 0.3}


def _styled(func: Any) -> Any:
    """Draw under the report's style (font sizes, grid) without touching global rcParams."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with matplotlib.rc_context(_STYLE):
            fig = func(*args, **kwargs)
            fit_legends(fig)
            return fig

    return wrapper


def fit_legends(fig: Figure, pad: float = 0.08) -> None:
    """Grow the canvas until every legend (and the title) lies inside it, `pad` inches clear of
    each edge.

    The margins are fixed in inches (`_figure`), but a legend's width is only known once its
    labels are laid out: a long label ("extrapolation (to 2x the largest N)") or many budgets
    would run past the PNG's edge, as would a long title over one narrow panel.  Hinted text is not exactly proportional to the resolution,
    so the legends are measured at each of `_MEASURE_DPIS` (the page's PNG and the PDF among
    them).  Each axes keeps its size in inches; the canvas grows on the side a legend overflows
    and every axes (legends, colorbars, texts with it) shifts inside."""
    w, h = fig.get_size_inches()
    boxes = _text_boxes(fig)
    if not boxes:
        return
    left, bottom = (max(0.0, pad - min(b[i] for b in boxes)) for i in (0, 1))
    right, top = (max(0.0, max(b[i] for b in boxes) + pad - size) for i, size in ((2, w), (3, h)))
    if not any((left, bottom, right, top)):
        return
    new_w, new_h = w + left + right, h + bottom + top
    for ax in fig.axes:
        box = ax.get_position()
        ax.set_position(((box.x0 * w + left) / new_w, (box.y0 * h + bottom) / new_h,
                         box.width * w / new_w, box.height * h / new_h))
    fig.set_size_inches(new_w, new_h)


_MEASURE_DPIS = (72, 110, 150)  # the PDF's text, the page's PNG, the PDF's raster


def _text_boxes(fig: Figure) -> list[tuple[float, float, float, float]]:
    """Every legend's and the title's (x0, y0, x1, y1) in inches from the canvas' lower left, at
    each measured dpi (none when the figure has no legend)."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)  # Figure() has none
    legends: list[Any] = [leg for ax in fig.axes if (leg := ax.get_legend()) is not None]
    title = getattr(fig, "_suptitle", None)  # matplotlib keeps the suptitle there; no public getter
    legends += [title] if legends and title is not None and title.get_text() else []
    dpi, boxes = fig.dpi, []
    try:
        for at in _MEASURE_DPIS if legends else ():
            fig.set_dpi(at)
            renderer = canvas.get_renderer()
            boxes += [(b.x0 / at, b.y0 / at, b.x1 / at, b.y1 / at)
                      for b in (leg.get_window_extent(renderer) for leg in legends)]
    finally:
        fig.set_dpi(dpi)
    return boxes


def _figure(width: float = 6.4, height: float = 4.2, wspace: float = 0.3, hspace: float = 0.5,
            bottom: float = 0.55, right: float = 0.25, top: float = 0.6) -> Figure:
    """A figure with fixed margins in inches (a constrained layout costs more than drawing at
    20,000 trials, and these figures' labels are known in advance)."""
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.8 / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=wspace, hspace=hspace)
    return fig


def _grid(n_panels: int, width: float, height: float, **margins: Any) -> tuple[Figure, list[Any]]:
    """Panels in rows of at most three; a figure of one or two panels is only as wide as they
    are (no half-empty canvas); unused cells are hidden."""
    n = max(n_panels, 1)
    cols = n if n <= 3 else min(3, math.ceil(math.sqrt(n)))  # four panels: 2 x 2, not 3 + 1
    rows = math.ceil(n / cols)
    fig = _figure(width * cols + 0.4, height * rows + 0.6, **margins)
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes


def _legend(ax: Any, fontsize: float = 7) -> None:
    """The legend beside the axes (the figure keeps a right margin for it): inside, it covers
    some point or curve, and matplotlib's loc="best" searches every point (slow at 20,000)."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


__all__ = ["fit_legends"]
