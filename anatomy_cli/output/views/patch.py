"""`patch`'s view: the grid as a layer x position (or head) table, one JSON cell per patched run, the check
table with --method attribution --check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from anatomy_cli.output import plots
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.views._attribution import extend
from anatomy_cli.output.views.ablate import token_record
from anatomy_cli.tasks.records import model_record
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line

if TYPE_CHECKING:
    from anatomy_cli.analyses.patch import Patching
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.driven import Shown
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.patch import PatchResult

CELL_COLUMNS = (Column("layer", "layer", "int"), Column("position", "position", "int"),
                Column("head", "head", "int"), Column("value", "value", "float", 3),
                Column("metric", "metric", "float", 4))
ROWS = "cells"
REPORT_FIRST = True  # the report, then --plot's picture


def metric_name(lm: LoadedModel, ids: Mapping[str, int | None]) -> str:
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    assert target is not None
    return f"logit({target['token']}) - logit({foil['token']})" if foil else f"logit({target['token']})"


def report(lm: LoadedModel, encoded: list[Encoded], result: PatchResult, shown: Shown) -> Report:
    """``encoded``: CLEAN, CORRUPT. In the table format the grid is a layer x column table; else one row per
    cell."""
    clean, corrupt = encoded
    wide = shown.fmt is Format.table
    return extend(_report(lm, clean, corrupt, result.ids, result.patching, wide=wide), result.extra, grid=True)


def figure(lm: LoadedModel, encoded: list[Encoded], result: PatchResult) -> FigureArgs:
    from anatomy_cli.output.plots._text import shorten

    clean, corrupt = encoded
    how = " · attribution patching (estimates)" if result.extra else ""
    cap = plots.Caption.of("patch", lm, clean.text, f"corrupt '{shorten(corrupt.text, 40)}' · site "
                           f"{result.patching.site}{how}")
    return (result.patching, clean.pieces, corrupt.pieces, metric_name(lm, result.ids), cap), {}


def _prompt(enc: Encoded) -> dict[str, object]:
    return {"prompt": enc.text, "token_ids": list(enc.ids), "tokens": list(enc.pieces)}


def _report(lm: LoadedModel, clean: Encoded, corrupt: Encoded, ids: Mapping[str, int | None], result: Patching, *,
            wide: bool) -> Report:
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    differ = [i for i, (a, b) in enumerate(zip(clean.ids, corrupt.ids)) if a != b]
    data = {**model_record(lm), "bos": clean.bos, "bos_source": clean.bos_source,
            "clean": _prompt(clean), "corrupt": _prompt(corrupt),
            "differing_positions": differ, "target": target, "foil": foil, **result.to_dict()}
    what = metric_name(lm, ids)
    heading = [f"patch · {model_label(lm)} · site {result.site} · {len(result.cells)} patched runs",
               f"clean   {prompt_line(clean)}", f"corrupt {prompt_line(corrupt)}",
               (f"metric {what} at the last position: clean {result.clean_metric:.4f}, "
                f"corrupt {result.corrupt_metric:.4f}")]
    notes = ["value = (m - m_corrupt) / (m_clean - m_corrupt): 0 = corrupt run, 1 = clean run"]
    if result.clean_metric == result.corrupt_metric:
        notes.append("the clean and corrupt metrics are equal: the normalized values are undefined (empty)")
    if not wide:
        return Report(data=data, sections=[Section(CELL_COLUMNS, data["cells"])], heading=heading, notes=notes)
    per_head = result.site == "head"
    columns = [Column("layer", "layer", "int")]
    for c in result.columns:
        title = f"h{c}" if per_head else f"{c} {clean.pieces[c]}" + ("*" if c in differ else "")
        columns.append(Column(f"c{c}", title, "float", 2))
    rows = [{"layer": layer, **{f"c{c}": result.value(layer, c) for c in result.columns}} for layer in result.layers]
    if not per_head:
        notes.append("columns: position and CLEAN's token; * = CLEAN and CORRUPT differ there")
    title = "layer x head (each head patched at every position)" if per_head else "layer x position"
    return Report(data=data, sections=[Section(columns, rows, title=title)], heading=heading, notes=notes)
