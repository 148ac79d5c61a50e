"""`anatomy verify` as a function: :func:`verify`. Runs the command's task (:mod:`anatomy_cli.tasks.verify`)
with the same :class:`~anatomy_cli.tasks.verify.VerifyOptions` and its view, and returns its JSON with its
result object. No torch at import time."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import load
from anatomy_cli.api._model import loaded
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.output.views import verify as view
from anatomy_cli.tasks import verify as task
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel


@command(task.VerifyOptions)
def verify(model: Model, prompt: str | list[str] | None = None, opts: task.VerifyOptions = task.VerifyOptions(), *,
           prompts: PromptOptions = PromptOptions()) -> Result:
    """`anatomy verify`: each check of anatomy's numbers on this model (parity with transformers, identities,
    precision, devices, known answers, llama.cpp for a ``.gguf`` model), its error, tolerance and pass or fail.
    ``prompt``: the prompts to check on (default the command's four; the CLI's ``--prompts FILE``); ``against``:
    ``transformers``, ``llama.cpp`` or ``all``. Failing checks do not raise: ``result.passed`` and
    ``to_dict()["failed"]`` say which. ``result``: Verification; rows: ``sections`` (each with its ``checks``)."""
    opts = dataclasses.replace(opts, prompt=None if prompt is None else tuple(texts_of(prompt)[0]))
    lm = loaded(model)
    encoded = encode(lm, opts.texts, prompts)
    plan = task.check(lm, encoded, opts, untrained=lm.untrained)

    def reload(dtype: str, device: str) -> LoadedModel:
        return load(lm.name, dtype=dtype, device=device, init="random" if lm.untrained else "pretrained")

    result = task.run(lm, encoded, reload, plan)
    args, kwargs = view.figure(lm, result, encoded)
    return Result(task.COMMAND, result, view.report(lm, result, encoded, plan).data, view.ROWS, args, kwargs)
