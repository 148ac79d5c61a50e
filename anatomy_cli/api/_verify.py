"""`anatomy verify` as a function: :func:`verify`. Runs the command's own code (its ``run`` and ``report``) and
returns its JSON with its result object. No torch at import time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.api._model import Model, encode, load, loaded, texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.errors import UsageError
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel


def verify(model: Model, prompt: str | list[str] | None = None, *, against: str = "all", quick: bool = False,
           prompts: PromptOptions = PromptOptions()) -> Result:
    """`anatomy verify`: each check of anatomy's numbers on this model (parity with transformers, identities,
    precision, devices, known answers, llama.cpp for a ``.gguf`` model), its error, tolerance and pass or fail.
    ``prompt``: the prompts to check on (default the command's four); ``against``: ``transformers``,
    ``llama.cpp`` or ``all``. Failing checks do not raise: ``result.passed`` and ``to_dict()["failed"]`` say
    which. ``result``: Verification; rows: ``sections`` (each with its ``checks``)."""
    from anatomy_cli.analyses.verify.suite import Plan
    from anatomy_cli.cli.commands import verify as command

    command.Against(against)  # ValueError for an unknown reference
    lm = loaded(model)
    texts = command.PROMPTS if prompt is None else texts_of(prompt)[0]
    encoded = encode(lm, list(texts)[:2] if quick else list(texts), prompts)
    if any(len(e) == 0 for e in encoded):
        raise UsageError("a prompt has no tokens")

    def reload(dtype: str, device: str) -> LoadedModel:
        return load(lm.name, dtype=dtype, device=device, init="random" if lm.untrained else "pretrained")

    plan = Plan(against=against, quick=quick, gguf=command.gguf_file(lm.name, lm.untrained))
    result = command.run(lm, encoded, reload, plan)
    data = command.report(lm, result, encoded, plan).data
    return Result("verify", result, data, "sections", (result, command.caption(lm, result, encoded)))
