"""`params --plot`: horizontal bars per component (the article's table), and per block with --per-layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.ticker import FuncFormatter

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import drawable
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import set_ticks
from anatomy_cli.output.statistics import PARAMS_COLOURS as _COLOURS
from anatomy_cli.output.statistics import PARAMS_LABELS as _LABELS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.params.breakdown import ParamsResult


def figure(result: ParamsResult, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.params.ParamsResult`.

    Left (or only) panel: one bar per row of ``rows`` (``parameters``, top to bottom in table order),
    labelled with the count and the share of ``total``; MoE models add a hatched bar of ``active``
    parameters. With ``--per-layer`` a second panel stacks each block's ``parameters`` by category.
    Returns a matplotlib Figure.
    """
    rows = list(result.rows)
    per_layer = result.layers is not None
    n_blocks = len(result.layers) if result.layers is not None else 0
    height = max(3.2, 0.5 * len(rows) + 2.0, (0.2 * n_blocks + 2.2) if per_layer else 0)
    fig = new_figure(14.0 if per_layer else 9.5, min(height, 13.0))
    if per_layer:
        ax, layer_ax = fig.subplots(1, 2, width_ratios=(1.1, 1))
    else:
        ax = fig.subplots()

    y = list(range(len(rows)))[::-1]  # first row at the top, as in the table
    ax.barh(y, [r.parameters for r in rows], color=[_COLOURS.get(r.key, "#4c72b0") for r in rows],
            height=0.65)
    has_active = any(r.active is not None for r in rows)
    if has_active:
        ax.barh(y, [r.active or 0 for r in rows], height=0.3, color="none", edgecolor="black", hatch="///",
                label="active per token")
        ax.legend(loc="lower right")
    ax.set_yticks(y, [drawable(r.label) for r in rows])
    top = max((r.parameters for r in rows), default=1) or 1
    for yi, r in zip(y, rows):
        ax.text(r.parameters + top * 0.01, yi, f"{r.parameters:,}  ({r.share:.1%})", va="center", fontsize=8)
    ax.set_xlim(0, top * 1.45)
    ax.set_xlabel("parameters")
    ax.xaxis.set_major_formatter(FuncFormatter(_count))
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"total {result.total:,}" + (f" · active {result.moe.active:,}" if result.moe and
                                                result.moe.active else ""))

    if per_layer:
        _per_layer(layer_ax, result, height)
    caption(fig, cap, list(result.notes)[:3])
    return fig


def _count(value: float, _pos: object = None) -> str:
    """Axis ticks: 0, 500k, 40M, 1.5B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _per_layer(ax: Axes, result: ParamsResult, height: float) -> None:
    blocks = list(result.layers or ())  # --per-layer: the blocks
    categories = [c for c in _LABELS if any(b.parameters.get(c, 0) for b in blocks)]
    y = [b.index for b in blocks]
    left = [0] * len(blocks)
    for c in categories:
        widths = [b.parameters.get(c, 0) for b in blocks]
        ax.barh(y, widths, left=left, height=0.8, color=_COLOURS[c], label=_LABELS[c])
        left = [a + w for a, w in zip(left, widths)]
    ax.invert_yaxis()  # block 0 at the top, as in the table
    pitch = (min(height, 13.0) - 2.2) * 72 / max(len(blocks), 1)
    set_ticks(ax.yaxis, [str(i) for i in y], pitch, need_pt=10, positions=y)
    ax.set_ylabel("block")
    ax.set_xlabel("parameters per block")
    ax.xaxis.set_major_formatter(FuncFormatter(_count))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(categories), frameon=False)
    ax.grid(axis="x", alpha=0.3)
