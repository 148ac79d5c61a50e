"""`attn --plot FILE.html`: one head's query x key pattern, with a layer and a head picker.

Every head's pattern is in the page, so switching layer and head needs no new file: the patterns are
quantized to 16 bits (steps of 1/65535, well below the 4 decimals shown), written as one base64
string per head (only the visible lower triangle for a causal model) and decoded by the page when
a head is picked. Long prompts are shown in blocks: beyond :data:`MAX_SHOWN` positions, or when all
heads together would pass :data:`MAX_CELLS` cells, ``f`` consecutive positions form one block (query
rows averaged, key weights summed, so every row still sums to 1), and the page says so.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
import torch

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import Part
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import script_json
from anatomy_cli.output.html import token
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks

if TYPE_CHECKING:
    from anatomy_cli.output.html.markup import Part
    from anatomy_cli.output.plots.caption import Caption

MAX_SHOWN = 512        # positions per axis at most; longer prompts are shown in blocks
MAX_CELLS = 6_000_000  # stored weights over all heads (2 bytes each, 2.7 as base64): ~16 MB
SCALE = 65535


def block_factor(n: int, n_heads_total: int, causal: bool) -> int:
    """The smallest block size ``f`` (1 = every position) that keeps the page within the limits."""
    f = max(1, math.ceil(n / MAX_SHOWN))
    while True:
        m = math.ceil(n / f)
        cells = m * (m + 1) // 2 if (causal and f == 1) else m * m
        if cells * n_heads_total <= MAX_CELLS:
            return f
        f += 1


def pool(pattern: torch.Tensor, f: int) -> torch.Tensor:
    """``[..., n, n]`` -> ``[..., m, m]`` with ``m = ceil(n / f)``: key weights summed over each block of
    ``f`` keys, query rows averaged over each block of ``f`` queries (rows still sum to 1)."""
    if f == 1:
        return pattern
    n = pattern.shape[-1]
    m = math.ceil(n / f)
    pad = m * f - n
    p = torch.nn.functional.pad(pattern, (0, pad, 0, pad))
    p = p.reshape(*p.shape[:-1], m, f).sum(-1)                        # keys: sum per block
    p = p.reshape(*p.shape[:-2], m, f, m).sum(-2)                      # queries: sum per block ...
    counts = torch.full((m,), float(f))
    counts[-1] = n - (m - 1) * f
    return p / counts[:, None]                                         # ... then the mean


def _encode(matrix: np.ndarray, tri: bool) -> str:
    values = matrix[np.tril_indices(matrix.shape[0])] if tri else matrix.reshape(-1)
    q = np.rint(np.clip(values, 0.0, 1.0) * SCALE).astype("<u2")
    return base64.b64encode(q.tobytes()).decode("ascii")


def figure(patterns: torch.Tensor, tokens: Sequence[str], cap: Caption, *, causal: bool, layer: int = 0,
           head: int = 0, block: int | None = None) -> Page:
    """A page with every head's pattern: ``patterns`` float ``[n_layers, n_heads, n, n]`` (query x key),
    ``tokens`` the n display pieces; ``layer``/``head`` are shown first. ``block``: the patterns are
    already :func:`pool`-ed with that block size (None: pooled here as :func:`block_factor` says).
    Returns a :class:`Page`."""
    # No detail line: the line under the pickers names the layer and head shown, and follows them.
    page = caption_page(dataclasses.replace(cap, detail=None))
    page.add(part(patterns, tokens, causal=causal, layer=layer, head=head, block=block))
    page.add(notes(["weight = softmax(QKᵀ/√d_head + mask) of the head, eager attention; each query row sums to 1",
                    "hover a cell to read the query, the key and the weight; pick a layer and a head above the plot"]))
    return page


def part(patterns: torch.Tensor, tokens: Sequence[str], *, causal: bool, layer: int = 0, head: int = 0,
         block: int | None = None, div_id: str = "attn") -> Part:
    """The picker, the heatmap and its script (for ``anatomy report``)."""
    n_layers, n_heads = patterns.shape[:2]
    n = len(tokens)
    f = block if block is not None else block_factor(n, n_layers * n_heads, causal)
    tri = causal and f == 1
    pooled = (patterns.float() if block is not None else pool(patterns.float(), f)).numpy()
    m = pooled.shape[-1]
    labels = [token(tokens[b * f], 16) if f == 1 else f"{b * f}–{min(n, (b + 1) * f) - 1}" for b in range(m)]
    data = {"n": m, "f": f, "tri": tri, "causal": causal, "scale": SCALE, "tokens": [tokens[i] for i in range(n)],
            "total": n,
            "data": [[_encode(pooled[a, b], tri) for b in range(n_heads)] for a in range(n_layers)]}
    # The first head is drawn by the page's script from the same base64 data: no second copy as JSON.
    heat = go.Heatmap(z=[[None]], colorscale="Blues", zmin=0.0, zmax=1.0,
                      colorbar={"title": {"text": "attention weight", "side": "right"}},
                      # in blocks, x and y are block numbers: the line above the plot names the positions
                      hovertemplate=("query %{y} → key %{x}<br>" if f == 1 else "") + "weight %{z:.4f}<extra></extra>",
                      hoverongaps=False)
    fig = go.Figure(heat)
    side = max(16, min(40, 700 // max(m, 1)))
    width, height = heat_size(m, m, cell_w=side, cell_h=side, max_w=1100, max_h=1000)
    fig.update_layout(**layout(width=width, height=height))  # the readout under the pickers names the head
    axis_title = "position block" if f > 1 else "token"
    fig.update_xaxes(title_text=f"key {axis_title} (attended to)", **ticks(labels), tickangle=-60 if m > 8 else 0,
                     showgrid=False)
    fig.update_yaxes(title_text=f"query {axis_title} (attending)", **ticks(labels), autorange="reversed",
                     showgrid=False)
    layer_options = "".join(f'<option value="{a}"{" selected" if a == layer else ""}>{a}</option>'
                            for a in range(n_layers))
    head_options = "".join(f'<option value="{b}"{" selected" if b == head else ""}>{b}</option>'
                           for b in range(n_heads))
    controls = (f'<div class="controls"><label>layer <select id="{div_id}-layer">{layer_options}</select></label>'
                f'<label>head <select id="{div_id}-head">{head_options}</select></label></div>'
                f'<div class="readout" id="{div_id}-readout"></div>')
    warning = ""
    if f > 1:
        warning = (f'<p class="note"><b>{n} tokens: shown in blocks of {f} positions</b> (query rows averaged, key '
                   f"weights summed, so each row still sums to 1). For every weight use --format json, or "
                   f"--layer/--head with a shorter prompt.</p>")
    # The id first: the data (base64) may contain any letters, never an underscore.
    prepare = _PREPARE.replace("__ID__", div_id).replace("__DATA__", script_json(data))
    return Part(controls + warning + plot(fig, div_id=div_id, prepare=prepare, script=_SCRIPT).html)


# The page's script: decode a head's weights (base64 little-endian uint16), show them, and describe
# the hovered cell. Token text is written with textContent, never as HTML. _PREPARE runs before the
# figure is first drawn and puts the picked head into it (one draw, not an empty one and a redraw);
# _SCRIPT runs once it is drawn.
_PREPARE = """
var D = __DATA__;
function matrix(l, h) {
  var s = atob(D.data[l][h]), u = new Uint16Array(s.length / 2);
  for (var i = 0; i < u.length; i++) { u[i] = s.charCodeAt(2 * i) | (s.charCodeAt(2 * i + 1) << 8); }
  var z = [], idx = 0;
  for (var q = 0; q < D.n; q++) {
    var row = new Array(D.n);
    for (var k = 0; k < D.n; k++) {
      if (D.tri) { row[k] = k <= q ? u[idx++] / D.scale : null; }
      else { row[k] = (D.causal && k > q) ? null : u[q * D.n + k] / D.scale; }  // a block all in the future: masked
    }
    z.push(row);
  }
  return z;
}
var L = document.getElementById('__ID__-layer'), H = document.getElementById('__ID__-head');
var R = document.getElementById('__ID__-readout');
function title() { return 'layer ' + L.value + ' head ' + H.value; }
F.data[0].z = matrix(+L.value, +H.value);
R.textContent = title();
"""
_SCRIPT = """
function show() {
  Plotly.restyle(gd, {z: [matrix(+L.value, +H.value)]}).then(function () { R.textContent = title(); });
}
function where(b) {
  if (D.f === 1) { return b + ' ' + D.tokens[b]; }
  return (b * D.f) + '–' + (Math.min(D.total, (b + 1) * D.f) - 1);
}
L.addEventListener('change', show); H.addEventListener('change', show);
gd.on('plotly_hover', function (ev) {
  var p = ev.points[0];
  R.textContent = title() + ' · query ' + where(p.y) + ' → key ' + where(p.x)
    + ' · weight ' + (p.z === null ? '–' : p.z.toFixed(4));
});
gd.on('plotly_unhover', function () { R.textContent = title(); });
"""
