"""The page around the pictures: plotly.js inline, a small stylesheet, plotly figures as parts.

plotly.js is the cartesian bundle shipped in ``anatomy_cli/data/plotly`` (every trace type the pages
draw) when plotly.py's own plotly.js has the same major version, else plotly.py's full bundle: a page
opens in about half the time with the smaller file (docs/performance.md, "HTML pages").

Importing this module imports plotly.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.offline import get_plotlyjs_version

from anatomy_cli.data import PLOTLY_CARTESIAN
from anatomy_cli.data import PLOTLY_CARTESIAN_VERSION
from anatomy_cli.output.html.markup import UNTRAINED
from anatomy_cli.output.html.markup import Part
from anatomy_cli.output.html.markup import esc
from anatomy_cli.output.html.markup import script_json


class Page(Protocol):
    """What :func:`render` reads of an :class:`anatomy_cli.output.html.Page` (the package imports this module)."""

    title: str
    lines: Sequence[str]
    parts: list[Part]
    untrained: bool

# No button that leaves the page: plotly.js 4 calls its upload button "sendChartToCloud" (shown by default, it
# offers to upload the figure to Plotly Cloud), older versions "sendDataToCloud"; "Edit in Chart Studio" too
# (plotly.py warns about showEditInChartStudio, so that one goes by the button list only).
CONFIG = {"displaylogo": False, "responsive": True, "showSendToCloud": False,
          "modeBarButtonsToRemove": ["sendChartToCloud", "sendDataToCloud", "editInChartStudio"]}
FONT = "DejaVu Sans, Verdana, sans-serif"
# plotly's toolbar (the modebar) sits in the top right corner of each figure, in its top ~30 px: a title, a
# panel title or a row of buttons placed there is covered by it. Our own pieces go below this band.
TOOLBAR_PX = 36
_ids = itertools.count(1)

STYLE = """
body { font-family: DejaVu Sans, Verdana, sans-serif; margin: 1.2em 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.3em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
p.line { margin: 0.1em 0; color: #333; white-space: pre-wrap; }
p.note { color: #555; font-size: 0.85em; margin: 0.2em 0; }
p.explain { max-width: 60em; line-height: 1.4; } p.untrained { color: #c00000; font-weight: bold; }
table.data { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
table.data td, table.data th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; white-space: pre; }
table.data td.num { text-align: right; font-variant-numeric: tabular-nums; }
.controls { margin: 0.4em 0; } .controls label { margin-right: 1em; }
.readout { font-family: DejaVu Sans Mono, monospace; font-size: 0.9em; min-height: 1.3em; white-space: pre; }
span.tok { background: #eef; border: 1px solid #ccd; border-radius: 3px; padding: 0 3px; margin: 1px;
           display: inline-block; font-family: DejaVu Sans Mono, monospace; white-space: pre; }
span.tok sub { color: #777; }
"""


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js written into every page: the shipped cartesian bundle when plotly.py targets the same
    plotly.js major version (its figures' JSON is that version's), else plotly.py's full bundle."""
    if get_plotlyjs_version().split(".")[0] == PLOTLY_CARTESIAN_VERSION.split(".")[0] and PLOTLY_CARTESIAN.is_file():
        return PLOTLY_CARTESIAN.read_text(encoding="utf-8")
    return get_plotlyjs()


def render(page: Page) -> str:
    """The whole HTML file of ``page`` (an :class:`anatomy_cli.output.html.Page`): plotly.js in the head, the
    heading, then every part in order."""
    head = f"<h1>{esc(page.title)}</h1>" + "".join(f'<p class="line">{esc(line)}</p>' for line in page.lines)
    if page.untrained:
        head += f'<p class="untrained">{esc(UNTRAINED)}</p>'
    body = "\n".join(part.html for part in page.parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(page.title)}</title><style>{STYLE}</style>"
            f'<script type="text/javascript">{plotly_js()}</script></head>\n'
            f"<body>{head}\n{body}\n</body></html>\n")


def layout(**extra: object) -> dict[str, object]:
    """The layout every figure starts from: white template, our font, compact margins."""
    base: dict[str, object] = {"template": "simple_white", "font": {"family": FONT, "size": 12},
                               "margin": {"l": 70, "r": 30, "t": 40, "b": 60},
                               "hoverlabel": {"font": {"family": FONT}}}
    base.update(extra)
    return base


def plot(fig: go.Figure, *, div_id: str | None = None, script: str = "", height: int | None = None,
         prepare: str = "") -> Part:
    """A plotly figure as a part (no plotly.js: the page has it once). ``script`` runs after the figure
    is drawn, with ``gd`` bound to its div. ``prepare``: script run before the figure is first drawn, with
    the figure as ``F`` (``F.data``, ``F.layout``) to fill in, e.g. a heatmap's ``z`` decoded from the page's
    own data, so the figure is drawn once (``script`` shares its variables). Returns the part; its div id
    is ``div_id`` or a fresh one."""
    div_id = div_id or f"plot{next(_ids)}"
    if height is not None:
        fig.update_layout(height=height)
    if prepare:
        figure = json.loads(pio.to_json(fig, validate=False))
        width, height = figure["layout"].get("width"), figure["layout"].get("height")
        size = "".join(f"{k}:{v}px;" for k, v in (("width", width), ("height", height)) if v)
        return Part(f'<div class="figure"><div id="{div_id}" class="plotly-graph-div" style="{size}"></div>'
                    f"<script>(function(){{var gd=document.getElementById('{div_id}');"
                    f"var F={script_json(figure)};{prepare}\n"
                    f"Plotly.newPlot(gd,F.data,F.layout,{script_json(CONFIG)}).then(function(){{{script}\n}});"
                    "})();</script></div>")
    html = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG,
                       validate=False)
    if script:
        html += (f"<script>(function(){{var gd=document.getElementById('{div_id}');"
                 f"function go(){{{script}}}"
                 "if(gd&&gd._fullLayout){go();}else{window.addEventListener('load',go);}})();</script>")
    return Part(f'<div class="figure">{html}</div>')


def heat_size(n_rows: int, n_cols: int, *, cell_w: int = 56, cell_h: int = 26, extra_w: int = 220,
              extra_h: int = 170, max_w: int = 1350, max_h: int = 1000) -> tuple[int, int]:
    """Pixel width and height for an ``n_rows`` x ``n_cols`` heatmap, cells shrunk to fit the caps."""
    w = min(max_w, max(520, n_cols * cell_w + extra_w))
    h = min(max_h, max(320, n_rows * cell_h + extra_h))
    return w, h


def ticks(labels: list[str], limit: int = 32) -> dict[str, object]:
    """Axis ticks at 0..n-1 with ``labels`` (escaped already); thinned to at most ``limit`` labels.

    plotly measures every tick label in the page (a few ms each in a browser): 60 labels per axis
    took a 512-token attention page 0.25 s to draw, 32 take half that; hover names every cell."""
    step = max(1, -(-len(labels) // limit))
    keep = list(range(0, len(labels), step))
    return {"tickmode": "array", "tickvals": keep, "ticktext": [labels[i] for i in keep]}
