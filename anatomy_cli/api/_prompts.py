"""Prompt-reading analyses of their own shape: lens, heads, attn (the others are the prompt driver's,
api/_driven.py). Each builds its command's options object from its keywords and runs the same task
(:mod:`anatomy_cli.tasks`) and view (:mod:`anatomy_cli.output.views`) as the command, returning the command's
JSON with its result object (:class:`~anatomy_cli.api._results.Result`). No torch at import time; nothing from
cli/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.tasks import attn as attn_task
from anatomy_cli.tasks import heads as heads_task
from anatomy_cli.tasks import lens as lens_task
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel

One = Result | list[Result]


def _caption(command: str, lm: LoadedModel, text: str | None, detail: str | None = None):
    """A picture's caption (the other API modules' figures; this module's come from their views)."""
    from anatomy_cli.output.plots import Caption

    return Caption.of(command, lm, text, detail)


def _one(results: list[Result], single: bool) -> One:
    return results[0] if single else results



@command(lens_task.LensOptions)
def lens(model: Model, prompt: str | list[str], opts: lens_task.LensOptions, *,
         prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy lens`: the logit lens at every residual-stream row (``embed``, then blocks 0..L−1) and position.
    ``layers``: the rows to show (``["embed", 0, 6]`` or ``"embed,0,6"``); ``lens``: ``logit``, ``tuned:DIR`` or
    ``jacobian:FILE`` (a fitted lens, docs/commands/lens.md#fitted-lenses). ``result``: LensGrid; rows: ``cells``
    (one per row x position)."""
    from anatomy_cli.output.views import lens as view

    texts, single = texts_of(prompt)
    first = opened(model)
    encoded = encode(first, texts, prompts)
    plan = lens_task.check(first, opts)
    lm = weights(first)
    out = []
    for enc, grid in zip(encoded, lens_task.run(lm, encoded, opts, plan)):
        args, kwargs = view.figure(lm, enc, grid, opts.stat)
        data = view.report(lm, enc, grid, opts.stat).data
        out.append(Result(lens_task.COMMAND, grid, data, view.ROWS, args, kwargs))
    return _one(out, single)


@command(heads_task.HeadsOptions)
def heads(model: Model, prompt: str | list[str] | None = None,
          opts: heads_task.HeadsOptions = heads_task.HeadsOptions(), *,
          prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy heads`: five scores per attention head; entropy, first_token, prev_token on the prompt (or the
    random sequence without one), induction and duplicate_token on ``seq_len`` random tokens repeated.
    ``result``: Heads; rows: ``heads`` (n_layers x n_heads, or ``top``)."""
    from anatomy_cli.output.views import heads as view

    single = prompt is None or isinstance(prompt, str)
    first = opened(model)
    encoded = [] if prompt is None else encode(first, texts_of(prompt)[0], prompts)
    heads_task.check(first, opts, encoded)
    lm = weights(first)
    out = []
    for enc, full in heads_task.run(lm, encoded, opts):
        part = view.shown(full, opts.top)
        args, kwargs = view.figure(lm, enc, full, opts.top, prompted=bool(encoded))
        out.append(Result(heads_task.COMMAND, part, view.report(lm, enc, part).data, view.ROWS, args, kwargs))
    return _one(out, single)


@command(attn_task.AttnOptions)
def attn(model: Model, prompt: str | list[str], opts: attn_task.AttnOptions, *,
         prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy attn`: attention weights, eager attention. ``layer`` (a block, 0..L−1) and ``head``: one head's
    query x key pattern; ``layer``: every head of it from one query (``position``); neither: every block.
    ``result``: Attention (``grid``: [layers, heads, queries, keys]); rows: ``weights`` (one per weight)."""
    from anatomy_cli.output.views import attn as view

    texts, single = texts_of(prompt)
    first = opened(model)
    encoded = encode(first, texts, prompts)
    plan = attn_task.check(first, opts, encoded)
    lm = weights(first)
    out = []
    for enc, result in zip(encoded, attn_task.run(lm, encoded, opts, plan)):
        args, kwargs = view.figure(lm, enc, result, opts.one_head)
        data = view.report(lm, enc, result, k=opts.k, one_head=opts.one_head).data
        out.append(Result(attn_task.COMMAND, result, data, view.ROWS, args, kwargs))
    return _one(out, single)
