"""`trace --plot`: cosines per layer on one panel, norms on a second, the logit lens's top token as labels."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import set_ticks
from anatomy_cli.output.plots._base import thin
from anatomy_cli.output.plots._base import token_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.trace import Trace


def figure(result: Trace, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.trace.Trace`.

    Top panel: ``cos_to_embedding`` and ``cos_to_previous`` (lines, x = the rows ``embed``, 0..L−1, None as a gap),
    with each layer's lens token (``lens_token``) along the top edge. Bottom panel: ``resid_norm``,
    ``attn_norm``, ``mlp_norm`` (lines; log scale when they span more than 30x).
    Returns a matplotlib Figure.
    """
    rows = result.layers
    labels = [str(r.layer) for r in rows]  # embed, then block numbers
    n = len(labels)
    layers = list(range(n))  # the x position of each row
    width = min(16.0, max(7.0, 0.42 * n + 3))
    fig = new_figure(width, 7.2)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1.15, 1))
    pitch = (width - 1.8) * 72 / max(n, 1)

    def series(key: str) -> list[float]:
        return [math.nan if getattr(r, key) is None else getattr(r, key) for r in rows]

    top.plot(layers, series("cos_to_embedding"), marker="o", ms=3, label="cos to embedding (embed row)")
    top.plot(layers, series("cos_to_previous"), marker="s", ms=3, label="cos to previous row")
    top.set_ylabel("cosine similarity")
    top.set_ylim(min(-0.05, min((v for v in series("cos_to_embedding") if not math.isnan(v)), default=0) - 0.05),
                 1.05)
    top.grid(alpha=0.3)
    top.legend(loc="best")
    if any(r.lens_token is not None for r in rows):
        lens_axis = top.secondary_xaxis("top")
        keep = thin(n, pitch, need_pt=11)
        lens_axis.set_xticks([layers[i] for i in keep], [token_label(rows[i].lens_token) for i in keep],
                             rotation=90, fontsize=8)
        lens_axis.set_xlabel("logit lens: top token of unembed(final_norm(h)) at each layer")

    for key, label in (("resid_norm", "‖h‖ residual"), ("attn_norm", "‖attn_out‖ added"),
                       ("mlp_norm", "‖mlp_out‖ added")):
        bottom.plot(layers, series(key), marker="o", ms=3, label=label)
    norms = [v for key in ("resid_norm", "attn_norm", "mlp_norm") for v in series(key) if v > 0]
    if norms and max(norms) / min(norms) > 30:
        bottom.set_yscale("log")
    bottom.set_ylabel("L2 norm (activation units)")
    bottom.set_xlabel("layer (embed, then block N's output)")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="best")
    set_ticks(bottom.xaxis, labels, pitch, need_pt=14, positions=layers)
    caption(fig, cap)
    return fig
