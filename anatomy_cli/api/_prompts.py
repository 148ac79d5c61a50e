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
from anatomy_cli.tasks import heads as heads_task
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
