"""One task run from the API: the same options object, check and run as the command, the same view.

:func:`run_prompts` is every prompt-driven API function's body: build the task's options from the keywords,
the texts from its arguments (the task's ``TAKES``), encode them (:mod:`anatomy_cli.tasks.session`), ``check``
(every refusal, worded as the CLI words it), ``run``, and wrap each result with its view's JSON
(:class:`~anatomy_cli.api._results.Result`). No torch at import time; nothing from cli/.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.declare.inputs import Inputs
from anatomy_cli.output.views import driven as views
from anatomy_cli.tasks import driven
from anatomy_cli.tasks import notes
from anatomy_cli.text.options import PromptOptions

One = Result | list[Result]


def read(takes: Inputs, given: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The arguments as the task reads them (a prompts argument as its list of texts, ``[]`` for None) and
    whether the answer is one Result (no prompts argument given a list)."""
    single, out = True, dict(given)
    for a in takes.arguments:
        if a.prompts:
            out[a.name], one = ([], True) if given[a.name] is None else texts_of(given[a.name])
            single = single and one
    return out, single


def run_prompts(task: ModuleType, view: ModuleType, model: Model, given: dict[str, Any], opts: Any,
                prompts: PromptOptions = PromptOptions()) -> One:
    """``task.check`` then ``task.run`` on the texts of the arguments ``given`` (one prompt → one Result; a list
    → a list), each result with its view's report and picture: the hooks of :mod:`anatomy_cli.tasks.driven` and
    :mod:`anatomy_cli.output.views.driven`, read as the CLI's prompt driver reads them (the API's options: no
    format, no picture path)."""
    takes = driven.takes(task)
    arguments, single = read(takes, given)
    opts, texts = driven.texts(task, opts, arguments)
    with notes.recorded() as warned:  # the task's run may carry them (driven.run)
        first = opened(model)
        encoded = encode(first, texts, prompts, what=takes.what, truncate_hint=takes.truncate) if texts else []
        plan = driven.check(task, first, opts, encoded)
        lm = weights(first)
    how = views.Shown(opts, plan)
    out = []
    results = driven.run(task, lm, encoded, opts, plan, warned, **views.run_kwargs(view, how))
    for enc, result in driven.units(task, encoded, results):
        args, kwargs = views.figure(view, lm, enc, result, how)
        data = views.report(view, lm, enc, result, how).data
        out.append(Result(task.COMMAND, driven.carried(task, result), data, view.ROWS, args, kwargs))
    return out[0] if single else out
