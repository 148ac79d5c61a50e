"""`sae --plot FILE.html`: tokens x features as in the PNG; hovering a cell shows the feature, its label, the
activation and the token."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import token
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks
from anatomy_cli.output.sae_scale import ColourScale
from anatomy_cli.output.sae_scale import colour_scale

if TYPE_CHECKING:
    from anatomy_cli.analyses.sae import Reading
    from anatomy_cli.output.plots.caption import Caption


def figure(reading: Reading, cap: Caption) -> Page:
    """A page with :class:`anatomy_cli.analyses.sae.Reading`'s heatmap: one row per token (the first at the
    top), one column per feature of ``reading.matrix()``, colour = activation."""
    ids, rows = reading.matrix()
    pieces = reading.pieces
    labels = reading.labels or {}
    hover = [[_hover(pos, pieces[pos], fid, labels.get(fid), rows[pos][c]) for c, fid in enumerate(ids)]
             for pos in range(len(pieces))]
    scale = colour_scale(rows) if ids else ColourScale(1.0)
    title = "activation" if scale.clipped is None else f"activation (position {scale.clipped} clipped)"
    heat = go.Heatmap(z=rows, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                      colorscale="Viridis", zmin=0, zmax=scale.top,
                      colorbar={"title": {"text": title, "side": "right"}}, xgap=1, ygap=1)
    fig = go.Figure(heat)
    width, height = heat_size(len(pieces), max(len(ids), 1), cell_w=34)
    fig.update_layout(**layout(width=width, height=height))
    fig.update_xaxes(title_text="feature", **ticks([str(f) for f in ids]), showgrid=False)
    fig.update_yaxes(title_text="token", **ticks([f"{i} {token(p, 12)}" for i, p in enumerate(pieces)], 40),
                     autorange="reversed", showgrid=False)
    page = caption_page(cap)
    page.add(plot(fig))
    lines = ["columns: " + ("the followed features, then " if reading.followed else "")
             + f"each token's top {reading.top} features, by their largest activation over the prompt; "
             "colour: the feature's activation (the SAE's units); hover a cell for the feature and its label"]
    if not ids:
        lines.append("no feature is active on this prompt")
    if scale.note():
        lines.append(f"{scale.note()}: hover its cells for their values")
    return page.add(notes(lines))


def _hover(pos: int, piece: str, fid: int, label: str | None, value: float) -> str:
    lines = [f"feature {fid}"]
    if label is not None:
        lines.append(f"label: {esc(label)}")
    lines += [f"activation: {value:.4f}", f"token {pos}: {token(piece, 24)}"]
    return "<br>".join(lines)
