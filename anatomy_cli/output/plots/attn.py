"""`attn --plot`: one head's query x key pattern (bertviz / CircuitsVis style), or a grid of heads at one query."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grid_size
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import token_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.attention import Attention

CMAP = "Blues"


def figure(result: Attention, cap: Caption, *, one_head: bool) -> Figure:
    """Draw an :class:`anatomy_cli.analyses.attention.Attention`.

    ``one_head``: ``result.grid[0, 0]`` as a query (rows, first at the top) x key (columns) heatmap
    with the tokens on both axes. Otherwise one panel per layer in ``result.layers``, heads (rows) x
    keys (columns), from the one query ``result.queries[0]``. Weights in [0, 1] on one colour scale;
    keys a causal model cannot see (after the query) are blank. Returns a matplotlib Figure.
    """
    tokens = [token_label(t) for t in result.tokens]
    if one_head:
        return _one_head(result, tokens, cap)
    return _heads(result, tokens, cap)


def _visible(result: Attention, values: list[list[float]], queries: list[int]) -> list[list[float]]:
    """Blank (NaN) the keys after the query for a causal model: their weight is 0 by construction."""
    if not result.causal:
        return values
    return [[v if k <= q else math.nan for k, v in enumerate(row)] for row, q in zip(values, queries)]


def _one_head(result: Attention, tokens: list[str], cap: Caption) -> Figure:
    queries = list(result.queries)
    values = as_array(_visible(result, result.grid[0, 0].tolist(), queries))
    width, height, cw, ch = grid_size(len(queries), len(tokens), extra_h=3.0)
    fig = new_figure(width, height)
    ax = fig.subplots()
    notes = heatmap(fig, ax, values, cell=(cw, ch), xlabels=tokens, ylabels=[tokens[q] for q in queries],
                    cmap=CMAP, vmin=0.0, vmax=1.0, colorbar="attention weight (each row sums to 1)",
                    xlabel="key token (attended to)", ylabel="query token (attending)", origin="upper")
    caption(fig, cap, notes)
    return fig


def _heads(result: Attention, tokens: list[str], cap: Caption) -> Figure:
    n_layers, n_heads = len(result.layers), len(result.heads)
    q = result.queries[0]
    n = len(tokens)
    cols = 1 if n_layers == 1 else min(n_layers, 6 if n <= 10 else 5 if n <= 20 else 3 if n <= 40 else 2)
    rows = math.ceil(n_layers / cols)
    cw = min(0.45, max(0.15, 2.2 / n)) if cols > 1 else min(0.8, max(0.3, 10.0 / n))
    ch = min(0.3, max(0.1, 1.2 / n_heads)) if cols > 1 else min(0.4, max(0.2, 8.0 / n_heads))
    cw = min(cw, (16.4 / cols - 0.9) / len(tokens))
    ch = min(ch, (20.0 / rows - 0.9) / n_heads)
    width = cols * (len(tokens) * cw + 0.9) + 1.6
    height = rows * (n_heads * ch + (0.9 if rows > 1 else 1.2)) + 1.9
    fig = new_figure(width, height)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    notes: list[str] = []
    for i, layer in enumerate(result.layers):
        ax = axes[i // cols][i % cols]
        values = as_array(_visible(result, result.grid[i, :, 0].tolist(), [q] * n_heads))
        notes = heatmap(fig, ax, values, cell=(cw, ch), xlabels=tokens, ylabels=[str(h) for h in result.heads],
                        cmap=CMAP, vmin=0.0, vmax=1.0, colorbar=None, origin="upper",
                        xlabel="key token" if i // cols == rows - 1 else "",
                        ylabel="head" if i % cols == 0 else "")
        ax.set_title(f"layer {layer}", fontsize=9, pad=3)
    for j in range(n_layers, rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    image = axes[0][0].images[0]
    fig.colorbar(image, ax=axes, label=f"attention weight from query {q} = {tokens[q]}", shrink=0.5, pad=0.01)
    caption(fig, cap, notes)
    return fig
