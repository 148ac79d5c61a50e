"""Prompt-reading analyses: trace, next_token, lens, heads, attn. Each builds its command's options object from
its keywords and runs the same task (:mod:`anatomy_cli.tasks`) and view (:mod:`anatomy_cli.output.views`) as the
command, returning the command's JSON with its result object (:class:`~anatomy_cli.api._results.Result`). No
torch at import time; nothing from cli/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import loaded
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.api._run import run_prompts
from anatomy_cli.tasks import next_token as next_task
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


def trace(model: Model, prompt: str | list[str], *, position: int | None = None, k: int = 5,
          target: str | None = None, target_id: int | None = None, first_token: bool = False,
          prompts: PromptOptions = PromptOptions(), batch_size: int = 8, lens: str = "logit") -> One:
    """`anatomy trace`: one position followed through the residual stream (rows ``embed``, then blocks 0..L−1:
    cosines, norms, the logit lens), and the model's top ``k`` next tokens. ``lens``: ``logit``, ``tuned:DIR`` or
    ``jacobian:FILE`` (the lens columns' lens). ``result``: Trace; rows: ``layers`` (n_layers + 1)."""
    from anatomy_cli.output.views import trace as view
    from anatomy_cli.tasks import trace as task

    opts = task.TraceOptions(position=position, k=k, target=target, target_id=target_id, first_token=first_token,
                             batch_size=batch_size, lens=lens)
    return run_prompts(task, view, model, prompt, opts, prompts, check_encoded=True, unwrap=lambda r: r.trace)


@command(next_task.NextOptions)
def next_token(model: Model, prompt: str | list[str], opts: next_task.NextOptions, *,
               prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy next`: the next-token distribution after the prompt (float64 softmax at the last position).
    ``result``: NextTokens; rows: ``top`` (k)."""
    from anatomy_cli.output.views import next as view

    return run_prompts(next_task, view, model, prompt, opts, prompts)


def route(model: Model, prompt: str | list[str], *, block: str | int | None = None, top: int | None = None,
          prompts: PromptOptions = PromptOptions(), batch_size: int = 8) -> One:
    """`anatomy route`: per MoE block and position, the chosen experts (heaviest first), the weights the block
    applies, the router's entropy (nats) and the margin between the k-th and (k+1)-th router probability.
    ``block``: ``"0,2"``, ``1`` (None: every MoE block). ``result``: RouteResult; rows: ``rows``."""
    from anatomy_cli.output.views import route as view
    from anatomy_cli.tasks import route as task

    opts = task.RouteOptions(block=block, top=top, batch_size=batch_size)
    return run_prompts(task, view, model, prompt, opts, prompts)


def lens(model: Model, prompt: str | list[str], *, stat: str = "prob", target: str | None = None,
         target_id: int | None = None, first_token: bool = False, layers: list[int | str] | str | None = None,
         stride: int | None = None, k: int | None = None, prompts: PromptOptions = PromptOptions(),
         batch_size: int = 8, lens: str = "logit") -> One:
    """`anatomy lens`: the logit lens at every residual-stream row (``embed``, then blocks 0..L−1) and position.
    ``layers``: the rows to show (``["embed", 0, 6]`` or ``"embed,0,6"``); ``lens``: ``logit``, ``tuned:DIR`` or
    ``jacobian:FILE`` (a fitted lens, docs/commands/lens.md#fitted-lenses). ``result``: LensGrid; rows: ``cells``
    (one per row x position)."""
    from anatomy_cli.output.views import lens as view
    from anatomy_cli.tasks import lens as task

    opts = task.LensOptions(stat=stat, target=target, target_id=target_id, first_token=first_token,
                            layers=layers, stride=stride, k=k, batch_size=batch_size, lens=lens)
    lm = loaded(model)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    plan = task.check(lm, opts)
    out = []
    for enc, grid in zip(encoded, task.run(lm, encoded, opts, plan)):
        args, kwargs = view.figure(lm, enc, grid, opts.stat)
        out.append(Result(task.COMMAND, grid, view.report(lm, enc, grid, opts.stat).data, view.ROWS, args, kwargs))
    return _one(out, single)


def heads(model: Model, prompt: str | list[str] | None = None, *, seq_len: int = 50, seed: int = 0,
          sort: str | None = None, top: int | None = None, prompts: PromptOptions = PromptOptions(),
          batch_size: int = 8) -> One:
    """`anatomy heads`: five scores per attention head; entropy, first_token, prev_token on the prompt (or the
    random sequence without one), induction and duplicate_token on ``seq_len`` random tokens repeated.
    ``result``: Heads; rows: ``heads`` (n_layers x n_heads, or ``top``)."""
    from anatomy_cli.output.views import heads as view
    from anatomy_cli.tasks import heads as task

    opts = task.HeadsOptions(seq_len=seq_len, seed=seed, sort=sort, top=top, batch_size=batch_size)
    lm = loaded(model)
    single = prompt is None or isinstance(prompt, str)
    encoded = [] if prompt is None else encode(lm, texts_of(prompt)[0], prompts)
    task.check(lm, opts, encoded)
    out = []
    for enc, full in task.run(lm, encoded, opts):
        part = view.shown(full, top)
        args, kwargs = view.figure(lm, enc, full, top, prompted=bool(encoded))
        out.append(Result(task.COMMAND, part, view.report(lm, enc, part).data, view.ROWS, args, kwargs))
    return _one(out, single)


def attn(model: Model, prompt: str | list[str], *, layer: int | None = None, head: int | None = None,
         position: int | None = None, k: int = 3, prompts: PromptOptions = PromptOptions(),
         batch_size: int = 8) -> One:
    """`anatomy attn`: attention weights, eager attention. ``layer`` (a block, 0..L−1) and ``head``: one head's
    query x key pattern; ``layer``: every head of it from one query (``position``); neither: every block.
    ``result``: Attention (``grid``: [layers, heads, queries, keys]); rows: ``weights`` (one per weight)."""
    from anatomy_cli.output.views import attn as view
    from anatomy_cli.tasks import attn as task

    opts = task.AttnOptions(layer=layer, head=head, position=position, k=k, batch_size=batch_size)
    lm = loaded(model)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    plan = task.check(lm, opts, encoded)
    out = []
    for enc, result in zip(encoded, task.run(lm, encoded, opts, plan)):
        args, kwargs = view.figure(lm, enc, result, opts.one_head)
        data = view.report(lm, enc, result, k=k, one_head=opts.one_head).data
        out.append(Result(task.COMMAND, result, data, view.ROWS, args, kwargs))
    return _one(out, single)
