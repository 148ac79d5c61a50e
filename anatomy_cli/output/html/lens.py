"""`lens --plot FILE.html`: the logit-lens grid, layers x positions; hovering a cell shows its top tokens.

Each cell's hover text names the input token at that position, the layer, the chosen statistic and the
cell's top tokens with probabilities (top 5 when the grid was computed with ``k >= 5``, as the lens
command does for HTML). About 0.4 kB of hover text per cell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from anatomy_cli.output import statistics
from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import token
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks

if TYPE_CHECKING:
    from anatomy_cli.analyses.lens import LensGrid
    from anatomy_cli.output.html.markup import Part
    from anatomy_cli.output.plots.caption import Caption

TOP = 5  # tokens listed per cell in the hover text
CELL_TEXT_COLUMNS = 40  # beyond this many positions the cells are too narrow to name their token


def figure(grid: LensGrid, stat: str, tokens: Sequence[str], cap: Caption) -> Page:
    """A page with a :class:`anatomy_cli.analyses.lens.LensGrid` drawn as in the PNG: ``grid.stat(stat)``
    as colour, the embed row at the bottom, columns labelled with ``tokens`` (the input pieces at
    ``grid.positions``), each cell naming its top token; the hover text gives the exact numbers."""
    page = caption_page(cap)
    page.add(part(grid, stat, tokens))
    lines = [f"each cell: the top token of {statistics.lens_reading(grid.lens)} at that layer and position; colour: "
             + statistics.LENS[stat].label + "; hover a cell for its top tokens"]
    if grid.target_id is not None:
        lines.append(f"framed: cells whose top token is the target {grid.target_token}")
    page.add(notes(lines))
    return page


def part(grid: LensGrid, stat: str, tokens: Sequence[str], *, div_id: str | None = None) -> Part:
    """The lens heatmap alone (for ``anatomy report``)."""
    values = grid.stat(stat).tolist()
    probs = grid.top_logprobs.exp().tolist()
    n_rows, n_cols = len(grid.layers), len(grid.positions)
    hover = [[_hover(grid, stat, tokens, r, c, values[r][c], probs[r][c]) for c in range(n_cols)]
             for r in range(n_rows)]
    described = statistics.LENS[stat]
    colours, title, limits = described.colorscale, described.label, described.limits
    z = [[math.log10(v) for v in row] for row in values] if described.log else values
    bar: dict[str, object] = {"title": {"text": esc(title), "side": "right"}}
    if described.log:
        top = max(max(row) for row in values)
        vals = [10 ** e for e in range(0, int(math.log10(max(top, 1))) + 1)]
        bar.update(tickvals=[math.log10(v) for v in vals], ticktext=[f"{v:,}" for v in vals])
    heat = go.Heatmap(z=z, customdata=hover, hovertemplate="%{customdata}<extra></extra>", colorscale=colours,
                      colorbar=bar, zmin=limits[0] if limits else None, zmax=limits[1] if limits else None,
                      xgap=1, ygap=1)
    if n_cols <= CELL_TEXT_COLUMNS:
        heat.update(text=[[token(grid.top_tokens[r][c][0], 8) for c in range(n_cols)] for r in range(n_rows)],
                    texttemplate="%{text}", textfont={"size": 10})
    fig = go.Figure(heat)
    width, height = heat_size(n_rows, n_cols, cell_w=62 if n_cols <= CELL_TEXT_COLUMNS else 14)
    fig.update_layout(**layout(width=width, height=height))
    fig.update_xaxes(title_text="input token at each position", **ticks([token(t, 12) for t in tokens]),
                     tickangle=-60 if n_cols > 8 else 0, showgrid=False)
    fig.update_yaxes(title_text="layer (embed, then block N's output)",
                     **ticks([str(layer) for layer in grid.layers], 40), showgrid=False)
    if grid.target_id is not None:
        top = grid.top_ids[..., 0].tolist()
        for r in range(n_rows):
            for c in range(n_cols):
                if top[r][c] == grid.target_id:
                    fig.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                                  line={"color": "white", "width": 2})
    return plot(fig, div_id=div_id)


def _number(value: float, stat: str) -> str:
    if stat == "rank":
        return f"#{int(value)}"
    return f"{value:.4f}"


def _hover(grid: LensGrid, stat: str, tokens: Sequence[str], r: int, c: int, value: float, probs: list[float]) -> str:
    position = grid.positions[c]
    lines = [f"position {position}: {token(tokens[c], 24)}", f"layer {grid.layers[r]}",
             f"{stat}: {_number(value, stat)}", f"top {min(TOP, len(probs))}:"]
    lines += [f"{i + 1}. {token(grid.top_tokens[r][c][i], 24)}  {p:.4f}" for i, p in enumerate(probs[:TOP])]
    if grid.target_ranks is not None and grid.target_logprobs is not None:
        rank = int(grid.target_ranks[r, c])
        p = math.exp(float(grid.target_logprobs[r, c]))
        lines.append(f"target {token(grid.target_token, 24)}: #{rank}  {p:.4f}")
    return "<br>".join(lines)
