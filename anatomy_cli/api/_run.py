"""One task run from the API: the same options object, check and run as the command, the same view.

:func:`run_prompts` is every prompt-reading API function's body: build the task's options from the keywords,
encode the prompts (:mod:`anatomy_cli.tasks.session`), ``check`` (every refusal, worded as the CLI words it),
``run``, and wrap each result with its view's JSON (:class:`~anatomy_cli.api._results.Result`). No torch at
import time; nothing from cli/.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import TypeVar
from typing import cast

from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.tasks import driven
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from types import ModuleType

    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.output.views.protocol import View
    from anatomy_cli.tasks.protocol import OptionsTask
    from anatomy_cli.tasks.protocol import PromptTask

One = Result | list[Result]
O = TypeVar("O")
P = TypeVar("P")
R = TypeVar("R")


def run_prompts(task: PromptTask[O, P, R] | OptionsTask[O, P, R], view: View[R], model: Model,
                prompt: str | list[str], opts: O, prompts: PromptOptions = PromptOptions(), *,
                figure: Callable[[LoadedModel, Encoded, R], FigureArgs] | None = None) -> One:
    """``task.check`` then ``task.run`` on ``prompt`` (one text → one Result; a list → a list).

    The check reads the encoded prompts where its signature does, and the Result carries what the task's
    ``carried`` hook says (:mod:`anatomy_cli.tasks.driven`); ``figure(lm, enc, result)``: the picture's ``(args,
    kwargs)`` for :meth:`Result.plot` (None: the view's ``figure`` if it has one)."""
    module = cast("ModuleType", task)
    texts, single = texts_of(prompt)
    first = opened(model)
    encoded = encode(first, texts, prompts)
    plan = driven.check(module, first, opts, encoded)
    lm = weights(first)
    results = task.run(lm, encoded, opts, plan)
    figure = figure or getattr(view, "figure", None)
    out = []
    for enc, result in zip(encoded, results):
        args, kwargs = figure(lm, enc, result) if figure is not None else ((), {})
        data = view.report(lm, enc, result).data
        out.append(Result(task.COMMAND, driven.carried(module, result), data, view.ROWS, args, kwargs))
    return out[0] if single else out
