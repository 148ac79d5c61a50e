"""`anatomy heads [PROMPT]`: five scores per attention head (entropy, sink, previous token, induction, duplicate)."""

from __future__ import annotations

from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.commands._common import draw_each
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import heads as task
from anatomy_cli.text.options import PromptOptions


@command("heads", task.HeadsOptions)
@model_options()
@prompt_options()
@output_options()
def heads_command(
    prompt: Annotated[Optional[str], typer.Argument(
        metavar="[PROMPT]", show_default=False,
        help="Measure entropy, first_token and prev_token on this text ('-': one prompt per stdin line). "
             "Default: on the random sequence.")] = None,
    opts: task.HeadsOptions = task.HeadsOptions(),
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """What each attention head does: one row per (layer, head) with five scores.

    entropy (nats), first_token (mass on position 0, the attention sink) and prev_token (weight on
    the previous position) are measured on PROMPT, or on the random sequence without one;
    induction and duplicate_token on --seq-len random ordinary tokens (seed --seed) repeated twice.
    Definitions and sources: docs/commands/heads.md. One forward with eager attention; the
    scores are computed layer by layer.

    Examples:

    \b
        anatomy heads --sort induction --top 5
        anatomy heads "The cat sat on the mat. The cat" --sort prev_token
        anatomy heads --seq-len 100 --seed 1 --format json
    """
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output.views import heads as view

    if prompt is not None:
        opened, encoded = open_prompts(prompt, spec, prompts)
    else:
        opened, encoded = open_model(spec), []
    task.check(opened, opts, encoded)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts)
    # Every head is scored; --top cuts the rows printed, while the picture colours every head and frames the top.
    emit_prompts([view.report(lm, enc, view.shown(result, opts.top)) for enc, result in results], fmt,
                 from_stdin=prompt == "-")
    draw_each("heads", plot, prompt, (view.figure(lm, enc, result, opts.top, prompted=bool(encoded))
                                      for enc, result in results))
