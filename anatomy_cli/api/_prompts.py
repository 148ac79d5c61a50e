"""Prompt-reading analyses: trace, next_token, lens, heads, attn. Each runs the code its command runs (the
command module's ``run`` where it has one, else the same engine and analysis calls) and returns the command's
JSON with its result object (:class:`~anatomy_cli.api._results.Result`). No torch at import time."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from anatomy_cli.api._model import Model, encode, loaded, resolve_token, texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.api._run import run_prompts
from anatomy_cli.errors import UsageError
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel

One = Result | list[Result]


def _caption(command: str, lm: LoadedModel, text: str | None, detail: str | None = None):
    from anatomy_cli.output.plots import Caption

    return Caption.of(command, lm, text, detail)


def _one(results: list[Result], single: bool) -> One:
    return results[0] if single else results


def trace(model: Model, prompt: str | list[str], *, position: int | None = None, k: int = 5,
          target: str | None = None, target_id: int | None = None, first_token: bool = False,
          prompts: PromptOptions = PromptOptions(), batch_size: int = 8) -> One:
    """`anatomy trace`: one position followed through every layer (cosines, norms, the logit lens), and the
    model's top ``k`` next tokens. ``result``: Trace; rows: ``layers`` (n_layers + 1)."""
    from anatomy_cli.cli.commands import trace as command
    from anatomy_cli.text.positions import check_position

    lm = loaded(model)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    check_position(position, encoded)
    wanted = resolve_token(lm, target, target_id, first_token=first_token)
    if wanted is not None and not lm.has_unembed:
        raise UsageError(f"--target needs the logit lens, and {lm.name} has no LM head (unembedding)")
    out = []
    for enc, (pos, result, record) in zip(encoded, command.run(lm, encoded, position, k, wanted, batch_size)):
        data = command._report(lm, enc, pos, result, target=record).data
        cap = _caption("trace", lm, enc.text, f"position {pos} = {enc.pieces[pos]}")
        out.append(Result("trace", result, data, "layers", (result, cap)))
    return _one(out, single)


def next_token(model: Model, prompt: str | list[str], *, k: int = 10, target: str | None = None,
               target_id: int | None = None, first_token: bool = False,
               prompts: PromptOptions = PromptOptions(), batch_size: int = 8) -> One:
    """`anatomy next`: the next-token distribution after the prompt (float64 softmax at the last position).
    ``result``: NextTokens; rows: ``top`` (k)."""
    from anatomy_cli.output.views import next as view
    from anatomy_cli.tasks import next_token as task

    opts = task.NextOptions(k=k, target=target, target_id=target_id, first_token=first_token,
                            batch_size=batch_size)
    return run_prompts(task, view, model, prompt, opts, prompts)


