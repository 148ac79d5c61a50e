"""`anatomy drift WORD`: how one word's vector diverges across contexts, layer by layer."""

from __future__ import annotations

from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks.drift import Pool
from anatomy_cli.text.options import PromptOptions


@app.command("drift")
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
    matrix: Annotated[Optional[str], typer.Option(
        "--matrix", metavar="LAYER", show_default=False,
        help="Print the full pairwise similarity matrix at this residual row (embed, or block N's output) "
        "instead of the per-layer table.",
    )] = None,
    pool: Annotated[Pool, typer.Option("--pool", case_sensitive=False,
                                       help="How to pool a word that spans several tokens.")] = Pool.mean,
    occurrence: Annotated[int, typer.Option("--occurrence", "-n", min=1, metavar="N",
                                            help="Which occurrence of WORD to use in each context (1-based).")] = 1,
    ignore_case: Annotated[bool, typer.Option("--ignore-case", "-i",
                                              help="Match WORD regardless of case.")] = False,
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
    from anatomy_cli.tasks import drift as task

    opts = task.DriftOptions(word=word, contexts=None if context is None else tuple(context), matrix=matrix,
                             pool=pool, occurrence=occurrence, ignore_case=ignore_case)  # before anything opens
    opened, encoded = open_texts(opts.texts(), spec, prompts, what="context", truncate_hint=False)
    plan = task.check(opened, opts, encoded)  # --matrix and the word in every context, before the weights
    lm = load_weights(opened)
    result = task.run(lm, encoded, opts, plan)
    emit(view.report(lm, encoded, result), fmt)
    if plot:
        args, kwargs = view.figure(lm, encoded, result)
        plots.draw("drift", plot, None, *args, **kwargs)
