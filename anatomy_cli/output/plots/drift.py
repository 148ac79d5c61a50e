"""`drift --plot`: the word's similarity per layer for each pair of contexts, the anisotropy baseline as a band."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import set_ticks
from anatomy_cli.output.plots._base import shorten

if TYPE_CHECKING:
    from collections.abc import Iterable

    from matplotlib.figure import Figure

    from anatomy_cli.analyses.drift import DriftResult


def figure(result: DriftResult, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.drift.DriftResult`.

    One line per pair of contexts (``pairs[i].similarity``, x = embed, blocks 0..L−1), a thicker line for the mean
    over pairs when there are several (``similarity``), the baseline (``baseline``, dashed) inside a band
    from the lowest to the highest context's own baseline (``baseline_by_context``). With ``--matrix`` a
    second panel shows the pairwise matrix at that layer. The contexts are listed under the picture.
    Returns a matplotlib Figure.
    """
    layers = list(range(result.n_layers + 1))  # x positions; their names are result.labels
    n_ctx = len(result.contexts)
    matrix = result.matrix is not None
    width = min(14.0, max(7.5, 0.26 * len(layers) + 3.5)) + (4.5 if matrix else 0)
    fig = new_figure(width, 5.4 + 0.16 * n_ctx)
    if matrix:
        ax, mat_ax = fig.subplots(1, 2, width_ratios=(width - 4.5, 4.5))
    else:
        ax = fig.subplots()

    for pair in result.pairs:
        ax.plot(layers, _nan(pair.similarity), marker="o", ms=3, lw=1.4,
                label=f"contexts {pair.context_a} and {pair.context_b}")
    if len(result.pairs) > 1:
        ax.plot(layers, _nan(result.similarity), color="black", lw=2.6, label=f"mean of {len(result.pairs)} pairs")
    low = [_min(col) for col in zip(*result.baseline_by_context)]
    high = [_max(col) for col in zip(*result.baseline_by_context)]
    ax.fill_between(layers, low, high, color="grey", alpha=0.25, lw=0,
                    label="baseline range over contexts" if n_ctx > 1 else None)
    ax.plot(layers, _nan(result.baseline), color="grey", ls="--", lw=1.4,
            label="baseline: mean cosine to the other tokens of its context")
    ax.set_xlabel("layer (embed = the embedding, N = block N's output, the last before the final norm)")
    ax.set_ylabel("cosine similarity")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    pitch = (width - (4.5 if matrix else 0) - 1.6) * 72 / len(layers)
    set_ticks(ax.xaxis, [str(x) for x in result.labels], pitch, need_pt=14)

    if result.matrix is not None:
        values = as_array(result.matrix)
        names = [str(loc.context) for loc in result.contexts]
        side = 3.6 / max(n_ctx, 1)
        heatmap(fig, mat_ax, values, cell=(side, side), xlabels=names, ylabels=names, cmap="viridis",
                vmin=min(0.0, float(values.min())), vmax=1.0, colorbar="cosine similarity",
                cells=[[f"{v:.2f}" for v in row] for row in result.matrix], xlabel="context", ylabel="context",
                x_rotation=0)
        mat_ax.invert_yaxis()  # context 1 at the top, like the table
        mat_ax.set_title(f"layer {result.matrix_label}: every pair")

    notes = [f"context {loc.context}: {shorten(loc.text, 90)} (token{'s' if len(loc.positions) > 1 else ''} "
             f"{', '.join(map(str, loc.positions))})"
             for loc in result.contexts]
    caption(fig, cap, notes)
    return fig


def _nan(values: Iterable[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]


def _min(values: Iterable[float | None]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return min(finite) if finite else math.nan


def _max(values: Iterable[float | None]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return max(finite) if finite else math.nan
