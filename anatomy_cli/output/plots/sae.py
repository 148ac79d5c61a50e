"""`sae --plot`: tokens x features, the top features over the prompt, each cell's colour its activation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.patches import Rectangle

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grid_size
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._text import shorten
from anatomy_cli.output.plots._text import token_label
from anatomy_cli.output.sae_scale import ColourScale
from anatomy_cli.output.sae_scale import colour_scale

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.sae import Reading

LABEL_NOTES = 8  # feature labels written under the picture at most


def figure(reading: Reading, cap: Caption) -> Figure:
    """Draw an :class:`anatomy_cli.analyses.sae.Reading`: one row per token (the first at the top), one
    column per feature of ``reading.matrix()`` (the followed features, then the top-features table's by
    their largest activation), colour = activation (0 to the largest shown, or to the largest after position 0
    when the attention sink dwarfs the rest: :func:`~anatomy_cli.output.sae_scale.colour_scale`). Returns a
    matplotlib Figure."""
    ids, rows = reading.matrix()
    n_rows = len(reading.pieces)
    values = as_array(rows) if ids else as_array([[None]] * n_rows)  # no active feature: one blank column
    scale = colour_scale(rows) if ids else ColourScale(1.0)
    width, height, cw, ch = grid_size(n_rows, values.shape[1])
    fig = new_figure(width, height)
    ax = fig.subplots()
    notes = heatmap(fig, ax, values, cell=(cw, ch), xlabels=[str(f) for f in ids] or [""],
                    ylabels=[token_label(p, 12) for p in reading.pieces], cmap="viridis", vmin=0.0,
                    vmax=scale.top, colorbar="feature activation (the SAE's units)"
                    + ("" if scale.clipped is None else f"; position {scale.clipped} clipped"),
                    xlabel="feature", ylabel="token", origin="upper", x_rotation=90 if len(ids) > 12 else 0)
    if scale.clipped is not None:  # the clipped row hatched: its colour is the scale's end, not its value
        ax.add_patch(Rectangle((-0.5, scale.clipped - 0.5), values.shape[1], 1, fill=False, hatch="//",
                               edgecolor="white", linewidth=0))
    notes.insert(0, "columns: " + ("the followed features, then " if reading.followed else "")
                 + f"each token's top {reading.top} features, by their largest activation over the prompt")
    if not ids:
        notes.append("no feature is active on this prompt")
    if scale.note():
        notes.insert(1, f"{scale.note()} (hatched; values: --format json)")
    if reading.labels:
        named = [(f, reading.labels[f]) for f in ids if f in reading.labels]
        notes += [f"{f}: {shorten(text, 90)}" for f, text in named[:LABEL_NOTES]]
        if len(named) > LABEL_NOTES:
            notes.append(f"… {len(named) - LABEL_NOTES} more labels in the HTML page and --format json")
    caption(fig, cap, notes)
    return fig
