"""`attribute --plot`: the prompt as text, each token's background coloured by its attribution."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap
from matplotlib.colors import Normalize

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import _luminance
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import symmetric_limit
from anatomy_cli.output.plots._text import token_label
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.attribute import TokenAttribution

WIDTH = 10.0       # inches
LINE = 0.42        # inches per line of tokens
MARGIN = 0.02      # axes fraction left and right


def figure(result: TokenAttribution, what: str, cap: Caption) -> Figure:
    """Draw an :class:`anatomy_cli.analyses.attribute.TokenAttribution` (``what``: the metric, e.g.
    ``log p(·much)``, named in the title). Tokens flow left to right and wrap; the background of each is
    its attribution on a diverging scale centred at 0 (red: raised the metric, blue: lowered it); a
    colour bar gives the scale. Returns a matplotlib Figure."""
    values = np.array([r.attribution for r in result.rows], dtype=float)
    limit = symmetric_limit(values[None, :]) if values.size else 1.0
    norm = Normalize(vmin=-limit, vmax=limit)
    cmap = colormaps["RdBu_r"]
    labels = [token_label(r.token, 24) for r in result.rows]
    # Lay out by character count (monospace-like estimate), then draw: wrap when a line is full.
    per_line = 100  # characters of 10 pt monospace (6 pt each) across the 10-inch axes, with padding
    lines: list[list[int]] = [[]]
    used = 0
    for i, label in enumerate(labels):
        size = len(label) + 2
        if lines[-1] and used + size > per_line:
            lines.append([])
            used = 0
        lines[-1].append(i)
        used += size
    fig = new_figure(WIDTH, max(2.6, len(lines) * LINE + 2.2))
    ax, bar_ax = fig.subplots(2, 1, height_ratios=[max(1, len(lines)) * 4, 1])
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    ax.set_ylim(len(lines), 0)
    step = (1 - 2 * MARGIN) / per_line
    for row, members in enumerate(lines):
        x = MARGIN
        for i in members:
            colour = cmap(norm(values[i]))
            ink = "black" if _luminance(colour) > 0.45 else "white"
            ax.text(x, row + 0.5, labels[i], va="center", ha="left", family="monospace", fontsize=10, color=ink,
                    bbox={"boxstyle": "square,pad=0.25", "facecolor": colour, "edgecolor": "#bbbbbb",
                          "linewidth": 0.5})
            x += (len(labels[i]) + 2) * step
    fig.colorbar(_mappable(norm, cmap), cax=bar_ax, orientation="horizontal",
                 label=f"attribution to {what}")
    notes = [f"f = {what} at the last position = {result.value:.4f}"]
    if result.completeness is not None and result.completeness.relative_error is not None:
        notes.append(f"completeness: relative error {result.completeness.relative_error:.1e} at "
                     f"{counted(result.steps or 0, 'step')}")
    ax.set_title(f"which tokens drove {what}", fontsize=10)
    caption(fig, cap, notes)
    return fig


def _mappable(norm: Normalize, cmap: Colormap) -> ScalarMappable:
    return ScalarMappable(norm=norm, cmap=cmap)
