"""`attn`'s view: one row per weight (machine formats), or a matrix / top keys per row (the table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots import is_html
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import stdout_console
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record

if TYPE_CHECKING:
    from anatomy_cli.analyses.attention import Attention
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.driven import Shown
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.attn import AttnRun

LONG_COLUMNS = (
    Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("query_position", "query", "int"), Column("key_position", "key", "int"),
    Column("query_token", "query token"), Column("key_token", "key token"),
    Column("weight", "weight", "float", 3),
)
CELL = 6  # table characters per weight column ("0.123" plus a gap)
ROWS = "weights"


def run_kwargs(shown: Shown) -> dict[str, object]:
    """An HTML page switches between every layer and head: the run keeps them all, pooled as the page says."""
    if shown.plot is None or not is_html(shown.plot):
        return {}
    from anatomy_cli.output.html.attn import block_factor
    from anatomy_cli.output.html.attn import pool

    return {"pooling": (block_factor, pool)}


def report(lm: LoadedModel, enc: Encoded, run: AttnRun, shown: Shown) -> Report:
    """The table's layout for ``Format.table``, else one row per weight."""
    result, fmt, k, one_head = run.attention, shown.fmt or Format.json, shown.opts.k, shown.opts.one_head
    data = {**prompt_record(lm, enc), "n_layers": lm.n_layers, "n_heads": lm.n_heads, **result.to_dict()}
    heading = [f"attn · {model_label(lm)} · {lm.n_layers} layers × {lm.n_heads} heads",
               f"{prompt_line(enc)} · {where(enc, result, one_head)}"]
    notes = ["weight = softmax(QKᵀ/√d_head + mask) of the head, eager attention; each query row sums to 1"]
    if fmt is not Format.table:
        sections = [Section(LONG_COLUMNS, data["weights"])]
    else:
        sections = _tables(result, k, one_head, _width())
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def _width() -> int:

    return stdout_console().width


def _tables(result: Attention, k: int, one_head: bool, width: int) -> list[Section]:
    """A matrix (rows: queries or heads; columns: keys) when it fits ``width``, else top-k keys per row."""
    tokens, n = result.tokens, len(result.tokens)
    label = max(len(t) for t in tokens) + 12
    fits = label + CELL * n <= width
    g = result.grid
    if one_head:
        rows = [(c, {"query_position": q, "query_token": tokens[q]}) for c, q in enumerate(result.queries)]
        lead = [Column("query_position", "query", "int"), Column("query_token", "token")]
        at = lambda c: (0, 0, c)
    else:
        rows = [(a * len(result.heads) + b, {"layer": layer, "head": head})
                for a, layer in enumerate(result.layers) for b, head in enumerate(result.heads)]
        lead = [Column("layer", "layer", "int"), Column("head", "head", "int")]
        at = lambda r: (r // len(result.heads), r % len(result.heads), 0)
    out = []
    for r, row in rows:
        a, b, c = at(r)
        q = result.queries[c]
        if fits:
            row.update({f"k{j}": (float(g[a, b, c, j]) if not (result.causal and j > q) else None)
                        for j in range(n)})
        else:
            row["top"] = "  ".join(f"{tokens[j]} {w:.2f}" for j, w in result.top_keys(a, b, c, k))
        out.append(row)
    cols = [Column(f"k{j}", tokens[j], "float", 2) for j in range(n)] if fits else [Column("top", f"top {k} keys")]
    title = "query × key" if one_head else "every head → key"
    return [Section([*lead, *cols], out, title=title)]


def where(enc: Encoded, result: Attention, one_head: bool) -> str:
    return (f"layer {result.layers[0]} head {result.heads[0]}" if one_head else
            f"query position {result.queries[0]} = {enc.pieces[result.queries[0]]}")


def figure(lm: LoadedModel, enc: Encoded, run: AttnRun, shown: Shown) -> FigureArgs:
    """``plots.draw("attn", ...)``'s arguments: the page of every head (a run with ``pooled``), else a PNG's."""
    one_head, plan = shown.opts.one_head, shown.plan
    caption = Caption.of("attn", lm, enc.text, where(enc, run.attention, one_head))
    if run.pooled is not None:
        return (run.pooled, enc.pieces, caption), {"causal": lm.is_causal, "layer": plan.layers[0],
                                                   "head": plan.heads[0], "block": run.block}
    return (run.attention, caption), {"one_head": one_head}
