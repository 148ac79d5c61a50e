"""`generate --plot FILE.html`: the coefficient sweep (target log-probability shift and KL against the
coefficient) or, with ``--lens``, the block x step grid of the chosen token's probability; hover gives the
exact numbers (and for the sweep, each coefficient's continuation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import token
from anatomy_cli.output.html._charts import clean
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks

if TYPE_CHECKING:
    from anatomy_cli.analyses.generate import Continuation
    from anatomy_cli.analyses.generate import Sweep
    from anatomy_cli.output.html.markup import Part
    from anatomy_cli.output.plots.caption import Caption

KL_COLOUR, SHIFT_COLOUR = "#4c72b0", "#dd8452"
LENS_NOTE = ("each cell: the probability of the token chosen at that step under the logit lens "
             "softmax(unembed(final_norm(h))) of that block's output; the last block's is the model's own")


def figure(result: Continuation | Sweep, cap: Caption) -> Page:
    """A page with a :class:`~anatomy_cli.analyses.generate.Sweep` or a ``--lens``
    :class:`~anatomy_cli.analyses.generate.Continuation` drawn as the PNG."""
    from anatomy_cli.analyses.generate import Sweep

    page = caption_page(cap)
    if isinstance(result, Sweep):
        page.add(_sweep(result))
        page.add(notes(["both at the first generated position: the next-token distribution right after the "
                        "prompt; hover a point for its continuation"]))
    else:
        page.add(_lens(result))
        page.add(notes([LENS_NOTE, "framed: the first block whose lens ranks the chosen token first"]))
    return page


def _sweep(sweep: Sweep) -> Part:
    coefs, kls, shifts = sweep.points()
    by_coef = {r.coef: r for r in sweep.rows}
    texts = [esc(by_coef[c].text[:80]).replace("\n", "↵") for c in coefs]
    has_target = sweep.target is not None
    titles = (["target log-probability shift"] if has_target else []) + ["KL from the unsteered distribution"]
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    if has_target:
        fig.add_trace(go.Scatter(x=coefs, y=clean(shifts), mode="lines+markers", line={"color": SHIFT_COLOUR},
                                 name="target shift", customdata=texts,
                                 hovertemplate="coef %{x}<br>shift %{y:.4f} nats<br>%{customdata}<extra></extra>"),
                      row=1, col=1)
        fig.update_yaxes(title_text=f"shift of log p({token(sweep.target, 24)}) (nats)", row=1, col=1)
    col = len(titles)
    fig.add_trace(go.Scatter(x=coefs, y=kls, mode="lines+markers", line={"color": KL_COLOUR}, name="KL",
                             customdata=texts,
                             hovertemplate="coef %{x}<br>KL %{y:.4f} nats<br>%{customdata}<extra></extra>"),
                  row=1, col=col)
    fig.update_yaxes(title_text="KL(P_coef ‖ P_0) (nats)", row=1, col=col)
    fig.update_xaxes(title_text="steering coefficient", tickvals=coefs)
    fig.update_layout(**layout(width=1000 if has_target else 620, height=460, showlegend=False))
    return plot(fig)


def _lens(c: Continuation) -> Part:
    z = c.lens_grid()
    n_rows, n_cols = len(z), len(c.steps)
    labels = [token(st.chosen.token, 12) for st in c.steps]
    hover = [[f"step {s}: {token(c.steps[s].chosen.token, 24)}<br>block {b}<br>"
              + ("not fitted: no reading" if z[b][s] is None else f"probability {z[b][s]:.4f}")
              for s in range(n_cols)] for b in range(n_rows)]
    heat = go.Heatmap(z=z, customdata=hover, hovertemplate="%{customdata}<extra></extra>", colorscale="Viridis",
                      zmin=0.0, zmax=1.0, xgap=1, ygap=1,
                      colorbar={"title": {"text": "probability of the chosen token", "side": "right"}})
    fig = go.Figure(heat)
    for s, st in enumerate(c.steps):
        if st.first_top1_layer is not None:
            b = st.first_top1_layer
            # a frame, not a fill: the template's shape defaults shade a rectangle (black, opacity 0.3)
            fig.add_shape(type="rect", x0=s - 0.5, x1=s + 0.5, y0=b - 0.5, y1=b + 0.5, layer="above",
                          fillcolor="rgba(0,0,0,0)", opacity=1, line={"color": "white", "width": 3})
    width, height = heat_size(n_rows, n_cols)
    fig.update_layout(**layout(width=width, height=height))
    fig.update_xaxes(title_text="token generated at each step", **ticks(labels), showgrid=False,
                     tickangle=-60 if n_cols > 8 else 0)
    fig.update_yaxes(title_text="block (its output, resid_post)", **ticks([str(b) for b in range(n_rows)], 40),
                     showgrid=False)
    return plot(fig)
