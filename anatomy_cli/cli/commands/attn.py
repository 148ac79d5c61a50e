"""`anatomy attn PROMPT`: attention patterns, one head's full pattern or every head at one query position."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import (
    BatchSizeOpt,
    PromptArg,
    emit_prompts,
    load_weights,
    model_label,
    open_prompts,
    prompt_line,
    prompt_record,
)
from anatomy_cli.cli.options import (
    FormatOpt,
    PlotOpt,
    model_options,
    prompt_options,
)
from anatomy_cli.errors import UsageError
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Format, Report, Section, resolve_format
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.positions import check_position

LONG_COLUMNS = (
    Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("query_position", "query", "int"), Column("key_position", "key", "int"),
    Column("query_token", "query token"), Column("key_token", "key token"),
    Column("weight", "weight", "float", 3),
)
CELL = 6  # table characters per weight column ("0.123" plus a gap)


@app.command("attn")
@model_options()
@prompt_options()
def attn_command(
    prompt: PromptArg,
    layer: Annotated[Optional[int], typer.Option(
        "--layer", "-l", metavar="L", show_default=False,
        help="Layer (0-based; negative counts from the end). Default: every layer.")] = None,
    head: Annotated[Optional[int], typer.Option(
        "--head", metavar="H", show_default=False,
        help="Head within --layer: show its full pattern, query position x key position.")] = None,
    position: Annotated[Optional[int], typer.Option(
        "--position", "-p", metavar="N", show_default=False,
        help="Query position when showing several heads (negative counts from the end). Default: the last "
             "token; for encoders the last one that is not [SEP]/[CLS].")] = None,
    k: Annotated[int, typer.Option("--top", "-k", "--k", min=1, metavar="N",
                                   help="Top keys per row in a table too wide for the terminal.")] = 3,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Attention patterns: how much each query position attends to each key position.

    --layer L --head H: the full pattern of one head (query x key). --layer L alone: every head of
    layer L, from one query position (--position) to every key. Neither: the same for every layer.
    JSON, JSONL, TSV and CSV give one row per weight (layer, head, query_position, key_position,
    query_token, key_token, weight); causal models leave out the keys after the query (weight 0).
    The table shows a matrix when it fits the terminal, else each row's --top keys.
    Patterns come from one forward with eager attention (every other command keeps sdpa).

    Examples:

    \b
        anatomy attn "The cat sat on the mat" --layer 5 --head 1
        anatomy attn "The cat sat on the mat" --layer 5 --position 3
        anatomy attn "The cat sat on the mat" --format json | jq '.weights[0]'
    """

    if head is not None and layer is None:
        raise UsageError("--head needs --layer: give the layer the head belongs to")
    if head is not None and position is not None:
        raise UsageError("--position picks the query row when showing several heads; with --head every row is shown")
    opened, encoded = open_prompts(prompt, spec, prompts)
    n_layers, n_heads = _check(opened.info, encoded, layer, head, position, spec.model)
    lm = load_weights(opened)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    from anatomy_cli import engine
    from anatomy_cli.analyses import attention as analysis
    layers = [layer % n_layers] if layer is not None else list(range(n_layers))
    heads = [head % n_heads] if head is not None else list(range(n_heads))
    queries = [list(range(len(e))) if head is not None else [_query(e, position)] for e in encoded]
    from anatomy_cli.output import plots

    html = plots.is_html(plot)
    if html:  # the page switches between every layer and head: all of them, every query
        full, blocks, grids = _all_heads(lm, encoded, layers, heads, queries, batch_size)
    else:
        grids = engine.attention_patterns(lm, encoded, layers=layers, batch_size=batch_size,
                                          reduce=lambda i, _layer, p: p[heads][:, queries[i]])
    fmt = resolve_format(fmt)
    reports = []
    for i, (enc, grid, q) in enumerate(zip(encoded, grids, queries)):
        result = analysis.attention(grid, layers=layers, heads=heads, queries=q, tokens=enc.pieces,
                                    causal=lm.is_causal)
        reports.append(_report(lm, enc, result, fmt, k, one_head=head is not None))
        if plot:
            where = (f"layer {layers[0]} head {heads[0]}" if head is not None else
                     f"query position {q[0]} = {enc.pieces[q[0]]}")
            cap = plots.Caption.of("attn", lm, enc.text, where)
            index = len(reports) if prompt == "-" else None
            if html:
                plots.draw("attn", plot, index, full[i], enc.pieces, cap, causal=lm.is_causal, layer=layers[0],
                           head=heads[0], block=blocks[i])
            else:
                plots.draw("attn", plot, index, result, cap, one_head=head is not None)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _all_heads(lm, encoded, layers, heads, queries, batch_size):
    """For an HTML page, from one forward: every head's pattern ``[n_layers, n_heads, m, m]`` per prompt,
    pooled into blocks when the prompt is long (``anatomy_cli.output.html.attn``), the block size per
    prompt, and the exact rows the table shows (``[layers, heads, queries, pos]``)."""
    import torch

    from anatomy_cli import engine
    from anatomy_cli.output.html.attn import block_factor, pool

    blocks = [block_factor(len(e), lm.n_layers * lm.n_heads, lm.is_causal) for e in encoded]
    exact: dict[tuple[int, int], Any] = {}

    def reduce(i, layer, pattern):
        if layer in layers:
            exact[i, layer] = pattern[heads][:, queries[i]].to("cpu", copy=True)
        return pool(pattern, blocks[i])  # a long prompt's full patterns never stay in memory

    full = engine.attention_patterns(lm, encoded, batch_size=batch_size, reduce=reduce)
    grids = [torch.stack([exact[i, layer] for layer in layers]) for i in range(len(encoded))]
    return full, blocks, grids


