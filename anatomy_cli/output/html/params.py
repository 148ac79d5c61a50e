"""`params --plot FILE.html`: parameter counts per component (the article's table) and per block."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.statistics import PARAMS_COLOURS as _COLOURS
from anatomy_cli.output.statistics import PARAMS_LABELS as _LABELS

if TYPE_CHECKING:
    from anatomy_cli.analyses.params.breakdown import ParamsResult
    from anatomy_cli.output.html.markup import Part
    from anatomy_cli.output.plots.caption import Caption


def figure(result: ParamsResult, cap: Caption) -> Page:
    """A page with a :class:`anatomy_cli.analyses.params.ParamsResult` drawn as the PNG: one bar per row (count
    and share in the hover text), active parameters for MoE models, and per block with ``--per-layer``."""
    page = caption_page(cap)
    page.add(part(result))
    page.add(notes(list(result.notes)[:3]))
    return page


def part(result: ParamsResult, *, div_id: str | None = None) -> Part:
    """The bars alone (for ``anatomy report``)."""
    rows = list(result.rows)
    per_layer = result.layers is not None
    fig = make_subplots(rows=1, cols=2 if per_layer else 1, column_widths=[0.55, 0.45] if per_layer else None)
    labels = [esc(r.label) for r in rows]
    fig.add_trace(go.Bar(y=labels, x=[r.parameters for r in rows], orientation="h", name="parameters",
                         marker_color=[_COLOURS.get(r.key, "#4c72b0") for r in rows],
                         customdata=[f"{r.parameters:,} ({r.share:.1%})" for r in rows],
                         text=[f"{r.parameters:,} ({r.share:.1%})" for r in rows], textposition="outside",
                         hovertemplate="%{y}<br>%{customdata}<extra></extra>", showlegend=False), row=1, col=1)
    if any(r.active is not None for r in rows):
        fig.add_trace(go.Bar(y=labels, x=[r.active or 0 for r in rows], orientation="h", name="active per token",
                             marker={"color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 1},
                                     "pattern": {"shape": "/"}},
                             hovertemplate="%{y}<br>active %{x:,}<extra></extra>"), row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    if per_layer:
        blocks = list(result.layers or ())
        for c in [c for c in _LABELS if any(b.parameters.get(c, 0) for b in blocks)]:
            fig.add_trace(go.Bar(y=[b.index for b in blocks], x=[b.parameters.get(c, 0) for b in blocks],
                                 orientation="h", name=_LABELS[c], marker_color=_COLOURS[c],
                                 hovertemplate=f"block %{{y}}<br>{_LABELS[c]}: %{{x:,}}<extra></extra>"), row=1, col=2)
        fig.update_yaxes(autorange="reversed", title_text="block", row=1, col=2)
        fig.update_xaxes(title_text="parameters per block", row=1, col=2)
    title = f"total {result.total:,}" + (f" · active {result.moe.active:,}" if result.moe and result.moe.active else "")
    fig.update_layout(**layout(width=1250 if per_layer else 900, height=max(320, 36 * len(rows) + 140),
                               barmode="stack" if per_layer else "overlay", title={"text": title},
                               margin={"l": 220, "r": 120, "t": 50, "b": 50}))
    fig.update_xaxes(title_text="parameters", row=1, col=1)
    return plot(fig, div_id=div_id)
