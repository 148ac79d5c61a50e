"""`patch --plot`: ROME-style causal tracing, layer x position (or head), diverging colours centred at 0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from anatomy_cli.models.sites import DESCRIPTION
from anatomy_cli.models.sites import Site
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grid_size
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import token_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.patch import Patching


def figure(result: Patching, clean: Sequence[str], corrupt: Sequence[str], what: str, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.patch.Patching`: the normalized ``value`` of each cell,
    layer 0 at the bottom, columns = positions labelled with CLEAN's token (``clean → corrupt`` where
    the prompts differ) or heads for site ``head``. Colours diverge from 0 (the corrupt run, white) to
    1 (the clean run, red); blue is below 0. Undefined values are blank. Returns a matplotlib Figure.
    """
    per_head = result.site == "head"
    n_cols = len(result.columns)
    grid = [[result.value(layer, c) for c in result.columns] for layer in result.layers]
    values = as_array(grid)
    finite = values[np.isfinite(values)]
    limit = max(1.0, float(abs(finite).max()) if finite.size else 1.0)
    if per_head:
        xlabels = [str(c) for c in result.columns]
    else:
        xlabels = [token_label(clean[c]) if clean[c] == corrupt[c] else
                   f"{token_label(clean[c], 7)}→{token_label(corrupt[c], 7)}" for c in result.columns]
    width, height, cw, ch = grid_size(len(result.layers), n_cols)
    fig = new_figure(width, height)
    ax = fig.subplots()
    notes = heatmap(fig, ax, values, cell=(cw, ch), xlabels=xlabels, ylabels=[str(l) for l in result.layers],
                    cmap="RdBu_r", vmin=-limit, vmax=limit,
                    colorbar="(m − m_corrupt) / (m_clean − m_corrupt): 0 corrupt, 1 clean",
                    xlabel="head" if per_head else "position: clean token (→ corrupt token where they differ)",
                    ylabel="layer", x_rotation=0 if per_head else 90)
    ax.set_title(f"patched: {DESCRIPTION[Site(result.site)]}")
    notes.insert(0, f"m = {what} at the last position: clean {result.clean_metric:.4f}, "
                    f"corrupt {result.corrupt_metric:.4f}")
    caption(fig, cap, notes)
    return fig
