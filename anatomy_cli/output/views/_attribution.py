"""The check table and footer ``--method attribution`` adds to `patch` and `ablate` reports."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section

if TYPE_CHECKING:
    from anatomy_cli.tasks._attribution import Extra


def extend(report: Report, extra: Extra | None, *, grid: bool = False) -> Report:
    """``report`` with ``method`` (and ``check``) in its JSON, the check as a second table, its footer notes."""
    if extra is None:
        return replace(report, data={**report.data, "method": "exact"})
    data = {**report.data, "method": extra.method, "check": None if extra.check is None else extra.check.to_dict()}
    heading = list(report.heading)
    if extra.heading:
        parts = heading[0].split(" · ")
        # patch: "... · 270 patched runs" becomes the estimate's line; ablate: the line is appended.
        heading[0] = " · ".join((parts[:-1] if grid else parts) + [extra.heading])
    what = "patched run" if grid else "ablation"
    notes = list(report.notes) + [f"--method attribution: each {what} is estimated as (a_new - a) . dm/da at the "
                                  "unedited run, a first-order estimate; --check N reruns the largest exactly"]
    sections = list(report.sections)
    check = extra.check
    if check is not None:
        keys = list(check.cells[0].key) if check.cells else ["layer"]
        cols = [Column(k, k, "int" if k != "component" else "text") for k in keys]
        cols += [Column("estimate", "estimate", "float", 4), Column("exact", "exact", "float", 4)]
        if grid:
            cols += [Column("estimate_value", "est. value", "float", 3),
                     Column("exact_value", "exact value", "float", 3)]
        sections.append(Section(cols, [c.to_dict() for c in check.cells],
                                title=f"checked: the {len(check.cells)} largest estimates rerun exactly "
                                      "(change of the metric)"))
        r = "undefined" if check.pearson is None else f"{check.pearson:.3f}"
        agree = "undefined" if check.top_agreement is None else f"{check.top_agreement:.2f}"
        notes.append(f"check over {len(check.cells)} cells: Pearson r = {r}; top-{check.top_k} agreement = "
                     f"{agree} (share of the {check.top_k} largest estimates among the {check.top_k} largest "
                     "exact changes)")
    return replace(report, data=data, heading=heading, notes=notes, sections=sections)
