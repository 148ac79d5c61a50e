"""`verify --plot FILE.html`: every section's rows, the measured error (or score) against its limit on a log
axis, green pass, red FAIL, grey skip; the rows again as a table under each section's figure."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import plotly.graph_objects as go

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import table
from anatomy_cli.output.html import text
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.verify_rows import COLOURS
from anatomy_cli.output.verify_rows import LIMIT_COLOUR
from anatomy_cli.output.verify_rows import drawn
from anatomy_cli.output.verify_rows import floor
from anatomy_cli.output.verify_rows import points

if TYPE_CHECKING:
    from anatomy_cli.analyses.verify.checks import Verification
    from anatomy_cli.output.plots.caption import Caption

TALL_PX = 600  # a section's figure taller than this gets its x axis on top too


def figure(result: Verification, cap: Caption) -> Page:
    """A page with a :class:`anatomy_cli.analyses.verify.checks.Verification`: one figure and one table per
    section. A 0 is drawn a decade below the smallest positive number (the hover says 0)."""
    page = caption_page(cap)
    low = floor(result)
    for i, section in enumerate(result.sections, start=1):
        rows = points(section)
        page.add(text(f"{i}. {section.title}", section.note or None))
        if any(p.value is not None for p in rows):
            page.add(plot(_figure(rows, low)))
        page.add(table(["check", "measured", "limit", "result", "note"],
                       [[p.label, "" if p.value is None else f"{p.value:.3g}",
                         "" if p.limit is None else f"{'≥' if p.at_least else '≤'} {p.limit:g}", p.result, p.note]
                        for p in rows], numeric=[False, True, True]))
    page.add(notes(["x: the measured error (≤ its tolerance passes) or a known answer's score (≥ its threshold "
                    f"passes), log scale; a 0 is drawn at {low:.0e}; | marks the limit"]))
    return page


def _figure(rows: list[Any], low: float) -> go.Figure:
    labels = [esc(p.label) for p in rows]   # y: the row's index (labels may repeat), named by the ticks
    y = list(range(len(rows)))
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[drawn(p.value, low) for p in rows], y=y, mode="markers", name="measured",
        marker={"color": [COLOURS[p.result] for p in rows], "size": 9},
        customdata=[[p.result, "–" if p.value is None else f"{p.value:.4g}", label]
                    for p, label in zip(rows, labels)],
        hovertemplate="%{customdata[2]}<br>measured %{customdata[1]} · %{customdata[0]}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=[drawn(p.limit, low) for p in rows], y=y, mode="markers", name="limit",
        marker={"color": LIMIT_COLOUR, "symbol": "line-ns-open", "size": 14, "line": {"width": 2}},
        customdata=[[("≥ " if p.at_least else "≤ ") + ("–" if p.limit is None else f"{p.limit:g}"), label]
                    for p, label in zip(rows, labels)],
        hovertemplate="%{customdata[1]}<br>limit %{customdata[0]}<extra></extra>"))
    fig.update_xaxes(type="log", title_text="measured error or score (log scale)", showgrid=True)
    fig.update_yaxes(tickmode="array", tickvals=y, ticktext=labels, range=[len(rows) - 0.5, -0.5])  # first on top
    height = 90 + 18 * len(rows)
    top = 20
    if height > TALL_PX:
        # a figure taller than a screen has its x axis below the first screen: the same ticks on top as well
        # (an overlaid axis bound to the first one, carried by an invisible point)
        top = 50
        fig.add_trace(go.Scatter(x=[drawn(rows[0].value, low) if rows[0].value is not None else low], y=[0],
                                 xaxis="x2", mode="markers", marker={"opacity": 0}, hoverinfo="skip",
                                 showlegend=False))
        fig.update_layout(xaxis2={"type": "log", "overlaying": "x", "side": "top", "matches": "x",
                                  "showgrid": False, "ticks": "outside", "tick0": 0, "dtick": "D2"})
    fig.update_layout(**layout(width=1000, height=height + top - 20, showlegend=False,
                               margin={"l": 260, "r": 30, "t": top, "b": 50}))
    return fig
