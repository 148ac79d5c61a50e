"""`trace --plot FILE.html`: cosines and norms per layer, with each layer's logit-lens token in the hover text."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import token
from anatomy_cli.output.html._charts import clean
from anatomy_cli.output.html._page import TOOLBAR_PX
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot

if TYPE_CHECKING:
    from anatomy_cli.analyses.trace import Trace
    from anatomy_cli.output.html.markup import Part
    from anatomy_cli.output.plots.caption import Caption


def figure(result: Trace, cap: Caption) -> Page:
    """A page with a :class:`anatomy_cli.analyses.trace.Trace` drawn as the PNG: cosines (top) and norms
    (bottom) per row (``embed``, then blocks 0..L−1); hovering a row shows its logit-lens top token and probability."""
    page = caption_page(cap)
    page.add(part(result))
    page.add(notes(["rows: embed = the embedding, N = block N's output (before the final norm); hover a point "
                    "for the row's logit-lens top token"]))
    return page


LABEL_CHARS = 10       # a lens token written at most this long above the top panel
LABEL_ANGLE = 60       # degrees, rising to the right
CHAR_PX = 7.5          # the width of one character at the page's 12 px font, generously
TITLE_PX = 22          # the axis title's line above the labels


def label_margins(labels: list[str]) -> tuple[int, int]:
    """The figure's top and right margins (px) that hold the rotated lens labels: the toolbar's band, the axis
    title, then the longest label's rise; on the right the last label's run past its tick."""
    longest = max((len(html.unescape(t)) for t in labels), default=0) * CHAR_PX
    rise = longest * math.sin(math.radians(LABEL_ANGLE))
    run = len(html.unescape(labels[-1])) * CHAR_PX * math.cos(math.radians(LABEL_ANGLE)) if labels else 0.0
    return int(TOOLBAR_PX + TITLE_PX + rise + 12), int(max(30.0, run + 12))


def part(result: Trace, *, div_id: str | None = None) -> Part:
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
    labels = [token(r.lens_token, LABEL_CHARS) for r in rows]
    shown = any(r.lens_token is not None for r in rows)
    top, right = label_margins(labels) if shown else (90, 30)
    fig.update_layout(**layout(width=max(700, min(1300, 36 * len(layers) + 300)), height=680 + top - 90,
                               legend={"orientation": "h", "x": 0, "y": -0.12, "yanchor": "top"},
                               margin={"l": 70, "r": right, "t": top, "b": 60}))
    fig.update_yaxes(title_text="cosine similarity", row=1, col=1)
    fig.update_yaxes(title_text="L2 norm", type="log" if norms and max(norms) / min(norms) > 30 else "linear",
                     row=2, col=1)
    fig.update_xaxes(type="category")
    fig.update_xaxes(title_text="layer (embed, then block N's output)", row=2, col=1)
    if shown:
        fig.update_xaxes(tickmode="array", tickvals=layers, ticktext=labels, tickangle=-LABEL_ANGLE, side="top",
                         showticklabels=True, automargin=False, row=1, col=1)
        fig.update_xaxes(title_text="logit lens: top token at each layer", title_standoff=2, row=1, col=1)
    return plot(fig, div_id=div_id)
