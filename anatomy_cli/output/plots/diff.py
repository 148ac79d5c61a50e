"""`diff --plot`: weights as a layer x component heat map of the relative change, activations as per-layer curves."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from matplotlib.colors import LogNorm
from matplotlib.ticker import MaxNLocator

from anatomy_cli.models.sites import residual_row
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grid_size
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import set_ticks

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.diff.activations import ActivationDiff
    from anatomy_cli.analyses.diff.weights import WeightsDiff

_LABELS = {"attention": "attention", "ffn": "FFN", "router": "router", "routed_experts": "routed experts",
           "shared_experts": "shared experts", "norm_other": "norms + other"}


def weights_figure(result: WeightsDiff, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.diff.WeightsDiff`.

    Left: ``rel_change`` of each block's components (rows = layers, block 0 at the bottom; columns = the
    components present), log colour scale, a blank cell where there is no such group or the change is 0.
    A component unchanged in every block (e.g. norms copied as they are by a requantization) has no column and
    no line: the footer names it. Right: the same figures as one line per component, x = layer, log y. The
    rows outside the blocks (embeddings, final norm, head) are written in the footer. Returns a matplotlib Figure.
    """
    blocks = [r for r in result.rows if r.layer is not None]
    present = [c for c in _LABELS if any(r.component == c for r in blocks)]
    present += sorted({r.component for r in blocks} - set(present))
    layers = sorted({r.layer for r in blocks if r.layer is not None})
    cell = {(r.layer, r.component): r.rel_change for r in blocks}
    components = [c for c in present if any(cell.get((layer, c)) for layer in layers)] or present
    unchanged = [_LABELS.get(c, c) for c in present if c not in components]
    values = as_array([[cell.get((layer, c)) or None for c in components] for layer in layers])
    finite = values[(values > 0) & ~(values != values)] if values.size else values
    width, height, cw, ch = grid_size(len(layers), len(components), extra_w=8.0)
    fig = new_figure(max(width, 10.0), max(height, 5.0))
    left, right = fig.subplots(1, 2, width_ratios=(max(len(components), 2), 3))
    if finite.size:
        low, high = float(finite.min()), float(finite.max())
        norm = LogNorm(vmin=low, vmax=high if high > low else low * 10)
    else:
        norm = None
    heatmap(fig, left, values, cell=(cw, ch), xlabels=[_LABELS.get(c, c) for c in components],
            ylabels=[str(layer) for layer in layers], cmap="viridis", vmin=0.0, vmax=1.0, norm=norm,
            colorbar="‖W_B − W_A‖ / ‖W_A‖", xlabel="component", ylabel="block", x_rotation=30)
    for c in components:
        ys = [cell.get((layer, c)) for layer in layers]
        right.plot(layers, [math.nan if not v else v for v in ys], marker="o", ms=3, label=_LABELS.get(c, c))
    if finite.size:
        right.set_yscale("log")
    right.set_xlabel("block")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))  # blocks are whole numbers
    right.set_ylabel("relative change ‖W_B − W_A‖ / ‖W_A‖")
    right.grid(alpha=0.3)
    right.legend(loc="best")
    outside = [f"{r.component} {r.rel_change:.3g}" for r in result.rows if r.layer is None]
    notes = [f"{', '.join(unchanged)}: unchanged in every block (rel Δ 0), so not drawn"] if unchanged else []
    if outside:
        notes.append(f"outside the blocks (rel Δ): {', '.join(outside)}")
    notes.append(f"all weights: rel Δ {result.total.rel_change:.4g}, cosine "
                 f"{'-' if result.total.cosine is None else f'{result.total.cosine:.6f}'}")
    caption(fig, cap, notes)
    return fig


def activations_figure(result: ActivationDiff, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.diff.ActivationDiff`: three panels over the residual rows
    (``embed``, then block N's output N; docs/engine.md#layers).

    Top: ``cos`` (at the position) and ``cos_mean`` (over positions). Middle: ``rel_delta``. Bottom:
    ``lens_kl_nats``, with a cross where the two lenses' top tokens differ. Log y for the middle and
    bottom panels when every value is positive. Returns a matplotlib Figure.
    """
    rows = result.layers
    labels = [r.layer for r in rows]
    layers = [residual_row(r.layer) for r in rows]
    width = min(16.0, max(7.0, 0.42 * len(layers) + 3))
    fig = new_figure(width, 8.0)
    top, middle, bottom = fig.subplots(3, 1, sharex=True)
    top.plot(layers, [r.cos for r in rows], marker="o", ms=3, label="cos(h_A, h_B) at the position")
    top.plot(layers, [r.cos_mean for r in rows], marker="s", ms=3, label="mean over positions")
    top.set_ylabel("cosine")
    top.grid(alpha=0.3)
    top.legend(loc="best")
    middle.plot(layers, [r.rel_delta for r in rows], marker="o", ms=3, color="#dd8452")
    middle.set_ylabel("‖h_A − h_B‖ / ‖h_A‖")
    kls = [r.lens_kl_nats for r in rows]
    bottom.plot(layers, kls, marker="o", ms=3, color="#55a868", label="KL(lens_A ‖ lens_B)")
    off = [(residual_row(r.layer), r.lens_kl_nats) for r in rows if not r.lens_agree]
    if off:
        bottom.scatter([x for x, _ in off], [y for _, y in off], marker="x", color="#c44e52", zorder=3,
                       label="top-1 differs")
    bottom.set_ylabel("lens KL (nats)")
    bottom.legend(loc="best")
    for ax, values in ((middle, [r.rel_delta for r in rows]), (bottom, kls)):
        if values and min(values) > 0 and max(values) / min(values) > 30:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    bottom.set_xlabel("layer (embed = the embedding; N = block N's output)")
    pitch = (width - 1.8) * 72 / max(len(layers), 1)
    set_ticks(bottom.xaxis, [str(x) for x in labels], pitch, need_pt=14, positions=layers)
    caption(fig, cap, [f"next token: KL(A ‖ B) {result.kl_nats:.4g} nats; A's top token "
                       f"{result.top_a[0].token} is rank {result.a_top1_rank_in_b} in B"])
    return fig
