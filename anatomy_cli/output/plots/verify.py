"""`verify --plot FILE.png|svg|pdf`: every section's rows, the measured error (or score) against its limit on a
log axis, green pass, red FAIL, grey skip; one panel per section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import drawable
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.verify_rows import COLOURS
from anatomy_cli.output.verify_rows import LIMIT_COLOUR
from anatomy_cli.output.verify_rows import drawn
from anatomy_cli.output.verify_rows import floor
from anatomy_cli.output.verify_rows import points

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.verify.checks import Verification

ROW_INCHES = 0.17


def figure(result: Verification, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.analyses.verify.checks.Verification`: per section a panel, one line per row,
    a dot at the measured number (log x) and a bar at its limit. Returns a matplotlib Figure."""
    sections = [(i, s, points(s)) for i, s in enumerate(result.sections, start=1)]
    heights = [max(len(rows), 1) for _i, _s, rows in sections]
    fig = new_figure(10.0, ROW_INCHES * sum(heights) + 0.55 * len(sections) + 1.6)
    axes = fig.subplots(len(sections), 1, height_ratios=heights, squeeze=False, sharex=True)[:, 0]
    low = floor(result)
    for ax, (i, section, rows) in zip(axes, sections):
        y = list(range(len(rows)))
        ax.scatter([drawn(p.limit, low) or float("nan") for p in rows], y, marker="|", s=120, color=LIMIT_COLOUR,
                   zorder=2)
        ax.scatter([drawn(p.value, low) or float("nan") for p in rows], y, s=22, zorder=3,
                   color=[COLOURS[p.result] for p in rows])
        ax.set_xscale("log")
        ax.set_yticks(y, [drawable(p.label) + ("  (skipped)" if p.result == "skip" else "") for p in rows],
                      fontsize=6.5)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(drawable(f"{i}. {section.title}"), fontsize=8.5, loc="left")
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    axes[-1].set_xlabel("measured error (≤ limit passes) or score (≥ limit passes), log scale")
    counts = result.counts()
    caption(fig, cap, [f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped; green "
                       f"pass, red FAIL, grey skip; | the limit; a 0 is drawn at {low:.0e}"])
    return fig
