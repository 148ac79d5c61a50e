"""`lens`'s view: the grid as a table (rows ``embed``, blocks; columns positions) or one row per cell."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots import is_html
from anatomy_cli.output.render import TOKEN_COLUMNS
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record

if TYPE_CHECKING:
    from anatomy_cli.analyses.lens import LensGrid
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.driven import Shown
    from anatomy_cli.output.views.protocol import FigureArgs

HOVER_TOP = 5  # top tokens per cell in an HTML page's hover text

CELL_COLUMNS = (
    Column("layer", "layer"), Column("position", "pos", "int"), *TOKEN_COLUMNS,
    Column("logprob", "logprob", "float", 3), Column("entropy", "entropy", "float", 3), Column("kl", "kl", "float", 3),
)
TARGET_COLUMNS = (Column("target_rank", "target rank", "int"), Column("target_probability", "target p", "prob", 4))
NOTE = ("rows: embed = {embedding}, N = block N's output (docs/engine.md#layers); each cell is the top token of "
        "softmax(unembed(final_norm(h))) at that row and position, the norm recomputed from h itself; {stat}")
STAT_NOTE = {"prob": "number = its probability", "logprob": "number = its natural-log probability",
             "rank": "number = the target's rank (1 = top)",
             "entropy": "number = the entropy of the distribution (nats)",
             "kl": "number = KL(last block || this row) in nats"}
ROWS = "cells"
LENS_NOTE = {
    "jacobian": "read through the Jacobian lens {source}: row N is unembed(final_norm(J_N h)), J_N fitted to map block "
                "N's output to the last block's; the last block's row as it is",
    "tuned": "read through the tuned lens {source}: row r is unembed(final_norm(h + A h + b)) with its translator "
             "(translator 0 = embed, translator N + 1 = block N); the last block's row as it is"}
TITLE = {"logit": "logit lens", "jacobian": "Jacobian lens", "tuned": "tuned lens"}


def _fmt(value: float, stat: str) -> str:
    if stat == "rank":
        return f"#{int(value)}"
    if stat == "prob":
        return f"{value:.2f}" if value >= 0.005 else f"{value:.0e}"
    return f"{value:.2f}"


def _notes(lm: LoadedModel, grid: LensGrid, data: dict[str, Any], stat: str) -> list[str]:
    embedding = "embedding (token + position)" if lm.adapter.pos_embed else "token embedding"
    out = [NOTE.format(embedding=embedding, stat=STAT_NOTE[stat])]
    if grid.lens != "logit":
        out.append(LENS_NOTE[grid.lens].format(source=grid.lens_source))
    if grid.unfitted:
        out.append(f"not shown: {', '.join(map(str, grid.unfitted))} (no reading in the {TITLE[grid.lens]})")
    if not lm.is_causal:
        out.append(f"{lm.name} is an encoder: each cell reads its masked-LM head, the token it predicts AT that "
                   "position, not a next token")
    if grid.target_id is not None:
        first = ", ".join(f"{p}: {'-' if layer is None else layer}"
                          for p, layer in zip(grid.positions, data["target"]["first_layer"]))
        out.append(f"target {grid.target_token} ({grid.target_id}): first row (embed or block) where it is the top "
                   f"token, by position: {first}")
    return out


def run_kwargs(shown: Shown) -> dict[str, int]:
    """An HTML page's hover text lists each cell's top 5 tokens, whatever --k the table shows: the run computes
    them (``k``), the report keeps ``--k``."""
    k = shown.opts.k
    return {"k": max(k or 1, HOVER_TOP)} if shown.plot is not None and is_html(shown.plot) else {}


def report(lm: LoadedModel, enc: Encoded, grid: LensGrid, shown: Shown) -> Report:
    """The table's layout (rows x positions) for ``Format.table``; else one row per cell (tsv, csv, json)."""

    if run_kwargs(shown).get("k", shown.opts.k) != shown.opts.k:
        grid = grid.keep_top(shown.opts.k)
    stat, as_grid = shown.opts.stat, shown.fmt is Format.table
    data = {**prompt_record(lm, enc), "n_layers": lm.n_layers, "predicts": "next" if lm.is_causal else "masked",
            "stat": stat, **grid.to_dict()}
    heading = [f"lens · {model_label(lm)} · {lm.n_layers} layers", prompt_line(enc)]
    notes = _notes(lm, grid, data, stat)
    if not as_grid:
        return Report(data=data, sections=[_cells(grid, data["cells"])], heading=heading, notes=notes)
    return Report(data=data, sections=_grid(grid, data["cells"], enc, stat), heading=heading, notes=notes)


def _cells(grid: LensGrid, cells: list[dict[str, Any]]) -> Section:
    columns = list(CELL_COLUMNS) + (list(TARGET_COLUMNS) if grid.target_id is not None else [])
    rows = cells
    if grid.k_given:
        columns.append(Column("top_tokens", "top"))
        rows = [{**c, "top_tokens": " ".join(t["token"] for t in c["top"])} for c in cells]
    return Section(columns, rows, title=TITLE[grid.lens])


def _grid(grid: LensGrid, cells: list[dict[str, Any]], enc: Encoded, stat: str) -> list[Section]:
    values = grid.stat(stat).tolist()
    # on a narrow terminal the first positions are left out first: the last is the prediction
    columns = [Column("layer", "layer")] + [Column(f"p{p}", f"{p} {enc.pieces[p]}", priority=n)
                                            for n, p in enumerate(grid.positions)]
    rows = []
    for r, layer in enumerate(grid.layers):
        row: dict[str, object] = {"layer": layer}
        for c, p in enumerate(grid.positions):
            if grid.k_given and stat in ("prob", "logprob"):
                top = cells[r * len(grid.positions) + c]["top"]
                row[f"p{p}"] = " ".join(
                    f"{t['token']} {_fmt(t['probability'] if stat == 'prob' else t['logprob'], stat)}" for t in top)
            else:
                tokens = " ".join(grid.top_tokens[r][c])
                row[f"p{p}"] = f"{tokens} {_fmt(values[r][c], stat)}"
        rows.append(row)
    sections = [Section(columns, rows, title=f"{TITLE[grid.lens]}: top token · {stat}")]
    if grid.target_id is not None and grid.target_ranks is not None and grid.target_logprobs is not None:
        ranks, probs = grid.target_ranks.tolist(), grid.target_logprobs.exp().tolist()
        target_rows = [{"layer": layer, **{f"p{p}": f"#{ranks[r][c]} {_fmt(probs[r][c], 'prob')}"
                                           for c, p in enumerate(grid.positions)}}
                       for r, layer in enumerate(grid.layers)]
        sections.append(Section(columns, target_rows, title=f"target {grid.target_token}: rank · probability"))
    return sections


def figure(lm: LoadedModel, enc: Encoded, grid: LensGrid, shown: Shown) -> FigureArgs:
    """``plots.draw("lens", ...)``'s arguments for ``grid``."""
    stat = shown.opts.stat

    cap = Caption.of("lens", lm, enc.text, f"--stat {stat}")
    return (grid, stat, [enc.pieces[p] for p in grid.positions], cap), {}
