"""`dla --plot FILE.html`: direct logit attribution per layer (attention and MLP bars), per head as a grid."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy_cli.output import statistics
from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html._charts import ATTN_COLOUR
from anatomy_cli.output.html._charts import MLP_COLOUR
from anatomy_cli.output.html._charts import OTHER_COLOUR
from anatomy_cli.output.html._charts import bars
from anatomy_cli.output.html._charts import diverging
from anatomy_cli.output.html._page import TOOLBAR_PX
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot

if TYPE_CHECKING:
    from anatomy_cli.analyses.dla import Attribution
    from anatomy_cli.output.html.markup import Part
    from anatomy_cli.output.plots.caption import Caption


def figure(result: Attribution, n_layers: int, n_heads: int, what: str, cap: Caption) -> Page:
    """A page with an :class:`anatomy_cli.analyses.dla.Attribution` (``what``: e.g. ``logit(·Berlin)``) drawn as
    the PNG: rows without a layer as grey bars, attention and MLP per layer, heads as a layer x head grid."""
    page = caption_page(cap)
    page.add(part(result, n_layers, n_heads, what))
    page.add(notes([f"rows add up to {result.total:.4f}; the model's own {what} is {result.logit:.4f}"]))
    return page


def part(result: Attribution, n_layers: int, n_heads: int, what: str, *, div_id: str | None = None) -> Part:
    """The bars (and head grid) alone (for ``anatomy report``)."""
    rows = result.rows
    by_name = statistics.by_component(rows)
    outside = [r for r in rows if r.layer is None]
    heads = [r for r in rows if r.head is not None]
    layers = list(range(n_layers))
    cols = 3 if heads else 2
    fig = make_subplots(rows=1, cols=cols, column_widths=[0.12, 0.5, 0.38][:cols] if heads else [0.15, 0.85],
                        subplot_titles=["outside the blocks", "MLP per layer" if heads else "per layer",
                                        "attention, per head"][:cols])
    fig.add_trace(go.Bar(x=[esc(r.component) for r in outside], y=[r.contribution for r in outside],
                         marker_color=OTHER_COLOUR, name="embedding, bias", showlegend=False,
                         hovertemplate="%{x}<br>%{y:.4f} logits<extra></extra>"), row=1, col=1)
    if not heads:
        fig.add_trace(bars(layers, [by_name.get(f"L{l}.attn") for l in layers], "attention", ATTN_COLOUR, "logits"),
                      row=1, col=2)
    fig.add_trace(bars(layers, [by_name.get(f"L{l}.mlp") for l in layers], "MLP", MLP_COLOUR, "logits"), row=1, col=2)
    if heads:
        grid: list[list[float | None]] = [[None] * n_heads for _ in layers]
        for r in heads:
            assert r.layer is not None and r.head is not None  # heads: the rows with a head
            grid[r.layer][r.head] = r.contribution
        fig.add_trace(diverging(grid, title=f"head → {what} (logits)"), row=1, col=3)
        fig.update_xaxes(title_text="head", row=1, col=3)
        fig.update_yaxes(title_text="layer", row=1, col=3)
    fig.update_layout(**layout(width=1200 if heads else 1000, height=max(460, min(900, 18 * n_layers + 200)),
                               margin={"l": 70, "r": 30, "t": TOOLBAR_PX + 28, "b": 60},  # titles under the toolbar
                               barmode="group", legend={"orientation": "h", "x": 0.15, "y": -0.12,
                                                        "yanchor": "top"}))
    fig.update_yaxes(matches="y2", row=1, col=1)  # one scale: a small embedding term looks small
    fig.update_yaxes(title_text=esc(f"contribution to {what} (logits)"), row=1, col=1)
    fig.update_xaxes(title_text="layer (block)", row=1, col=2)
    return plot(fig, div_id=div_id)
