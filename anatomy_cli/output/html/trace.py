"""`trace --plot FILE.html`: cosines and norms per layer, with each layer's logit-lens token in the hover text."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy_cli.output.html import Page, caption_page, esc, notes, token
from anatomy_cli.output.html._charts import clean
from anatomy_cli.output.html._page import layout, plot


def figure(result: Any, cap: Any) -> Page:
    """A page with a :class:`anatomy_cli.analyses.trace.Trace` drawn as the PNG: cosines (top) and norms
    (bottom) per row (``embed``, then blocks 0..L−1); hovering a row shows its logit-lens top token and probability."""
    page = caption_page(cap)
    page.add(part(result))
    page.add(notes(["rows: embed = the embedding, N = block N's output (before the final norm); hover a point "
                    "for the row's logit-lens top token"]))
    return page


def part(result: Any, *, div_id: str | None = None) -> Any:
    """The two panels alone (for ``anatomy report``)."""
    rows = result.layers
    layers = [str(r.layer) for r in rows]  # embed, then block numbers: a category axis
    lens = [(f"{token(r.lens_token, 24)} {r.lens_probability:.4f}" if r.lens_token is not None else "–")
            for r in rows]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.55, 0.45])
    for key, label in (("cos_to_embedding", "cos to embedding (embed row)"),
                       ("cos_to_previous", "cos to previous row")):
        fig.add_trace(go.Scatter(x=layers, y=clean([getattr(r, key) for r in rows]), mode="lines+markers",
                                 name=esc(label), customdata=lens,
                                 hovertemplate=f"layer %{{x}}<br>{esc(label)}: %{{y:.4f}}<br>lens: %{{customdata}}"
                                               "<extra></extra>"), row=1, col=1)
    norms = []
    for key, label in (("resid_norm", "‖h‖ residual"), ("attn_norm", "‖attn_out‖ added"),
                       ("mlp_norm", "‖mlp_out‖ added")):
        values = clean([getattr(r, key) for r in rows])
        norms += [v for v in values if v]
        fig.add_trace(go.Scatter(x=layers, y=values, mode="lines+markers", name=esc(label),
                                 hovertemplate=f"layer %{{x}}<br>{esc(label)}: %{{y:.4f}}<extra></extra>"),
                      row=2, col=1)
    fig.update_layout(**layout(width=max(700, min(1300, 36 * len(layers) + 300)), height=680,
                               legend={"orientation": "h", "x": 0, "y": -0.12, "yanchor": "top"},
                               margin={"l": 70, "r": 30, "t": 90, "b": 60}))
    fig.update_yaxes(title_text="cosine similarity", row=1, col=1)
    fig.update_yaxes(title_text="L2 norm", type="log" if norms and max(norms) / min(norms) > 30 else "linear",
                     row=2, col=1)
    fig.update_xaxes(type="category")
    fig.update_xaxes(title_text="layer (embed, then block N's output)", row=2, col=1)
    if any(r.lens_token is not None for r in rows):
        fig.update_xaxes(tickmode="array", tickvals=layers, ticktext=[token(r.lens_token, 10) for r in rows],
                         tickangle=-60, side="top", showticklabels=True, row=1, col=1)
        fig.update_xaxes(title_text="logit lens: top token at each layer", title_standoff=2, row=1, col=1)
    return plot(fig, div_id=div_id)
