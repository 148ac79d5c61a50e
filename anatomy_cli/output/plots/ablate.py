"""`ablate --plot`: the effect of knocking out each layer's attention and MLP as bars, or each head (each routed
expert) as a grid."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import ATTN_COLOUR
from anatomy_cli.output.plots._base import MLP_COLOUR
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grouped_bars
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import set_ticks
from anatomy_cli.output.plots._base import symmetric_limit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.ablate import Ablation


def figure(result: Ablation, n_heads: int, what: str, cap: Caption) -> Figure:
    """Draw an :class:`anatomy_cli.analyses.ablate.Ablation` (``what``: the metric, e.g. ``log p(·much)``).

    Rows with component ``attn``/``mlp``: the ``effect`` per layer as side-by-side bars (negative: the
    component helped the target). Rows with component ``head`` (``expert``): a layer x head (x expert) heatmap
    of ``effect``, diverging and centred at 0; ``n_heads``: the grid's columns (heads, or routed experts).
    Returns a matplotlib Figure.
    """
    rows = result.rows
    layers = sorted({r.layer for r in rows})
    unit = "nats" if result.metric == "logprob" else "logits"
    label = f"effect on {what} ({unit}): ablated − intact"
    kind = result.grid
    if kind == "expert":
        how = ("router logit set to −inf before the top k" if result.mode == "reroute"
               else "weight set to 0 where chosen")
        notes = [f"intact run: {what} = {result.clean_metric:.4f}; each routed expert's {how}, at every position"]
    else:
        by = "zeros" if result.mode == "zero" else "its mean over the positions"
        notes = [f"intact run: {what} = {result.clean_metric:.4f}; each {kind or 'component'} replaced at every "
                 f"position by {by}"]
    if kind is not None:
        grid = [[float("nan")] * n_heads for _ in layers]
        for r in rows:
            assert r.index is not None  # a grid's rows: each a head or an expert
            grid[layers.index(r.layer)][r.index] = r.effect
        values = as_array(grid)
        limit = symmetric_limit(values)
        cw = min(0.6, max(0.2, 9.0 / n_heads))
        ch = min(0.45, max(0.2, 8.0 / len(layers)))
        fig = new_figure(max(6.0, n_heads * cw + 3.4), max(3.8, len(layers) * ch + 2.8))
        ax = fig.subplots()
        notes += heatmap(fig, ax, values, cell=(cw, ch), xlabels=[str(h) for h in range(n_heads)],
                         ylabels=[str(l) for l in layers], cmap="RdBu_r", vmin=-limit, vmax=limit, colorbar=label,
                         xlabel=kind, ylabel="layer", x_rotation=0)
    else:
        width = min(17.0, max(8.0, 0.32 * len(layers) + 3.0))
        fig = new_figure(width, 5.4)
        ax = fig.subplots()
        effect = {(r.layer, r.component): r.effect for r in rows}
        grouped_bars(ax, layers, [("attention ablated", [effect.get((l, "attn")) for l in layers], ATTN_COLOUR),
                                  ("MLP ablated", [effect.get((l, "mlp")) for l in layers], MLP_COLOUR)])
        set_ticks(ax.xaxis, [str(l) for l in layers], (width - 1.5) * 72 / max(len(layers), 1), need_pt=14,
                  positions=layers)
        ax.set_xlabel("layer (block)")
        ax.set_ylabel(label)
        ax.legend(loc="best")
    caption(fig, cap, notes)
    return fig