def _check(info: ModelInfo, encoded: list, layer: int | None, head: int | None, position: int | None,
           name: str) -> tuple[int, int]:
    """``(n_layers, n_heads)`` of the model; UsageError for --layer/--head/--position out of range."""
    n_layers, n_heads = info.n_layers, info.n_heads
    if layer is not None and not -n_layers <= layer < n_layers:
        raise UsageError(f"--layer {layer} is out of range: {name} has {n_layers} layers "
                         f"(use 0..{n_layers - 1}, or -{n_layers}..-1 from the end)")
    if head is not None and not -n_heads <= head < n_heads:
        raise UsageError(f"--head {head} is out of range: {name} has {n_heads} heads per layer "
                         f"(use 0..{n_heads - 1}, or -{n_heads}..-1 from the end)")
    check_position(position, encoded)
    return n_layers, n_heads


def _query(enc, position: int | None) -> int:
    if position is not None:
        return position % len(enc)
    text = [i for i, special in enumerate(enc.special) if not special]  # an encoder's last token is [SEP]
    return text[-1] if text else len(enc) - 1


def _report(lm, enc, result, fmt: Format, k: int, *, one_head: bool) -> Report:
    data = {**prompt_record(lm, enc), "n_layers": lm.n_layers, "n_heads": lm.n_heads, **result.to_dict()}
    where = (f"layer {result.layers[0]} head {result.heads[0]}" if one_head else
             f"query position {result.queries[0]} = {enc.pieces[result.queries[0]]}")
    heading = [f"attn · {model_label(lm)} · {lm.n_layers} layers × {lm.n_heads} heads",
               f"{prompt_line(enc)} · {where}"]
    notes = ["weight = softmax(QKᵀ/√d_head + mask) of the head, eager attention; each query row sums to 1"]
    if fmt is not Format.table:
        sections = [Section(LONG_COLUMNS, data["weights"])]
    else:
        sections = _tables(result, k, one_head, _width())
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def _width() -> int:
    from anatomy_cli.output.render import stdout_console

    return stdout_console().width


def _tables(result, k: int, one_head: bool, width: int) -> list[Section]:
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
