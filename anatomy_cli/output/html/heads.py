"""`heads --plot FILE.html`: the layer x head grid of each score, with buttons to switch scores."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from anatomy_cli.output import statistics
from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html._page import TOOLBAR_PX
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot

if TYPE_CHECKING:
    from anatomy_cli.analyses.heads import Heads
    from anatomy_cli.output.html.markup import Part
    from anatomy_cli.output.plots.caption import Caption

SCORES = ("entropy", "first_token", "prev_token", "induction", "duplicate_token")
_LABELS = {key: s.label for key, s in statistics.HEADS.items()}


def figure(result: Heads, n_layers: int, n_heads: int, cap: Caption, top: int | None = None) -> Page:
    """A page with an :class:`anatomy_cli.analyses.heads.Heads`: one layer x head heatmap per score (layer 0
    at the bottom), the buttons above it switching between scores; ``result.sort`` (or entropy) first.
    Every head is coloured (``top``, the PNG's marker of the best N, is accepted and not drawn: hover gives
    each head's value). Weights on [0, 1]; entropy from 0 to its largest value."""
    page = caption_page(cap)
    page.add(part(result, n_layers, n_heads))
    lines = []
    if len(result.rows) < result.n_heads_total:
        lines.append(f"only the top {len(result.rows)} of {result.n_heads_total} heads by "
                     f"{result.sort or 'layer, head'} (--top); the others are blank")
    on = "the prompt" if result.measured_on == "prompt" else "the random sequence"
    lines.append(f"entropy, first token, previous token measured on {on}; induction and duplicate token on "
                 f"{result.seq_len} random tokens repeated twice (seed {result.seed})")
    page.add(notes(lines))
    return page


def part(result: Heads, n_layers: int, n_heads: int, *, div_id: str | None = None) -> Part:
    """The heatmaps and their score buttons (for ``anatomy report``)."""
    first = result.sort or "entropy"
    order = [first] + [s for s in SCORES if s != first]
    fig = go.Figure()
    for s in order:
        grid: list[list[float | None]] = [[None] * n_heads for _ in range(n_layers)]
        for row in result.rows:
            grid[row.layer][row.head] = getattr(row, s)
        finite = [v for r in grid for v in r if v is not None and not math.isnan(v)]
        top = (max(finite) if finite else 1.0) or 1.0
        fig.add_trace(go.Heatmap(
            z=grid, visible=s == first, name=s, zmin=0.0, zmax=top if s == "entropy" else 1.0,
            colorscale=statistics.HEADS[s].colorscale, xgap=1, ygap=1, hoverongaps=False,
            colorbar={"title": {"text": esc(_LABELS[s]), "side": "right"}},
            hovertemplate=f"layer %{{y}} head %{{x}}<br>{s}: %{{z:.4f}}<extra></extra>"))
    buttons = [{"label": s, "method": "update",
                "args": [{"visible": [t == s for t in order]}, {"title.text": _LABELS[s]}]} for s in order]
    width, height = heat_size(n_layers, n_heads, cell_w=34, cell_h=22)
    # Top down: plotly's toolbar band (right), the score's name (left), the buttons, then the plot.
    height, top, buttons_px = height + 62, 112, TOOLBAR_PX + 26
    plot_h = height - top - 60
    fig.update_layout(**layout(width=max(width, 640), height=height,
                               title={"text": _LABELS[first], "x": 0.01, "xanchor": "left", "yref": "container",
                                      "y": 1 - TOOLBAR_PX / height, "yanchor": "top"},
                               margin={"l": 70, "r": 30, "t": top, "b": 60},
                               updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons,
                                             "x": 0, "y": 1 + (top - buttons_px) / plot_h, "xanchor": "left",
                                             "yanchor": "top", "pad": {"t": 0, "b": 0}, "showactive": True}]))
    fig.update_xaxes(title_text="head", dtick=1 if n_heads <= 32 else None, showgrid=False)
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 40 else None, showgrid=False)
    return plot(fig, div_id=div_id)
