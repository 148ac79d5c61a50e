"""`ablate --plot FILE.html`: the effect of knocking out each layer's attention and MLP, or each head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html._charts import ATTN_COLOUR
from anatomy_cli.output.html._charts import MLP_COLOUR
from anatomy_cli.output.html._charts import bars
from anatomy_cli.output.html._charts import diverging
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot

if TYPE_CHECKING:
    from anatomy_cli.analyses.ablate import Ablation
    from anatomy_cli.output.plots.caption import Caption


def figure(result: Ablation, n_heads: int, what: str, cap: Caption) -> Page:
    """A page with an :class:`anatomy_cli.analyses.ablate.Ablation` drawn as the PNG: bars per layer, or a
    layer x head (x expert) grid (diverging, centred at 0); hover values are the effects (ablated − intact)."""
    rows = result.rows
    layers = sorted({r.layer for r in rows})
    unit = "nats" if result.metric == "logprob" else "logits"
    label = f"effect on {what} ({unit}): ablated − intact"
    fig = go.Figure()
    kind = result.grid
    if kind is not None:
        grid: list[list[float | None]] = [[None] * n_heads for _ in layers]
        for r in rows:
            assert r.index is not None  # a grid's rows: each a head or an expert
            grid[layers.index(r.layer)][r.index] = r.effect
        fig.add_trace(diverging(grid, y=layers, title=label))
        fig.update_xaxes(title_text=kind)
        fig.update_yaxes(title_text="layer")
    else:
        effect = {(r.layer, r.component): r.effect for r in rows}
        fig.add_trace(bars(layers, [effect.get((l, "attn")) for l in layers], "attention ablated", ATTN_COLOUR, unit))
        fig.add_trace(bars(layers, [effect.get((l, "mlp")) for l in layers], "MLP ablated", MLP_COLOUR, unit))
        fig.update_xaxes(title_text="layer (block)")
        fig.update_yaxes(title_text=esc(label))
    fig.update_layout(**layout(width=1000, height=520, barmode="group"))
    page = caption_page(cap)
    page.add(plot(fig))
    if kind == "expert":
        how = ("router logit set to −inf before the top k" if result.mode == "reroute"
               else "weight set to 0 where chosen")
        done = f"each routed expert's {how}, at every position"
    else:
        by = "zeros" if result.mode == "zero" else "its mean over the positions"
        done = f"each component replaced at every position by {by}"
    page.add(notes([f"intact run: {what} = {result.clean_metric:.4f}; {done}"]))
    return page
