"""`lens --plot`: the lens grid (logit, Jacobian or tuned) as nostalgebraist drew it, layers x positions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from matplotlib.colors import LogNorm
from matplotlib.patches import Rectangle

from anatomy_cli.output import statistics
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grid_size
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import token_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.lens import LensGrid


def figure(grid: LensGrid, stat: str, tokens: Sequence[str], cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.lens.LensGrid`: ``grid.stat(stat)`` as colour, the embed row at the
    bottom, one column per position of ``grid.positions`` labelled with ``tokens`` (the input pieces
    at those positions), each cell naming its top-1 token (``grid.top_tokens[r][c][0]``). With a target,
    cells whose top token is the target get a white frame. Returns a matplotlib Figure.
    """
    values = as_array(grid.stat(stat).tolist())
    n_rows, n_cols = values.shape
    width, height, cw, ch = grid_size(n_rows, n_cols)
    fig = new_figure(width, height)
    ax = fig.subplots()
    described = statistics.LENS[stat]  # colour scale, label, fixed limits: bright = confident, for every stat
    cmap, label, limits = described.cmap, described.label, described.limits
    norm = None
    vmin: float | None
    vmax: float | None
    if described.log:
        norm = LogNorm(vmin=1, vmax=max(2.0, float(values.max())))
        vmin = vmax = None
    elif limits is None:
        vmin, vmax = float(values.min()), float(values.max())
    else:
        vmin, vmax = limits
    notes = heatmap(fig, ax, values, cell=(cw, ch), xlabels=[token_label(t) for t in tokens],
                    ylabels=[str(layer) for layer in grid.layers], cmap=cmap, vmin=vmin, vmax=vmax,
                    norm=norm, colorbar=label, cells=[[row[c][0] for c in range(n_cols)] for row in grid.top_tokens],
                    xlabel="input token at each position", ylabel="layer (embed, then block N's output)")
    if grid.target_id is not None:
        top = grid.top_ids[..., 0].tolist()
        for r in range(n_rows):
            for c in range(n_cols):
                if top[r][c] == grid.target_id:
                    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="white", lw=1.6))
        notes.append(f"framed: cells whose top token is the target {token_label(grid.target_token, 24)}")
    notes.insert(0, f"each cell: the top token of {statistics.lens_reading(grid.lens)} at that layer and "
                    "position; its colour: " + label)
    caption(fig, cap, notes)
    return fig
