"""`route --plot FILE.html`: MoE blocks x positions coloured by the top expert; hovering a cell shows the chosen
experts with their weights, the router's entropy and margin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import token
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks
from anatomy_cli.output.statistics import EXPERT_COLOURS as COLOURS

if TYPE_CHECKING:
    from anatomy_cli.output.plots.caption import Caption
    from anatomy_cli.tasks.route import RouteResult

PALETTE = len(COLOURS)


def stepped_scale() -> list[list[object]]:
    """A colorscale with one flat band per colour: z = i (zmin -0.5, zmax PALETTE - 0.5) is ``COLOURS[i]``, as
    the PNG's tab20 colormap. Band edges are ``(i + edge) / PALETTE``, one float per edge: plotly.js drops a
    scale whose positions ever decrease (``i / 20 + 1 / 20`` is 0.9500000000000001, then 0.95) for its default,
    which drew every cell in near-identical blues."""
    return [[(i + edge) / PALETTE, COLOURS[i]] for i in range(PALETTE) for edge in (0, 1)]


def figure(result: RouteResult, tokens: Sequence[str], cap: Caption) -> Page:
    page = caption_page(cap)
    blocks, ids = result.top_experts()
    hover: dict[tuple[int, int], str] = {}
    for r in result.rows:
        chosen = "<br>".join(f"expert {e}: {w:.4f}" for e, w in zip(r.experts, r.weights))
        margin = "n/a" if r.margin is None else f"{r.margin:.4f}" + (" (near tie)" if r.near_tie else "")
        hover[(r.block, r.position)] = (f"block {r.block} · position {r.position}: {token(r.token, 24)}<br>{chosen}"
                                        f"<br>entropy {r.entropy:.4f} nats<br>margin {margin}")
    n_cols = len(ids[0]) if ids else 0
    scale = stepped_scale()
    heat = go.Heatmap(z=[[i % PALETTE for i in row] for row in ids], zmin=-0.5, zmax=PALETTE - 0.5, colorscale=scale,
                      showscale=False, xgap=1, ygap=1,
                      customdata=[[hover[(b, p)] for p in range(n_cols)] for b in blocks],
                      hovertemplate="%{customdata}<extra></extra>",
                      text=[[str(i) for i in row] for row in ids], texttemplate="%{text}", textfont={"size": 10})
    fig = go.Figure(heat)
    width, height = heat_size(len(blocks), n_cols)
    fig.update_layout(**layout(width=width, height=height))
    fig.update_xaxes(title_text="input token at each position", **ticks([token(t, 12) for t in tokens]),
                     tickangle=-60 if n_cols > 8 else 0, showgrid=False)
    fig.update_yaxes(title_text="MoE block", **ticks([str(b) for b in blocks], 40), showgrid=False)
    page.add(plot(fig))
    page.add(notes([f"each cell: the expert with the largest weight (of {result.n_experts}; top {result.top_k} "
                    f"chosen); colours repeat every {PALETTE} experts; hover a cell for the chosen experts' weights, "
                    f"the entropy and the margin (near tie below {result.near_tie_threshold})"]))
    return page