def lens(model: Model, prompt: str | list[str], *, stat: str = "prob", target: str | None = None,
         target_id: int | None = None, first_token: bool = False, layers: list[int] | None = None,
         stride: int | None = None, k: int | None = None, prompts: PromptOptions = PromptOptions(),
         batch_size: int = 8) -> One:
    """`anatomy lens`: the logit lens at every layer and position. ``result``: LensGrid; rows: ``cells``
    (one per layer x position)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import lens as analysis
    from anatomy_cli.cli.commands import lens as command
    from anatomy_cli.cli.commands._common import describe

    command.Stat(stat)  # ValueError for an unknown statistic
    lm = loaded(model)
    wanted = resolve_token(lm, target, target_id, first_token=first_token)
    if stat == "rank" and wanted is None:
        raise UsageError("--stat rank is the target's rank: give --target TEXT or --target-id N")
    if layers is not None and stride is not None:
        raise UsageError("--layers and --stride both thin the rows: give one of them")
    if not lm.has_unembed:
        raise UsageError(f"{lm.name} has no LM head (unembedding): the logit lens has nothing to read tokens from")
    rows = command._rows(lm.n_layers, list(layers) if layers is not None else None, stride)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    caches = engine.run(lm, encoded, engine.residual_names(lm), batch_size=batch_size)
    out = []
    for enc, cache in zip(encoded, caches):
        grid = analysis.lens_grid(cache.residual_stream(), lambda h: engine.unembed(lm, h), describe=describe(lm),
                                  positions=cache.positions, k=k, target_id=wanted).select(rows)
        data = command._report(lm, enc, grid, stat, False).data
        cap = _caption("lens", lm, enc.text, f"--stat {stat}")
        out.append(Result("lens", grid, data, "cells", (grid, stat, [enc.pieces[p] for p in grid.positions], cap)))
    return _one(out, single)


def heads(model: Model, prompt: str | list[str] | None = None, *, seq_len: int = 50, seed: int = 0,
          sort: str | None = None, top: int | None = None, prompts: PromptOptions = PromptOptions(),
          batch_size: int = 8) -> One:
    """`anatomy heads`: five scores per attention head; entropy, first_token, prev_token on the prompt (or the
    random sequence without one), induction and duplicate_token on ``seq_len`` random tokens repeated.
    ``result``: Heads; rows: ``heads`` (n_layers x n_heads, or ``top``)."""
    from anatomy_cli.cli.commands import heads as command

    lm = loaded(model)
    if sort is not None:
        command.Score(sort)  # ValueError for an unknown score
    single = prompt is None or isinstance(prompt, str)
    encoded = [] if prompt is None else encode(lm, texts_of(prompt)[0], prompts)
    command._check(lm.info, encoded, seq_len, lm.name)
    out = []
    for enc, full in command.run(lm, encoded, seq_len, seed, sort, batch_size):
        shown = dataclasses.replace(full, rows=full.rows[:top] if top else full.rows)
        detail = f"induction, duplicate on {seq_len} random tokens × 2, seed {seed}"
        cap = _caption("heads", lm, enc.text if encoded else None, detail)
        out.append(Result("heads", shown, command._report(lm, enc, shown).data, "heads",
                          (full, lm.n_layers, lm.n_heads, cap), {"top": top}))
    return _one(out, single)


def attn(model: Model, prompt: str | list[str], *, layer: int | None = None, head: int | None = None,
         position: int | None = None, prompts: PromptOptions = PromptOptions(), batch_size: int = 8) -> One:
    """`anatomy attn`: attention weights, eager attention. ``layer`` and ``head``: one head's query x key
    pattern; ``layer``: every head of it from one query (``position``); neither: every layer. ``result``:
    Attention (``grid``: [layers, heads, queries, keys]); rows: ``weights`` (one per weight)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import attention as analysis
    from anatomy_cli.cli.commands import attn as command
    from anatomy_cli.output.render import Format

    lm = loaded(model)
    if head is not None and layer is None:
        raise UsageError("--head needs --layer: give the layer the head belongs to")
    if head is not None and position is not None:
        raise UsageError("--position picks the query row when showing several heads; with --head every row is shown")
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    n_layers, n_heads = command._check(lm.info, encoded, layer, head, position, lm.name)
    layers = [layer % n_layers] if layer is not None else list(range(n_layers))
    heads_ = [head % n_heads] if head is not None else list(range(n_heads))
    queries = [list(range(len(e))) if head is not None else [command._query(e, position)] for e in encoded]
    grids = engine.attention_patterns(lm, encoded, layers=layers, batch_size=batch_size,
                                      reduce=lambda i, _layer, p: p[heads_][:, queries[i]])
    out = []
    for enc, grid, q in zip(encoded, grids, queries):
        result = analysis.attention(grid, layers=layers, heads=heads_, queries=q, tokens=enc.pieces,
                                    causal=lm.is_causal)
        data = command._report(lm, enc, result, Format.json, 3, one_head=head is not None).data
        where = (f"layer {layers[0]} head {heads_[0]}" if head is not None else
                 f"query position {q[0]} = {enc.pieces[q[0]]}")
        out.append(Result("attn", result, data, "weights", (result, _caption("attn", lm, enc.text, where)),
                          {"one_head": head is not None}))
    return _one(out, single)
