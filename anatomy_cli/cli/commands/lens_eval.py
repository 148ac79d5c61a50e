"""`anatomy lens-eval ITEMS.json --lens logit --lens jacobian:FILE`: jlens' lens evaluation, pass@1/5/10 per lens."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import lens_eval as task
from anatomy_cli.text.options import PromptOptions


@command("lens-eval", task.LensEvalOptions)
@model_options()
@prompt_options()
def lens_eval_command(
    items: Annotated[str, typer.Argument(metavar="ITEMS", show_default=False,
                                         help="jlens' evaluation file: {\"items\": [{\"prompt\": ..., "
                                         "\"intermediates\": [...]}, ...]}.")],
    opts: task.LensEvalOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
) -> None:
    """Compare lenses the way jlens evaluates one: pass@1, pass@5 and pass@10 per lens, side by side.

    Each item's prompt is read at its last token (a set named *poetry*: its last newline) at every
    block the lens reads: the logit lens every block below the last, a Jacobian lens its fitted
    blocks, a tuned lens the blocks with a translator. An intermediate's rank is the best (1-based)
    over those blocks and over its single-token forms (as given, with a leading space, capitalised);
    pass@k is the mean over items of the fraction of intermediates with rank <= k. A word with no
    single-token form is a miss (said on stderr). The table and tsv give pass@k per lens, then every
    intermediate's rank and block under each lens; json gives both.

    Examples:

    \b
        anatomy lens-eval items.json
        anatomy lens-eval items.json --lens logit --lens jacobian:lens.pt --lens tuned:tuned/
        anatomy lens-eval items.json --lens jacobian:lens.pt --format json
    """
    view = when_run("output.views.lens_eval")

    opts = dataclasses.replace(opts, items=items)  # fails before anything opens
    opened, encoded = open_texts(opts.prompts, spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    emit(view.report(lm, task.run(lm, encoded, opts, plan)), fmt)
