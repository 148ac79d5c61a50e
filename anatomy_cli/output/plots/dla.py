"""`dla --plot`: direct logit attribution as bars per layer (attention and MLP side by side), or per head."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output import statistics
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import ATTN_COLOUR
from anatomy_cli.output.plots._base import MLP_COLOUR
from anatomy_cli.output.plots._base import OTHER_COLOUR
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grouped_bars
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import set_ticks
from anatomy_cli.output.plots._base import symmetric_limit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.dla import Attribution


def figure(result: Attribution, n_layers: int, n_heads: int, what: str, cap: Caption) -> Figure:
    """Draw an :class:`anatomy_cli.analyses.dla.Attribution` (``what``: e.g. ``logit(·Berlin)``).

    Left panel: the rows without a layer (``embed``, ``pos_embed``, ``bias``) as grey bars. Right panel:
    per layer, the ``L{l}.attn`` and ``L{l}.mlp`` contributions as side-by-side bars; with ``--by head``,
    the MLP bars stay and a second panel shows the ``L{l}.H{h}`` rows as a layer x head heatmap
    (diverging, centred at 0; the ``L{l}.attn_bias`` rows are listed in the footer when not zero).
    Units: logit. Returns a matplotlib Figure.
    """
    rows = result.rows
    by_name = statistics.by_component(rows)
    outside = [r for r in rows if r.layer is None]
    heads = [r for r in rows if r.head is not None]
    layers = list(range(n_layers))
    width = min(17.0, max(8.0, 0.3 * n_layers + 4.0)) + (5.0 if heads else 0)
    fig = new_figure(width, 5.6 if not heads else max(5.6, min(12.0, 0.24 * n_layers + 2.8)))
    ratios = (1.2, 0.3 * n_layers + 2, 5.0)[:3 if heads else 2]
    panels = fig.subplots(1, len(ratios), width_ratios=ratios)
    side, ax = panels[0], panels[1]
    ax.sharey(side)  # one scale: a small embedding term looks small

    side.bar(range(len(outside)), [r.contribution for r in outside], color=OTHER_COLOUR, width=0.6)
    for i, r in enumerate(outside):
        side.annotate(f"{r.contribution:+.3f}", (i, r.contribution), ha="center", fontsize=7,
                      va="bottom" if r.contribution >= 0 else "top", xytext=(0, 2 if r.contribution >= 0 else -2),
                      textcoords="offset points")
    side.set_xticks(range(len(outside)), [r.component for r in outside], rotation=90)
    side.axhline(0, color="black", lw=0.8)
    side.grid(axis="y", alpha=0.3)
    side.set_ylabel(f"contribution to {what} (logits)")

    series = [] if heads else [("attention", [by_name.get(f"L{l}.attn") for l in layers], ATTN_COLOUR)]
    series.append(("MLP", [by_name.get(f"L{l}.mlp") for l in layers], MLP_COLOUR))
    grouped_bars(ax, layers, series)
    pitch = (width - 1.5) * ratios[1] / sum(ratios) * 72 / max(n_layers, 1)
    set_ticks(ax.xaxis, [str(l) for l in layers], pitch, need_pt=14)
    ax.set_xlabel("layer (block)")
    ax.legend(loc="best")
    ax.set_title("per layer" if not heads else "MLP per layer")

    notes = [f"rows add up to {result.total:.4f}; the model's own {what} is {result.logit:.4f}"]
    if heads:
        grid = [[float("nan")] * n_heads for _ in layers]
        for r in heads:
            assert r.layer is not None and r.head is not None  # heads: the rows with a head
            grid[r.layer][r.head] = r.contribution
        values = as_array(grid)
        limit = symmetric_limit(values)
        heatmap(fig, panels[2], values, cell=(5.0 / max(n_heads, 1) * 0.6, (0.24 * n_layers) / max(n_layers, 1)),
                xlabels=[str(h) for h in range(n_heads)], ylabels=[str(l) for l in layers], cmap="RdBu_r",
                vmin=-limit, vmax=limit, colorbar=f"head's contribution to {what} (logits)", xlabel="head",
                ylabel="layer", x_rotation=0)
        panels[2].set_title("attention, per head")
        biases = [f"{r.component} {r.contribution:+.3f}" for r in rows
                  if r.component.endswith(".attn_bias") and abs(r.contribution) > 1e-9]
        if biases:
            notes.append("attention output bias: " + ", ".join(biases[:8]) + (" …" if len(biases) > 8 else ""))
    caption(fig, cap, notes)
    return fig
