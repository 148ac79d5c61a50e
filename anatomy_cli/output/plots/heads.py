"""`heads --plot`: a layer x head heatmap of the chosen score (--sort), or of all five scores side by side."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.patches import Rectangle

from anatomy_cli.output import statistics
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.heads import Heads

SCORES = ("entropy", "first_token", "prev_token", "induction", "duplicate_token")
_LABELS = {key: s.label for key, s in statistics.HEADS.items()}


def figure(result: Heads, n_layers: int, n_heads: int, cap: Caption, top: int | None = None) -> Figure:
    """Draw an :class:`anatomy_cli.analyses.heads.Heads`: for ``result.sort`` (or, without one, for each
    of the five scores) a heatmap with layer 0..n_layers-1 as rows (0 at the bottom) and head
    0..n_heads-1 as columns, every head coloured by its score. ``top``: the first ``top`` rows of
    ``result`` (the ``--top`` heads, in ``--sort`` order) are framed and numbered by rank. Weights share
    the scale [0, 1]; entropy runs from 0 to its largest value. Returns a matplotlib Figure.
    """
    scores = (result.sort,) if result.sort else SCORES
    grids = {s: [[math.nan] * n_heads for _ in range(n_layers)] for s in scores}
    for row in result.rows:
        for s in scores:
            grids[s][row.layer][row.head] = getattr(row, s)
    panels = len(scores)
    cw = min(0.5, max(0.12, (2.2 if panels > 1 else 9.0) / n_heads), (12.0 / panels) / n_heads)
    ch = min(0.4, max(0.12, 7.5 / n_layers), 10.0 / n_layers)
    width = panels * (n_heads * cw + 0.45) + 2.6
    height = n_layers * ch + 2.8
    fig = new_figure(width, height)
    axes = list(fig.subplots(1, panels, squeeze=False, sharey=True)[0])
    weights = [ax for ax, s in zip(axes, scores) if s != "entropy"]
    for ax, s in zip(axes, scores):
        values = as_array(grids[s])
        if s == "entropy":
            finite = values[np.isfinite(values)]
            vmax = float(finite.max()) if finite.size else 1.0
            limits, cmap, bar = (0.0, vmax or 1.0), statistics.HEADS[s].cmap, _LABELS[s]
        else:
            # The weights share one scale, [0, 1], and one colour bar.
            fixed = statistics.HEADS[s].limits
            assert fixed is not None  # the weights' statistics declare [0, 1]
            limits, cmap, bar = fixed, statistics.HEADS[s].cmap, None
        heatmap(fig, ax, values, cell=(cw, ch), xlabels=[str(h) for h in range(n_heads)],
                ylabels=[str(layer) for layer in range(n_layers)], cmap=cmap, vmin=limits[0], vmax=limits[1],
                colorbar=bar, xlabel="head", ylabel="layer" if ax is axes[0] else "", x_rotation=0)
        ax.set_title(s)
        for rank, row in enumerate(result.rows[:top] if top else (), start=1):
            ax.add_patch(Rectangle((row.head - 0.5, row.layer - 0.5), 1, 1, fill=False, edgecolor="#e4572e",
                                   linewidth=1.6, label=f"top {rank}"))
            if cw >= 0.2 and ch >= 0.2:
                ax.text(row.head, row.layer, str(rank), ha="center", va="center", fontsize=7, color="white",
                        fontweight="bold")
    if weights:
        label = _LABELS[scores[0]] if len(scores) == 1 else "mean attention weight (first_token … duplicate_token)"
        fig.colorbar(weights[0].images[0], ax=weights, label=label, shrink=0.8, pad=0.01)
    notes = []
    if top and top < result.n_heads_total:
        notes.append(f"framed: the top {top} of {result.n_heads_total} heads by {result.sort or 'layer, head'} "
                     "(--top), numbered by rank")
    on = "the prompt" if result.measured_on == "prompt" else "the random sequence"
    notes.append(f"entropy, first token, previous token measured on {on}; induction and duplicate token on "
                 f"{result.seq_len} random tokens repeated twice (seed {result.seed})")
    caption(fig, cap, notes)
    return fig
