"""`lens-eval`: lenses compared on jlens' evaluation sets (pass@k of intermediates at the readout position)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.output.views import lens_eval as view
from anatomy_cli.tasks import lens_eval as task
from anatomy_cli.text.options import PromptOptions


@command(task.LensEvalOptions)
def lens_eval(model: Model, items: str | Path | dict[str, Any] | list[dict[str, Any]], opts: task.LensEvalOptions, *,
              prompts: PromptOptions = PromptOptions()) -> Result:
    """`anatomy lens-eval ITEMS`: ``items`` (jlens' evaluation file, its loaded ``{"items": [...]}`` or the list
    of items, each ``{"prompt": TEXT, "intermediates": [WORD, ...]}``) read through each of ``lens`` (``logit``,
    ``tuned:DIR``, ``jacobian:FILE``; one text or several): per lens pass@1/5/10, the mean over items of the
    fraction of intermediates whose best 1-based rank (over the lens' blocks and the word's single-token forms)
    is at most k. ``result``: LensEval (``pass_at(j, k)``); rows: ``lenses``."""
    opts = dataclasses.replace(opts, items=items)
    first = opened(model)
    encoded = encode(first, opts.prompts, prompts)
    plan = task.check(first, opts)  # every refusal before the weights load
    lm = weights(first)
    result = task.run(lm, encoded, opts, plan)
    return Result(task.COMMAND, result, view.report(lm, result).data, view.ROWS)
