"""`--method exact|attribution` and `--check N` for `patch` and `ablate`: options, runs and the check table.

With ``--method attribution`` every cell is estimated from one backward (``engine.gradients``);
``--check N`` reruns the N cells with the largest estimates exactly and prints them beside the
estimates, with Pearson's r and the top-k agreement in the footer (``analyses.attribution_patching``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Annotated, Any

import typer

from anatomy_cli.errors import UsageError
from anatomy_cli.output.render import Column, Report, Section


class Method(str, Enum):
    exact = "exact"
    attribution = "attribution"


MethodOpt = Annotated[Method, typer.Option(
    "--method", case_sensitive=False,
    help="exact: one edited run per cell; attribution: every cell estimated at once from one backward, "
    "(a_new - a) . dm/da (attribution patching), at the cost of one forward and one backward (patch runs "
    "CLEAN and CORRUPT in that forward as two batch rows).")]
CheckOpt = Annotated[int, typer.Option(
    "--check", metavar="N", min=0,
    help="With --method attribution: rerun the N cells with the largest |estimate| exactly and print them "
    "beside the estimates (Pearson's r and top-k agreement in the footer).")]


def check_options(method: Method, check: int) -> None:
    """UsageError for ``--check`` without ``--method attribution``."""
    if check and method is not Method.attribution:
        raise UsageError("--check N compares attribution estimates with exact runs: it needs --method attribution")


@dataclass(frozen=True)
class Extra:
    """What ``--method attribution`` adds to a report: the check (or None), and the heading's first line."""

    method: str
    check: Any | None
    heading: str | None = None


def patch(lm, clean_ids, corrupt_ids, site: str, ids: dict, check: int, batch_size: int):
    """Attribution patching of one site: ``(Patching result, Extra)``; values as the exact grid's."""
    from anatomy_cli.analyses import attribution_patching as ap
    from anatomy_cli.analyses import patch as analysis
    from anatomy_cli.engine import gradients

    metric = analysis.logit_metric(ids["target"], ids["foil"])
    run = gradients.attribution_patch_grid(lm, clean_ids, corrupt_ids, site, reduce=metric)
    result = analysis.patching(site, "logit_diff" if ids["foil"] is not None else "logit", run.layers,
                               run.columns, run.corrupt + run.estimate, run.clean, run.corrupt)
    found = None
    if check:
        flat = ap.largest(run.estimate, check)
        cells = [(run.layers[i // len(run.columns)], run.columns[i % len(run.columns)]) for i in flat]
        exact = gradients.exact_patch_cells(lm, corrupt_ids, run, cells, reduce=metric, batch_size=batch_size)
        column = "head" if site == "head" else "position"
        keys = [{"layer": layer, column: c} for layer, c in cells]
        found = ap.compare(keys, run.estimate.reshape(-1)[flat].tolist(), (exact - run.corrupt).tolist(),
                           scale=run.clean - run.corrupt)
    n = len(result.cells)
    return result, Extra("attribution", found, f"{n} cells estimated by attribution patching "
                                                 "(1 forward of CLEAN and CORRUPT as 2 batch rows, 1 backward)")


def ablate(lm, ids, plan, metric, *, position: int, check: int, batch_size: int):
    """Attribution ablation of one prompt: ``(intact metric, float64 [len(plan)] metrics, Extra)``."""
    from anatomy_cli.analyses import attribution_patching as ap
    from anatomy_cli.engine import gradients, interventions

    rows = [edits for *_, edits in plan]
    base, estimate = gradients.attribution_ablation(lm, ids, rows, reduce=metric, position=position)
    found = None
    if check:
        chosen = ap.largest(estimate, check)
        exact_base, exact = interventions.run_edits(lm, ids, [rows[i] for i in chosen], position=position,
                                                    batch_size=batch_size, reduce=metric)
        keys = [{"layer": plan[i][0], "component": plan[i][1], "head": plan[i][2]} for i in chosen]
        changes = (exact.detach().cpu().double().reshape(-1) - float(exact_base[0])).tolist()
        found = ap.compare(keys, estimate[chosen].tolist(), changes)
    return base, base + estimate, Extra("attribution", found, f"{len(plan)} ablations estimated from 1 forward "
                                                              "+ 1 backward")


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
