"""`route --plot`: MoE blocks x positions, each cell coloured by (and naming) the expert with the largest weight."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from matplotlib.patches import Rectangle

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grid_size
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import token_label
from anatomy_cli.output.statistics import EXPERT_COLOURS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.tasks.route import RouteResult

PALETTE = len(EXPERT_COLOURS)  # tab20: experts i and i + 20 share a colour; the cell names the expert


def figure(result: RouteResult, tokens: Sequence[str], cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.tasks.route.RouteResult`: one row per MoE block (the first at the bottom), one
    column per position labelled with ``tokens``; colour and text: the top expert. Near ties get a black frame."""
    blocks, ids = result.top_experts()
    values = as_array([[float(i % PALETTE) for i in row] for row in ids])
    n_rows, n_cols = values.shape
    width, height, cw, ch = grid_size(n_rows, n_cols)
    fig = new_figure(width, height)
    ax = fig.subplots()
    notes = heatmap(fig, ax, values, cell=(cw, ch), xlabels=[token_label(t) for t in tokens],
                    ylabels=[str(b) for b in blocks], cmap="tab20", vmin=-0.5, vmax=PALETTE - 0.5, colorbar=None,
                    cells=[[str(i) for i in row] for row in ids], xlabel="input token at each position",
                    ylabel="MoE block")
    row_of = {b: i for i, b in enumerate(blocks)}
    for r in result.rows:
        if r.near_tie:
            ax.add_patch(Rectangle((r.position - 0.5, row_of[r.block] - 0.5), 1, 1, fill=False, edgecolor="black",
                                   lw=1.4, ls="--"))
    notes.insert(0, f"each cell: the expert with the largest weight at that block and position (of {result.n_experts}; "
                    f"top {result.top_k} chosen); colours repeat every {PALETTE} experts")
    notes.append(f"dashed frame: a near tie (margin < {result.near_tie_threshold}); --format json has every weight")
    caption(fig, cap, notes)
    return fig
