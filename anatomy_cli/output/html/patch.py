"""`patch --plot FILE.html`: activation patching, layer x position (or head), diverging colours centred at 0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import token
from anatomy_cli.output.html._charts import diverging
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks

if TYPE_CHECKING:
    from anatomy_cli.analyses.patch import Patching
    from anatomy_cli.output.plots.caption import Caption


def figure(result: Patching, clean: Sequence[str], corrupt: Sequence[str], what: str, cap: Caption) -> Page:
    """A page with a :class:`anatomy_cli.analyses.patch.Patching` drawn as the PNG: the normalized value of
    each cell (0 = corrupt run, 1 = clean run), layer 0 at the bottom; hover gives the value and tokens."""
    per_head = result.site == "head"
    grid = [[result.value(layer, c) for c in result.columns] for layer in result.layers]
    finite = [abs(v) for row in grid for v in row if v is not None]
    limit = max(1.0, max(finite) if finite else 1.0)
    if per_head:
        labels = [str(c) for c in result.columns]
    else:
        labels = [token(clean[c], 12) if clean[c] == corrupt[c] else f"{token(clean[c], 8)}→{token(corrupt[c], 8)}"
                  for c in result.columns]
    heat = diverging(grid, title="(m − m_corrupt) / (m_clean − m_corrupt)", limit=limit,
                     hover="layer %{y} · %{customdata}")
    heat.update(customdata=[[f"head {c}" if per_head else f"position {c}: {labels[i]}"
                             for i, c in enumerate(result.columns)] for _ in result.layers],
                y=list(result.layers))
    fig = go.Figure(heat)
    width, height = heat_size(len(result.layers), len(result.columns))
    fig.update_layout(**layout(width=width, height=height, title={"text": f"patched: {result.site}"}))
    fig.update_xaxes(title_text="head" if per_head else "position: clean token (→ corrupt token where they differ)",
                     **ticks(labels), tickangle=0 if per_head else -60)
    fig.update_yaxes(title_text="layer")
    page = caption_page(cap)
    page.add(plot(fig))
    page.add(notes([f"m = {what} at the last position: clean {result.clean_metric:.4f}, corrupt "
                    f"{result.corrupt_metric:.4f}"]))
    return page
