"""`anatomy drift WORD`: how one word's vector diverges across contexts, layer by layer."""

from __future__ import annotations

from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import drift as task
from anatomy_cli.text.options import PromptOptions


@command("drift", task.DriftOptions)
@model_options()
@prompt_options(truncate=False)
@output_options()
def drift_command(
    word: Annotated[str, typer.Argument(
        metavar="WORD", show_default=False,
        help="The word to follow: matched as a whole word; in scripts written without spaces (Chinese, Japanese, "
        "Thai) as characters.")],
    context: Annotated[Optional[list[str]], typer.Option(
        "--context", "-c", metavar="TEXT", show_default=False,
        help="A context containing WORD; repeat, at least two. Default (for 'bank'): a money and a river sentence.",
    )] = None,
    opts: task.DriftOptions = None,  # type: ignore[assignment]  # the declared fields take its place
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """Cosine similarity of WORD's vector between contexts at every layer, with an anisotropy baseline.

    Layer embed is the embedding; layer N is block N's output, the last one
    before any final norm. The header gives the 0-based token positions of
    WORD in each context. Baseline: the mean cosine between WORD and the other
    tokens of its own context.

    Examples:

        anatomy drift bank --init random

        anatomy drift bank -c "I paid at the bank." -c "We swam to the bank."

        anatomy drift bank -c TEXT -c TEXT -c TEXT --matrix 5 --format json
    """
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output import plots
    from anatomy_cli.output.render import emit
    from anatomy_cli.output.views import drift as view

    opts = opts.with_inputs(word, context)  # WORD and the contexts checked before anything opens
    opened, encoded = open_texts(opts.texts(), spec, prompts, what="context", truncate_hint=False)
    plan = task.check(opened, opts, encoded)  # --matrix and the word in every context, before the weights
    lm = load_weights(opened)
    result = task.run(lm, encoded, opts, plan)
    emit(view.report(lm, encoded, result), fmt)
    if plot:
        args, kwargs = view.figure(lm, encoded, result)
        plots.draw("drift", plot, None, *args, **kwargs)
