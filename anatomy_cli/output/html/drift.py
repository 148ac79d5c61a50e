"""`drift --plot FILE.html`: a word's similarity per layer for each pair of contexts, with the baseline band."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import notes
from anatomy_cli.output.html._charts import clean
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot

if TYPE_CHECKING:
    from anatomy_cli.analyses.drift import DriftResult
    from anatomy_cli.output.plots.caption import Caption


def figure(result: DriftResult, cap: Caption) -> Page:
    """A page with a :class:`anatomy_cli.analyses.drift.DriftResult` drawn as the PNG: one line per pair, the
    mean of the pairs, the baseline inside its range over contexts, and with ``--matrix`` the pairwise grid."""
    layers = [str(label) for label in result.labels]
    matrix = result.matrix is not None
    fig = make_subplots(rows=1, cols=2 if matrix else 1, column_widths=[0.65, 0.35] if matrix else None)
    low = [min((v for v in col if v is not None), default=None) for col in zip(*result.baseline_by_context)]
    high = [max((v for v in col if v is not None), default=None) for col in zip(*result.baseline_by_context)]
    fig.add_trace(go.Scatter(x=layers, y=clean(high), mode="lines", line={"width": 0}, showlegend=False,
                             hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(x=layers, y=clean(low), mode="lines", line={"width": 0}, fill="tonexty",
                             fillcolor="rgba(128,128,128,0.25)", name="baseline range over contexts",
                             hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(x=layers, y=clean(result.baseline), mode="lines", line={"dash": "dash", "color": "grey"},
                             name="baseline: mean cosine to the other tokens of its context",
                             hovertemplate="layer %{x}<br>baseline %{y:.4f}<extra></extra>"), row=1, col=1)
    for pair in result.pairs:
        name = f"contexts {pair.context_a} and {pair.context_b}"
        fig.add_trace(go.Scatter(x=layers, y=clean(pair.similarity), mode="lines+markers", name=name,
                                 hovertemplate=f"{name} · layer %{{x}}<br>cosine %{{y:.4f}}<extra></extra>"),
                      row=1, col=1)
    if len(result.pairs) > 1:
        fig.add_trace(go.Scatter(x=layers, y=clean(result.similarity), mode="lines",
                                 line={"color": "black", "width": 3},
                                 name=f"mean of {len(result.pairs)} pairs",
                                 hovertemplate="mean · layer %{x}<br>cosine %{y:.4f}<extra></extra>"), row=1, col=1)
    if matrix:
        names = [str(loc.context) for loc in result.contexts]
        fig.add_trace(go.Heatmap(z=result.matrix, x=names, y=names, colorscale="Viridis", zmax=1.0,
                                 texttemplate="%{z:.2f}", showscale=False,
                                 hovertemplate="contexts %{y} and %{x}<br>cosine %{z:.4f}<extra></extra>"),
                      row=1, col=2)
        fig.update_yaxes(autorange="reversed", title_text="context", row=1, col=2)
        fig.update_xaxes(title_text=f"layer {result.matrix_label}: every pair", row=1, col=2)
    fig.update_layout(**layout(width=1100 if matrix else 900, height=560, legend={"orientation": "h", "y": -0.2}))
    fig.update_xaxes(title_text="layer (embed = the embedding, N = block N's output, the last before the final "
                     "norm)", type="category", row=1, col=1)
    fig.update_yaxes(title_text="cosine similarity", row=1, col=1)
    page = caption_page(cap)
    page.add(plot(fig))
    page.add(notes([f"context {loc.context}: {loc.text} (tokens {', '.join(map(str, loc.positions))})"
                    for loc in result.contexts]))
    return page


