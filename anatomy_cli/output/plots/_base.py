"""What every picture shares: matplotlib set up for files (Agg, no dates), captions, token labels, heatmaps.

Importing this module imports matplotlib; only the picture modules do, and only for ``--plot``.

Rules that hold for every picture:

- the title names the command, the model and the prompt (shortened in the middle);
- "untrained (random weights)" is written in red at the bottom when the weights are random;
- tokens are shown as in the tables (``·`` for a leading space, ``↵`` for a newline), and a character
  that no installed font can draw (CJK without a CJK font) becomes ``<U+4E2D>`` instead of an empty box;
- a ``$`` in a token or prompt is a dollar sign, never the start of mathtext;
- labels are thinned (every k-th) when they would not fit, so nothing overlaps;
- a footer note wider than the figure wraps between words, so none runs off the right edge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.layout_engine import ConstrainedLayoutEngine

from anatomy_cli.output.plots._text import drawable
from anatomy_cli.output.plots._text import fonts
from anatomy_cli.output.plots._text import shorten
from anatomy_cli.output.plots._text import token_label
from anatomy_cli.output.plots.caption import Caption

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis

DPI = 100
CELL_CHARS = 6  # a heatmap cell shows at least this many characters of its token before "…"
FOOTER_COLOUR = "#555555"
FOOTER_SIZE = 7.5  # points
FOOTER_X = 0.005  # the footer's left edge, as a fraction of the figure's width (the same margin on the right)
UNTRAINED = "untrained (random weights)"
BLANK = "#e4e4e4"  # cells without a value

_METADATA = {"svg": {"Date": None}, "pdf": {"CreationDate": None}, "png": {}}


def _setup() -> None:
    families, _ = fonts()
    matplotlib.rcParams.update({
        "svg.hashsalt": "anatomy",  # fixed ids in SVG: the same picture gives the same bytes
        "font.family": list(families),
        "font.size": 9,
        "axes.titlesize": 10,
        "figure.titlesize": 11,
        "legend.fontsize": 8,
        "savefig.dpi": DPI,
        "figure.dpi": DPI,
    })


_setup()


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches with constrained layout and an Agg canvas (no pyplot state)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def caption(fig: Figure, cap: Caption, notes: Sequence[str] = ()) -> None:
    """The title (command · model, then the prompt and detail) and a footer with ``notes`` and, for random
    weights, "untrained (random weights)" in red. Reserves room at the bottom for the footer."""
    title = f"{cap.command} · {drawable(cap.model)}"
    lines = [title]
    second = []
    if cap.prompt is not None:
        second.append(f"'{drawable(shorten(cap.prompt))}'")
    if cap.detail:
        second.append(drawable(cap.detail))
    if second:
        lines.append(" · ".join(second))
    fig.suptitle("\n".join(lines))
    footer = [line for n in notes for line in _wrap(fig, drawable(n), FOOTER_SIZE)]
    height = fig.get_figheight() * 72
    line = 11.0  # points per footer line
    n_lines = len(footer) + (1 if cap.untrained else 0)
    if not n_lines:
        return
    bottom = (n_lines * line + 4) / height
    engine = fig.get_layout_engine()
    assert isinstance(engine, ConstrainedLayoutEngine)  # new_figure's
    engine.set(rect=(0, bottom, 1, 1 - bottom))  # (left, bottom, width, height)
    y = 3 / height
    if cap.untrained:
        fig.text(FOOTER_X, y, UNTRAINED, ha="left", va="bottom", color="#c00000", fontsize=9, fontweight="bold")
        y += line / height
    for note in reversed(footer):
        fig.text(FOOTER_X, y, note, ha="left", va="bottom", color=FOOTER_COLOUR, fontsize=FOOTER_SIZE)
        y += line / height


def _wrap(fig: Figure, text: str, size: float) -> list[str]:
    """``text`` as lines that each fit the figure's width at ``size`` points (broken between words; a single
    word wider than the figure stays whole): a long footer note wraps instead of running off the right edge."""
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)  # new_figure's
    renderer = canvas.get_renderer()
    font = FontProperties(size=size)
    room = fig.get_figwidth() * fig.dpi * (1 - 2 * FOOTER_X)

    def width(s: str) -> float:
        return renderer.get_text_width_height_descent(s, font, ismath=False)[0]

    if width(text) <= room:
        return [text]
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        joined = f"{line} {word}" if line else word
        if line and width(joined) > room:
            lines.append(line)
            line = word
        else:
            line = joined
    lines.append(line)
    return lines


def thin(n: int, pitch_pt: float, need_pt: float = 11.0, keep_last: bool = True) -> list[int]:
    """Indices 0..n-1 to label when labels are ``pitch_pt`` points apart and each needs ``need_pt``:
    every k-th, plus the last one (dropping its neighbour when they would touch)."""
    if n <= 0:
        return []
    step = max(1, math.ceil(need_pt / max(pitch_pt, 1e-9)))
    keep = list(range(0, n, step))
    if keep_last and keep[-1] != n - 1:
        if (n - 1 - keep[-1]) * pitch_pt < need_pt:
            keep.pop()
        keep.append(n - 1)
    return keep


def set_ticks(axis: Axis, labels: Sequence[str], pitch_pt: float, *, need_pt: float = 11.0,
              rotation: float = 0, keep_last: bool = True, positions: Sequence[float] | None = None) -> None:
    """Put ``labels`` on ``axis`` (ax.xaxis / ax.yaxis) at 0..n-1 (or ``positions``), thinned to fit."""
    pos = list(range(len(labels))) if positions is None else list(positions)
    keep = thin(len(labels), pitch_pt, need_pt, keep_last)
    axis.set_ticks([pos[i] for i in keep], [labels[i] for i in keep])
    if rotation:
        for tick in axis.get_ticklabels():
            tick.set_rotation(rotation)


def grid_size(n_rows: int, n_cols: int, *, extra_w: float = 3.2, extra_h: float = 2.6,
              max_w: float = 17.0, max_h: float = 13.0) -> tuple[float, float, float, float]:
    """Figure width, height and cell width, height (inches) for an ``n_rows`` x ``n_cols`` heatmap:
    cells between 0.3 and 0.85 in wide and 0.2 and 0.45 in high, the figure capped at ``max_w`` x ``max_h``."""
    cw = min(0.85, max(0.3, 12.0 / max(n_cols, 1)))
    ch = min(0.45, max(0.2, 8.5 / max(n_rows, 1)))
    cw = min(cw, (max_w - extra_w) / max(n_cols, 1))
    ch = min(ch, (max_h - extra_h) / max(n_rows, 1))
    return max(5.5, n_cols * cw + extra_w), max(3.6, n_rows * ch + extra_h), cw, ch


def as_array(rows: Sequence[Sequence[float | None]]) -> np.ndarray:
    """A float array with None as NaN (drawn as the colour map's 'bad' colour: blank)."""
    return np.array([[math.nan if v is None else float(v) for v in row] for row in rows], dtype=float)


def heatmap(fig: Figure, ax: Any, values: np.ndarray, *, cell: tuple[float, float], xlabels: Sequence[str],
            ylabels: Sequence[str], cmap: str, vmin: float | None, vmax: float | None, colorbar: str | None,
            cells: Sequence[Sequence[str | None]] | None = None, xlabel: str = "", ylabel: str = "",
            x_rotation: float = 90, origin: str = "lower", norm: Any = None) -> list[str]:
    """Draw ``values`` (``origin`` "lower": row 0 at the bottom, as layers; "upper": at the top, as queries)
    with thinned tick labels, optional text in each cell (``cells``, None for none) and a colour bar.
    ``norm`` (a matplotlib Normalize) replaces ``vmin``/``vmax``. NaN cells are blank.
    Returns footer notes (e.g. when the cells were too small to name their tokens)."""
    limits = {} if norm is not None else {"vmin": vmin, "vmax": vmax}
    colours = matplotlib.colormaps[cmap].with_extremes(bad=BLANK)  # NaN: light grey, not the colour of 0
    image = ax.imshow(values, origin=origin, aspect="auto", cmap=colours, norm=norm, interpolation="nearest",
                      **limits)
    cw_pt, ch_pt = cell[0] * 72, cell[1] * 72
    if x_rotation and max((len(t) for t in xlabels), default=0) * 0.62 * 8 + 6 <= cw_pt:
        x_rotation = 0  # every label fits its column lying down
    set_ticks(ax.xaxis, list(xlabels), cw_pt, need_pt=10.5 if x_rotation else cw_pt, rotation=x_rotation)
    set_ticks(ax.yaxis, list(ylabels), ch_pt, need_pt=10.5)
    ax.tick_params(labelsize=8, length=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if colorbar is not None:
        fig.colorbar(image, ax=ax, label=colorbar, shrink=0.9, pad=0.01)
    notes = []
    if cells is not None:
        # The size at which CELL_CHARS characters fit a cell; then as many characters as fit at that size.
        size = min(8.5, 0.62 * ch_pt, (cw_pt - 4) / (0.62 * CELL_CHARS))
        limit = max(CELL_CHARS, min(12, int((cw_pt - 4) / (0.62 * max(size, 1.0)))))
        texts = [[token_label(t, limit) if t is not None else None for t in row] for row in cells]
        if size < 4.5:
            notes.append("cells too small to name their tokens: see --format json")
        else:
            norm = image.norm
            colours = image.get_cmap()
            for r, row in enumerate(texts):
                for c, text in enumerate(row):
                    if not text:
                        continue
                    v = values[r, c]
                    dark = (not math.isnan(v)) and _luminance(colours(norm(v))) < 0.45
                    ax.text(c, r, text, ha="center", va="center", fontsize=size,
                            color="white" if dark else "black", clip_on=True)
    return notes


def _luminance(rgba: Sequence[float]) -> float:
    r, g, b = rgba[:3]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def symmetric_limit(values: np.ndarray) -> float:
    """max |v| over the finite values (1 when there are none or all are 0): limits for a scale centred at 0."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 0.0
    return top if top > 0 else 1.0


def write(fig: Figure, path: Path) -> None:
    """Save in the format the suffix names, with no date in SVG/PDF metadata. Raises OSError."""
    fmt = path.suffix.lower().lstrip(".")
    fig.savefig(path, format=fmt, metadata=_METADATA[fmt])


ATTN_COLOUR, MLP_COLOUR, OTHER_COLOUR = "#dd8452", "#4c72b0", "#8c8c8c"


def grouped_bars(ax: Axes, x: Sequence[float], series: Sequence[tuple[str, Sequence[float | None], str]],
                 width: float = 0.8) -> None:
    """Side-by-side vertical bars at each ``x``: one ``(label, values, colour)`` per series (None: no bar),
    a line at 0, a grid. Bar heights are the values as given."""
    n = len(series)
    w = width / max(n, 1)
    for i, (label, values, colour) in enumerate(series):
        offset = (i - (n - 1) / 2) * w
        ax.bar([xi + offset for xi in x], [math.nan if v is None else v for v in values], width=w,
               color=colour, label=label)
    ax.axhline(0, color="black", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
