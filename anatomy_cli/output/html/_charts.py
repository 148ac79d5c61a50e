"""Shared plotly pieces for the figures that are bars, lines or diverging grids (trace, dla, ablate, patch,
drift, params): the same colours as the PNGs, hover text with the exact numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from anatomy_cli.output.html import esc

ATTN_COLOUR, MLP_COLOUR, OTHER_COLOUR = "#dd8452", "#4c72b0", "#8c8c8c"


def clean(values: Sequence[float | None]) -> list[float | None]:
    """None and NaN as None (a gap in plotly)."""
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]


def bars(x: Sequence[object], values: Sequence[float | None], name: str, colour: str, unit: str) -> go.Bar:
    """One series of vertical bars with the value (4 decimals) and ``unit`` in the hover text."""
    return go.Bar(x=list(x), y=clean(values), name=esc(name), marker_color=colour,
                  hovertemplate=f"{esc(name)} · layer %{{x}}<br>%{{y:.4f}} {esc(unit)}<extra></extra>")


def diverging(z: Sequence[Sequence[float | None]], *, x: Sequence[object] | None = None,
              y: Sequence[object] | None = None, title: str, limit: float | None = None,
              hover: str = "layer %{y} head %{x}") -> go.Heatmap:
    """A red-blue heatmap centred at 0 (``limit``: the colour scale's ±, default max |z|)."""
    finite = [abs(v) for row in z for v in row if v is not None and not math.isnan(v)]
    top = limit if limit is not None else (max(finite) if finite else 1.0) or 1.0
    return go.Heatmap(z=[clean(row) for row in z], x=x, y=y, colorscale="RdBu", reversescale=True, zmid=0,
                      zmin=-top, zmax=top, xgap=1, ygap=1, hoverongaps=False,
                      colorbar={"title": {"text": esc(title), "side": "right"}},
                      hovertemplate=f"{hover}<br>%{{z:.4f}}<extra></extra>")
