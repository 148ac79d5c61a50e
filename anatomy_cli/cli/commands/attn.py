"""`anatomy attn PROMPT`: attention patterns, one head's query x key or every head from one query."""

from __future__ import annotations

from typing import Any

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import attn as task
from anatomy_cli.text.options import PromptOptions


@command("attn", task.AttnOptions)
@model_options()
@prompt_options()
@output_options()
def attn_command(
    prompt: PromptArg,
    opts: task.AttnOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
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
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output import plots
    from anatomy_cli.output.render import resolve_format
    from anatomy_cli.output.views import attn as view

    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts, encoded)
    lm = load_weights(opened)
    html = plots.is_html(plot)
    grids = None
    if html:  # the page switches between every layer and head: all of them, every query
        full, blocks, grids = _all_heads(lm, encoded, plan.layers, plan.heads, plan.queries, opts.batch_size)
    fmt = resolve_format(fmt)
    reports = []
    for i, (enc, result) in enumerate(zip(encoded, task.run(lm, encoded, opts, plan, grids))):
        reports.append(view.report(lm, enc, result, fmt, opts.k, one_head=opts.one_head))
        if plot:
            index = len(reports) if prompt == "-" else None
            args, kwargs = view.figure(lm, enc, result, opts.one_head)
            if html:
                plots.draw("attn", plot, index, full[i], enc.pieces, args[1], causal=lm.is_causal,
                           layer=plan.layers[0], head=plan.heads[0], block=blocks[i])
            else:
                plots.draw("attn", plot, index, *args, **kwargs)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _all_heads(lm, encoded, layers, heads, queries, batch_size):
    """For an HTML page, from one forward: every head's pattern ``[n_layers, n_heads, m, m]`` per prompt,
    pooled into blocks when the prompt is long (``anatomy_cli.output.html.attn``), the block size per
    prompt, and the exact rows the table shows (``[layers, heads, queries, pos]``)."""
    import torch

    from anatomy_cli import engine
    from anatomy_cli.output.html.attn import block_factor
    from anatomy_cli.output.html.attn import pool

    blocks = [block_factor(len(e), lm.n_layers * lm.n_heads, lm.is_causal) for e in encoded]
    exact: dict[tuple[int, int], Any] = {}

    def reduce(i, layer, pattern):
        if layer in layers:
            exact[i, layer] = pattern[heads][:, queries[i]].to("cpu", copy=True)
        return pool(pattern, blocks[i])  # a long prompt's full patterns never stay in memory

    full = engine.attention_patterns(lm, encoded, batch_size=batch_size, reduce=reduce)
    grids = [torch.stack([exact[i, layer] for layer in layers]) for i in range(len(encoded))]
    return full, blocks, grids
